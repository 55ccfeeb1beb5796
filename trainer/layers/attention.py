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
        length = tf.shape(keys)[1]
        q = tf.tile(query[:, None, :], [1, length, 1])
        x = tf.concat([q, keys, q - keys, q * keys], axis=-1)
        if self.mlp is not None:
            x = self.mlp(x, training=training)
        scores = tf.squeeze(self.score(x), axis=-1)  # [B, L]
        scores = tf.where(mask, scores, tf.fill(tf.shape(scores), tf.constant(-1e9, scores.dtype)))
        weights = tf.nn.softmax(scores, axis=-1) * tf.cast(mask, scores.dtype)
        if values is not None:
            keys = tf.concat([keys, values], axis=-1)
        return tf.einsum("bl,bld->bd", weights, keys)
