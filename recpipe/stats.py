"""A paired test of two ROC AUCs on the same rows: DeLong, DeLong & Clarke-Pearson (1988),
"Comparing the areas under two or more correlated receiver operating characteristic curves: a
nonparametric approach", Biometrics 44(3):837-845, with the midrank computation of Sun & Xu
(2014), "Fast implementation of DeLong's algorithm", IEEE Signal Processing Letters 21(11).

The promotion gate uses it to tell a real AUC difference between champion and candidate from
the noise of a small held-out set."""

# Imports inside functions: scipy, slow to import, is imported where ranks are taken: the DAG
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
    strata: int = 0  # groups the AUCs were taken within (0: all rows ranked together)

    def as_dict(self) -> dict:
        return asdict(self)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the Mann-Whitney U statistic with average ranks for ties: ``labels`` ``[N]``
    (values > 0.5 count as positive), ``scores`` ``[N]``. NaN when only one class is present."""
    from scipy.stats import rankdata  # slow to import: the DAG file that wires the gate must parse fast

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
    from scipy.stats import rankdata  # slow to import: the DAG file that wires the gate must parse fast

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
    return _tested(auc_a, auc_b, var, confidence, m, n)


def _tested(
    auc_a: float, auc_b: float, var: float, confidence: float, m: int, n: int, strata: int = 0
) -> PairedAUC:
    """The difference ``auc_b - auc_a`` with variance ``var``: its interval and p-value."""
    diff = auc_b - auc_a
    se = math.sqrt(max(var, 0.0))
    if se == 0.0:  # identical rankings: no difference, and no doubt about it
        p = 1.0 if diff == 0 else 0.0
        return PairedAUC(auc_a, auc_b, diff, 0.0, diff, diff, p, confidence, m, n, strata)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p_value = 2 * (1 - NormalDist().cdf(abs(diff) / se))
    return PairedAUC(auc_a, auc_b, diff, se, diff - z * se, diff + z * se, p_value, confidence, m, n, strata)


def stratified_paired_auc_test(
    labels: np.ndarray,
    scores_a: np.ndarray,
    scores_b: np.ndarray,
    groups: np.ndarray,
    confidence: float = 0.95,
) -> PairedAUC:
    """DeLong's paired test within strata: ``AUC(b) - AUC(a)`` where each AUC ranks rows only
    against rows of the same group (a stream day's pass, scored by one model), the groups'
    AUCs weighted by their rows. Per group ``g`` with at least two rows of each class, DeLong's
    difference ``d_g`` and variance ``v_g``; then ``d = sum w_g d_g`` and ``var = sum w_g^2
    v_g`` (groups are independent samples), ``w_g = n_g / sum n``. Other groups carry no
    ranking DeLong can measure and are left out (their rows do not count). The pooled AUC of
    rows scored by models whose base rates drift ranks the groups, not the rows (a cold
    model's early passes score every row higher); this one does not.

    Args:
        labels, scores_a, scores_b: ``[N]`` as ``paired_auc_test``'s.
        groups: ``[N]`` the group of each row (any hashable values; a pass id).
        confidence: the interval's coverage, in (0, 1).

    Returns:
        ``PairedAUC`` (``auc_a`` / ``auc_b``: the row-weighted AUCs within groups;
        ``positives`` / ``negatives``: of the groups counted); NaN throughout when no group has
        both classes.

    Raises:
        ValueError: as ``paired_auc_test``; ``groups`` of another length.
    """
    y = np.asarray(labels) > 0.5
    a, b, g = np.asarray(scores_a, np.float64), np.asarray(scores_b, np.float64), np.asarray(groups)
    if not (y.shape == a.shape == b.shape == g.shape) or y.ndim != 1:
        raise ValueError(
            f"labels {y.shape}, scores {a.shape}, {b.shape} and groups {g.shape} must be [N] each"
        )
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence}: expected a value in (0, 1)")
    parts = []
    for group in np.unique(g):
        rows = g == group
        m = int(y[rows].sum())
        if 2 <= m <= int(rows.sum()) - 2:
            parts.append((int(rows.sum()), paired_auc_test(y[rows], a[rows], b[rows], confidence)))
    nan = float("nan")
    if not parts:
        return PairedAUC(nan, nan, nan, nan, nan, nan, nan, confidence, 0, 0, 0)
    total = sum(n for n, _ in parts)
    weights = [n / total for n, _ in parts]
    auc_a = sum(w * p.auc_a for w, (_, p) in zip(weights, parts, strict=True))
    auc_b = sum(w * p.auc_b for w, (_, p) in zip(weights, parts, strict=True))
    positives = sum(p.positives for _, p in parts)
    negatives = sum(p.negatives for _, p in parts)
    var = sum(w * w * p.se**2 for w, (_, p) in zip(weights, parts, strict=True))
    return _tested(auc_a, auc_b, var, confidence, positives, negatives, len(parts))


def group_aucs(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each group's ROC AUC at once, as ``auc`` takes it within the group (Mann-Whitney U,
    average ranks for ties): ``labels``, ``scores``, ``groups`` ``[N]`` (values > 0.5 count as
    positive). Returns ``(auc float64 [G], rows int64 [G], positives int64 [G])`` in the
    groups' sorted order; a group with one class only has a NaN AUC. One sort of the rows by
    (group, score), not one rank per group: thousands of users' gAUC in milliseconds."""
    y, s, g = np.asarray(labels) > 0.5, np.asarray(scores), np.asarray(groups)
    if y.size == 0:
        empty = np.zeros(0, np.int64)
        return np.zeros(0), empty, empty
    g = np.unique(g, return_inverse=True)[1].reshape(-1)  # raw ids (bytes objects) as codes
    order = np.lexsort((s, g))
    y, s, g = y[order], s[order], g[order]
    n = y.size
    new_group = np.ones(n, bool)
    new_group[1:] = g[1:] != g[:-1]
    starts = np.flatnonzero(new_group)
    # rank within the group, 1-based, then ties (same group and score) given their mean rank
    rank = np.arange(n) - starts[np.cumsum(new_group) - 1] + 1.0
    new_run = new_group.copy()
    new_run[1:] |= s[1:] != s[:-1]
    runs = np.flatnonzero(new_run)
    ends = np.append(runs[1:], n)
    mean_rank = (rank[runs] + rank[ends - 1]) / 2
    rank = np.repeat(mean_rank, ends - runs)
    rows = np.diff(np.append(starts, n))
    positives = np.add.reduceat(y.astype(np.int64), starts)
    ranked = np.add.reduceat(np.where(y, rank, 0.0), starts)
    negatives = rows - positives
    with np.errstate(divide="ignore", invalid="ignore"):
        aucs = (ranked - positives * (positives + 1) / 2) / (positives * negatives)
    aucs[(positives == 0) | (negatives == 0)] = np.nan
    return aucs, rows, positives


def grouped_auc(
    labels: np.ndarray, scores: np.ndarray, groups: np.ndarray, reduction: str = "mean_by_sample_num"
) -> float:
    """The mean of each group's AUC (``[N]`` each, ``group_aucs``) over the groups holding both
    classes, weighted by ``reduction``: ``mean_by_sample_num`` (a group's rows), ``mean`` (each
    group alike) or ``mean_by_positive_num`` (its positives); NaN when no group holds both. A
    stream day's ``pass_auc`` (rows ranked against rows scored by the same model) and EasyRec's
    ``gauc`` / ``session_auc`` (``trainer.metrics.gauc``)."""
    aucs, rows, positives = group_aucs(labels, scores, groups)
    weights = {"mean": np.ones_like(rows), "mean_by_sample_num": rows, "mean_by_positive_num": positives}
    both = ~np.isnan(aucs)
    weight = weights[reduction][both]
    if not weight.sum():
        return float("nan")
    return float((aucs[both] * weight).sum() / weight.sum())
