"""The promotion gate: may the new model take the ``champion`` alias?

Rules, in order (``gate.*`` in the retrain config):

1. Never promoted: no metric, a metric that is not finite (a diverged model), or one below
   ``min_metric`` (0.5 for AUC: no better than chance). Champion or not.
2. No champion scored on these rows: promoted.
3. With each row's scores of both models (``auc``): DeLong's paired test of the difference
   (``recpipe.stats``). Fewer than ``min_positives`` / ``min_negatives`` held-out labels, or
   a difference whose ``confidence`` interval holds 0 (not significant), is *inconclusive*:
   ``inconclusive`` decides (``keep_champion``, the default, or ``promote``). A significant
   difference is promoted unless the candidate is worse by more than ``tolerance``.
4. Without them (``gauc``, or scores of different rows): promoted unless worse than the
   champion by more than ``tolerance``.
"""

# Imports inside functions defer numpy and pyarrow off the DAG files'
# parse.

from __future__ import annotations

import math
from pathlib import Path

from recpipe.config.retrain import GateConfig
from recpipe.registry import INCONCLUSIVE, PROMOTED, REJECTED, GateDecision
from recpipe.stats import PairedAUC, paired_auc_test, stratified_paired_auc_test

__all__ = [
    "INCONCLUSIVE", "PROMOTED", "REJECTED", "POLICY_PROMOTE", "GateDecision", "gate", "paired_scores",
    "class_counts",
]  # fmt: skip


def gate(
    candidate: dict | None,
    champion: dict | None,
    rules: GateConfig,
    paired: PairedAUC | None = None,
    held_out: tuple[int, int] | None = None,
) -> GateDecision:
    """Decide on promotion.

    Args:
        candidate: the new model's metrics on the day's held-out rows (``{"auc": ...}``).
        champion: the champion's metrics on the same rows, or None when there is no champion.
        rules: the gate's settings (the retrain config's ``gate``).
        paired: DeLong's test of the two models on the same rows (``paired_scores``), or None.
        held_out: (positives, negatives) of the held-out rows (``class_counts``), or None.
            A window of one class has no AUC: inconclusive, not rejected, so that
            ``max_inconclusive_days`` counts it.
    """
    metric, tolerance = rules.metric, rules.tolerance
    if not candidate or metric not in candidate:
        return GateDecision(REJECTED, False, f"the new model has no {metric} on the eval data")
    new = candidate[metric]
    if new is None and held_out is not None:
        positives, negatives = held_out
        if not (positives and negatives):
            promote_anyway = rules.inconclusive == "promote"
            policy = POLICY_PROMOTE if promote_anyway else "the champion stays"
            reason = (
                f"inconclusive: {positives} positives and {negatives} negatives held out, no {metric} "
                f"to compare; {policy}"
            )
            numbers = {"positives": positives, "negatives": negatives}
            return GateDecision(INCONCLUSIVE, promote_anyway, reason, numbers)
    if new is None or not math.isfinite(new):
        return GateDecision(REJECTED, False, f"new {metric}={new} is not a finite number")
    if new < rules.min_metric:
        return GateDecision(
            REJECTED, False, f"new {metric}={new:.4f} is below the floor gate.min_metric={rules.min_metric}"
        )
    old = (champion or {}).get(metric)
    if old is None or not math.isfinite(old):
        first = GateDecision(
            PROMOTED,
            True,
            f"no champion {metric} on these rows; new {metric}={new:.4f} >= floor {rules.min_metric}",
        )
        return _guarded(first, candidate, champion or {}, rules)
    if paired is not None and metric.rsplit("/", 1)[-1] == "auc":
        return _guarded(_paired(paired, rules), candidate, champion, rules)
    if new >= old - tolerance:
        return _guarded(
            GateDecision(
                PROMOTED, True, f"new {metric}={new:.4f} >= champion {old:.4f} - tolerance {tolerance}"
            ),
            candidate,
            champion,
            rules,
        )
    return GateDecision(
        REJECTED,
        False,
        f"new {metric}={new:.4f} is worse than champion {old:.4f} by {old - new:.4f} > tolerance {tolerance}",
    )


