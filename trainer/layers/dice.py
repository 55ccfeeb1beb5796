"""Dice, the data-adaptive activation of DIN (Zhou et al., "Deep Interest Network for
Click-Through Rate Prediction", KDD 2018, section 4.3), as EasyRec's ``activation: "dice"``."""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from trainer.layers.batch_norm import BatchNorm


class Dice(keras.layers.Layer):
    """``f(s) = p(s) * s + (1 - p(s)) * alpha * s`` with ``p(s) = sigmoid((s - E[s]) /
    sqrt(Var[s] + eps))``: E and Var the batch's while training, their moving averages when
    serving (a batch norm without its own shift and scale); ``alpha`` one learned value per
    unit, starting at 0 (PReLU's slope).

    Input and output ``float32 [B, d]`` (or ``[..., d]``).
    """

    def __init__(self, epsilon: float = 1e-9, **kwargs):
        super().__init__(**kwargs)
        self.norm = BatchNorm(center=False, scale=False, epsilon=epsilon, name="norm")

    def build(self, input_shape):
        self.alpha = self.add_weight(name="alpha", shape=(input_shape[-1],), initializer="zeros")
        super().build(input_shape)

    def call(self, x, training=False):
        p = tf.sigmoid(self.norm(x, training=training))
        return p * x + (1.0 - p) * tf.cast(self.alpha, x.dtype) * x
