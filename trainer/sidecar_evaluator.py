"""Evaluation while training (``eval_config.eval_method``).

- ``separate``: an evaluator process beside the training job follows ``model_dir``: it
  evaluates every new checkpoint, in step order (not only the latest, as Keras'
  ``SidecarEvaluator`` does), and stops once the chief has written ``train_done.json`` and its
  checkpoint was evaluated. A checkpoint that ``keep_checkpoint_max`` deleted before its turn is
  logged and skipped.
- ``master``: the chief evaluates each checkpoint it saves, in its own process (the other
  workers wait at their next collective).
- ``none``: no evaluation while training.

Each evaluation writes ``<model_dir>/eval/eval_result-<step>.json`` and appends one line
``{"step", <metric>: value, ...}`` to ``<model_dir>/eval_history.jsonl``, which the Airflow
operator forwards to MLflow as ``eval_<metric>`` at that step.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path

import tensorflow as tf

from recpipe import atomic, jsonl
from recpipe.config.pipeline import PipelineConfig
from recpipe.layout import ModelDir
from trainer.best_exporter import keep_if_best
from trainer.checkpoints import CheckpointError
from trainer.scoring import evaluate

log = logging.getLogger(__name__)
_STEP = re.compile(r"-(\d+)$")


def checkpoint_step(path: str) -> int:
    """``.../model.ckpt-1200`` -> 1200.

    Raises:
        CheckpointError: the path does not end in ``-<step>``.
    """
    match = _STEP.search(str(path))
    if not match:
        raise CheckpointError(f"checkpoint path {path!r} does not end in -<step>")
    return int(match.group(1))


def mark_train_done(model_dir: Path, step: int, checkpoint: str) -> None:
    """Written by the chief when training ends: the evaluator's signal to finish."""
    marker = {"global_step": step, "checkpoint": checkpoint}
    atomic.write_text(ModelDir(model_dir).train_done, json.dumps(marker))


def evaluate_and_record(
    config: PipelineConfig, model_dir: Path, eval_days: list[str], checkpoint: str
) -> dict:
    """Evaluate one checkpoint; write its result file, append it to the history and, under
    ``exporter_type: best``, keep a copy of it when it scored best so far."""

    files = ModelDir(model_dir)
    target = files.eval_result_at(checkpoint_step(checkpoint))
    result = evaluate(config, model_dir, eval_days, checkpoint, target)
    metrics = {k: v for k, v in result.items() if isinstance(v, float)}
    jsonl.append(files.eval_history, {"step": result["global_step"], **metrics})
    keep_if_best(config, model_dir, checkpoint, result["global_step"])  # exporter_type: best
    return result


def evaluated_steps(model_dir: Path) -> set[int]:
    """Steps already in ``eval_history.jsonl`` (a restarted evaluator does not redo them)."""
    return {entry["step"] for entry in jsonl.read(ModelDir(model_dir).eval_history) if "step" in entry}


def follow(
    config: PipelineConfig,
    model_dir: str | Path,
    eval_days: list[str],
    poll_s: float = 2.0,
    timeout_s: float | None = None,
) -> list[int]:
    """The separate evaluator: evaluate each new checkpoint of ``model_dir`` until training
    is done; return the steps evaluated.

    Raises:
        TimeoutError: ``timeout_s`` passed without training finishing.
    """
    model_dir = Path(model_dir)
    # the job's start, not this process's: a restarted evaluator must still see the marker
    started = float(os.environ.get("RECPIPE_JOB_STARTED") or time.time())
    done_steps = evaluated_steps(model_dir)
    evaluated: list[int] = []
    while True:
        # read the marker before listing: a checkpoint saved before it is listed below
        done = _train_done(model_dir, started)
        state = tf.train.get_checkpoint_state(str(model_dir))
        paths = list(state.all_model_checkpoint_paths) if state else []
        for path in sorted(paths, key=checkpoint_step):
            step = checkpoint_step(path)
            if step in done_steps:
                continue
            try:
                evaluate_and_record(config, model_dir, eval_days, path)
            except (CheckpointError, tf.errors.NotFoundError) as err:
                log.warning("checkpoint %s was deleted before its evaluation: %s", path, err)
            done_steps.add(step)
            evaluated.append(step)
        if done is not None and done["global_step"] in done_steps:
            log.info("training finished at step %d: evaluator stops", done["global_step"])
            return evaluated
        if timeout_s is not None and time.time() - started > timeout_s:
            raise TimeoutError(f"{model_dir}: training did not finish within {timeout_s} s")
        time.sleep(poll_s)


def _train_done(model_dir: Path, started: float) -> dict | None:
    path = ModelDir(model_dir).train_done
    try:
        # a marker older than this evaluator belongs to an earlier job in the same model_dir
        if path.stat().st_mtime < started - 1:
            return None
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
