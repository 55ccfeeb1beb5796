"""Exact evaluation metrics over a whole eval set (numpy), not averages of per-batch values.

Inputs: labels ``[N]`` in {0, 1} (soft labels are thresholded at 0.5 for AUC), probabilities
``[N]`` in [0, 1], and for gAUC a group key per row.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

from recpipe.config.model import Metric


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the Mann-Whitney U statistic with average ranks for ties.

    Returns NaN when only one class is present.
    """
    y = np.asarray(labels) > 0.5
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


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
