"""A paired test of two ROC AUCs on the same rows: DeLong, DeLong & Clarke-Pearson (1988),
"Comparing the areas under two or more correlated receiver operating characteristic curves: a
nonparametric approach", Biometrics 44(3):837-845, with the midrank computation of Sun & Xu
(2014), "Fast implementation of DeLong's algorithm", IEEE Signal Processing Letters 21(11).

The promotion gate uses it to tell a real AUC difference between champion and candidate from
the noise of a small held-out set."""

# Imports inside functions: scipy (1.4 s to import) is imported where ranks are taken: the DAG
# files that wire the gate parse without it.

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np


@dataclass(frozen=True)
class PairedAUC:
    """Two AUCs on the same rows and their difference ``b - a`` with its standard error,
    ``confidence`` interval and two-sided p-value (normal approximation)."""

    auc_a: float
    auc_b: float
    diff: float
    se: float
    ci_low: float
    ci_high: float
    p_value: float
    confidence: float
    positives: int
    negatives: int

    def as_dict(self) -> dict:
        return asdict(self)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the Mann-Whitney U statistic with average ranks for ties: ``labels`` ``[N]``
    (values > 0.5 count as positive), ``scores`` ``[N]``. NaN when only one class is present."""
    from scipy.stats import rankdata  # 1.4 s to import: the DAG file that wires the gate must parse fast

    y = np.asarray(labels) > 0.5
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _components(scores: np.ndarray, positive: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """AUC and DeLong's structural components: ``v10`` per positive (the share of negatives
    it outranks, ties counted half), ``v01`` per negative (the share of positives above it)."""
    from scipy.stats import rankdata  # 1.4 s to import: the DAG file that wires the gate must parse fast

    m, n = int(positive.sum()), int((~positive).sum())
    ranks = rankdata(scores)
    ranks_pos, ranks_neg = rankdata(scores[positive]), rankdata(scores[~positive])
    v10 = (ranks[positive] - ranks_pos) / n
    v01 = 1.0 - (ranks[~positive] - ranks_neg) / m
    return float(v10.mean()), v10, v01


def paired_auc_test(
    labels: np.ndarray, scores_a: np.ndarray, scores_b: np.ndarray, confidence: float = 0.95
) -> PairedAUC:
    """DeLong's test of ``AUC(b) - AUC(a)`` on the same rows.

    Args:
        labels: ``[N]`` in {0, 1} (values > 0.5 count as positive).
        scores_a, scores_b: ``[N]`` scores of the two models on the same rows, in the same order.
        confidence: the interval's coverage, in (0, 1).

    Returns:
        ``PairedAUC``; with fewer than two positives or two negatives the variance is
        undefined: ``se``, the interval and the p-value are NaN.

    Raises:
        ValueError: the arrays differ in length, or ``confidence`` is not in (0, 1).
    """
    y = np.asarray(labels) > 0.5
    a, b = np.asarray(scores_a, dtype=np.float64), np.asarray(scores_b, dtype=np.float64)
    if not (y.shape == a.shape == b.shape) or y.ndim != 1:
        raise ValueError(f"labels {y.shape} and scores {a.shape}, {b.shape} must be [N] each")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence}: expected a value in (0, 1)")
    m, n = int(y.sum()), int((~y).sum())
    nan = float("nan")
    if m == 0 or n == 0:
        return PairedAUC(nan, nan, nan, nan, nan, nan, nan, confidence, m, n)
    auc_a, v10_a, v01_a = _components(a, y)
    auc_b, v10_b, v01_b = _components(b, y)
    diff = auc_b - auc_a
    if m < 2 or n < 2:
        return PairedAUC(auc_a, auc_b, diff, nan, nan, nan, nan, confidence, m, n)
    s10 = np.cov(np.stack([v10_a, v10_b]))  # over positives
    s01 = np.cov(np.stack([v01_a, v01_b]))  # over negatives
    cov = s10 / m + s01 / n
    var = float(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1])
    se = math.sqrt(max(var, 0.0))
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    if se == 0.0:  # identical rankings: no difference, and no doubt about it
        p = 1.0 if diff == 0 else 0.0
        return PairedAUC(auc_a, auc_b, diff, 0.0, diff, diff, p, confidence, m, n)
    p_value = 2 * (1 - NormalDist().cdf(abs(diff) / se))
    return PairedAUC(auc_a, auc_b, diff, se, diff - z * se, diff + z * se, p_value, confidence, m, n)
