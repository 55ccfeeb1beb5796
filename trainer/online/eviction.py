"""Which rows to evict, by three rules: by steps (DeepRec's ``GlobalStepEvict``), by days
unseen (PaddleRec's ``shrink``, ``delete_after_unseen_days``) and, when the table is full,
least recently used first (HKV's default). Each returns row numbers (``int64 [n]``); the
table frees them (``EmbeddingVariable.evict``).

References: DeepRec ``Feature-Eviction.md``; PaddleRec ``doc/online_trainer.md``.
"""

from __future__ import annotations

import tensorflow as tf

LRU_SHARE = 64  # a full table frees at least 1/64 of its rows at once


def stale_by_steps(
    keys: tf.Variable, versions: tf.Variable, step: tf.Tensor, steps_to_live: int
) -> tf.Tensor:
    """Used rows whose version (``int64 [rows]``) is older than ``step - steps_to_live``."""
    stale = (keys >= 0) & (versions < step - steps_to_live)
    return tf.reshape(tf.where(stale), [-1])


def unseen_for_days(
    keys: tf.Variable, days: tf.Variable, day: int, delete_after_unseen_days: int
) -> tf.Tensor:
    """Used rows last seen (``days``, days since 1970-01-01) before ``day - delete_after_unseen_days``."""
    return tf.reshape(tf.where((keys >= 0) & (days < day - delete_after_unseen_days)), [-1])


def least_recently_used(
    keys: tf.Variable, versions: tf.Variable, step: tf.Tensor, need: tf.Tensor
) -> tf.Tensor:
    """The ``max(need, rows / LRU_SHARE)`` least recently looked-up rows not used at ``step``
    (fewer if fewer are used), oldest first: one O(rows) search serves many admissions."""
    rows = tf.size(keys, out_type=tf.int64)
    old = tf.reshape(tf.where((keys >= 0) & (versions < step)), [-1])
    k = tf.minimum(tf.maximum(need, rows // LRU_SHARE), tf.size(old, out_type=tf.int64))
    _, order = tf.math.top_k(-tf.gather(versions, old), k=tf.cast(k, tf.int32))
    return tf.gather(old, order)
