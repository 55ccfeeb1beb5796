"""The training loop: steps, logging, summaries, checkpoints, resume and fine-tune.

The loop receives a frozen ``TrainJob`` and a ``Distribution`` (``trainer.distribute``); it
never reads environment variables, TF_CONFIG or Horovod state (the distribution does). Every
strategy runs this same loop: each replica's loss is its share of the step's global mean
(``loss * n_replica / n_global``), so summed gradients equal those of one process on the
global batch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras

from recpipe import atomic
from recpipe.config.model import EvalMethod
from recpipe.config.pipeline import PipelineConfig
from recpipe.errors import UsageError
from recpipe.layout import CHECKPOINT_PREFIX, FeaturePartition, ModelDir, parse_ds_range, partition_ds
from trainer import online
from trainer.best_exporter import early_stop
from trainer.checkpoints import fine_tune_restore, read_var_map, restore_embedding_variables
from trainer.distribute import Distribution
from trainer.distribute.base import StepParts, online_tables_refused
from trainer.embedding_tables import placement, variable_name
from trainer.hooks import (
    CheckpointSaver,
    EarlyStopping,
    PhaseTimer,
    StepEnd,
    StepLog,
    Summaries,
    check_finite,
)
from trainer.hooks import DivergedError as DivergedError  # the loop's errors, where callers look
from trainer.hooks import TrainError as TrainError
from trainer.input import FeatureReader, holdout_split
from trainer.losses import build_loss
from trainer.memory import MemoryProfile, release_free_memory
from trainer.optimizers import scale_gradients
from trainer.sidecar_evaluator import evaluate_and_record, mark_train_done
from trainer.state import build_state

log = logging.getLogger(__name__)


class ModelDirInUseError(TrainError, UsageError):
    """``model_dir`` holds checkpoints and ``--continue_train`` is unset (exit code 2)."""


@dataclass(frozen=True)
class TrainJob:
    """Everything one training process needs, fixed before it starts.

    Args:
        config: the effective pipeline config (overrides applied).
        model_dir: where checkpoints, summaries and results go.
        train_days: the ``ds`` partitions to train on.
        continue_train: resume from ``model_dir``'s latest checkpoint.

    This process's shard and role (rank, world size, chief) are the ``Distribution``'s.
    """

    config: PipelineConfig
    model_dir: Path
    train_days: list[str]
    continue_train: bool = False


@dataclass
class TrainResult:
    """What a finished ``train()`` reports (step, checkpoint, last loss, examples/s, fine-tune report,
    the online tables' figures, this process's CPU-seconds in the training loop, the peak
    memory of each phase, and ``phases``: the first step's wall and CPU seconds (tracing and
    first run), the later steps' mean wall and CPU milliseconds, the traced step's operations;
    ``distribution``: the distribution's own figures, ``Distribution.figures``)."""

    global_step: int
    checkpoint: str
    loss: float
    examples_per_sec: float
    fine_tune: dict = field(default_factory=dict)
    online_tables: dict = field(default_factory=dict)
    cpu_seconds: float = 0.0
    memory_mb: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)
    distribution: dict = field(default_factory=dict)


def graph_ops(step) -> int | None:
    """Operations in a traced train step (a ``tf.function`` with a pinned signature): its
    graph and every function it calls (branches of conditions, loop bodies); None where the
    step is not one ``tf.function`` (a parameter-server chief's schedule)."""
    try:
        graph = step.get_concrete_function().graph.as_graph_def()
    except (AttributeError, TypeError, ValueError):
        return None
    return len(graph.node) + sum(len(f.node_def) for f in graph.library.function)


def _l2_on_rows(grads: list, variables: list, tables: set, reg: float) -> tuple[list, tf.Tensor]:
    """``reg * l2_loss`` of each embedding row a batch looks up, once per lookup, added to
    the tables' sparse gradients (EasyRec regularizes the looked-up embeddings). Unlike an L2
    of whole tables this keeps every table's gradient a ``tf.IndexedSlices``."""
    out, reg_loss = [], tf.constant(0.0)
    for grad, var in zip(grads, variables, strict=True):
        if var.ref() in tables and isinstance(grad, tf.IndexedSlices):
            rows = tf.gather(var, grad.indices)
            reg_loss += reg * tf.nn.l2_loss(rows)
            grad = tf.IndexedSlices(grad.values + reg * rows, grad.indices, grad.dense_shape)
        out.append(grad)
    return out, reg_loss


