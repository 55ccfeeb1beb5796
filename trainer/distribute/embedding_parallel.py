"""Embedding rows sharded across Horovod ranks by id: the lookup and its gradient.

Row ``g`` of a table (a fused table's global row) lives on rank ``g mod W`` at local row
``g div W``; an online table's id ``k`` (``ev_params``) is owned, admitted and looked up on rank
``k mod W``, in that rank's own id -> row map (PaddleRec's and HugeCTR's modulo placement:
hashed ids spread evenly). A lookup
de-duplicates the batch's ids, sends each owner the ids it holds (``hvd.alltoall`` with uneven
splits), gathers the rows there and sends them back (a second all-to-all). Autodiff runs the
same path backwards: Horovod's all-to-all gradient is the reverse all-to-all, so each owner's
shard receives, as ``tf.IndexedSlices``, the summed gradients of its rows from every rank;
these gradients must not be all-reduced again.

Reference: Mudigere et al., "Software-Hardware Co-design for Fast and Scalable Training of
Deep Learning Recommendation Models" (2021), model parallel embeddings with all-to-all.
"""

# Imports inside functions: horovod.tensorflow is imported when the strategy is built: other
# strategies never load it.

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from trainer.checkpoints import restore_by_name
from trainer.distribute.horovod import HorovodDistribution
from trainer.embedding_tables import variable_name
from trainer.online import SKETCH_DEPTH, SKETCH_NAME, widened

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


