"""Raw values -> 64-bit ids inside the TensorFlow graph, per the contract in ``recpipe.ids``.

Training applies ``hash_ids`` to the clean strings the Spark job wrote; the serving graph
applies ``clean_ids`` then ``hash_ids`` to raw request values. Both give the same ids.
"""

from __future__ import annotations

import tensorflow as tf

from recpipe.ids import STRIP_PATTERN

# Without hash_bucket_size the id space is [0, 2**63 - 1): FarmHash Fingerprint64 mod this.
FULL_ID_SPACE = 2**63 - 1


def clean_ids(values: tf.Tensor) -> tf.Tensor:
    """Canonical id strings: integers in decimal, strings stripped of surrounding whitespace.

    Args:
        values: any shape, dtype string, int32 or int64.

    Returns:
        A string tensor of the same shape.

    Raises:
        TypeError: another dtype.
    """
    if values.dtype in (tf.int32, tf.int64):
        return tf.strings.as_string(values)
    if values.dtype != tf.string:
        raise TypeError(f"id values must be string or integer, got {values.dtype.name}")
    return tf.strings.regex_replace(values, STRIP_PATTERN, "")


def hash_ids(clean: tf.Tensor, hash_bucket_size: int | None = None) -> tf.Tensor:
    """FarmHash Fingerprint64 of each clean string, modulo ``hash_bucket_size`` (or 2**63 - 1).

    Args:
        clean: string tensor (dense or ragged) from ``clean_ids`` or the Spark output.

    Returns:
        int64 ids in [0, hash_bucket_size), same shape as ``clean``.
    """
    buckets = hash_bucket_size or FULL_ID_SPACE
    if isinstance(clean, tf.RaggedTensor):
        return clean.with_flat_values(tf.strings.to_hash_bucket_fast(clean.flat_values, buckets))
    return tf.strings.to_hash_bucket_fast(clean, buckets)


def split_tags(values: tf.Tensor, separator: str) -> tf.RaggedTensor:
    """Split raw tag strings [batch] into cleaned, non-empty tokens [batch, (tokens)]
    (row splits int64, as ``trainer.input.feature_spec`` has them)."""
    tokens = tf.strings.split(values, sep=separator)
    tokens = tokens.with_flat_values(tf.strings.regex_replace(tokens.flat_values, STRIP_PATTERN, ""))
    return tf.ragged.boolean_mask(tokens, tf.not_equal(tokens, "")).with_row_splits_dtype(tf.int64)
