"""Admission by count (DeepRec's ``CounterFilter``): ids without a row are counted in a
count-min sketch and admitted once their count reaches ``filter_freq``.

The sketch (``float32 [4 * counter_width]``, 4 hashes, conservative update) needs no eviction
of its own and, at a fixed width, only over-counts: an id may be admitted early, never late.
How early depends on how full it is: an id never seen finds all 4 of its counters in use with
probability about ``fill ** 4``. A width that followed the table's rows saturated on production
days, where most ids are seen once and never admitted (a 1M-row Criteo day of the ``kaggle``
profile: 3.3M rows admitted at ``filter_freq: 2`` where 0.83M ids were seen twice). So by default
the width follows the sketch's own fill: it doubles (``grow``) as soon as half its counters are
in use, up to the width that would follow ``max_capacity``; the counts keep their positions, so
the ids whose position moves to the new upper half start again from 0 (admitted later by at most
the sightings before the widening; early admissions stay under about ``0.5 ** 4`` = 6 %).
Its counts decay at each day boundary, so that it does not fill up over a forever-running daily
retrain.

References: DeepRec ``Feature-Filter.md``; Cormode and Muthukrishnan, "An improved data
stream summary: the count-min sketch" (2005).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer.embedding_tables import rows_of

SKETCH_DEPTH = 4
SKETCH_SHIFT = 11  # bits between the sketch's hashes of a (uniform) fingerprint


SKETCH_NAME = "ev_filter_counts"  # the sketch variable's name in its table's scope


def widened(counts: tf.Tensor, width) -> tf.Tensor:
    """A flat sketch (``float32 [SKETCH_DEPTH * w]``) at ``width`` counters per hash, a
    multiple of ``w``: each hash's counters repeated, so every count stays an upper bound
    (a restore into a wider sketch, per-rank sketches summed at a save)."""
    rows = tf.reshape(counts, [SKETCH_DEPTH, -1])
    times = tf.maximum(tf.cast(width, tf.int64) // tf.shape(rows, out_type=tf.int64)[1], 1)
    return tf.reshape(tf.tile(rows, tf.stack([tf.constant(1, tf.int64), times])), [-1])


class CountMinSketch:
    """Counts of ids over a flat ``float32 [SKETCH_DEPTH * width]`` variable (``counts``,
    a model weight named ``<table>/ev_filter_counts``, of unknown length: it can widen)."""

    def __init__(self, counts: tf.Variable):
        self.counts = counts

    def width(self) -> tf.Tensor:
        """``int64 []``: counters per hash now (from the variable's shape: no read)."""
        return rows_of(self.counts) // SKETCH_DEPTH

    def index(self, keys: tf.Tensor) -> tf.Tensor:
        """``int64 [n, 4]`` counter positions of ``keys`` (``int64 [n]``) in the flat sketch."""
        width = self.width()
        shifts = tf.constant([SKETCH_SHIFT * d for d in range(SKETCH_DEPTH)], tf.int64)
        offsets = width * tf.range(SKETCH_DEPTH, dtype=tf.int64)
        return tf.math.floormod(tf.bitwise.right_shift(tf.expand_dims(keys, 1), shifts), width) + offsets

    def used(self) -> tf.Tensor:
        """``int64 []``: counters in use (non-zero), over all hashes."""
        return tf.math.count_nonzero(self.counts, dtype=tf.int64)

    def grow(self, width) -> None:
        """Widen to ``width`` counters per hash (a power-of-two multiple of the width now),
        each hash's counts kept at their positions and the new ones empty: ``h mod width`` is
        the old position of ``h`` or beyond the old width, where it starts from 0 (the module
        docstring). Graph or eager."""
        rows = tf.reshape(self.counts, [SKETCH_DEPTH, -1])
        extra = tf.cast(width, tf.int64) - tf.shape(rows, out_type=tf.int64)[1]
        # pad, not concat with zeros: one new buffer, not two (the sketch is the job's largest)
        self.counts.assign(
            tf.reshape(tf.pad(rows, [[0, 0], tf.stack([tf.constant(0, tf.int64), extra])]), [-1])
        )

    def load(self, saved: np.ndarray, width: int | None) -> bool:
        """Take a saved sketch (``float32 [4 * w]``): as it is, or (``width``, a wider one
        when the saved sketch is narrower) tiled to ``max(width, w)``; a sketch of a fixed
        width takes a saved one of another width tiled when it divides it, folded (the max
        over the counters that map to one) when it is a multiple, and starts empty otherwise.
        Returns whether the counts were kept."""
        saved_width = len(saved) // SKETCH_DEPTH
        own = int(self.width().numpy())
        target = max(width, saved_width) if width is not None else own
        rows = saved.reshape(SKETCH_DEPTH, saved_width)
        if target % saved_width == 0:
            rows = np.tile(rows, (1, target // saved_width))
        elif saved_width % target == 0:
            rows = rows.reshape(SKETCH_DEPTH, saved_width // target, target).max(axis=1)
        else:
            self.counts.assign(np.zeros(SKETCH_DEPTH * target, np.float32))
            return False
        self.counts.assign(rows.reshape(-1).astype(np.float32))
        return True

    def estimate(self, keys: tf.Tensor) -> tf.Tensor:
        """The sketch's count of each of ``keys`` (``float32 [n]``)."""
        return self.estimate_at(self.index(keys))

    def estimate_at(self, index: tf.Tensor) -> tf.Tensor:
        """The count at ``index`` (``int64 [n, 4]``, from ``index``): ``float32 [n]``."""
        return tf.reduce_min(tf.gather(self.counts, index), axis=1)

    def keep(self, index: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
        """Conservative update: raise each counter at ``index`` (``int64 [n, 4]``) to the id's
        ``counts`` (``float32 [n]``) where it is lower (a count of 0 changes nothing). Returns
        the counters this put in use (``int64 []``; a counter two ids share in the step counts
        twice, so this is an upper bound)."""
        before = tf.gather(self.counts, index)
        started = tf.math.count_nonzero((before == 0.0) & (tf.expand_dims(counts, 1) > 0.0), dtype=tf.int64)
        tf.raw_ops.ResourceScatterMax(
            resource=self.counts.handle,
            indices=index,
            updates=tf.tile(tf.expand_dims(counts, 1), [1, SKETCH_DEPTH]),
        )
        return started

    def decay(self, factor: float) -> None:
        """Multiply every count by ``factor`` (``filter_counter_decay``; the day boundary)."""
        self.counts.assign(self.counts * factor)


def fitted_width(used: tf.Tensor, width: tf.Tensor, most: int) -> tf.Tensor:
    """The width (``int64 []``) at which ``used`` counters fill at most half a sketch: ``width``
    doubled until ``2 * used <= SKETCH_DEPTH * width``, at most ``most`` (and never narrower)."""
    return tf.while_loop(
        lambda w: (2 * used > SKETCH_DEPTH * w) & (2 * w <= most), lambda w: [2 * w], [width]
    )[0]


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
