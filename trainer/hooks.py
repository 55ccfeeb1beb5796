"""The training loop's hooks: each concern of ``Trainer.train`` beside the step itself, one
class each, called after every step in a fixed order (TensorFlow's ``SessionRunHook``, Keras'
callbacks). A hook reads the step's ``StepEnd`` and returns True to end training there.

- ``PhaseTimer``: the first step's wall and CPU seconds (tracing included), then the mean of
  every later step, and the memory freed by tracing;
- ``StepLog``: every ``log_step_count_steps`` the loss (checked finite), the learning rate,
  examples/s and an ETA in the log, and the same figures with the online tables' to
  ``on_log`` (MLflow);
- ``Summaries``: TensorBoard scalars every ``save_summary_steps`` (the chief);
- ``CheckpointSaver``: a checkpoint every ``save_checkpoints_steps`` / ``_secs`` where no
  batch is admitted ahead, and the last one at the end;
- ``EarlyStopping``: ``export_config.enable_early_stop``, asked every save interval.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf

from recpipe.errors import PipelineError

log = logging.getLogger(__name__)

# steps between two releases of malloc's free pages (``release_free_memory``: milliseconds)
TRIM_STEPS = 100


class TrainError(PipelineError):
    """The job cannot start with the data or dirs it was given."""


class DivergedError(TrainError):
    """The loss is NaN or infinite: training stops before anything later is checkpointed."""


def check_finite(loss: float, step: int, last_saved: int) -> None:
    """Stop a diverged job (checked at each logged step, before each save and at the end).

    Raises:
        DivergedError: ``loss`` is not finite; the message names the step and the last
            checkpoint, which is left as it was.
    """
    if not math.isfinite(loss):
        raise DivergedError(
            f"the loss is {loss} at step {step}: training diverged; nothing after step "
            f"{last_saved} was saved. Lower the optimizer's learning_rate or check the day's "
            "features (_stats.json) for extreme values"
        )


def eta_text(steps_left: float, steps_per_sec: float) -> str:
    """``steps_left`` at ``steps_per_sec`` as ``1h02m``, ``3m05s`` or ``12s``; ``?`` when unknown."""
    if not math.isfinite(steps_left) or steps_left < 0 or steps_per_sec <= 0:
        return "?"
    seconds = round(steps_left / steps_per_sec)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


@dataclass(frozen=True)
class StepEnd:
    """What the hooks see after a step.

    Attributes:
        step: the global step now (the step just run).
        loss: its loss, a tensor not yet fetched (``fetch`` reads it: a device sync).
        examples: examples this process trained in it.
        first: the job's first step (tracing included).
        drained: no batch is admitted ahead of the next step (a save may run).
    """

    step: int
    loss: tf.Tensor
    examples: int
    first: bool
    drained: bool


class LoopHook:
    """One concern of the loop; the base does nothing."""

    def after_step(self, end: StepEnd) -> bool:
        """Called after every step; True ends training after it."""
        return False

    def end(self, step: int) -> None:
        """Called once training ended at global ``step`` (every hook, in order)."""


class PhaseTimer(LoopHook):
    """The step's phases for ``TrainResult.phases``: ``first_step_s`` / ``first_step_cpu_s``
    (from ``started``'s clocks, set before the first step, to its loss fetched), then
    ``step_ms`` / ``step_cpu_ms`` over every later step (saves and logs included). Marks
    ``first_step`` in ``memory`` and releases what tracing freed; every ``TRIM_STEPS`` steps
    releases malloc's free pages again (before a growing table's next doubling adds to them)."""

    def __init__(self, fetch: Callable, memory, release: Callable[[], None], started: dict):
        self.fetch, self.memory, self.release, self.started = fetch, memory, release, started
        self.phases: dict = {}
        self.steady: tuple[float, float, int] | None = None

    def after_step(self, end: StepEnd) -> bool:
        if end.first:
            self.fetch(end.loss)
            self.memory.mark("first_step")  # the step traced and run once
            self.release()  # what tracing freed
            self.phases["first_step_s"] = round(time.perf_counter() - self.started["wall"], 3)
            self.phases["first_step_cpu_s"] = round(time.process_time() - self.started["cpu"], 3)
            self.steady = (time.perf_counter(), time.process_time(), end.step)
        if end.step % TRIM_STEPS == 0:
            self.release()
        return False

    def end(self, step: int) -> None:
        """The steady steps' means, up to ``step``, into ``phases``."""
        if self.steady is not None and step > self.steady[2]:
            wall, cpu, first = self.steady
            self.phases["step_ms"] = round(1e3 * (time.perf_counter() - wall) / (step - first), 3)
            self.phases["step_cpu_ms"] = round(1e3 * (time.process_time() - cpu) / (step - first), 3)


