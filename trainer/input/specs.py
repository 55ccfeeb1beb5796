"""The type specs of a features dict, and a one-row sample to build a model with."""

from __future__ import annotations

import tensorflow as tf

from recpipe.config.pipeline import PipelineConfig


def feature_spec(config: PipelineConfig) -> dict[str, tf.TypeSpec]:
    """The type spec of the model's features dict (pins a step's input signature): id
    features ``int64 [B]`` and tag features ``int64 [B, (n)]`` hashed ids (a bucketized raw
    feature's buckets are ids), raw features ``float32 [B]``."""
    ids = tf.int64
    spec: dict[str, tf.TypeSpec] = {}
    for f in config.feature_config.features:
        if f.kind == "id":
            spec[f.name] = tf.TensorSpec([None], ids)
        elif f.kind == "list":
            spec[f.name] = tf.RaggedTensorSpec([None, None], ids, ragged_rank=1, row_splits_dtype=tf.int64)
        else:
            spec[f.name] = tf.TensorSpec([None], tf.float32)
    return spec


def sample_inputs(config: PipelineConfig) -> dict[str, tf.Tensor]:
    """A one-row features dict (empty ids and tags, zero dense values) to build a model."""
    sample: dict[str, tf.Tensor] = {}
    for f in config.feature_config.features:
        if f.kind == "id":
            sample[f.name] = tf.constant([0], tf.int64)
        elif f.kind == "list":
            sample[f.name] = tf.RaggedTensor.from_row_splits(
                tf.constant([], tf.int64), tf.constant([0, 0], tf.int64)
            )
        else:
            sample[f.name] = tf.constant([0.0])
    return sample
