"""Parameter-server training: ``PSStrategy``, and ``NoStrategy`` with ps in the cluster.

TensorFlow 2's ``ParameterServerStrategy`` with a ``ClusterCoordinator`` (TF's "Parameter
server training" guide; EasyRec's ``PSStrategy``). This process is the chief: it reads the
input and schedules one train step per batch on whichever worker is free; workers and ps are
plain ``tf.distribute.Server`` processes (``trainer.distribute.server``). Variables live on
the ps; a table larger than ``MIN_SHARD_BYTES`` is partitioned across them (a
``ShardedVariable``, rows split in contiguous ranges). Each step updates the variables as soon
as its worker is done, without waiting for the others: training is asynchronous, as
EasyRec's ``sync_replicas: false``. When a worker dies, the coordinator runs its steps on the
others and takes the worker back when it returns (TensorFlow's fault tolerance); a ps or chief
failure ends the job, and a retry resumes from the latest checkpoint.

With ``sync_replicas: true`` (``SynchronousParameterServerDistribution``) every update
aggregates one batch per worker first, as TF1's ``SyncReplicasOptimizer`` did with its
accumulators on the ps. TF2 has no such optimizer, so: the chief schedules one gradient step per
worker (each on its own batch, its loss scaled by its share of the examples), fetches their
gradients, sums the dense ones and concatenates the tables' (ids, rows), and applies the sum
itself, once, to the variables on the ps; then the next update starts. Gradient steps change
nothing, so one that is lost with its worker is simply run again on another: each update is
applied exactly once.

With ``sync_mode: half_async`` (``HalfAsyncParameterServerDistribution``, PaddleRec's
communicator) the same gradient steps run without waiting for each other, and the chief merges
every ``max_merge_var_num`` of them by id into one update. ``sync_mode: geo`` is
``trainer.distribute.geo``.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from trainer.distribute.base import Distribution, StepParts, StrategyError
from trainer.layers.batch_norm import apply_moving_statistics, deferred_moving_statistics

log = logging.getLogger(__name__)

# tables under this size stay whole on one ps: splitting them only adds requests
MIN_SHARD_BYTES = 256 << 10
# a gradient step whose result is lost with its worker is run again, at most this often
FETCH_ATTEMPTS = 5
# scheduled train steps whose losses stay fetchable: one lost with its worker is stood in for by a
# later one (enough for the steps in flight between two logged steps)
RECENT_STEPS = 64
# the errors a fetch raises when the worker that ran the step went away before the chief copied
# its result (the step itself is done, or run again by the coordinator): it died (Unavailable,
# Cancelled), or came back without the context the result lived in (Aborted: "Unable to find a
# context_id ... Perhaps the worker was restarted")
LOST_RESULT = (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError)


def cluster_from_tf_config() -> dict:
    """``TF_CONFIG``'s cluster, checked to have a chief, workers and ps.

    Raises:
        StrategyError: TF_CONFIG is missing, or lacks one of those roles, or this process
            is not the chief.
    """
    try:
        tf_config = json.loads(os.environ["TF_CONFIG"])
        cluster, task = tf_config["cluster"], tf_config["task"]
    except (KeyError, json.JSONDecodeError) as err:
        raise StrategyError(
            f"parameter-server training needs TF_CONFIG with cluster and task ({err!r}); start it "
            "with recpipe train --num_workers N --num_ps M (or the DistributedTrainOperator) "
            "rather than by hand"
        ) from None
    missing = [role for role in ("chief", "worker", "ps") if not cluster.get(role)]
    if missing:
        raise StrategyError(f"TF_CONFIG cluster for parameter-server training lacks {missing}")
    if task.get("type") != "chief":
        raise StrategyError(
            f"TF_CONFIG task {task}: the trainer runs as the chief; workers and ps run "
            "python -m trainer.distribute.server"
        )
    return cluster


class ParameterServerDistribution(Distribution):
    """The chief (coordinator) of an asynchronous parameter-server job.

    Steps are scheduled, not run: ``run_step`` returns a ``RemoteValue``, ``fetch`` waits
    for one, ``sync`` for all (before a checkpoint). A step's loss lives on the worker that
    ran it until fetched; when that worker dies first, ``fetch`` returns the next step's loss
    (a train step updates the ps, so it is not run again for its loss).

    Raises:
        StrategyError: see ``cluster_from_tf_config``.
    """

    # an online table's id -> row map is a hash table, which TensorFlow cannot place on a ps
    holds_online_tables = False
    # after an error, the ClusterCoordinator's destructor can wait forever on its worker-
    # preemption thread (seen in CI: a chief that raised never exited, so the job never ended)
    exits_at_once_on_error = True

    def __init__(self):
        self.cluster = cluster = cluster_from_tf_config()
        ps = len(cluster["ps"])
        partitioner = (
            tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=MIN_SHARD_BYTES, max_shards=ps
            )
            if ps > 1
            else None
        )
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        super().__init__(tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner))
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        self._recent: collections.deque = collections.deque(maxlen=RECENT_STEPS)

    def run_step(self, train_step, element):
        value = self.coordinator.schedule(train_step, args=tuple(element))
        self._recent.append(value)
        return value

    def fetch(self, value) -> float:
        """``value``'s loss (float), or, when its worker died before the chief copied it, the
        loss of the first later step whose result is still there.

        Raises:
            tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError: no
                later step's loss either (``LOST_RESULT``).
        """
        recent = list(self._recent)
        at = next((i for i, v in enumerate(recent) if v is value), len(recent))
        for candidate in [value, *recent[at + 1 :]]:
            try:
                return float(candidate.fetch())
            except LOST_RESULT as err:
                lost = err
                log.warning("a step's worker went away before its loss was fetched; taking a later step's")
        raise lost

    def sync(self) -> None:
        self.coordinator.join()

    def job_loss(self, loss: tf.Tensor) -> tf.Tensor:
        return loss  # one replica per scheduled step

    def local_examples(self, element) -> int:
        return int(element[0].shape[0])


def _fetch(coordinator, fn, args: tuple, value, attempts: int = FETCH_ATTEMPTS):
    """``value.fetch()``; when the worker holding a finished step's result dies before the
    chief copied it, the step (free of side effects) is scheduled again.

    Raises:
        tf.errors.UnavailableError (or another ``LOST_RESULT``): still lost after ``attempts``
            tries.
    """
    for _ in range(attempts - 1):
        try:
            return value.fetch()
        except LOST_RESULT:
            log.warning("a gradient step's worker went away before its result was fetched; rescheduling")
            value = coordinator.schedule(fn, args=args)
    return value.fetch()


def _groups(dataset, size: int) -> Iterator[list[tuple]]:
    """Consecutive elements of ``dataset`` in lists of ``size`` (the last one may be shorter)."""
    group: list[tuple] = []
    for element in dataset:
        group.append(tuple(element))
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


class _GradientSteps:
    """Gradient steps scheduled on the workers, their results summed and applied by the chief.

    ``schedule(share, batch)`` runs one replica's gradients (its loss scaled by ``share``) on
    whichever worker is free and changes nothing; ``result`` fetches one (a step lost with
    its worker is run again); ``apply`` sums a list of results (dense gradients added, the
    tables' (rows, ids) concatenated, or with ``merge_ids`` added per id first, PaddleRec's
    merge of sparse gradients) scaled by ``scale`` and applies them once to the variables on
    the ps, incrementing the counters by ``steps``.
    """

    def __init__(self, strategy, coordinator, parts: StepParts):
        self.coordinator = coordinator
        gradients, apply = parts.gradients, parts.apply
        self.variables, counters = parts.variables, parts.counters
        self.kinds: list = []  # per variable: "dense", (indices dtype) or None; set when traced

        self.moving: list[tuple] = []  # batch norm's deferred updates: (variable, value, momentum)

        @tf.function(input_signature=(tf.TensorSpec([], tf.float32), *parts.signature), autograph=False)
        def compute(share, *flat):
            def replica(share, *flat):
                # batch norm's moving statistics travel with the gradients and are applied once
                # per update, not on the ps by each (possibly re-run) step
                with deferred_moving_statistics() as moving:
                    loss, grads = gradients(flat, share)
                self.moving[:] = moving
                self.kinds[:], out = [], []
                for grad in grads:
                    if isinstance(grad, tf.IndexedSlices):
                        self.kinds.append(grad.indices.dtype)
                        out += [grad.values, grad.indices]
                    else:
                        self.kinds.append(None if grad is None else "dense")
                        out += [] if grad is None else [grad]
                return loss, out + [value for _, value, _ in moving]

            return strategy.run(replica, args=(share, *flat))

        self.compute = compute
        self._apply = None

        def build_apply() -> Callable:
            # once ``compute`` is traced: the flat gradients' specs
            specs = [tf.TensorSpec([], tf.int64)]
            for var, kind in zip(self.variables, self.kinds, strict=True):
                if kind == "dense":
                    specs.append(tf.TensorSpec(var.shape, var.dtype))
                elif kind is not None:
                    specs += [tf.TensorSpec([None, *var.shape[1:]], var.dtype), tf.TensorSpec([None], kind)]
            specs += [tf.TensorSpec(var.shape, var.dtype) for var, _, _ in self.moving]

            @tf.function(input_signature=specs, autograph=False)
            def apply_sum(steps, *flat):
                grads, parts = [], iter(flat)
                for var, kind in zip(self.variables, self.kinds, strict=True):
                    if kind == "dense":
                        grads.append(next(parts))
                    elif kind is not None:
                        values, indices = next(parts), next(parts)
                        shape = tf.constant(var.shape.as_list(), kind)
                        grads.append(tf.IndexedSlices(values, indices, shape))
                    else:
                        grads.append(None)
                strategy.run(apply, args=(grads,))  # the optimizers need a replica context
                apply_moving_statistics(self.moving, list(parts))
                for counter in counters:
                    counter.assign_add(steps)

            return apply_sum

        self._build_apply = build_apply

    def schedule(self, share: float, batch: tuple):
        args = (np.float32(share), *batch)
        return args, self.coordinator.schedule(self.compute, args=args)

    def result(self, scheduled):
        """``(loss, flat gradients)`` of one scheduled step, as numpy."""
        args, value = scheduled
        return _fetch(self.coordinator, self.compute, args, value)

    def apply(self, results: list, scale: float = 1.0, merge_ids: bool = False, steps: int = 1) -> int:
        """Apply the sum of ``results``; returns the bytes of the gradients sent to the ps."""
        if self._apply is None:
            self._apply = self._build_apply()
        per_entry = iter(list(zip(*(r[1] for r in results), strict=True)))  # every result's part of an entry
        summed = []
        for kind in self.kinds:
            if kind == "dense":
                summed.append(sum(next(per_entry)) * np.float32(scale))
            elif kind is not None:
                values, indices = np.concatenate(next(per_entry)), np.concatenate(next(per_entry))
                if merge_ids:
                    ids, at = np.unique(indices, return_inverse=True)
                    merged = np.zeros((len(ids), *values.shape[1:]), values.dtype)
                    np.add.at(merged, at, values)
                    values, indices = merged, ids
                summed += [values * np.float32(scale), indices]
        # batch norm's statistics: the mean over the merged batches, applied once
        summed += [np.mean(next(per_entry), axis=0) for _ in self.moving]
        self._apply(np.int64(steps), *summed)
        return sum(int(a.nbytes) for a in summed)


class SynchronousParameterServerDistribution(ParameterServerDistribution):
    """The chief of a synchronous parameter-server job (``sync_replicas: true``).

    One update takes one batch per worker (``replicas_per_process`` = workers; the last update
    of an epoch may take fewer): the global batch is ``workers * batch_size``, as under
    MultiWorkerMirrored. ``build_train_step`` returns the Python function that runs one update.

    Raises:
        StrategyError: see ``cluster_from_tf_config``.
    """

    def __init__(self):
        super().__init__()
        self.replicas_per_process = len(self.cluster["worker"])

    def distribute(self, make_dataset: Callable[[], tf.data.Dataset]):
        return _groups(make_dataset(), self.replicas_per_process)

    def local_examples(self, element) -> int:
        return sum(int(batch[0].shape[0]) for batch in element)

    def run_step(self, train_step, element):
        return train_step(element)

    def fetch(self, value) -> float:
        return float(value)

    def build_train_step(self, parts: StepParts) -> Callable[[list[tuple]], float]:
        """The function running one synchronous update on a group of batches (``parts.
        exchanged`` is not used: every gradient is summed on the chief).

        Returns:
            ``update(group) -> loss``: the group's mean loss (float) once the update is applied.
        """
        steps = _GradientSteps(self.strategy, self.coordinator, parts)

        def update(group: list[tuple]) -> float:
            sizes = [int(batch[0].shape[0]) for batch in group]
            total = sum(sizes)
            scheduled = [steps.schedule(n / total, batch) for n, batch in zip(sizes, group, strict=True)]
            results = [steps.result(s) for s in scheduled]
            steps.apply(results)
            return float(sum(r[0] for r in results))

        return update


class _Scheduled:
    """A half-async gradient step: scheduled, then fetched once (``result``)."""

    __slots__ = ("scheduled", "result")

    def __init__(self, scheduled):
        self.scheduled, self.result = scheduled, None


class HalfAsyncParameterServerDistribution(ParameterServerDistribution):
    """The chief of a half-asynchronous parameter-server job (``sync_mode: half_async``).

    PaddleRec's half-async communicator: workers compute gradients without waiting for each
    other (each on the ps's values when its step starts), and the chief merges every
    ``max_merge_var_num`` of them (dense gradients averaged, table rows of one id added and
    averaged) into one update of the variables on the ps. Unlike ``sync`` no update waits for
    every worker; unlike ``async`` the ps takes one merged update per ``max_merge_var_num``
    steps, and a step's gradient is at most ``max_merge_var_num + workers`` steps stale.

    Args:
        merge: gradient steps per update (``max_merge_var_num``); None: one per worker.

    Attributes:
        traffic: ``updates`` and ``bytes_to_ps`` (the merged gradients the chief sent).

    Raises:
        StrategyError: see ``cluster_from_tf_config``.
    """

    def __init__(self, merge: int | None = None):
        super().__init__()
        self.merge = merge or len(self.cluster["worker"])
        # steps kept in flight beyond one merge, so that workers compute while the chief applies
        self.ahead = len(self.cluster["worker"])
        self._pending: collections.deque = collections.deque()
        self._steps: _GradientSteps | None = None
        self.traffic = {"updates": 0, "bytes_to_ps": 0}

    def build_train_step(self, parts: StepParts):
        self._steps = _GradientSteps(self.strategy, self.coordinator, parts)
        return self._steps

    def distribute(self, make_dataset: Callable[[], tf.data.Dataset]):
        def epoch():
            yield from make_dataset()
            self.sync()  # the epoch's steps count in it before the loop resets batch_in_epoch

        return epoch()

    def run_step(self, train_step, element):
        item = _Scheduled(train_step.schedule(1.0, tuple(element)))
        self._pending.append(item)
        if len(self._pending) >= self.merge + self.ahead:
            self._merge(self.merge)
        return item

    def _merge(self, count: int) -> None:
        items = [self._pending.popleft() for _ in range(count)]
        for item in items:
            if item.result is None:
                item.result = self._steps.result(item.scheduled)
        sent = self._steps.apply([i.result for i in items], 1.0 / count, merge_ids=True, steps=count)
        self.traffic["updates"] += 1
        self.traffic["bytes_to_ps"] += sent

    def fetch(self, value) -> float:
        if value.result is None:
            value.result = self._steps.result(value.scheduled)
        return float(value.result[0])

    def sync(self) -> None:
        while self._pending:
            self._merge(min(self.merge, len(self._pending)))

    def figures(self) -> dict:
        return dict(self.traffic)
