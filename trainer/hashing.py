"""Raw values -> 64-bit ids inside the TensorFlow graph, per the contract in ``recpipe.ids``.

Training applies ``feature_ids`` to the clean strings the Spark job wrote; the serving graph
applies ``clean_ids`` then ``feature_ids`` to raw request values. Both give the same ids:
hashed (``hash_ids``), the integers themselves for ``num_buckets`` (``identity_ids``), a row
of ``vocab_list`` (``vocabulary_ids``) or a sequence of numbers' buckets (``number_bucket_ids``).
"""

from __future__ import annotations

import tensorflow as tf

from recpipe.config.data import FeatureSpec
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


def combo_ids(values: list[tf.Tensor], separator: str) -> tf.Tensor:
    """A ComboFeature's ids as the Spark job writes them (``features.transform.combo_id``):
    each input's clean id joined by ``separator``; empty where any input is empty.

    Args:
        values: two or more tensors of one shape, dtype string, int32 or int64.

    Returns:
        A string tensor of that shape.
    """
    clean = [clean_ids(v) for v in values]
    missing = tf.reduce_any(tf.stack([tf.equal(c, "") for c in clean]), axis=0)
    return tf.where(missing, "", tf.strings.join(clean, separator=separator))


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


def identity_ids(clean: tf.Tensor, num_buckets: int) -> tf.Tensor:
    """The integer each clean string holds, as its own row (EasyRec's ``num_buckets``:
    ``categorical_column_with_identity`` with default 0).

    Args:
        clean: string tensor (dense or ragged) of decimal integers.
        num_buckets: rows of the table.

    Returns:
        int64 ids in [0, num_buckets), same shape as ``clean``: a value that is not a
        non-negative decimal integer below ``num_buckets`` (``""``, ``-3``, ``4.0``) is 0.
    """
    if isinstance(clean, tf.RaggedTensor):
        return clean.with_flat_values(identity_ids(clean.flat_values, num_buckets))
    # at most 18 digits: to_number never overflows int64
    ok = tf.strings.regex_full_match(clean, "[0-9]{1,18}")
    ids = tf.strings.to_number(tf.where(ok, clean, "0"), tf.int64)
    return tf.where(ids < num_buckets, ids, tf.zeros_like(ids))


def vocabulary_ids(clean: tf.Tensor, vocabulary: list[str]) -> tf.Tensor:
    """Each clean string's row in a vocabulary table (EasyRec's ``vocab_list``):
    ``vocabulary[k]`` is row ``k + 1``; any other string is row 0.

    Args:
        clean: string tensor (dense or ragged).
        vocabulary: the values, distinct.

    Returns:
        int64 ids in [0, len(vocabulary)], same shape as ``clean``.
    """
    if isinstance(clean, tf.RaggedTensor):
        return clean.with_flat_values(vocabulary_ids(clean.flat_values, vocabulary))
    # a comparison per value: vocabularies are short enumerations (hours, levels)
    hits = tf.equal(clean[..., None], tf.constant(vocabulary))
    found = tf.reduce_any(hits, axis=-1)
    return tf.where(found, tf.argmax(tf.cast(hits, tf.int8), axis=-1) + 1, tf.zeros_like(found, tf.int64))


def number_bucket_ids(clean: tf.Tensor, feature: FeatureSpec) -> tf.Tensor:
    """A sequence of numbers' buckets (``FeatureSpec.bucket_bounds``): each string read as a
    number (one that is not: 0), normalised when ``num_buckets`` cuts ``[min_val, max_val]``,
    then the count of boundaries ``<=`` it, as a RawFeature's ``boundaries``.

    Args:
        clean: string tensor (dense or ragged).

    Returns:
        int64 ids in [0, len(bounds)], same shape as ``clean``.
    """
    if isinstance(clean, tf.RaggedTensor):
        return clean.with_flat_values(number_bucket_ids(clean.flat_values, feature))
    number = tf.strings.regex_full_match(clean, r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
    x = tf.strings.to_number(tf.where(number, clean, "0"), tf.float32)
    if feature.boundaries is None:
        x = (x - feature.min_val) / (feature.max_val - feature.min_val)
    return tf.cast(tf.raw_ops.Bucketize(input=x, boundaries=feature.bucket_bounds), tf.int64)


def feature_ids(clean: tf.Tensor, feature: FeatureSpec) -> tf.Tensor:
    """A feature's ids from its clean strings: ``identity_ids`` for ``num_buckets``,
    ``vocabulary_ids`` for ``vocab_list``, else ``hash_ids`` (modulo ``hash_bucket_size``,
    or the full fingerprint for an online table).

    Args:
        clean: string tensor (dense or ragged).
        feature: the id, tag or sequence feature.

    Returns:
        int64 ids, same shape as ``clean``.
    """
    if feature.bucket_bounds is not None:
        return number_bucket_ids(clean, feature)
    if feature.identity_buckets is not None:
        return identity_ids(clean, feature.identity_buckets)
    if feature.vocabulary is not None:
        return vocabulary_ids(clean, feature.vocabulary)
    return hash_ids(clean, feature.id_buckets)


def split_tags(values: tf.Tensor, separator: str) -> tf.RaggedTensor:
    """Split raw tag strings [batch] into cleaned, non-empty tokens [batch, (tokens)]
    (row splits int64, as ``trainer.input.feature_spec`` has them)."""
    tokens = tf.strings.split(values, sep=separator)
    tokens = tokens.with_flat_values(tf.strings.regex_replace(tokens.flat_values, STRIP_PATTERN, ""))
    return tf.ragged.boolean_mask(tokens, tf.not_equal(tokens, "")).with_row_splits_dtype(tf.int64)
