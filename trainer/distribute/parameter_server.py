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

log = logging.getLogger(__name__)

# tables under this size stay whole on one ps: splitting them only adds requests
MIN_SHARD_BYTES = 256 << 10
# a gradient step whose result is lost with its worker is run again, at most this often
FETCH_ATTEMPTS = 5
# scheduled train steps whose losses stay fetchable: one lost with its worker is stood in for by a
# later one (enough for the steps in flight between two logged steps)
RECENT_STEPS = 64
# the errors a fetch raises when the worker that ran the step went away before the chief copied
# its result (the step itself is done, or run again by the coordinator)
LOST_RESULT = (tf.errors.UnavailableError, tf.errors.CancelledError)


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
            tf.errors.UnavailableError, tf.errors.CancelledError: no later step's loss either.
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
        tf.errors.UnavailableError: still lost after ``attempts`` tries.
    """
    for _ in range(attempts - 1):
        try:
            return value.fetch()
        except (tf.errors.UnavailableError, tf.errors.CancelledError):
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
        strategy, coordinator = self.strategy, self.coordinator
        signature, gradients, apply = parts.signature, parts.gradients, parts.apply
        variables, counters = parts.variables, parts.counters
        kinds: list = []  # per variable: "dense", (indices dtype) or None; set when traced

        @tf.function(input_signature=(tf.TensorSpec([], tf.float32), *signature), autograph=False)
        def compute(share, *flat):
            def replica(share, *flat):
                loss, grads = gradients(flat, share)
                kinds[:], out = [], []
                for grad in grads:
                    if isinstance(grad, tf.IndexedSlices):
                        kinds.append(grad.indices.dtype)
                        out += [grad.values, grad.indices]
                    else:
                        kinds.append(None if grad is None else "dense")
                        out += [] if grad is None else [grad]
                return loss, out

            return strategy.run(replica, args=(share, *flat))

        built: dict = {}

        def build_apply() -> tuple[Callable, list[bool]]:
            # once ``compute`` is traced: the flat gradients' specs, and which are a table's
            # (rows, ids), summed by concatenation as IndexedSlices are
            specs, concat = [], []
            for var, kind in zip(variables, kinds, strict=True):
                if kind == "dense":
                    specs.append(tf.TensorSpec(var.shape, var.dtype))
                    concat.append(False)
                elif kind is not None:
                    specs += [tf.TensorSpec([None, *var.shape[1:]], var.dtype), tf.TensorSpec([None], kind)]
                    concat += [True, True]

            @tf.function(input_signature=specs, autograph=False)
            def apply_sum(*flat):
                grads, parts = [], iter(flat)
                for var, kind in zip(variables, kinds, strict=True):
                    if kind == "dense":
                        grads.append(next(parts))
                    elif kind is not None:
                        values, indices = next(parts), next(parts)
                        shape = tf.constant(var.shape.as_list(), kind)
                        grads.append(tf.IndexedSlices(values, indices, shape))
                    else:
                        grads.append(None)
                strategy.run(apply, args=(grads,))  # the optimizers need a replica context
                for counter in counters:
                    counter.assign_add(1)

            return apply_sum, concat

        def update(group: list[tuple]) -> float:
            sizes = [int(batch[0].shape[0]) for batch in group]
            total = sum(sizes)
            args = [(np.float32(n / total), *batch) for n, batch in zip(sizes, group, strict=True)]
            scheduled = [coordinator.schedule(compute, args=a) for a in args]
            results = [_fetch(coordinator, compute, a, v) for a, v in zip(args, scheduled, strict=True)]
            if not built:
                built["apply"], built["concat"] = build_apply()
            per_entry = zip(*(r[1] for r in results), strict=True)  # every worker's grads of one entry
            summed = [
                np.concatenate(parts) if concat else sum(parts)
                for concat, parts in zip(built["concat"], per_entry, strict=True)
            ]
            built["apply"](*summed)
            return float(sum(r[0] for r in results))

        return update
