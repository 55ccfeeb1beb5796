"""DLRM pairwise dot-product interaction.

References: Naumov et al., "Deep Learning Recommendation Model for Personalization and
Recommendation Systems", 2019, section 2.2 (the upper triangle of Z Z^T).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras


class DotInteraction(keras.layers.Layer):
    """Input ``float32 [B, F, D]`` -> ``float32 [B, F(F-1)/2]`` (or with the diagonal,
    ``F(F+1)/2``, when ``self_interaction``)."""

    def __init__(self, self_interaction: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.self_interaction = self_interaction

    def call(self, z):
        f = z.shape[1]
        products = tf.matmul(z, z, transpose_b=True)  # [B, F, F]
        k = 0 if self.self_interaction else 1
        rows, cols = zip(*[(i, j) for i in range(f) for j in range(i + k, f)], strict=True)
        pairs = tf.stack([tf.constant(rows), tf.constant(cols)], axis=1)
        # gather the (i, j) entries of [F, F, B] -> [P, B], then batch-major
        return tf.transpose(tf.gather_nd(tf.transpose(products, [1, 2, 0]), pairs))
