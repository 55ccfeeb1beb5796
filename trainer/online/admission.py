"""Admission by count (DeepRec's ``CounterFilter``): ids without a row are counted in a
count-min sketch and admitted once their count reaches ``filter_freq``.

The sketch (``float32 [4 * counter_width]``, 4 hashes, conservative update) has fixed memory,
needs no eviction of its own and only over-counts: an id may be admitted early, never late.
Its counts decay at each day boundary, so that it does not fill up over a forever-running
daily retrain.

References: DeepRec ``Feature-Filter.md``; Cormode and Muthukrishnan, "An improved data
stream summary: the count-min sketch" (2005).
"""

from __future__ import annotations

import tensorflow as tf

SKETCH_DEPTH = 4
SKETCH_SHIFT = 11  # bits between the sketch's hashes of a (uniform) fingerprint


class CountMinSketch:
    """Counts of ids over a flat ``float32 [SKETCH_DEPTH * width]`` variable (``counts``,
    a model weight named ``<table>/ev_filter_counts``)."""

    def __init__(self, counts: tf.Variable, width: int):
        self.counts, self.width = counts, width

    def index(self, keys: tf.Tensor) -> tf.Tensor:
        """``int64 [n, 4]`` counter positions of ``keys`` (``int64 [n]``) in the flat sketch."""
        shifts = tf.constant([SKETCH_SHIFT * d for d in range(SKETCH_DEPTH)], tf.int64)
        offsets = tf.constant([self.width * d for d in range(SKETCH_DEPTH)], tf.int64)
        return tf.math.floormod(tf.bitwise.right_shift(tf.expand_dims(keys, 1), shifts), self.width) + offsets

    def estimate(self, keys: tf.Tensor) -> tf.Tensor:
        """The sketch's count of each of ``keys`` (``float32 [n]``)."""
        return self.estimate_at(self.index(keys))

    def estimate_at(self, index: tf.Tensor) -> tf.Tensor:
        """The count at ``index`` (``int64 [n, 4]``, from ``index``): ``float32 [n]``."""
        return tf.reduce_min(tf.gather(self.counts, index), axis=1)

    def keep(self, index: tf.Tensor, counts: tf.Tensor) -> None:
        """Conservative update: raise each counter at ``index`` (``int64 [n, 4]``) to the id's
        ``counts`` (``float32 [n]``) where it is lower (a count of 0 changes nothing)."""
        tf.raw_ops.ResourceScatterMax(
            resource=self.counts.handle,
            indices=index,
            updates=tf.tile(tf.expand_dims(counts, 1), [1, SKETCH_DEPTH]),
        )

    def decay(self, factor: float) -> None:
        """Multiply every count by ``factor`` (``filter_counter_decay``; the day boundary)."""
        self.counts.assign(self.counts * factor)


def ready(
    sketch: CountMinSketch, miss: tf.Tensor, occurrences: tf.Tensor, filter_freq: int
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor | None]:
    """Which ids without a row (``miss``, ``int64 [n]``, seen ``occurrences`` times in this
    step) may take one: ``(ready bool [n], count float32 [n], sketch index int64 [n, 4] or
    None)``. With ``filter_freq`` <= 1 every id is ready and the sketch is not read."""
    count = tf.cast(occurrences, tf.float32)
    if filter_freq <= 1:
        return tf.ones_like(miss, tf.bool), count, None
    index = sketch.index(miss)
    count += sketch.estimate_at(index)
    return count >= filter_freq, count, index
