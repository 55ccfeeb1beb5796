"""Factorization-machine second-order interaction.

    y = 1/2 * sum_k [ (sum_i v_ik)^2 - sum_i v_ik^2 ]

References: Rendle, "Factorization Machines", ICDM 2010, eq. 5; used by DeepFM (Guo et al., 2017).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras


class FM(keras.layers.Layer):
    """Input ``float32 [B, F, D]`` (F field embeddings of equal width) -> ``float32 [B, 1]``,
    or with ``vector`` the term per dimension before the sum over ``k``, ``float32 [B, D]``
    (what EasyRec's DeepFM feeds its ``final_dnn``)."""

    def call(self, v, vector: bool = False):
        square_of_sum = tf.square(tf.reduce_sum(v, axis=1))
        sum_of_square = tf.reduce_sum(tf.square(v), axis=1)
        if vector:
            return 0.5 * (square_of_sum - sum_of_square)
        return 0.5 * tf.reduce_sum(square_of_sum - sum_of_square, axis=1, keepdims=True)
