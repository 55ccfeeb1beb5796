"""Embedding rows sharded across Horovod ranks by id: the lookup and its gradient.

Row ``g`` of a table (a fused table's global row) lives on rank ``g mod W`` at local row
``g div W`` (PaddleRec's and HugeCTR's modulo placement: hashed ids spread evenly). A lookup
de-duplicates the batch's ids, sends each owner the ids it holds (``hvd.alltoall`` with uneven
splits), gathers the rows there and sends them back (a second all-to-all). Autodiff runs the
same path backwards: Horovod's all-to-all gradient is the reverse all-to-all, so each owner's
shard receives, as ``tf.IndexedSlices``, the summed gradients of its rows from every rank;
these gradients must not be all-reduced again.

Reference: Mudigere et al., "Software-Hardware Co-design for Fast and Scalable Training of
Deep Learning Recommendation Models" (2021), model parallel embeddings with all-to-all.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

AllToAll = Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


def shard_rows(rows: int, rank: int, world_size: int) -> int:
    """Rows of a ``rows``-row table that rank ``rank`` of ``world_size`` holds
    (``g mod world_size == rank``)."""
    return max(0, -(-(rows - rank) // world_size))


def horovod_alltoall() -> AllToAll:
    """``hvd.alltoall(tensor, splits) -> (received, received_splits)``."""
    import horovod.tensorflow as hvd

    def alltoall(tensor: tf.Tensor, splits: tf.Tensor):
        return hvd.alltoall(tensor, splits=splits)

    return alltoall


def sharded_lookup(shard: tf.Variable, ids: tf.Tensor, world_size: int, alltoall: AllToAll) -> tf.Tensor:
    """Rows of the global ``ids`` from the table sharded over ``world_size`` ranks.

    Every rank must call it at the same point of its step (it is collective).

    Args:
        shard: this rank's rows, ``float32 [shard_rows(rows, rank, W), dim]``.
        ids: global row ids, ``int64`` of any shape ``S`` (duplicates allowed).
        world_size: ``W``.
        alltoall: the exchange (``horovod_alltoall()``).

    Returns:
        ``float32 [*S, dim]``, equal to ``tf.gather(full_table, ids)``.
    """
    flat = tf.reshape(ids, [-1])
    unique, index = tf.unique(flat)
    owner = tf.cast(unique % world_size, tf.int32)
    order = tf.argsort(owner, stable=True)
    send = tf.gather(unique, order)
    splits = tf.math.bincount(owner, minlength=world_size, maxlength=world_size, dtype=tf.int32)
    wanted, wanted_splits = alltoall(send, splits)
    rows = tf.gather(shard, wanted // world_size)
    received, _ = alltoall(rows, wanted_splits)
    by_unique = tf.gather(received, tf.argsort(order))
    out = tf.gather(by_unique, index)
    return tf.reshape(out, tf.concat([tf.shape(ids), tf.shape(shard)[1:]], axis=0))
