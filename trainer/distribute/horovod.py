"""``HorovodStrategy``: data parallel over ``horovodrun`` processes (Gloo, or MPI when built in).

Sergeev and Del Balso, "Horovod: fast and easy distributed deep learning in TensorFlow" (2018).
Every rank reads its own shard, computes gradients of its share of the global loss, and sums
them with Horovod's all-reduce (dense gradients, grouped) or all-gather (embedding gradients,
``tf.IndexedSlices``: only the rows a batch touched travel), as ``DistributedGradientTape``
does. Variables are broadcast from rank 0 after restore; rank 0 is the chief.
"""

# Imports inside functions: horovod.tensorflow is imported when the strategy is built: other
# strategies never load it.

from __future__ import annotations

import os

import tensorflow as tf

from trainer.distribute.base import Distribution, share_cores


def is_collective_failure(err: BaseException) -> bool:
    """Whether ``err`` is a Horovod collective that failed (True) or anything else (False).

    The op in flight when Gloo gives up fails with Gloo's own reason (a read timed out, no
    route to a cut-off host), named as recpipe named it (``recpipe_sparse_grad_3``) or as
    Horovod did (``HorovodAllreduce``); every later one finds Horovod shut down. Eager ops say
    ``[Op:HorovodAllreduce]``, traced ones carry Horovod's frames in "defined at": so an
    ``OpError`` that mentions Horovod or Gloo."""
    from horovod.common.exceptions import HorovodInternalError

    if isinstance(err, tf.errors.OpError):
        text = str(err).lower()
        return "horovod" in text or "gloo" in text
    return isinstance(err, HorovodInternalError)


class HorovodDistribution(Distribution):
    """This process as one Horovod rank (``hvd.init()``; a single process is a world of 1)."""

    synchronous = True

    def __init__(self):
        import horovod.tensorflow as hvd

        share_cores()
        hvd.init()
        super().__init__()
        self.hvd = hvd
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.is_chief = self.rank == 0

    def job_failure(self, err: BaseException) -> Exception | None:
        """A collective that failed on this rank: another rank exited, or its host stopped
        answering for Gloo's timeout (``HOROVOD_GLOO_TIMEOUT_SECONDS``, horovodrun's
        ``--gloo-timeout-seconds``, 30 s by default). The job cannot go on without the rank:
        it fails, and a retry resumes from the latest checkpoint."""
        from recpipe.errors import PipelineError

        if not is_collective_failure(err):
            return None
        timeout = os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "30")
        return PipelineError(
            f"rank {self.rank} of {self.world_size} ({os.uname().nodename}): a Horovod collective "
            f"failed: another rank exited or its host stopped answering within {timeout} s (see "
            "the ranks' logs above); the job stops here and a retry resumes from the latest checkpoint"
        )

    def agree(self, flag: bool) -> bool:
        return bool(self.hvd.broadcast_object(flag, root_rank=0, name="recpipe_agree"))

    def all_sum(self, value: tf.Tensor) -> tf.Tensor:
        return self.hvd.allreduce(value, op=self.hvd.Sum, name="recpipe_all_sum")

    def reduce_gradients(self, grads: list) -> list:
        hvd = self.hvd
        dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
        out = list(grads)
        if dense:
            for i, g in zip(dense, hvd.grouped_allreduce([grads[i] for i in dense], op=hvd.Sum), strict=True):
                out[i] = g
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                out[i] = hvd.allreduce(g, op=hvd.Sum, name=f"recpipe_sparse_grad_{i}")
        return out

    def sum_over_processes(self, values: list[int]) -> list[int]:
        total = self.hvd.allreduce(tf.constant(values, tf.int64), op=self.hvd.Sum, name="recpipe_sum_values")
        return [int(v) for v in total.numpy()]

    def key_union(self, keys: tf.Tensor, counts: tf.Tensor, members: tf.Tensor | None = None):
        """An online table's distinct ids of this step on every rank (``int64 [U]``), their
        summed counts and (a group's) their member tables (``int64 [U]`` or None), in the same
        order on every rank: each rank holds the whole table, so all must admit and evict the
        same ids (``EmbeddingVariable``)."""
        if self.world_size == 1:
            return keys, counts, members
        every_key = self.hvd.allgather(keys)
        every_count = self.hvd.allgather(counts)
        unique, index = tf.unique(every_key, out_idx=tf.int64)
        n = tf.size(unique, out_type=tf.int64)
        if members is not None:
            members = tf.math.unsorted_segment_max(self.hvd.allgather(members), index, n)
        return unique, tf.math.unsorted_segment_sum(every_count, index, n), members

    def job_loss(self, loss: tf.Tensor) -> tf.Tensor:
        return self.hvd.allreduce(loss, op=self.hvd.Sum, name="recpipe_job_loss")

    def broadcast(self, variables: list[tf.Variable]) -> None:
        self.hvd.broadcast_variables(variables, root_rank=0)