def _route(
    ids: tf.Tensor,
    world_size: int,
    alltoall: AllToAll,
    local_rows,
    dim,
    with_counts: bool,
    members: tf.Tensor | None = None,
) -> tf.Tensor:
    """Send each distinct id of ``ids`` to rank ``id mod W``, get ``local_rows(wanted,
    counts, members)`` there, bring the rows back in ``ids``' shape (``counts``: how often
    each id occurs in the sender's batch, sent only ``with_counts``; ``members``: each id's
    table in an online group, ``int64`` in ``ids``' shape, sent with its id)."""
    flat = tf.reshape(ids, [-1])
    unique, index, counts = tf.unique_with_counts(flat, out_idx=tf.int64)
    owner = tf.cast(unique % world_size, tf.int32)
    order = tf.argsort(owner, stable=True)
    send = tf.gather(unique, order)
    splits = tf.math.bincount(owner, minlength=world_size, maxlength=world_size, dtype=tf.int32)
    wanted, wanted_splits = alltoall(send, splits)
    wanted_counts = alltoall(tf.gather(counts, order), splits)[0] if with_counts else None
    wanted_members = None
    if members is not None:
        member = tf.math.unsorted_segment_max(
            tf.reshape(members, [-1]), index, tf.size(unique, out_type=tf.int64)
        )
        wanted_members = alltoall(tf.gather(member, order), splits)[0]
    received, _ = alltoall(local_rows(wanted, wanted_counts, wanted_members), wanted_splits)
    by_unique = tf.gather(received, tf.argsort(order))
    out = tf.gather(by_unique, index)
    return tf.reshape(out, tf.concat([tf.shape(ids), [dim]], axis=0))


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

    def local_rows(wanted, *_):
        return tf.gather(shard, wanted // world_size)

    return _route(ids, world_size, alltoall, local_rows, shard.shape[1], with_counts=False)


@dataclass(frozen=True)
class Sharding:
    """How this rank holds embedding tables: ``rank`` of ``world_size``, rows by id modulo.

    Injected into ``FeatureEmbedding`` (via ``build_model``); the layer then holds
    ``rows(total)`` rows of each fused variable and looks ids up with ``lookup``.
    """

    rank: int
    world_size: int
    alltoall: AllToAll

    def rows(self, total: int) -> int:
        """Local rows of a ``total``-row variable."""
        return shard_rows(total, self.rank, self.world_size)

    def lookup(self, shard: tf.Variable, ids: tf.Tensor) -> tf.Tensor:
        """``sharded_lookup`` over this job's ranks (collective: every rank calls it)."""
        return sharded_lookup(shard, ids, self.world_size, self.alltoall)

    def lookup_keys(
        self, ev, keys: tf.Tensor, training: bool, members: tf.Tensor | None = None, counted: bool = True
    ) -> tf.Tensor:
        """An online table's rows (an ``EVView``) of ``keys`` (of ``members`` in a group): each
        id is admitted, counted and looked up on rank ``id mod W``, which holds its row
        (collective). ``counted=False``: the ids go through admission with a count of zero (a
        history's ids, ``FeatureEmbedding.sequence``)."""

        def local_rows(wanted, counts, wanted_members):
            if counts is not None and not counted:
                counts = tf.zeros_like(counts)
            return ev.lookup(wanted, counts, training, wanted_members)

        return _route(keys, self.world_size, self.alltoall, local_rows, ev.dim, training, members)

    def local(self, rows, first_global_row: int = 0):
        """The rows of ``rows`` (global rows from ``first_global_row`` on, a numpy array or
        tensor ``[n, ...]``) that this rank holds, in local order."""
        return rows[(self.rank - first_global_row) % self.world_size :: self.world_size]

    def merge(self, shards: list[np.ndarray]) -> np.ndarray:
        """Global rows from each rank's local rows (``shards[r]``, numpy ``[rows_r, ...]``)."""
        total = sum(len(s) for s in shards)
        out = np.empty((total, *shards[0].shape[1:]), shards[0].dtype)
        for r, part in enumerate(shards):
            out[r :: self.world_size] = part
        return out


class EmbeddingParallelDistribution(HorovodDistribution):
    """``EmbeddingParallelStrategy``: Horovod data parallel for dense weights, embedding rows
    sharded across ranks by id (``Sharding``; the model's tables are built with it).

    Dense gradients are all-reduced as under ``HorovodStrategy``. A sharded table's gradient
    already sums every rank's contributions (the reverse all-to-all of the lookup), so the
    loop applies it as it is. A save gathers each sharded variable and its optimizer slots on the
    chief, which writes the unsharded checkpoint every reader knows (evaluator, export,
    fine-tune); a restore keeps each rank's rows of it, so any world size resumes any other.
    """

    key_union = None  # online tables: each id is admitted on its owner rank only

    def __init__(self):
        super().__init__()
        self.sharding = Sharding(self.rank, self.world_size, horovod_alltoall())

    def _collective(self, state) -> bool:
        # a save gathers every rank's rows when tables are sharded over several ranks
        return bool(state.sharded_names) and self.world_size > 1

    def saved_state(self, state, build_unsharded):
        """On the chief of several ranks, an unsharded copy the gathered rows are copied into."""
        return build_unsharded() if self._collective(state) and self.is_chief else state

    def takes_part_in_saves(self, state) -> bool:
        return self.is_chief or self._collective(state)

    def prepare_save(self, state, saved) -> None:
        """Gather every sharded variable and its slots on the chief into ``saved``, copy the
        rest (every rank calls it, in the same order)."""
        if not self._collective(state):
            return
        targets = saved.all_variables() if self.is_chief else None
        for i, var in enumerate(state.all_variables()):
            if state.is_sharded(var) and state.is_online(var):
                # an online table's rows, each rank's as many as it grew to: one after the
                # other (a restore takes rows by id, in any order)
                value = self.hvd.allgather(tf.convert_to_tensor(var), name=f"recpipe_save_{i}")
            elif state.is_sharded(var):
                value = self.gather_rows(var, f"recpipe_save_{i}")
            elif variable_name(var) in state.summed_names:  # each rank counts the ids it owns
                value = tf.convert_to_tensor(var)
                if variable_name(var).endswith(SKETCH_NAME):  # widths follow each rank's table
                    widest = self.hvd.allreduce(tf.size(value), op=self.hvd.Max, name=f"recpipe_width_{i}")
                    value = widened(value, widest // SKETCH_DEPTH)
                value = self.hvd.allreduce(value, op=self.hvd.Sum, name=f"recpipe_sum_{i}")
            else:
                value = var
            if targets is not None:
                targets[i].assign(value)

    def save_due(self, due: bool, state) -> bool:
        return self.agree(due) if self._collective(state) else due

    def restore(self, state, checkpoint: str) -> None:
        """By name: each rank keeps its rows of every table and slot, whatever world size wrote
        the checkpoint (``trainer.checkpoints.restore_by_name``)."""
        if not state.sharded_names:
            return super().restore(state, checkpoint)

        restore_by_name(state, checkpoint, self.sharding)

    def gather_rows(self, variable: tf.Variable, name: str):
        full = self.hvd.allgather(tf.convert_to_tensor(variable), name=name).numpy()
        if not self.is_chief:
            return None
        sizes = [shard_rows(len(full), r, self.world_size) for r in range(self.world_size)]
        return self.sharding.merge(np.split(full, np.cumsum(sizes)[:-1]))
