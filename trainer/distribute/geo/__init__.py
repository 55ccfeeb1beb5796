"""GEO-asynchronous parameter-server training (PaddleRec's ``sync_mode: geo``).

PaddleRec's distributed-modes doc (shared/reference/paddlerec_distributed_modes.md): every
worker runs the whole training step locally (forward, backward, optimizer) on a full copy of
the model, and every ``geo_step`` batches sends the difference between its parameters and the
values it last pulled to the parameter servers, which add it up; it then pulls the latest
values and trains on without waiting for anyone.

Here the chief (this process) keeps the global variables on the ps, as in asynchronous PS
training, and builds one copy of model and optimizers on each worker (``StepParts.
build_replica`` under the worker's device). A thread per worker feeds it batches from the
chief's input, each copied to the worker by a feeder thread while the step before it runs;
its step touches only that worker's variables. A push, run on the worker:

- dense variables: ``global += local - last_pulled``, then ``local = last_pulled = global``;
- tables (rank-2 variables of the embedding and wide groups): only the rows that changed on
  this worker since its last pull travel (ids and rows), added with ``scatter_add``; the ps
  marks them as changed for every other worker, and the worker pulls the rows marked for it
  (PaddleRec's GEO communicator sends sparse deltas and receives the ids others updated). A
  row-wise optimizer on the tables (``lazy_adam``, ``adagrad``, ``ftrl``) changes only the
  rows a step looked up; Adam's momentum moves every row it has seen, and all of those travel.

A push is staged, shipped, committed, pulled, then merged, and only staging and merging (both
on the worker, no network) hold up the worker's steps (PaddleRec's GEO communicator sends from a
thread of its own while training goes on):

- stage, in the worker's turn between two steps: the change since the last push (worker-local
  ops; its last-pushed values advance to the copy's), so a push holds exactly the batches
  trained before it;
- then a thread of the chief's sends it: copies the change to the ps (nothing global changes:
  a worker lost here loses its push whole), one function with every op on the ps applies it,
  marks the changed rows for the other workers (after the rows hold the update) and counts its
  batches on the ps, then pulls to the worker each row another worker changed and the dense
  values;
- merge, in the worker's turn again: the pulled values move its copy by ``pulled - last
  pulled``, so what the worker trained meanwhile is kept. One push a worker is in flight at a
  time: the next stage waits for the last merge.

So each batch is applied exactly once or not at all, and the chief's ledger (``figures``:
trained, applied, lost) says which.

The package: ``replica`` (a worker's copy and the protocol's functions), ``scheduler`` (the
queue, the ledger and failover, over replicas or stand-ins), and here the distribution that
builds the replicas on the workers and hands the loop's batches to the scheduler.

Each worker's optimizer slots are its own; a checkpoint holds the ps values of the model and
the first live worker's optimizer slots (so tomorrow's fine-tune resumes them). Tables stay
whole on one ps each (no partitioner: a row's id is its index on its ps). A worker that
fails is dropped: a batch whose step failed with it is trained by another; batches it trained
but had not pushed are lost (at most ``geo_step``), never trained again; with no worker left
the job fails at once with a clear error, never waiting on a queue no one takes from. An
error in any step fails the job at the next step, even when that step's loss was never read.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context as eager_context
from tensorflow.python.eager import executor as eager_executor

from trainer.distribute.base import Distribution, StepParts, StrategyError
from trainer.distribute.geo.replica import GeoReplica, narrow, worker_lost
from trainer.distribute.geo.scheduler import ALL_FAILED, GeoScheduler, QueuedBatch
from trainer.distribute.parameter_server import cluster_from_tf_config

__all__ = [
    "ALL_FAILED",
    "GeoParameterServerDistribution",
    "GeoReplica",
    "GeoScheduler",
    "narrow",
    "worker_lost",
]

log = logging.getLogger(__name__)


class GeoParameterServerDistribution(Distribution):
    """The chief of a GEO-asynchronous parameter-server job (``train_config.sync_mode: geo``).

    ``run_step`` queues a batch for the next free worker and returns at once; ``fetch`` waits
    for that batch's loss (float); ``sync`` waits for every queued batch and makes every worker
    push what it has not, so that the ps hold every step before a checkpoint.

    Args:
        geo_step: local batches between two pushes of a worker (PaddleRec's ``geo_step``).

    Attributes:
        scheduler: the ``GeoScheduler`` (queue, ledger, failover) over the workers' replicas.

    Raises:
        StrategyError: see ``cluster_from_tf_config``; at ``run_step`` or ``sync`` once every
            worker has failed.
    """

    holds_online_tables = False
    exits_at_once_on_error = True

    def __init__(self, geo_step: int):
        self.cluster = cluster_from_tf_config()
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        # no partitioner: a table stays whole on one ps, so a row's id is its index there
        super().__init__(tf.distribute.ParameterServerStrategy(resolver))
        self.geo_step = geo_step
        self.scheduler = GeoScheduler(len(self.cluster["worker"]), geo_step)
        self._counters: tuple = ()
        self._dispatched = 0  # steps queued since the counters were last advanced
        self._commit_executor = eager_executor.new_executor(enable_async=False)
        self._commit_lock = threading.Lock()
        self._commits: dict = {}
        self.applied_on_ps: tf.Variable | None = None

    # -- the step ------------------------------------------------------------------------------
    def build_train_step(self, parts: StepParts):
        """Build a model copy on every worker from the chief's (restored) values and start the
        workers' threads; returns the function ``run_step`` is given (unused: steps run on
        the workers' copies).

        Raises:
            StrategyError: ``parts`` cannot build copies (``build_replica`` is None).
        """
        if parts.build_replica is None:
            raise StrategyError("train_config.sync_mode: geo needs model copies the loop cannot build")
        model_vars = parts.state.model.variables
        grouped = parts.state.model.variable_groups()
        sparse = {v.ref() for v in grouped["embedding"] + grouped["wide"] if len(v.shape) == 2}
        tables = {i for i, v in enumerate(model_vars) if v.ref() in sparse}
        n = len(self.cluster["worker"])
        stale = {}
        for i in tables:
            with tf.device(model_vars[i].device):
                rows = model_vars[i].shape[0]
                stale[i] = [tf.Variable(tf.zeros([rows], tf.bool), trainable=False) for _ in range(n)]
        dense_bytes = sum(
            int(np.prod(v.shape)) * v.dtype.size for i, v in enumerate(model_vars) if i not in tables
        )
        row_bytes = {i: int(np.prod(model_vars[i].shape[1:])) * model_vars[i].dtype.size + 8 for i in tables}
        workers = []
        for k in range(n):
            device = f"/job:worker/replica:0/task:{k}"
            with tf.device(device):
                local = parts.build_replica()
            worker = GeoReplica(k, device, parts, local, stale)
            with worker.scope():
                worker.pull_all()
            workers.append(worker)
            log.info("geo: worker %d holds a copy of %d variables", k, len(worker.pairs))
        with tf.device(model_vars[0].device):
            self.applied_on_ps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._commits = {w.index: w.commit_fn(self.applied_on_ps) for w in workers}
        self._counters = parts.counters
        self.scheduler.start(workers, self._commit, dense_bytes, row_bytes)
        for worker in workers:
            name = f"geo-worker-{worker.index}"
            threading.Thread(target=self.scheduler.serve, args=(worker,), name=name, daemon=True).start()
        return self.scheduler.serve

    def _commit(self, worker: GeoReplica, shipped, batches: int) -> None:
        """A shipped push applied on the ps, one at a time, in an executor of its own."""
        with self._commit_lock, eager_context.executor_scope(self._commit_executor):
            self._commits[worker.index](shipped, tf.constant(batches, tf.int64))

    def run_step(self, train_step, element) -> QueuedBatch:
        item = self.scheduler.submit(narrow(element))
        self._dispatched += 1
        return item

    def fetch(self, value) -> float:
        value.done.wait()
        if value.error is not None:
            raise value.error
        return value.loss

    def distribute(self, make_dataset):
        def epoch():
            batches = iter(make_dataset())
            while True:
                try:
                    element = self._next(batches)
                except StopIteration:
                    break
                yield element
            self._advance_counters()  # before the loop resets batch_in_epoch

        return epoch()

    def _next(self, batches, tries: int = 3):
        """The input's next batch. A lost worker's error that its remote handles' release
        left in this thread's executor is raised by the iterator's first wait, before it
        reads: cleared, and the read tried again (``tries`` times)."""
        while True:
            try:
                return next(batches)
            except tf.errors.OpError as err:
                tries -= 1
                if not tries or not worker_lost(err) or "/job:worker" not in str(err):
                    raise
                log.warning("geo: a lost worker's error left in the input's thread, cleared: %s", err.message)
                eager_context.context().executor.clear_error()

    def _advance_counters(self) -> None:
        self.scheduler.queue.join()
        if self._dispatched:
            for counter in self._counters:
                counter.assign_add(self._dispatched)
            self._dispatched = 0

    def sync(self) -> None:
        """Wait for every queued batch and push in flight, then push every worker's remaining
        change and wait for it (``GeoScheduler.sync``).

        Raises:
            StrategyError: every worker has failed. The first error of a step (one whose
                loss was never read), as it was raised.
        """
        if not self.scheduler.workers:
            return
        self._advance_counters()
        self.scheduler.sync()

    def prepare_save(self, state, saved) -> None:
        """The first live worker's optimizer slots into the chief's optimizers, which the
        checkpoint holds (the model's values are the ps's after ``sync``).

        Raises:
            StrategyError: no worker is left.
        """
        self.scheduler.save_slots()

    def figures(self) -> dict:
        """The traffic, and the ledger: ``batches_trained`` (each by one worker),
        ``batches_applied`` (their pushes committed), ``batches_applied_on_ps`` (the ps's own
        count), ``batches_lost`` (trained by a worker that died before pushing them)."""
        on_ps = int(self.applied_on_ps.numpy()) if self.applied_on_ps is not None else 0
        return {**self.scheduler.figures(), "batches_applied_on_ps": on_ps}

    def job_loss(self, loss):
        return loss

    def local_examples(self, element) -> int:
        return int(element[0].shape[0])
