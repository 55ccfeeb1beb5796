"""Multi-layer perceptron (EasyRec's ``dnn { hidden_units }``)."""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from recpipe.config.model import DNN
from trainer.layers.batch_norm import BatchNorm
from trainer.layers.dice import Dice


class MLP(keras.layers.Layer):
    """Dense layers of ``config.activation`` (ReLU by default; Dice a layer of its own after
    a linear Dense), each optionally followed by batch norm and dropout.

    Input ``float32 [B, d]`` -> output ``float32 [B, hidden_units[-1]]``. With
    ``dtype_policy: mixed_bfloat16`` the Dense layers compute in bfloat16 (Keras' mixed
    precision: float32 weights, cast for the product) and the output is cast back to float32.
    """

    def __init__(self, config: DNN, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        policy = config.dtype_policy
        dice = config.activation == "dice"
        activation = "linear" if dice else config.activation
        self.dense = [
            keras.layers.Dense(u, activation=activation, name=f"dense_{i}", dtype=policy)
            for i, u in enumerate(config.hidden_units)
        ]
        self.dice = [Dice(name=f"dice_{i}") for i in range(len(self.dense))] if dice else []
        self.norms = [BatchNorm(name=f"bn_{i}") for i in range(len(self.dense))] if config.use_bn else []
        self.dropout = keras.layers.Dropout(config.dropout_ratio) if config.dropout_ratio else None

    def call(self, x, training=False, preactivation=False):
        """``x``: ``float32 [..., d]``; with ``preactivation``, the first layer's
        pre-activation ``x @ W_0 + b_0`` (``[..., hidden_units[0]]``) that the caller computed
        in a cheaper form. Returns ``float32 [..., hidden_units[-1]]``."""
        for i, dense in enumerate(self.dense):
            if i == 0 and preactivation:
                x = dense.activation(x)
            else:
                x = dense(x)
            x = self._after(i, x, training)
        return tf.cast(x, tf.float32)  # a no-op in float32

    def _after(self, i, x, training):
        if self.dice:
            x = self.dice[i](tf.cast(x, tf.float32), training=training)
        if self.norms:
            x = self.norms[i](x, training=training)
        if self.dropout is not None:
            x = self.dropout(x, training=training)
        return x
