"""``MirroredStrategy`` (one process, several replicas) and ``MultiWorkerMirroredStrategy``
(one replica per worker process, collective all-reduce, cluster from TF_CONFIG)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import tensorflow as tf

from trainer.distribute.base import Distribution, StrategyError, lost_task, share_cores, silent_task


def _replica_devices(count: int) -> list[str]:
    """``count`` GPUs, or without GPUs ``count`` logical CPU devices (configured here, before
    TensorFlow initialises its devices)."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if len(gpus) < count:
            raise StrategyError(f"train_config.num_gpus_per_worker: {count} but {len(gpus)} GPUs found")
        return [f"/gpu:{i}" for i in range(count)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    return [f"/cpu:{i}" for i in range(count)]


class _Collective(Distribution):
    synchronous = True
    holds_online_tables = False

    def distribute(self, make_dataset: Callable[[], tf.data.Dataset]):
        # each process reads its own shard; its consecutive batches go to its replicas
        return self.strategy.distribute_datasets_from_function(lambda _: make_dataset())

    def input_signature(self, dataset, flat_signature: tuple) -> tuple:
        return tuple(dataset.element_spec)

    def agree(self, flag: bool) -> bool:
        """The chief's ``flag`` on every worker: a sum over the replicas of the chief's 1."""
        mine = tf.constant(1.0 if flag and self.is_chief else 0.0)
        total = self.strategy.reduce(
            tf.distribute.ReduceOp.SUM, self.strategy.run(lambda: tf.identity(mine)), axis=None
        )
        return float(total) > 0


class MirroredDistribution(_Collective):
    """Synchronous replicas on one machine (``train_config.num_gpus_per_worker`` of them:
    GPUs, or logical CPU devices without GPUs); gradients summed across replicas each step.

    Raises:
        StrategyError: fewer GPUs than ``num_gpus_per_worker``.
    """

    def __init__(self, replicas: int):
        devices = _replica_devices(max(replicas, 1))
        cross = None if devices[0].startswith("/gpu") else tf.distribute.ReductionToOneDevice()
        super().__init__(tf.distribute.MirroredStrategy(devices, cross_device_ops=cross))
        self.replicas_per_process = len(devices)


class MultiWorkerMirroredDistribution(_Collective):
    """One replica per worker process; workers and this one's index come from TF_CONFIG
    (the launcher writes it). Gradients are all-reduced with ring collectives each step.

    Raises:
        StrategyError: TF_CONFIG is missing or names no worker task for this process.
    """

    def __init__(self):
        try:
            tf_config = json.loads(os.environ["TF_CONFIG"])
            workers = tf_config["cluster"]["worker"]
            task = tf_config["task"]
        except (KeyError, json.JSONDecodeError) as err:
            raise StrategyError(
                "MultiWorkerMirroredStrategy needs TF_CONFIG with cluster.worker and task "
                f"({err!r}); start its workers with recpipe train --num_workers N (or the "
                "DistributedTrainOperator) rather than by hand"
            ) from None
        if task.get("type") != "worker":
            raise StrategyError(f"TF_CONFIG task {task}: MultiWorkerMirroredStrategy runs workers only")
        share_cores()
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
        super().__init__(tf.distribute.MultiWorkerMirroredStrategy(communication_options=options))
        self.rank, self.world_size = int(task["index"]), len(workers)
        self.is_chief = self.rank == 0
        self.cluster = tf_config["cluster"]
        self.replicas_per_process = self.strategy.num_replicas_in_sync // self.world_size

    def job_failure(self, err: BaseException) -> Exception | None:
        """A worker lost: TensorFlow's coordination service misses its heartbeats (10 s) or
        it exited, and aborts every collective. The job cannot go on without it: it fails,
        naming the worker and its address, and a retry resumes from the latest checkpoint."""
        from recpipe.errors import PipelineError

        if not isinstance(err, tf.errors.OpError):  # Unavailable, Aborted, or a cancelled all-reduce
            return None
        me = ("worker", self.rank)
        # an error that blames no other task (a cancelled all-reduce): ask the peers themselves
        lost = lost_task(err, self.cluster, me) or silent_task(self.cluster, me)
        if lost is None:
            return None
        return PipelineError(
            f"worker {self.rank} of {self.world_size}: {lost} stopped answering (its process "
            "exited or its host is cut off); the job stops here and a retry resumes from the "
            "latest checkpoint"
        )
