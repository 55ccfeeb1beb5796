"""Initial rows drawn from a hash of the id: every process and every re-admission of an id
draws the same row, with no random state to checkpoint or broadcast."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

STDDEV = 0.01
_GOLDEN = 0x9E3779B97F4A7C15
_LO, _HI = 0.022750132, 0.977249868  # Phi(-2), Phi(2)


def _mix(x: tf.Tensor) -> tf.Tensor:
    """SplitMix64's finalizer on ``uint64``: a well-spread 64-bit hash."""
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = (x ^ tf.bitwise.right_shift(x, np.uint64(shift))) * np.uint64(factor)
    return x ^ tf.bitwise.right_shift(x, np.uint64(31))


def initial_rows(keys: tf.Tensor, dim: int, salt: int) -> tf.Tensor:
    """A truncated normal (stddev ``STDDEV``, cut at 2 stddevs) row per id, drawn from a hash
    of ``(salt, id, column)``: ``int64 [n]`` -> ``float32 [n, dim]``, the same on every process.
    Column ``j`` of a wider call equals column ``j`` of a narrower one."""
    # per column: salt + j * golden, mod 2^64 (kept in Python ints: numpy would warn on overflow)
    offsets = np.array([(salt + j * _GOLDEN) % 2**64 for j in range(1, dim + 1)], np.uint64)
    bits = _mix(tf.expand_dims(tf.bitcast(keys, tf.uint64), 1) + offsets)
    # 24 high bits -> u in (0, 1) -> the normal quantile, restricted to [-2, 2] stddevs
    high = tf.cast(tf.bitwise.right_shift(bits, np.uint64(40)), tf.float32)
    scale = (_HI - _LO) / 2.0**24
    return STDDEV * tf.math.ndtri(high * scale + (_LO + 0.5 * scale))
