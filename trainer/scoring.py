"""Evaluate a checkpoint on ``ds`` partitions: exact metrics, written to ``eval_result.json``."""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

from recpipe import atomic
from recpipe.config.pipeline import PipelineConfig
from recpipe.layout import ModelDir, partition_ds
from trainer import online
from trainer.best_exporter import export_checkpoint
from trainer.checkpoints import resolve
from trainer.embedding_tables import checkpoint_map
from trainer.input import FeatureReader, holdout_split, sample_inputs
from trainer.losses import task_targets
from trainer.metrics import compute_metrics
from trainer.models.builders import build_model
from trainer.models.ranking import RankingModel

log = logging.getLogger(__name__)
# rows a scoring batch holds at least: a row's prediction does not depend on its batch (no
# admission, dropout or batch statistics in inference), and a stream pass's training batch of
# 32 rows would make its scoring one call per 32 rows (10k rows: 0.70 s against 0.23 s here)
SCORE_BATCH_ROWS = 1024


def load_model(config: PipelineConfig, checkpoint: str | Path) -> tuple[RankingModel, int]:
    """Build the model, restore its variables from ``checkpoint``; return it and the step.

    Raises:
        trainer.checkpoints.CheckpointError: no checkpoint there.
        AssertionError: the checkpoint does not hold every model variable.
    """
    path = resolve(checkpoint)
    model = build_model(config)
    model(sample_inputs(config))
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(variables=checkpoint_map(model), global_step=step)
    ckpt.restore(path).expect_partial().assert_existing_objects_matched()
    online.refresh(model)  # online tables: the id -> row maps from the restored rows
    return model, int(step)


_traced: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> spec -> function


def _probabilities(model: RankingModel, spec: dict) -> Callable:
    """``model``'s probabilities as a function traced once per model and input spec (a
    process that scores again, a warm trainer's next pass, reuses the trace)."""
    by_spec = _traced.setdefault(model, {})
    key = repr(sorted(spec.items()))
    if key not in by_spec:
        held = weakref.ref(model)  # the function must not keep its key alive
        by_spec[key] = tf.function(
            lambda f: tf.sigmoid(held()(f, training=False)), input_signature=[spec], autograph=False
        )
    return by_spec[key]


def predict(
    model: RankingModel, reader: FeatureReader, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Labels ``float32 [N]``, probabilities ``float32 [N]`` and the raw values (``object [N]``
    of bytes) of the reader's ``raw_columns`` over the reader; a multi-task model's labels are
    ``float32 [N, L]`` (every label field) and probabilities ``float32 [N, T]``. With
    ``limit`` (EasyRec's ``eval_config.num_examples``), only the first ``limit`` rows."""
    call = _probabilities(model, reader.feature_spec())
    labels, probs, kept = [], [], {k: [] for k in reader.raw_columns}
    seen = 0
    for features, y, raw in reader.dataset():
        labels.append(np.asarray(y))
        probs.append(call(features).numpy())
        for k, values in raw.items():
            kept[k].append(values.numpy())
        seen += len(labels[-1])
        if limit is not None and seen >= limit:
            break
    if limit is not None and seen > limit:  # the last batch's surplus
        cut = len(labels[-1]) - (seen - limit)
        labels[-1], probs[-1] = labels[-1][:cut], probs[-1][:cut]
        for k in kept:
            kept[k][-1] = kept[k][-1][:cut]
    return (
        np.concatenate(labels),
        np.concatenate(probs),
        {k: np.concatenate(v) for k, v in kept.items()},
    )


def evaluate(
    config: PipelineConfig,
    model_dir: str | Path,
    eval_days: list[str],
    checkpoint: str | Path | None = None,
    result_path: str | Path | None = None,
    predictions_path: str | Path | None = None,
) -> dict:
    """Score ``eval_days`` with ``checkpoint`` (default: what the export task exports,
    ``trainer.best_exporter.export_checkpoint``: model_dir's latest, or its best) and write
    ``result_path`` (default ``<model_dir>/eval_result.json``, atomically) with the metrics,
    step and checkpoint. Days also in ``train_ds`` contribute only their held-out rows.

    With ``predictions_path``, the rows' ``label`` and ``probability`` (float32, in the
    readers' fixed order: two checkpoints scored on the same days give aligned files) go to
    that Parquet file, for the gate's paired test (``recpipe.stats``)."""
    path = resolve(checkpoint) if checkpoint else export_checkpoint(config, model_dir)
    model, step = load_model(config, path)
    return score(config, model, step, path, model_dir, eval_days, result_path, predictions_path)


def score(
    config: PipelineConfig,
    model: RankingModel,
    step: int,
    checkpoint: str,
    model_dir: str | Path,
    eval_days: list[str],
    result_path: str | Path | None = None,
    predictions_path: str | Path | None = None,
) -> dict:
    """``evaluate`` of a model already in this process (``checkpoint``: where its variables
    came from, recorded with ``step``): a stream pass's train job scores the pass with the
    model it starts from before training on it (PaddleRec's progressive validation), with no
    process, restore or config load of its own. Writes and returns what ``evaluate`` does.
    Rows are scored ``max(data_config.batch_size, SCORE_BATCH_ROWS)`` at a time."""
    model_dir = Path(model_dir)
    path = checkpoint
    partitions, holdout = holdout_split(config, eval_days, "eval")
    metrics_sets = [config.eval_config.metrics_set] + [t.metrics_set for t in config.model.tasks]
    groups = list(dict.fromkeys(m.group_field for ms in metrics_sets for m in ms if m.group_field))
    # GAUC groups by the raw ids: hashed ones could merge users that share a bucket
    reader = FeatureReader(
        config,
        partitions,
        batch_size=max(config.data_config.batch_size, SCORE_BATCH_ROWS),
        shuffle=False,
        holdout=holdout,
        raw_columns=tuple(groups),
    )
    labels, probs, kept = predict(model, reader, config.eval_config.num_examples)
    columns = {}
    if probs.ndim == 2:  # a multi-task model: each task's metrics as <task>/<metric>
        tasks, names = config.model.tasks, config.model.task_names
        targets = task_targets(labels, config.task_labels()).numpy()
        metrics = {}
        for t, (task, name) in enumerate(zip(tasks, names, strict=True)):
            chosen = task.metrics_set or config.eval_config.metrics_set
            got = compute_metrics(chosen, targets[:, t], probs[:, t], kept)
            metrics.update({f"{name}/{k}": v for k, v in got.items()})
            columns[f"label_{name}"], columns[f"probability_{name}"] = targets[:, t], probs[:, t]
        # the first task's, unprefixed as well: what a single-task reader (the gate) expects
        metrics.update({k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith(f"{names[0]}/")})
        labels, probs = targets[:, 0], probs[:, 0]
    else:
        metrics = compute_metrics(config.eval_config.metrics_set, labels, probs, kept)
    result = {
        "global_step": step,
        "checkpoint": path,
        "eval_days": [partition_ds(p) for p in partitions],
        "num_examples": int(labels.size),
        **metrics,
    }
    if predictions_path is not None:
        table = pa.table(
            {
                "label": labels.astype(np.float32),
                "probability": probs.astype(np.float32),
                **{k: v.astype(np.float32) for k, v in columns.items()},
            }
        )
        with atomic.file(predictions_path) as tmp:
            pq.write_table(table, tmp)
    atomic.write_text(result_path or ModelDir(model_dir).eval_result, json.dumps(result, indent=2))
    log.info(
        "eval at step %d on %d examples: %s",
        step,
        labels.size,
        {k: v for k, v in result.items() if isinstance(v, float)},
    )
    return result
