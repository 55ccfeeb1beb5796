"""Multi-gate mixture of experts (Ma et al., "Modeling Task Relationships in Multi-task
Learning with Multi-gate Mixture-of-Experts", KDD 2018; EasyRec's ``mmoe``)."""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from recpipe.config.model import DNN
from trainer.layers.mlp import MLP


class MMoE(keras.layers.Layer):
    """``num_expert`` expert MLPs over one input and a softmax gate per task: task ``t``
    gets ``sum_e softmax(W_t x)_e * expert_e(x)``.

    Args:
        expert_dnn: each expert's MLP.
        num_expert: experts (at least 1).
        num_task: gates, one per task.

    Call:
        x: ``float32 [B, d]``.

    Returns:
        a list of ``num_task`` tensors ``float32 [B, expert_dnn.hidden_units[-1]]``.
    """

    def __init__(self, expert_dnn: DNN, num_expert: int, num_task: int, **kwargs):
        super().__init__(**kwargs)
        self.experts = [MLP(expert_dnn, name=f"expert_{i}") for i in range(num_expert)]
        self.gates = [keras.layers.Dense(num_expert, name=f"gate_{t}") for t in range(num_task)]

    def call(self, x, training=False):
        experts = tf.stack([e(x, training=training) for e in self.experts], axis=1)  # [B, E, H]
        out = []
        for gate in self.gates:
            weights = tf.nn.softmax(gate(x), axis=-1)  # [B, E]
            out.append(tf.einsum("be,beh->bh", weights, experts))
        return out