class CheckpointSaver(LoopHook):
    """Checkpoints every ``save_checkpoints_steps`` (or ``save_checkpoints_secs``, where every
    process takes the chief's clock: ``due``), only between steps that leave no batch
    admitted ahead, and at the end (``end``). ``save(step)`` writes one (``Trainer._save``).

    Args:
        save: writes the checkpoint of ``step``.
        fetch: reads a loss tensor (checked finite before each save).
        due: ``(step, last_step, last_time) -> bool``.
        step: the global step the job starts at.
        takes_part: this process takes part in saves (some distributions gather rows there).
        had_checkpoint: the model dir held a checkpoint when the job started.
    """

    def __init__(self, save, fetch, due, step: int, takes_part: bool, had_checkpoint: bool):
        self.save, self.fetch, self.due_at, self.takes_part = save, fetch, due, takes_part
        self.had_checkpoint = had_checkpoint
        self.last_step, self.last_time, self.saved = step, time.time(), False

    def due(self, step: int) -> bool:
        """A save follows ``step`` (the loop drains a batch admitted ahead before it)."""
        return self.takes_part and self.due_at(step, self.last_step, self.last_time)

    def after_step(self, end: StepEnd) -> bool:
        if end.drained and self.due(end.step):
            check_finite(self.fetch(end.loss), end.step, self.last_step)
            self._save(end.step)
        return False

    def _save(self, step: int) -> None:
        self.save(step)
        self.last_step, self.last_time, self.saved = step, time.time(), True

    def end(self, step: int) -> None:
        """The last checkpoint, unless ``step`` is saved already (or the job ran no step in a
        model dir that holds one)."""
        if self.takes_part and (step != self.last_step or (not self.had_checkpoint and not self.saved)):
            self._save(step)


class StepLog(LoopHook):
    """Every ``every`` steps: the loss (fetched and checked finite), learning rate, this
    process's examples/s over the window and the ETA to ``planned`` steps in the log; with
    ``on_log``, ``on_log(step, {"loss", "learning_rate", "examples_per_sec", **metrics()})``."""

    def __init__(self, every, planned, fetch, learning_rate, metrics, on_log, saver: CheckpointSaver):
        self.every, self.planned, self.fetch = every, planned, fetch
        self.learning_rate, self.metrics, self.on_log, self.saver = learning_rate, metrics, on_log, saver
        self.window_start, self.window_examples = time.time(), 0

    def after_step(self, end: StepEnd) -> bool:
        self.window_examples += end.examples
        if end.step % self.every:
            return False
        loss = self.fetch(end.loss)
        check_finite(loss, end.step, self.saver.last_step)
        elapsed = max(time.time() - self.window_start, 1e-9)
        rate, lr = self.window_examples / elapsed, self.learning_rate()
        eta = eta_text(self.planned - end.step, self.every / elapsed)
        log.info(
            "step %d/%d loss %.5f lr %.6g examples/s %.0f eta %s", end.step, self.planned, loss, lr, rate, eta
        )
        figures = self.metrics()
        if self.on_log:
            self.on_log(end.step, {"loss": loss, "learning_rate": lr, "examples_per_sec": rate, **figures})
        self.window_start, self.window_examples = time.time(), 0
        return False


class Summaries(LoopHook):
    """TensorBoard's ``loss`` and ``learning_rate`` every ``every`` steps into ``directory``."""

    def __init__(self, directory: str, every: int, fetch, learning_rate):
        self.writer = tf.summary.create_file_writer(directory)
        self.every, self.fetch, self.learning_rate = every, fetch, learning_rate

    def after_step(self, end: StepEnd) -> bool:
        if end.step % self.every == 0:
            with self.writer.as_default(step=end.step):
                tf.summary.scalar("loss", self.fetch(end.loss))
                tf.summary.scalar("learning_rate", self.learning_rate())
        return False

    def end(self, step: int) -> None:
        self.writer.flush()


class EarlyStopping(LoopHook):
    """Every ``every`` steps where no batch is admitted ahead, ``stop(step)`` decides
    (``Trainer._early_stop``: the chief reads the evaluations, every process takes its
    answer)."""

    def __init__(self, every: int, stop: Callable[[int], bool]):
        self.every, self.stop = every, stop

    def after_step(self, end: StepEnd) -> bool:
        return end.drained and end.step % self.every == 0 and self.stop(end.step)