class Trainer:
    """Builds model, optimizers and checkpoint for a job, then runs ``train()``. With
    ``warm`` (``trainer.warm.take``), the last job's model, optimizers, distribution and traced
    step are taken instead of built, their step counters set back to their start."""

    def __init__(self, job: TrainJob, distribution: Distribution | None = None, warm=None):
        self.job = job
        self.files = ModelDir(job.model_dir)
        self.config = job.config
        self.dist = warm.dist if warm is not None else distribution or Distribution()
        features = self.config.feature_config.online_features
        if features and not self.dist.holds_online_tables:
            raise online_tables_refused(self.config.train_config.train_distribute.value, features)
        self.strategy = self.dist.strategy
        tc = self.config.train_config
        self.partitions, holdout = holdout_split(self.config, job.train_days, "train")
        self.reader = FeatureReader(
            self.config,
            self.partitions,
            self.dist.rank,
            self.dist.world_size,
            seed=tc.random_seed,
            holdout=holdout,
        )
        keras.utils.set_random_seed(tc.random_seed)
        if tc.op_determinism:
            tf.config.experimental.enable_op_determinism()
        if warm is not None:
            self.state = warm.state
            for counter in (self.state.global_step, self.state.epoch, self.state.batch_in_epoch):
                counter.assign(0)
            for opt in self.state.optimizers:  # a slot-less optimizer's count is not restored
                opt.iterations.assign(0)
        else:
            self.state = build_state(self.config, self.dist.sharding, self.strategy, self.dist.key_union)
        st = self.state
        for line in placement(st.model):
            log.info("%s", line)
        self.model, self.optimizers, self.var_split = st.model, st.optimizers, st.var_split
        self.global_step, self.epoch, self.batch_in_epoch = st.global_step, st.epoch, st.batch_in_epoch
        self.variables, self.checkpoint = st.variables, st.checkpoint
        # what this process's checkpoint manager saves (an unsharded copy, for some)
        if warm is not None:
            self.saved = warm.saved
            self.saved.checkpoint.save_counter.assign(0)  # as a new checkpoint's
        else:
            self.saved = self.dist.saved_state(st, lambda: build_state(self.config))
        self.manager = tf.train.CheckpointManager(
            self.saved.checkpoint,
            str(job.model_dir),
            max_to_keep=tc.keep_checkpoint_max,
            checkpoint_name=CHECKPOINT_PREFIX,
        )
        self.loss_fn = build_loss(self.config.model, self.config.task_labels())
        self.train_step: Callable | None = None
        # (input signature, train step, AheadSteps or None): a warm job's, reused if it fits
        self.traced: tuple | None = warm.traced if warm is not None else None
        self._predict: Callable | None = None
        self.resumed = False  # set by _restore: the job resumed its own latest checkpoint

    def _restore(self) -> dict:
        tc = self.config.train_config
        latest = self.manager.latest_checkpoint
        self.resumed = latest is not None
        if latest and not self.job.continue_train:
            raise ModelDirInUseError(
                f"model_dir {self.job.model_dir} already holds checkpoints (latest {latest}); "
                "pass --continue_train to resume, or choose another --model_dir"
            )
        if latest:
            self.dist.restore(self.state, latest)
            log.info("resumed from %s at step %d", latest, int(self.global_step.numpy()))
            # a resumed job reports the warm start its first attempt made (the run's lineage)
            kept = self.files.fine_tune
            return json.loads(kept.read_text()) if kept.exists() else {}
        if tc.fine_tune_checkpoint:
            var_map = read_var_map(tc.fine_tune_ckpt_var_map) if tc.fine_tune_ckpt_var_map else None
            static = self.state.static_variables()
            report = fine_tune_restore(static, tc.fine_tune_checkpoint, var_map, self.optimizers)
            restored = restore_embedding_variables(
                self.state.evs, tc.fine_tune_checkpoint, self.dist.sharding
            )
            report = {
                "source": tc.fine_tune_checkpoint,
                "checkpoint": report.checkpoint,
                "restored": len(report.restored),
                "missing": report.missing,
                "shape_mismatch": report.shape_mismatch,
                "slots_restored": len(report.slots_restored),
                "optimizer_iterations": report.optimizer_iterations,
                **({"online_rows_restored": restored} if restored else {}),
            }
            if self.dist.is_chief:
                atomic.write_text(self.files.fine_tune, json.dumps(report))
            return report
        return {}

    def _train_step_fn(self, signature: tuple) -> Callable:
        def replica() -> StepParts:
            # a whole copy of model and optimizers, built under the caller's device scope
            return self._step_parts(build_state(self.config), signature)

        parts = self._step_parts(self.state, signature)
        return self.dist.build_train_step(dataclasses.replace(parts, build_replica=replica))

    def _ahead_steps(self, signature: tuple):
        """The loop's ``trainer.online.ahead.AheadSteps``, or None where each step admits its
        own batch (``train_config.admit_ahead`` off, no online tables, or a distribution whose
        step is not one call of this process)."""
        if not (self.config.train_config.admit_ahead and self.state.evs and self.dist.admits_ahead):
            return None
        return self.dist.build_ahead_steps(self._step_parts(self.state, signature))

    def _steps(self, data, train_step: Callable, ahead, drain_next: Callable[[], bool], started: dict):
        """``(element trained, its loss)`` of each step over ``data``. With ``ahead``
        (``AheadSteps``) an element is admitted one step before it trains; the pending one
        trains alone where ``drain_next()`` says the next step must leave no batch admitted
        ahead (a save or the last step follows), and at the end of ``data``. ``started`` gets
        the wall and CPU clocks before the first step (tracing included)."""
        for element in data:
            if not started:
                started.update(wall=time.perf_counter(), cpu=time.process_time())
            if ahead is None:
                yield element, self.dist.run_step(train_step, element)
            elif ahead.pending is None:
                ahead.admit(element)
            elif drain_next():
                yield ahead.drain()
                ahead.admit(element)
            else:
                yield ahead.step(element)
        if ahead is not None and ahead.pending is not None:
            yield ahead.drain()

    def _step_parts(self, state, signature: tuple) -> StepParts:
        reader = self.reader
        model, loss_fn, optimizers, split = state.model, self.loss_fn, state.optimizers, state.var_split
        reg = self.config.model.embedding_regularization
        tables = {t.ref() for t in model.variable_groups()["embedding"]}
        # EasyRec's l2_regularization: on the dense layers' kernels (not biases nor tables)
        l2 = self.config.model.l2_regularization
        kernels = [v for v in model.trainable_variables if "kernel" in v.name and v.ref() not in tables]
        variables = [v for part in split for v in part]
        # a sharded table's gradient is already the job's sum (the lookup's reverse all-to-all)
        exchanged = [i for i, v in enumerate(variables) if not state.is_sharded(v)]

        def gradients(flat: tuple, share) -> tuple[tf.Tensor, list]:
            # this replica's loss (its share of the global mean) and its gradients, unreduced
            features, labels = reader.structure(flat)
            with tf.GradientTape() as tape:
                logits = model(features, training=True)
                loss = loss_fn(labels, logits, reader.sample_weights(flat)) * share
                if model.losses:  # the layers' own (variational_dropout's penalty)
                    loss += tf.add_n(model.losses) * share
                if l2 and kernels:
                    loss += l2 * tf.add_n([tf.nn.l2_loss(k) for k in kernels]) * share
            grads = tape.gradient(loss, variables)
            if reg:
                grads, reg_loss = _l2_on_rows(grads, variables, tables, reg)
                loss += reg_loss
            return loss, grads

        entries = self.config.train_config.optimizer_config
        multipliers = [o.embedding_learning_rate_multiplier for o in entries]

        def apply(grads: list) -> None:
            i = 0
            for opt, part, m in zip(optimizers, split, multipliers, strict=True):
                part_grads = scale_gradients(grads[i : i + len(part)], part, tables, m)
                opt.apply_gradients(zip(part_grads, part, strict=True))
                i += len(part)

        clock = online.clock(model)

        def admit(flat: tuple) -> None:
            model(reader.structure(flat)[0], training=False)  # the tables admit (ahead.record)

        return StepParts(
            signature,
            gradients,
            apply,
            variables,
            exchanged,
            state.counters(),
            state,
            admit=admit if clock is not None else None,
            ahead=clock.ahead if clock is not None else None,
        )

    def _learning_rate(self) -> float:
        opt = self.optimizers[-1]
        lr = (
            opt.learning_rate(opt.iterations.read_value())
            if callable(opt.learning_rate)
            else opt.learning_rate
        )
        return float(lr.numpy() if hasattr(lr, "numpy") else lr)

    def train(
        self,
        on_log: Callable[[int, dict], None] | None = None,
        on_start: Callable[[keras.Model, dict], None] | None = None,
    ) -> TrainResult:
        """Train until ``num_steps`` or ``num_epochs`` of data; return the final state.

        ``on_log(step, {"loss", "learning_rate", "examples_per_sec"})`` is called on the chief
        at every ``log_step_count_steps`` (for tracking); examples/s are this process's.
        ``on_start(model, fine_tune_report)`` is called on the chief once the model holds the
        fine-tune checkpoint's variables, before the first step; not when the job resumes its
        own checkpoint or starts from scratch (a stream pass's progressive score).
        In a synchronous job every process runs the same steps: shards are padded to the
        largest one's batch count.
        """
        job, tc, dc, dist = self.job, self.config.train_config, self.config.data_config, self.dist
        fine_tune, memory, online_start = self._begin(on_start)
        on_log = on_log if dist.is_chief else None
        per_step = dist.replicas_per_process
        pad_to = self._padded_batches()

        def epoch_data(epoch: int, skip_steps: int):
            return dist.distribute(
                lambda: self.reader.flat_dataset(epoch, skip_steps * per_step, dc.prefetch_size, pad_to)
            )

        # the job's planned steps, for the ETA in the log (rows / batch per epoch, or num_steps)
        epoch_steps = pad_to or math.ceil(self.reader.num_rows / (dc.batch_size * per_step))
        planned = min(epoch_steps * dc.num_epochs, tc.num_steps or math.inf)
        started: dict = {}  # the first step's start (_steps), wall and CPU
        # the step is counted here too: reading global_step every step would sync with the device
        step = int(self.global_step.numpy())
        timer = PhaseTimer(dist.fetch, memory, release_free_memory, started)
        saver = CheckpointSaver(
            self._save,
            dist.fetch,
            self._due,
            step,
            dist.takes_part_in_saves(self.state),  # some distributions gather every process's rows
            self.manager.latest_checkpoint is not None,
        )
        hooks = self._hooks(timer, saver, planned, on_log, online_start)
        total_start, cpu_start = time.time(), time.process_time()
        total_examples, loss_t, traced = self._run(step, epoch_data, hooks, saver, started)
        dist.sync()
        loss = dist.fetch(loss_t) if total_examples else float("nan")
        step = int(self.global_step.numpy())
        if total_examples:
            check_finite(loss, step, saver.last_step)
        memory.mark("train")
        for hook in hooks:
            hook.end(step)  # the last checkpoint among them
        memory.mark("save")
        phases = timer.phases
        if traced is not None:
            phases["step_ops"] = graph_ops(traced)
        if dist.is_chief:
            mark_train_done(job.model_dir, step, self.manager.latest_checkpoint)
        elapsed = max(time.time() - total_start, 1e-9)
        return TrainResult(
            step,
            self.manager.latest_checkpoint or "",
            loss,
            total_examples / elapsed,
            fine_tune,
            self._online_metrics(online_start),
            time.process_time() - cpu_start,
            memory.phases(),
            phases,
            dist.figures(),
        )

    def _run(self, step: int, epoch_data, hooks: list, saver: CheckpointSaver, started: dict):
        """The steps from global ``step`` over ``epoch_data(epoch, skip_steps)`` until
        ``num_steps``, ``num_epochs`` or a hook ends training; each step's ``StepEnd`` goes to
        every hook in order. Returns ``(examples, the last loss tensor or None, the traced
        step function or None)``."""
        tc, dc, dist = self.config.train_config, self.config.data_config, self.dist
        train_step, ahead, loss_t, examples = None, None, None, 0
        done = tc.num_steps is not None and step >= tc.num_steps

        def drain_next() -> bool:
            # the next step saves or is the last: it must leave no batch admitted ahead
            return (tc.num_steps is not None and step + 1 >= tc.num_steps) or saver.due(step + 1)

        while not done and int(self.epoch.numpy()) < dc.num_epochs:
            data = epoch_data(int(self.epoch.numpy()), int(self.batch_in_epoch.numpy()))
            if train_step is None:  # one trace per job (pinned signature, short last batch included)
                signature = dist.input_signature(data, self.reader.signature())
                if self.traced is not None and self.traced[0] == signature:
                    _, train_step, ahead = self.traced
                else:
                    train_step, ahead = self._train_step_fn(signature), self._ahead_steps(signature)
                self.train_step, self.traced = train_step, (signature, train_step, ahead)
            for element, loss_t in self._steps(data, train_step, ahead, drain_next, started):
                step += 1
                drained = ahead is None or ahead.pending is None  # no batch admitted ahead
                end = StepEnd(step, loss_t, dist.local_examples(element), not examples, drained)
                examples += end.examples
                stop = [hook.after_step(end) for hook in hooks]  # every hook, in order
                if any(stop) or (tc.num_steps is not None and step >= tc.num_steps):
                    done = True
                    break
            else:
                self.epoch.assign_add(1)
                self.batch_in_epoch.assign(0)
        traced = train_step if ahead is None else ahead.traced
        return examples, loss_t, traced

    def _begin(self, on_start) -> tuple[dict, MemoryProfile, dict]:
        """The job's start: the model dir, the restore or fine-tune (the checkpoint's or the
        chief's variables everywhere), the online tables' maps and day, the normalisation
        serving needs. Returns the fine-tune report, the memory profile and the online tables'
        figures at the start."""
        job, dist = self.job, self.dist
        if self.config.eval_config.eval_method == EvalMethod.master and dist.is_chief:
            self._eval_days()  # fail before training, not at the first checkpoint
        job.model_dir.mkdir(parents=True, exist_ok=True)
        fine_tune = self._restore()
        dist.broadcast([v for v in self.state.all_variables() if not self.state.is_per_rank(v)])
        online.refresh(self.model)  # the id -> row maps, from the restored / broadcast rows
        if on_start is not None and dist.is_chief and fine_tune and not self.resumed:
            on_start(self.model, fine_tune)
        memory = MemoryProfile()
        memory.mark("build")  # model, optimizer slots, checkpoint restored
        online_start = self._online_stats()  # the day's figures include the day boundary's
        online.start_day(self.model, partition_ds(self.partitions[-1]))
        if dist.is_chief:
            self._save_normalization()
            self.files.train_done.unlink(missing_ok=True)  # an earlier job's
        return fine_tune, memory, online_start

    def _padded_batches(self) -> int | None:
        """In a synchronous job, every process's batches an epoch (the largest shard's: every
        process runs the same steps); None otherwise."""
        dist = self.dist
        pad_to = self.reader.synchronized_batches(dist.replicas_per_process) if dist.synchronous else None
        if pad_to is not None:
            log.info(
                "rank %d of %d: %d rows, %d batches an epoch (padded to the largest shard)",
                dist.rank,
                dist.world_size,
                self.reader.num_rows,
                pad_to,
            )
        return pad_to

    def _hooks(self, timer, saver, planned: float, on_log, online_start: dict) -> list:
        """The loop's hooks (``trainer.hooks``) in the order they run after a step: the phase
        timer, the log, the chief's summaries, the checkpoint saver, early stopping."""
        tc, dist = self.config.train_config, self.dist
        metrics = lambda: self._online_metrics(online_start)  # noqa: E731
        lr = self._learning_rate
        hooks = [timer, StepLog(tc.log_step_count_steps, planned, dist.fetch, lr, metrics, on_log, saver)]
        if dist.is_chief:
            summaries = str(self.files.summaries)
            hooks.append(Summaries(summaries, tc.save_summary_steps, dist.fetch, lr))
        hooks.append(saver)
        # steps between two looks at the evaluations (every process looks at the same steps)
        every = tc.save_checkpoints_steps or tc.log_step_count_steps
        if self.config.export_config.enable_early_stop and every:
            hooks.append(EarlyStopping(every, self._early_stop))
        return hooks

    def train_batches(self, batches: Iterable[tuple], ds: str) -> float:
        """Train one step on each of ``batches`` (``FeatureReader.batches`` tuples of this
        job's config) in this process, for data of ``ds`` (a day or a pass: the online tables'
        day boundary). No checkpoint, summary or log: consecutive calls are consecutive passes
        of one warm process, what a pass costs without a process start, tracing or restore
        (``bench/freshness.py``). The first call starts from the fresh model (no fine-tune).

        Returns:
            The last step's loss (NaN without batches).
        """
        if self.train_step is None:
            online.refresh(self.model)
            signature = self.dist.input_signature(None, self.reader.signature())
            self.train_step = self._train_step_fn(signature)
        online.start_day(self.model, ds)
        loss = None
        for flat in batches:
            loss = self.dist.run_step(self.train_step, flat)
        return float("nan") if loss is None else self.dist.fetch(loss)

    def predict_batch(self, flat: tuple) -> np.ndarray:
        """The model's probabilities ``float32 [B]`` (``[B, T]`` for T tasks) on one
        ``FeatureReader.batches`` tuple, as it is now (``training=False``)."""
        if self._predict is None:
            reader, model = self.reader, self.model

            def call(*inputs):
                return tf.sigmoid(model(reader.structure(inputs)[0], training=False))

            self._predict = tf.function(call, input_signature=self.reader.signature(), autograph=False)
        return self._predict(*flat).numpy()

    def _online_stats(self) -> dict[str, dict[str, int]]:
        """Each online table's ``EmbeddingVariable.summary``, over the job (embedding-parallel
        ranks each hold their ids: summed; Horovod ranks hold equal tables: the chief's)."""
        out = {}
        for ev in self.state.evs:
            scope = variable_name(ev.keys).rsplit("/", 2)[0]
            for member, summary in ev.member_summaries().items():
                if self.dist.sharding is not None:
                    summary = dict(
                        zip(summary, self.dist.sum_over_processes(list(summary.values())), strict=True)
                    )
                out[f"{scope}/{member}"] = {**summary, "group_size": len(ev.members)}
        return out

    def _online_metrics(self, start: dict) -> dict[str, float]:
        """``ev/<table>/{rows_used, capacity, group_size, admitted, evicted, refused,
        filtered_share}`` since the job started (``capacity``: the rows its group holds, shared
        by the ``group_size`` tables of the group; ``filtered_share``: lookups in training that
        found no row)."""
        out: dict[str, float] = {}
        for name, now in self._online_stats().items():
            first = start.get(name, {})
            delta = {
                k: now[k] - first.get(k, 0) for k in ("admitted", "evicted", "refused", "lookups", "filtered")
            }
            prefix = f"ev/{name}/"
            out[prefix + "rows_used"] = now["rows_used"]
            out[prefix + "capacity"] = now["capacity"]
            out[prefix + "group_size"] = now["group_size"]
            for k in ("admitted", "evicted", "refused"):
                out[prefix + k] = delta[k]
            out[prefix + "filtered_share"] = delta["filtered"] / max(delta["lookups"], 1)
        return out

    def _early_stop(self, step: int) -> bool:
        """Whether training ends at ``step`` (``export_config.enable_early_stop``): the chief
        reads the evaluations so far, every process takes its answer."""
        reason = early_stop(self.config, self.job.model_dir) if self.dist.is_chief else None
        if not self.dist.agree(reason is not None):
            return False
        log.info("step %d: %s", step, reason or "early stop (the chief's decision)")
        return True

    def _save(self, step: int) -> None:
        """A checkpoint; with ``eval_method: master`` the chief evaluates it at once."""
        self.dist.sync()  # scheduled parameter-server steps land before the save
        self.dist.prepare_save(self.state, self.saved)
        if not self.dist.is_chief:
            return
        path = self.manager.save(checkpoint_number=step)
        if self.config.eval_config.eval_method == EvalMethod.master:
            evaluate_and_record(self.config, self.job.model_dir, self._eval_days(), path)

    def _eval_days(self) -> list[str]:
        if not self.config.eval_ds:
            raise TrainError("eval_config.eval_method: master evaluates eval_ds, which is not set")
        return parse_ds_range(self.config.eval_ds)

    def _due(self, step: int, last_step: int, last_time: float) -> bool:
        tc = self.config.train_config
        if tc.save_checkpoints_secs is not None:
            due = time.time() - last_time >= tc.save_checkpoints_secs
            return self.dist.save_due(due, self.state)
        return step - last_step >= tc.save_checkpoints_steps

    def _save_normalization(self) -> None:
        # serving must apply the normalisation of the newest training day
        source = FeaturePartition(self.partitions[-1]).normalization
        target = self.files.normalization
        if source.exists():
            atomic.copy_file(source, target)
        else:
            atomic.write_text(target, json.dumps({"features": {}}))
