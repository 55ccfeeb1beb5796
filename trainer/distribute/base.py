"""The single-process distribution (``NoStrategy``) and the interface the others implement."""

from __future__ import annotations

import os
from collections.abc import Callable

import tensorflow as tf

from recpipe.config.errors import ConfigError

LOCAL_PROCESSES = "RECPIPE_LOCAL_PROCESSES"


class StrategyError(ConfigError):
    """The configured train_distribute cannot run here (the message says why)."""


class Distribution:
    """One process, one replica, TensorFlow's default strategy.

    Attributes:
        strategy: the ``tf.distribute.Strategy`` variables are created under.
        rank, world_size: this process's input shard and the number of shards (processes).
        is_chief: writes checkpoints, summaries, metrics and the result.
        synchronous: every process runs the same number of steps (all-reduce each step), so
            shorter shards are padded with empty batches.
        replicas_per_process: replicas fed by this process (consecutive batches go to
            consecutive replicas).
        sharding: how embedding rows are split across ranks
            (``trainer.distribute.embedding_parallel.Sharding``), or None (every process
            holds whole tables).
        aggregates_on_chief: the chief sums the workers' gradients and applies them itself
            (synchronous parameter-server training): the trainer hands ``build_update`` its
            gradient and apply functions instead of running one fused step.
    """

    synchronous = False
    sharding = None
    aggregates_on_chief = False

    def __init__(self, strategy: tf.distribute.Strategy | None = None):
        self.strategy = strategy or tf.distribute.get_strategy()
        self.rank, self.world_size, self.is_chief = 0, 1, True
        self.replicas_per_process = 1

    def local_examples(self, element) -> int:
        """Examples this process feeds in one step (``element`` from ``distribute``)."""
        labels = element[0]
        return sum(int(t.shape[0]) for t in self.strategy.experimental_local_results(labels))

    def distribute(self, make_dataset: Callable[[], tf.data.Dataset]) -> tf.data.Dataset:
        """The dataset the train step iterates (one element a step)."""
        return make_dataset()

    def input_signature(self, dataset, flat_signature: tuple) -> tuple:
        """The train step's input signature for elements of ``distribute(...)``."""
        return flat_signature

    def run_step(self, train_step: Callable, element) -> object:
        """Run (or, on a parameter-server chief, schedule) one step on ``element``."""
        return train_step(*element)

    def fetch(self, value) -> float:
        """A step's result as a float (waits for a scheduled step)."""
        return float(value)

    def sync(self) -> None:
        """Wait until every scheduled step has updated the variables."""

    def all_sum(self, value: tf.Tensor) -> tf.Tensor:
        """Sum of ``value`` over every replica of the job (called in replica context)."""
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value)

    def reduce_gradients(self, grads: list) -> list:
        """Gradients summed over replicas before the update; tf.distribute optimizers sum them
        themselves, so this is the identity except for Horovod."""
        return grads

    def agree(self, flag: bool) -> bool:
        """The chief's ``flag`` on every process (one process: ``flag``)."""
        return flag

    def gather_rows(self, variable: tf.Variable, name: str):
        """A sharded variable's rows from every rank, merged in global order: numpy on the
        chief, None elsewhere (collective). Unsharded: its value."""
        return variable.numpy()

    def job_loss(self, loss: tf.Tensor) -> tf.Tensor:
        """This replica's share of the job's loss -> the job's loss (cross-replica context)."""
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

    def broadcast(self, variables: list[tf.Variable]) -> None:
        """Make every process start from the chief's values (after restore)."""


def share_cores() -> None:
    """Split this machine's cores between the job's processes on it (``RECPIPE_LOCAL_PROCESSES``,
    set by the local launcher): oversubscribed thread pools cost more than they give."""
    processes = int(os.environ.get(LOCAL_PROCESSES, "1"))
    if processes > 1:
        threads = max(1, (os.cpu_count() or 1) // processes)
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
