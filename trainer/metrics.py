"""Exact evaluation metrics over a whole eval set (numpy), not averages of per-batch values.

Inputs: labels ``[N]`` in {0, 1} (soft labels are thresholded at 0.5 for AUC), probabilities
``[N]`` in [0, 1], and for gAUC a group key per row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recpipe import atomic
from recpipe.config.model import Metric
from recpipe.stats import auc, grouped_auc


def gauc(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> float:
    """Group AUC: per-group AUC weighted by the group's row count, over groups that hold both
    classes (as EasyRec's ``gauc`` grouped by ``uid_field``)."""
    order = np.argsort(groups, kind="stable")
    g, y, s = np.asarray(groups)[order], np.asarray(labels)[order], np.asarray(scores)[order]
    bounds = np.flatnonzero(g[1:] != g[:-1]) + 1
    total, weight = 0.0, 0
    for ys, ss in zip(np.split(y, bounds), np.split(s, bounds), strict=True):
        value = auc(ys, ss)
        if not np.isnan(value):
            total += value * ys.size
            weight += ys.size
    return total / weight if weight else float("nan")


def logloss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross entropy, probabilities clipped to [eps, 1 - eps]."""
    p = np.clip(probs, eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def _confusion(labels, probs, threshold):
    y, pred = np.asarray(labels) > 0.5, np.asarray(probs) >= threshold
    return (y & pred).sum(), (~y & pred).sum(), (y & ~pred).sum(), (~y & ~pred).sum()


def compute_metrics(
    metrics_set: list[Metric], labels: np.ndarray, probs: np.ndarray, groups: dict[str, np.ndarray]
) -> dict[str, float]:
    """Every metric of ``eval_config.metrics_set``.

    Args:
        groups: feature name -> per-row values, for gAUC's ``uid_field``.

    Raises:
        KeyError: gAUC's ``uid_field`` is not among ``groups``.
    """
    out: dict[str, float] = {}
    for metric in metrics_set:
        which, c = metric.which(), metric.value()
        if which == "auc":
            out["auc"] = auc(labels, probs)
        elif which == "gauc":
            if c.uid_field not in groups:
                raise KeyError(f"eval_config.metrics_set: gauc uid_field {c.uid_field!r} is not a feature")
            out["gauc"] = gauc(labels, probs, groups[c.uid_field])
        elif which == "logloss":
            out["logloss"] = logloss(labels, probs)
        else:
            tp, fp, fn, tn = _confusion(labels, probs, c.threshold)
            if which == "accuracy":
                out["accuracy"] = float((tp + tn) / max(tp + fp + fn + tn, 1))
            elif which == "precision":
                out["precision"] = float(tp / (tp + fp)) if tp + fp else 0.0
            else:
                out["recall"] = float(tp / (tp + fn)) if tp + fn else 0.0
    return out


def pooled_eval(predictions: list[str | Path], out: str | Path) -> dict:
    """AUC and logloss of several evaluations' rows pooled (the stream DAG's day: each pass's
    progressive scores, ``pass_eval_predictions.parquet``), ``pass_auc`` (each evaluation's
    AUC, weighted by its rows: rows ranked against rows one model scored,
    ``recpipe.stats.grouped_auc``), and the pooled rows written to ``out`` (Parquet, ``label``,
    ``probability`` and ``pass``, the index of the file a row came from, int32; temporary
    file, then rename).

    Args:
        predictions: Parquet files with ``label`` (float) and ``probability`` (float) columns
            (and a multi-task model's ``label_<task>`` / ``probability_<task>``, pooled into
            ``<task>/auc`` and ``<task>/logloss``).
        out: the pooled file.

    Returns:
        ``{"metrics": {"auc", "pass_auc", "logloss"}, "num_examples", "predictions"}``; a metric that is not
        finite (one class only) is None.

    Raises:
        ValueError: no file given. OSError, pyarrow.ArrowInvalid: a file unreadable or
            without those columns.
    """

    if not predictions:
        raise ValueError("pooled_eval: no predictions to pool")
    # a multi-task model's files also hold label_<task> / probability_<task>: pooled per task
    first = pq.read_schema(predictions[0]).names
    tasks = [c[len("label_") :] for c in first if c.startswith("label_") and f"probability_{c[6:]}" in first]
    columns = ["label", "probability", *(f"{k}_{t}" for t in tasks for k in ("label", "probability"))]
    tables = [pq.read_table(p, columns=columns) for p in predictions]
    tables = [
        t.append_column("pass", pa.array(np.full(t.num_rows, i, np.int32))) for i, t in enumerate(tables)
    ]
    joined = pa.concat_tables(tables)
    labels = joined.column("label").to_numpy()
    probs = joined.column("probability").to_numpy()
    groups = joined.column("pass").to_numpy()
    metrics = {
        "auc": auc(labels, probs),
        "pass_auc": grouped_auc(labels, probs, groups),
        "logloss": logloss(labels, probs),
    }
    for t in tasks:
        y, p = joined.column(f"label_{t}").to_numpy(), joined.column(f"probability_{t}").to_numpy()
        metrics.update({f"{t}/auc": auc(y, p), f"{t}/logloss": logloss(y, p)})
    with atomic.file(Path(out)) as tmp:
        pq.write_table(joined, tmp)
    return {
        "metrics": {k: v if np.isfinite(v) else None for k, v in metrics.items()},
        "num_examples": int(len(labels)),
        "predictions": str(out),
    }
