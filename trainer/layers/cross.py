"""DCN-v2 cross layer: x_{l+1} = x_0 * (W x_l + b) + x_l (full-rank W).

References: Wang et al., "DCN V2: Improved Deep & Cross Network", WWW 2021, eq. 1.
"""

from __future__ import annotations

import tf_keras as keras


class Cross(keras.layers.Layer):
    """One cross layer. Call ``(x0, x)``, both ``float32 [B, d]`` -> ``float32 [B, d]``."""

    def build(self, input_shape):
        d = int(input_shape[0][-1])
        self.dense = keras.layers.Dense(d, name="dense")
        self.dense.build((None, d))
        super().build(input_shape)

    def call(self, inputs):
        x0, x = inputs
        return x0 * self.dense(x) + x