def _guarded(decision: GateDecision, candidate: dict, champion: dict, rules: GateConfig) -> GateDecision:
    """``decision``, unless it promotes and a ``guard_tasks`` task loses more than
    ``tolerance`` of the gate's metric (``<task>/<auc|gauc>``) against the champion, or the
    new model has no such metric: then rejected, naming the task."""
    if not decision.promote or not rules.guard_tasks:
        return decision
    base = rules.metric.rsplit("/", 1)[-1]
    for task in rules.guard_tasks:
        key = f"{task}/{base}"
        new, old = candidate.get(key), champion.get(key)
        if new is None or not math.isfinite(new):
            return GateDecision(REJECTED, False, f"gate.guard_tasks: the new model has no finite {key}")
        if old is not None and math.isfinite(old) and new < old - rules.tolerance:
            reason = (
                f"gate.guard_tasks: {key}={new:.4f} is worse than the champion's {old:.4f} by "
                f"{old - new:.4f} > tolerance {rules.tolerance} (the gate's own: {decision.reason})"
            )
            return GateDecision(REJECTED, False, reason, decision.numbers)
    return decision


POLICY_PROMOTE = "promoted (gate.inconclusive: promote)"  # what an inconclusive gate does by config


def _paired(p: PairedAUC, rules: GateConfig) -> GateDecision:
    numbers = {k: v for k, v in p.as_dict().items() if k != "confidence"}
    ci = f"{p.diff:+.4f} [{p.ci_low:+.4f}, {p.ci_high:+.4f}] at {rules.confidence:.0%}"
    if p.strata:
        ci += f" within {p.strata} passes"
    promote_anyway = rules.inconclusive == "promote"
    policy = POLICY_PROMOTE if promote_anyway else "the champion stays"
    if p.positives < rules.min_positives or p.negatives < rules.min_negatives:
        reason = (
            f"inconclusive: {p.positives} positives and {p.negatives} negatives held out, fewer than "
            f"gate.min_positives={rules.min_positives} / min_negatives={rules.min_negatives}; {policy}"
        )
        return GateDecision(INCONCLUSIVE, promote_anyway, reason, numbers)
    if not (p.ci_low > 0 or p.ci_high < 0):
        reason = f"inconclusive: AUC difference {ci} (DeLong, p={p.p_value:.3f}) is not significant; {policy}"
        return GateDecision(INCONCLUSIVE, promote_anyway, reason, numbers)
    if p.diff >= -rules.tolerance:
        return GateDecision(
            PROMOTED,
            True,
            f"AUC difference {ci} (DeLong, p={p.p_value:.3g}) >= -tolerance {rules.tolerance}",
            numbers,
        )
    reason = (
        f"significantly worse: AUC difference {ci} (DeLong, p={p.p_value:.3g}) < -tolerance {rules.tolerance}"
    )
    return GateDecision(REJECTED, False, reason, numbers)


def paired_scores(
    champion_predictions: str | None,
    candidate_predictions: str | None,
    confidence: float,
    task: str | None = None,
):
    """DeLong's test from the two evaluations' per-row files (``EvalOperator``'s
    ``predictions``), or None with why not (a file missing, or the rows differ). ``task``:
    a multi-task model's task (its ``label_<task>`` / ``probability_<task>`` columns). When
    the candidate's rows carry a ``pass`` column (a stream day's progressive scores, each
    pass scored by another model: ``trainer.metrics.pooled_eval``), the test is taken within
    passes (``recpipe.stats.stratified_paired_auc_test``): the pooled AUC of such rows ranks
    the passes by their models' base rates, not the rows."""
    import numpy as np
    import pyarrow.parquet as pq

    paths = [Path(p) if p else None for p in (champion_predictions, candidate_predictions)]
    if not all(p is not None and p.exists() for p in paths):
        return None, "no per-row scores of both models"
    old, new = (pq.read_table(p).to_pydict() for p in paths)
    label, prob = (f"label_{task}", f"probability_{task}") if task else ("label", "probability")
    if label not in old or label not in new:
        return None, f"no {label} column in both evaluations"
    if len(old[label]) != len(new[label]) or old[label] != new[label]:
        return None, "the two evaluations scored different rows"
    labels = np.asarray(new[label])
    if "pass" in new:
        groups = np.asarray(new["pass"])
        return stratified_paired_auc_test(
            labels, np.asarray(old[prob]), np.asarray(new[prob]), groups, confidence
        ), ""
    return paired_auc_test(labels, np.asarray(old[prob]), np.asarray(new[prob]), confidence), ""


def class_counts(predictions: str | None, task: str | None = None) -> tuple[int, int] | None:
    """(positives, negatives) among an evaluation's scored rows (its per-row ``predictions``
    file: ``label`` or ``label_<task>``), or None when the file is missing."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if not predictions or not Path(predictions).exists():
        return None
    labels = pq.read_table(predictions, columns=[f"label_{task}" if task else "label"]).column(0)
    positives = int(pc.sum(pc.greater(labels, 0.5)).as_py() or 0)
    return positives, len(labels) - positives
