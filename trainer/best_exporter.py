"""EasyRec's ``best`` exporter and early stopping, read from a job's evaluations while
training (``<model_dir>/eval_history.jsonl``, one line per evaluated checkpoint).

- ``keep_if_best``: after each evaluation, a checkpoint that scored best so far by
  ``export_config.best_exporter_metric`` is copied into ``<model_dir>/best/`` (the old copy
  replaced whole), so ``keep_checkpoint_max`` cannot delete it before the export.
- ``export_checkpoint``: what the day's evaluate and export tasks load: that copy under
  ``exporter_type: best``, else the latest checkpoint.
- ``early_stop``: whether training ends, as ``tf.estimator.experimental.
  stop_if_no_increase_hook`` (which EasyRec's ``enable_early_stop`` installs) decides: the
  best evaluated step is ``max_check_steps`` or more behind the latest evaluated one.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import tensorflow as tf

from recpipe import atomic, jsonl
from recpipe.config.pipeline import PipelineConfig
from recpipe.layout import ModelDir
from trainer.checkpoints import CheckpointError, resolve

log = logging.getLogger(__name__)


def best_entry(history: list[dict], metric: str, bigger: bool) -> dict | None:
    """The history line whose ``metric`` is best (the earliest of equals), or None when no
    line holds it.

    Args:
        history: ``eval_history.jsonl``'s lines, ``{"step": int, <metric>: float, ...}``.
        metric: a key of those lines; ``bigger``: whether a bigger value is better.
    """
    scored = [e for e in history if isinstance(e.get(metric), int | float)]
    if not scored:
        return None
    sign = 1.0 if bigger else -1.0
    return max(scored, key=lambda e: (sign * e[metric], -e["step"]))


def _history(model_dir: Path) -> list[dict]:
    return [e for e in jsonl.read(ModelDir(model_dir).eval_history) if "step" in e]


def _metric(config: PipelineConfig, history: list[dict]) -> str:
    """``best_exporter_metric``, checked against what the evaluations wrote.

    Raises:
        CheckpointError: no evaluation holds it (the message lists the metrics they hold).
    """
    metric = config.export_config.best_exporter_metric
    if history and not any(metric in e for e in history):
        held = sorted({k for e in history for k in e if k != "step"})
        raise CheckpointError(
            f"export_config.best_exporter_metric: {metric!r} is not among the evaluations' metrics "
            f"({', '.join(held)})"
        )
    return metric


def keep_if_best(config: PipelineConfig, model_dir: str | Path, checkpoint: str, step: int) -> bool:
    """Under ``exporter_type: best``: copy ``checkpoint`` (of ``step``, just evaluated, its
    line in the history) into ``<model_dir>/best/`` when it is the best so far. Returns whether it was
    copied; a checkpoint deleted before its copy is logged and skipped.

    Raises:
        CheckpointError: ``best_exporter_metric`` is not among the evaluation's metrics.
    """
    if config.export_config.exporter_type != "best":
        return False
    model_dir = Path(model_dir)
    history = _history(model_dir)
    best = best_entry(history, _metric(config, history), config.export_config.metric_bigger)
    if best is None or best["step"] != step:
        return False
    files = [Path(p) for p in tf.io.gfile.glob(checkpoint + ".*")]
    try:
        with atomic.directory(ModelDir(model_dir).best) as tmp:
            for f in files:
                shutil.copyfile(f, tmp / f.name)
            # the state file TensorFlow reads, written by its own writer (TF 2 keeps it in compat)
            tf.compat.v1.train.update_checkpoint_state(str(tmp), Path(checkpoint).name)
            (tmp / "best.json").write_text(json.dumps(best))
    except FileNotFoundError as err:
        log.warning("checkpoint %s was deleted before its copy as the best: %s", checkpoint, err)
        return False
    log.info("best checkpoint so far: step %d (%s)", step, best)
    return True


def export_checkpoint(config: PipelineConfig, model_dir: str | Path) -> str:
    """The checkpoint the day's evaluate and export tasks load: ``<model_dir>/best/``'s under
    ``exporter_type: best``, else the latest. A model dir without ``best/`` (a champion
    trained before the config asked for it, which exported its latest) gives its latest.

    Raises:
        CheckpointError: no checkpoint there.
    """
    if config.export_config.exporter_type != "best":
        return resolve(model_dir)
    best = ModelDir(model_dir).best
    if not best.is_dir():
        log.warning("%s: no best/ (trained under exporter_type final): its latest checkpoint", model_dir)
        return resolve(model_dir)
    return resolve(best)


def early_stop(config: PipelineConfig, model_dir: str | Path) -> str | None:
    """Under ``enable_early_stop``: why training ends now (the best step and the latest
    evaluated one), or None to go on.

    Raises:
        CheckpointError: ``best_exporter_metric`` is not among the evaluations' metrics.
    """
    export = config.export_config
    if not export.enable_early_stop:
        return None
    history = _history(Path(model_dir))
    best = best_entry(history, _metric(config, history), export.metric_bigger)
    if best is None:
        return None
    latest = max(e["step"] for e in history)
    if latest - best["step"] < export.max_check_steps:
        return None
    return (
        f"early stop: {export.best_exporter_metric} has not improved for {latest - best['step']} steps "
        f"(best {best[export.best_exporter_metric]:.6g} at step {best['step']}, evaluated up to step "
        f"{latest}; export_config.max_check_steps: {export.max_check_steps})"
    )
