"""The single-process distribution (``NoStrategy``) and the interface the others implement."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf

from recpipe.config.errors import ConfigError
from trainer.server_watch import probe

log = logging.getLogger(__name__)

LOCAL_PROCESSES = "RECPIPE_LOCAL_PROCESSES"


class StrategyError(ConfigError):
    """The configured train_distribute cannot run here (the message says why)."""


_TASK = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")


def lost_task(
    err: BaseException, cluster: dict[str, list[str]], me: tuple[str, int] | None = None
) -> str | None:
    """The task a TensorFlow error says it lost: ``"<type> <index> (<address>)"``, the
    address from ``cluster`` (TF_CONFIG's), or None when ``err`` names no task of it but ``me``
    (this process's own type and index). A task the error blames (``Task /job:...`` or
    ``reported from /job:...``) is taken before one it merely mentions."""
    text = str(err)
    named = [(m.start(), kind, int(index)) for m in _TASK.finditer(text) for kind, index in [m.groups()]]
    blamed = [n for n in named if text[max(0, n[0] - 14) : n[0]].endswith(("Task ", "reported from "))]
    for _, kind, index in blamed + named:
        if (kind, index) != me and index < len(cluster.get(kind, [])):
            return f"{kind} {index} ({cluster[kind][index]})"
    return None


def silent_task(cluster: dict[str, list[str]], me: tuple[str, int], timeout_s: float = 3.0) -> str | None:
    """The first task of ``cluster`` but ``me`` whose address refuses or ignores a TCP connect
    within ``timeout_s`` seconds: ``"<type> <index> (<address>)"``, or None when all answer.

    For a collective error that names no task (a cancelled all-reduce says only "Cancelled"):
    a host cut off or a process gone no longer accepts connections on its server port."""
    for kind, addresses in cluster.items():
        for index, address in enumerate(addresses):
            if (kind, index) == me:
                continue
            try:
                answered = probe(address, timeout_s)
            except ValueError:  # no port: nothing to connect to
                answered = None
            if answered is not True:
                return f"{kind} {index} ({address})"
    return None


def online_tables_refused(strategy: str, features: list[str]) -> StrategyError:
    """The error for online tables (``ev_params``) under a strategy that cannot hold them."""
    return StrategyError(
        f"train_config.train_distribute: {strategy} cannot train the online tables (ev_params) of "
        f"{features}: their id -> row maps are per-process hash tables that tf.distribute can "
        "neither mirror nor place on ps. Use EmbeddingParallelStrategy (ids sharded over Horovod "
        "ranks), HorovodStrategy or NoStrategy"
    )


@dataclass(frozen=True)
class StepParts:
    """What the loop hands a distribution to build its train step from.

    Attributes:
        signature: one batch's flat input signature (``Distribution.input_signature``).
        gradients: ``(flat, share) -> (loss, grads)`` of one replica's batch, ``grads``
            aligned with ``variables`` (``tf.IndexedSlices`` for tables, None where a
            variable has none).
        apply: ``grads -> None``, the optimizers' update.
        variables: the trainable variables, in ``gradients``' order.
        exchanged: indices of the gradients summed across processes (``reduce_gradients``);
            the others are already the job's sum (embedding-parallel tables).
        counters: variables incremented once per step (global_step, batch_in_epoch).
        state: the ``TrainState`` (model, optimizers, checkpoint) the parts were built over.
        build_replica: ``() -> StepParts`` of a new, whole copy of model and optimizers (its
            variables created under the caller's device scope), for a distribution that trains
            local copies (GEO); None where no copy can be built.
        admit: ``flat -> None``: the model called on one batch's features, for an admission
            pass (``trainer.online.ahead``); None where the model has no online tables.
        ahead: the model's ``trainer.online.ahead.Ahead`` (with ``admit``).
    """

    signature: tuple
    gradients: Callable
    apply: Callable
    variables: list
    exchanged: list[int]
    counters: tuple
    state: object = None
    build_replica: Callable | None = None
    admit: Callable | None = None
    ahead: object = None


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
        key_union: see ``trainer.online.EmbeddingVariable``.
        holds_online_tables: online tables (``ev_params``) can train here: their id -> row
            maps are per-process hash tables, which tf.distribute cannot mirror or place on ps.

    Beyond the step, a distribution decides how its train step is built (``build_train_step``)
    and how checkpoints are written and read (``saved_state``, ``prepare_save``,
    ``restore``): the loop holds no strategy's special case.
    """

    synchronous = False
    sharding = None
    # (keys, counts) -> the same over every process, for online tables each process holds whole
    key_union = None
    # whether online tables (ev_params) can train under this distribution
    holds_online_tables = True
    # whether a process that failed must exit at once: its strategy's finalizers may block
    exits_at_once_on_error = False

    def __init__(self, strategy: tf.distribute.Strategy | None = None):
        self.strategy = strategy or tf.distribute.get_strategy()
        self.rank, self.world_size, self.is_chief = 0, 1, True
        self.replicas_per_process = 1

    def job_failure(self, err: BaseException) -> Exception | None:
        """What ``err``, raised while training, says about the job (another process or its
        host lost: a ``recpipe.errors.PipelineError`` naming it), or None: ``err`` as it is."""
        return None

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

    def sum_over_processes(self, values: list[int]) -> list[int]:
        """Element-wise sum of ``values`` over the job's processes (collective; one process:
        ``values``)."""
        return list(values)

    def gather_rows(self, variable: tf.Variable, name: str):
        """A sharded variable's rows from every rank, merged in global order: numpy on the
        chief, None elsewhere (collective). Unsharded: its value."""
        return variable.numpy()

    def job_loss(self, loss: tf.Tensor) -> tf.Tensor:
        """This replica's share of the job's loss -> the job's loss (cross-replica context)."""
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

    def figures(self) -> dict:
        """The distribution's own figures of the job (say, bytes sent to the ps), for the
        result; none by default."""
        return {}

    def broadcast(self, variables: list[tf.Variable]) -> None:
        """Make every process start from the chief's values (after restore)."""

    @property
    def admits_ahead(self) -> bool:
        """Whether online tables can admit one batch ahead here (``train_config.admit_ahead``):
        one process and one replica under the default strategy, where a step is one function
        call (``trainer.online.ahead``)."""
        return type(self) is Distribution

    def build_ahead_steps(self, parts: StepParts):
        """The ``trainer.online.ahead.AheadSteps`` of ``parts`` (``admits_ahead`` only)."""
        from trainer.online import AheadSteps

        step = self._replica_step(parts)
        train = lambda flat: self.job_loss(self.strategy.run(step, args=tuple(flat)))  # noqa: E731
        return AheadSteps(parts.ahead, parts.signature, train, parts.admit, parts.counters)

    def build_train_step(self, parts: StepParts) -> Callable:
        """The train step ``run_step`` runs: one fused ``tf.function`` (gradients of this
        replica's share of the global mean loss, summed over replicas, applied, counters
        incremented) returning the job's loss."""
        step = self._replica_step(parts)

        # autograph off: the step's Python control flow is all on Python values, and converting
        # the model's and optimizers' code is most of the first step's tracing
        @tf.function(input_signature=parts.signature, reduce_retracing=True, autograph=False)
        def train_step(*inputs):
            loss = self.strategy.run(step, args=inputs)
            for counter in parts.counters:
                counter.assign_add(1)
            return self.job_loss(loss)

        return train_step

    def _replica_step(self, parts: StepParts) -> Callable:
        """``*flat -> loss``: one replica's gradients of its share of the global mean loss,
        summed over replicas and applied."""
        several = self.world_size * self.replicas_per_process > 1

        def step(*flat):
            n = tf.cast(tf.shape(flat[0])[0], tf.float32)  # labels come first
            share = tf.math.divide_no_nan(n, self.all_sum(n)) if several else 1.0
            loss, grads = parts.gradients(flat, share)
            reduced = self.reduce_gradients([grads[i] for i in parts.exchanged])
            for i, g in zip(parts.exchanged, reduced, strict=True):
                grads[i] = g
            parts.apply(grads)
            return loss

        return step

    # -- checkpoints ---------------------------------------------------------------------------
    def saved_state(self, state, build_unsharded: Callable):
        """The ``TrainState`` whose checkpoint this process's manager writes: ``state`` itself
        (``build_unsharded`` builds a whole-table copy where a distribution needs one)."""
        return state

    def takes_part_in_saves(self, state) -> bool:
        """Whether this process runs ``prepare_save`` at each save (the chief always)."""
        return self.is_chief

    def prepare_save(self, state, saved) -> None:
        """Make ``saved`` hold what the next checkpoint must (every taking-part process calls
        it at the same step)."""

    def save_due(self, due: bool, state) -> bool:
        """Whether a time-based save is due on every process that takes part in saves."""
        return due

    def restore(self, state, checkpoint: str) -> None:
        """Resume ``state`` from a checkpoint this job wrote.

        Raises:
            AssertionError: the checkpoint does not hold every object of ``state``.
        """
        state.checkpoint.restore(checkpoint).assert_existing_objects_matched()


def share_cores() -> None:
    """Split this machine's cores between the job's processes on it (``RECPIPE_LOCAL_PROCESSES``,
    set by the local launcher): oversubscribed thread pools cost more than they give. A pool
    the config sized (``set_threads``) keeps its size."""
    processes = int(os.environ.get(LOCAL_PROCESSES, "1"))
    if processes > 1:
        threads = max(1, (os.cpu_count() or 1) // processes)
        if not tf.config.threading.get_intra_op_parallelism_threads():
            tf.config.threading.set_intra_op_parallelism_threads(threads)
        if not tf.config.threading.get_inter_op_parallelism_threads():
            tf.config.threading.set_inter_op_parallelism_threads(threads)


def set_threads(inter_op: int, intra_op: int) -> None:
    """Size TensorFlow's thread pools for this process (``train_config``'s
    ``inter_op_parallelism_threads`` / ``intra_op_parallelism_threads``, EasyRec's fields); 0
    leaves a pool to TensorFlow (or ``share_cores``). Must run before TensorFlow's runtime
    starts: ``distribution_for`` calls it before any distribution is made. In a process whose
    runtime an earlier job started (a fork server's resident, ``trainer.warm``) pools of
    another size are kept, with a warning."""
    for size, name in ((intra_op, "intra_op"), (inter_op, "inter_op")):
        if not size:
            continue
        try:
            getattr(tf.config.threading, f"set_{name}_parallelism_threads")(size)
        except RuntimeError:
            now = getattr(tf.config.threading, f"get_{name}_parallelism_threads")()
            log.warning(
                "train_config.%s_parallelism_threads %d: this process's runtime started with %s "
                "before this job (a resident); it keeps them",
                name,
                size,
                now or "TensorFlow's choice",
            )
