"""Variational feature dropout: a learned dropout rate per input feature (or per embedding
dimension) whose retention is penalised, so that the rates rank the features (Chang,
Rampasek and Goldenberg, "Dropout Feature Ranking for Deep Learning Models", arXiv:1712.08645;
EasyRec's ``variational_dropout``)."""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

_EPS = 1e-7
_TEMPERATURE = 0.1  # of the concrete relaxation of the Bernoulli mask


class VariationalDropout(keras.layers.Layer):
    """Multiplies each feature's columns by a mask: in training a relaxed Bernoulli sample
    that keeps a feature with probability ``1 - p``, in inference the expectation ``1 - p``,
    where ``p = sigmoid(logit_p)`` is learned (``logit_p`` starts at 0: ``p = 0.5``). Adds the
    loss ``regularization_lambda / B * sum(1 - p)``, which pushes unhelpful features' ``p``
    up.

    Args:
        widths: each feature's columns, in the order ``call`` concatenates them.
        regularization_lambda: the penalty's weight.
        embedding_wise: a rate per column (``sum(widths)`` of them) instead of per feature.

    Call:
        x: ``float32 [B, sum(widths)]``, the features side by side.

    Returns:
        ``float32 [B, sum(widths)]``.
    """

    def __init__(self, widths: list[int], regularization_lambda: float, embedding_wise: bool, **kwargs):
        super().__init__(**kwargs)
        self.widths = list(widths)
        self.regularization_lambda = regularization_lambda
        self.embedding_wise = embedding_wise

    def build(self, input_shape=None):
        size = sum(self.widths) if self.embedding_wise else len(self.widths)
        self.logit_p = self.add_weight(name="logit_p", shape=[size], initializer="zeros", trainable=True)
        super().build(input_shape)

    def dropout_rates(self) -> tf.Tensor:
        """``p`` per feature (or column): ``float32 [F]`` (or ``[sum(widths)]``)."""
        return tf.sigmoid(self.logit_p)

    def call(self, x, training=False):
        p = self.dropout_rates()
        batch = tf.shape(x)[0]
        if training:
            u = tf.random.uniform(tf.stack([batch, tf.size(p)]))
            drop = tf.sigmoid(
                (
                    tf.math.log(p + _EPS)
                    - tf.math.log(1 - p + _EPS)
                    + tf.math.log(u + _EPS)
                    - tf.math.log(1 - u + _EPS)
                )
                / _TEMPERATURE
            )
            keep = 1.0 - drop
        else:
            keep = tf.broadcast_to(1.0 - p, tf.stack([batch, tf.size(p)]))
        if not self.embedding_wise:
            keep = tf.repeat(keep, self.widths, axis=1)
        self.add_loss(self.regularization_lambda / tf.cast(batch, tf.float32) * tf.reduce_sum(1.0 - p))
        return x * keep
