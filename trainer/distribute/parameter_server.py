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

Synchronous PS (``sync_replicas: true``: every worker's gradients aggregated before one update)
is TF1's ``SyncReplicasOptimizer``; it is not available in this version.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from trainer.distribute.base import Distribution, StrategyError

# tables under this size stay whole on one ps: splitting them only adds requests
MIN_SHARD_BYTES = 256 << 10


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
            f"parameter-server training needs TF_CONFIG with cluster and task ({err!r}); run it "
            "through a launcher (DistributedTrainOperator) rather than by hand"
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
    for one, ``sync`` for all (before a checkpoint).

    Raises:
        StrategyError: see ``cluster_from_tf_config``.
    """

    def __init__(self):
        cluster = cluster_from_tf_config()
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

    def run_step(self, train_step, element):
        return self.coordinator.schedule(train_step, args=tuple(element))

    def fetch(self, value) -> float:
        return float(value.fetch())

    def sync(self) -> None:
        self.coordinator.join()

    def job_loss(self, loss: tf.Tensor) -> tf.Tensor:
        return loss  # one replica per scheduled step

    def local_examples(self, element) -> int:
        return int(element[0].shape[0])
