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


def gauc(
    labels: np.ndarray, scores: np.ndarray, groups: np.ndarray, reduction: str = "mean_by_sample_num"
) -> float:
    """Group AUC: per-group AUC over the groups that hold both classes, reduced by
    ``reduction``: ``mean`` (each group alike), ``mean_by_sample_num`` (weighted by its rows)
    or ``mean_by_positive_num`` (by its positives): EasyRec's ``gauc`` and ``session_auc``.
    NaN when no group holds both classes.

    Raises:
        ValueError: another ``reduction``.
    """
    if reduction not in ("mean", "mean_by_sample_num", "mean_by_positive_num"):
        raise ValueError(
            f"gauc reduction: mean, mean_by_sample_num or mean_by_positive_num, got {reduction!r}"
        )
    return grouped_auc(labels, scores, groups, reduction)


def max_f1(labels: np.ndarray, probs: np.ndarray) -> float:
    """The largest F1 over every threshold: rows at or above a score count as positive,
    each distinct score tried (exact; 0 without a positive label)."""
    y = np.asarray(labels) > 0.5
    positives = int(y.sum())
    if positives == 0:
        return 0.0
    order = np.argsort(-np.asarray(probs), kind="stable")
    s, hits = np.asarray(probs)[order], y[order]
    tp = np.cumsum(hits)
    # the last row of each run of equal scores: thresholds fall between distinct scores
    ends = np.append(np.flatnonzero(s[1:] != s[:-1]), s.size - 1)
    tp, predicted = tp[ends], ends + 1
    return float(np.max(2 * tp / (predicted + positives)))


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
        groups: feature name -> per-row values, for ``gauc``'s ``uid_field`` and
            ``session_auc``'s ``session_id_field``.

    Raises:
        KeyError: a grouped AUC's field is not among ``groups``.
    """
    out: dict[str, float] = {}
    error = np.asarray(labels, np.float64) - np.asarray(probs, np.float64)
    for metric in metrics_set:
        which, c = metric.which(), metric.value()
        if which == "auc":
            out["auc"] = auc(labels, probs)
        elif which in ("gauc", "session_auc"):
            field = metric.group_field
            if field not in groups:
                named = "uid_field" if which == "gauc" else "session_id_field"
                raise KeyError(f"eval_config.metrics_set: {which} {named} {field!r} is not a feature")
            out[which] = gauc(labels, probs, groups[field], c.reduction)
        elif which == "logloss":
            out["logloss"] = logloss(labels, probs)
        elif which == "max_f1":
            out["max_f1"] = max_f1(labels, probs)
        elif which == "mean_absolute_error":
            out[which] = float(np.mean(np.abs(error)))
        elif which == "mean_squared_error":
            out[which] = float(np.mean(error**2))
        elif which == "root_mean_squared_error":
            out[which] = float(np.sqrt(np.mean(error**2)))
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
