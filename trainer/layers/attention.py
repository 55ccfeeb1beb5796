"""DIN's target attention over a behaviour sequence (Zhou et al., KDD 2018, "Deep Interest
Network for Click-Through Rate Prediction"; EasyRec's ``din`` layer)."""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from recpipe.config.model import DNN
from trainer.layers.mlp import MLP


class DINAttention(keras.layers.Layer):
    """Scores each history element against the query with an MLP over
    ``[query, key, query - key, query * key]`` and pools the history by those scores,
    softmax-normalised over the valid elements (EasyRec's variant; the paper leaves the scores
    unnormalised).

    Args:
        dnn: the scoring MLP; its last layer must have one unit (its ReLU is dropped: a score
            is a logit).

    Call:
        query: ``float32 [B, D]`` (the candidate's embeddings).
        keys: ``float32 [B, L, D]`` (the history's embeddings, padded).
        mask: ``bool [B, L]``, the valid elements; a row without any pools to zeros.
        values: ``float32 [B, L, A]`` or None: ``aux_hist_seq`` embeddings of the same
            elements, pooled with the same weights and appended.

    Returns:
        ``float32 [B, D]``, or ``[B, D + A]`` with ``values``.

    Raises:
        ValueError: ``dnn.hidden_units`` does not end with 1.
    """

    def __init__(self, dnn: DNN, **kwargs):
        super().__init__(**kwargs)
        if dnn.hidden_units[-1] != 1:
            raise ValueError(f"din_towers.dnn.hidden_units must end with 1, got {dnn.hidden_units}")
        hidden = dnn.model_copy(update={"hidden_units": dnn.hidden_units[:-1]})
        self.mlp = MLP(hidden, name="att_dnn") if hidden.hidden_units else None
        self.score = keras.layers.Dense(1, name="att_score")

    def call(self, query, keys, mask, values=None, training=False):
        if self.mlp is not None:
            x = self.mlp(self._first_layer(query, keys), training=training, preactivation=True)
        else:
            length = tf.shape(keys)[1]
            q = tf.tile(query[:, None, :], [1, length, 1])
            x = tf.concat([q, keys, q - keys, q * keys], axis=-1)
        scores = tf.squeeze(self.score(x), axis=-1)  # [B, L]
        scores = tf.where(mask, scores, tf.fill(tf.shape(scores), tf.constant(-1e9, scores.dtype)))
        weights = tf.nn.softmax(scores, axis=-1) * tf.cast(mask, scores.dtype)
        if values is not None:
            keys = tf.concat([keys, values], axis=-1)
        return tf.einsum("bl,bld->bd", weights, keys)

    def _first_layer(self, query, keys):
        """The scoring MLP's first pre-activation, ``[q, k, q - k, q * k] @ W + b``, as
        ``q @ (W_q + W_d)`` once per row plus ``[k, q * k] @ [W_k - W_d; W_p]`` per element: the
        query's share is not repeated for each of the L elements, and no ``[B, L, 4D]`` block
        is built. The same kernel ``[4D, H]`` as the concatenated form (checkpoints unchanged).

        Returns ``float32 [B, L, H]``."""
        dense = self.mlp.dense[0]
        width = query.shape[-1]
        if not dense.built:  # created as the concatenated form's call would name them
            with tf.name_scope(self.mlp.name):
                dense(tf.zeros([1, 4 * width], query.dtype))
        w_q, w_k, w_d, w_p = tf.split(dense.kernel, 4, axis=0)
        once = tf.matmul(query, w_q + w_d) + dense.bias  # [B, H]
        per = tf.concat([keys, query[:, None, :] * keys], axis=-1)  # [B, L, 2D]
        flat = tf.reshape(per, [-1, 2 * width])
        each = tf.matmul(flat, tf.concat([w_k - w_d, w_p], axis=0))
        each = tf.reshape(each, [tf.shape(keys)[0], -1, dense.units])
        return each + once[:, None, :]
