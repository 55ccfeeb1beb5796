"""Batch normalization whose moving-statistics update can be deferred to whoever applies the
step's update (the parameter-server chief), so that it is applied once per update.

Under the synchronous and half-async parameter-server modes a gradient step runs on a worker
and changes nothing; the chief applies the summed gradients once. Keras's
``BatchNormalization`` would instead assign its moving mean and variance on the ps inside the
gradient step: once per worker batch (twice a step with two workers) and again when a step
lost with its worker is run again. Inside ``deferred_moving_statistics()`` a ``BatchNorm``
layer normalizes with the batch's statistics as usual but records ``(moving variable, batch
statistic, momentum)`` instead of assigning; ``apply_moving_statistics`` then applies the
exponential moving average once, with the statistics averaged over the merged batches.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import tensorflow as tf
import tf_keras as keras

_local = threading.local()


@contextlib.contextmanager
def deferred_moving_statistics() -> Iterator[list[tuple]]:
    """Within the block (while a step is traced), ``BatchNorm`` layers record their
    moving-average updates instead of assigning them; yields the list they go to:
    ``(variable, value float32 [channels], momentum float)``."""
    collected: list[tuple] = []
    previous = getattr(_local, "updates", None)
    _local.updates = collected
    try:
        yield collected
    finally:
        _local.updates = previous


def apply_moving_statistics(updates: list[tuple], values: list) -> None:
    """Apply each deferred update once: ``variable -= (variable - value) * (1 - momentum)``
    (Keras's moving average), ``values`` aligned with ``updates``."""
    for (variable, _, momentum), value in zip(updates, values, strict=True):
        variable.assign_sub((variable - tf.cast(value, variable.dtype)) * (1.0 - momentum))


class BatchNorm(keras.layers.BatchNormalization):
    """Keras's ``BatchNormalization`` (input ``float32 [B, d]``, output the same), its moving
    statistics' update deferred inside ``deferred_moving_statistics``."""

    def _assign_moving_average(self, variable, value, momentum, inputs_size):
        updates = getattr(_local, "updates", None)
        if updates is None:
            return super()._assign_moving_average(variable, value, momentum, inputs_size)
        updates.append((variable, tf.cast(value, variable.dtype), float(momentum)))
        return variable
