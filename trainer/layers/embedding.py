"""Hashed embedding lookups for id and tag features (EasyRec's ``input_layer``).

Each table is a ``[hash_bucket_size, dim]`` variable named
``<table>/embedding_weights``, where ``<table>`` is the feature's ``embedding_name`` (shared
tables) or its name. Ids follow ``recpipe.ids``: FarmHash Fingerprint64 of the clean string
modulo ``hash_bucket_size``. Lookups use ``tf.gather``, so table gradients are sparse
(``tf.IndexedSlices`` over the rows in the batch).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from recpipe.config.data import FeatureSpec, FeatureType
from trainer.features.ids import hash_ids


class EmbeddingConfigError(ValueError):
    """Features sharing a table disagree on its shape, or a table has no size."""


def table_shapes(features: list[FeatureSpec], dim: int | None = None) -> dict[str, tuple[int, int]]:
    """Table name -> (rows, dim) for id / tag features; ``dim`` overrides embedding_dim.

    Raises:
        EmbeddingConfigError: a feature lacks ``hash_bucket_size``, or features sharing an
            ``embedding_name`` differ in size or dimension.
    """
    shapes: dict[str, tuple[int, int]] = {}
    for f in features:
        if f.hash_bucket_size is None:
            raise EmbeddingConfigError(
                f"feature_config: {f.name!r} needs hash_bucket_size for an embedding table"
            )
        table = f.embedding_name or f.name
        shape = (f.hash_bucket_size, dim or f.embedding_dim)
        if shapes.setdefault(table, shape) != shape:
            raise EmbeddingConfigError(
                f"feature_config: features sharing embedding_name {table!r} need one hash_bucket_size and "
                f"embedding_dim, got {shapes[table]} and {shape}"
            )
    return shapes


class FeatureEmbedding(keras.layers.Layer):
    """Id / tag features -> one embedding per feature.

    Args:
        features: the id and tag features to embed.
        dim: table width for every feature (the wide part uses 1); default each
            feature's ``embedding_dim``.

    Call:
        inputs: dict with ``string [B]`` per id feature, ``RaggedTensor string [B, (n)]``
            per tag feature.

    Returns:
        dict feature name -> ``float32 [B, dim]``; tags combined by ``combiner``
        (sum or mean; an empty tag list gives zeros).
    """

    def __init__(self, features: list[FeatureSpec], dim: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.features = [f for f in features if f.feature_type != FeatureType.RawFeature]
        self.shapes = table_shapes(self.features, dim)
        self.tables: dict[str, tf.Variable] = {}

    def build(self, input_shape=None):
        for table, (rows, width) in self.shapes.items():
            self.tables[table] = self.add_weight(
                name=f"{table}/embedding_weights",
                shape=(rows, width),
                initializer=keras.initializers.TruncatedNormal(stddev=0.01),
            )
        super().build(input_shape)

    def call(self, inputs: dict) -> dict[str, tf.Tensor]:
        out = {}
        for f in self.features:
            table = self.tables[f.embedding_name or f.name]
            ids = hash_ids(inputs[f.name], f.hash_bucket_size)
            if f.feature_type == FeatureType.IdFeature:
                out[f.name] = tf.gather(table, ids)
                continue
            rows = tf.gather(table, ids.flat_values)
            summed = tf.math.unsorted_segment_sum(rows, ids.value_rowids(), num_segments=ids.nrows())
            if f.combiner == "mean":
                counts = tf.cast(tf.maximum(ids.row_lengths(), 1), summed.dtype)
                summed = summed / counts[:, None]
            out[f.name] = summed
        return out
