"""DeLong's paired AUC test against what it must agree with: the exact AUCs, a bootstrap of
the same rows, and the edge cases; then the gate's outcomes built on it."""

from __future__ import annotations

import numpy as np
import pytest

from operators.gate import INCONCLUSIVE, PROMOTED, REJECTED, gate
from recpipe.config.retrain import GateConfig
from recpipe.stats import auc, paired_auc_test


def _scores(rng, n=2000, rate=0.3, strength_a=1.0, strength_b=1.2):
    y = (rng.random(n) < rate).astype(np.float32)
    shared = rng.normal(0, 1.0, n)  # the two models see much the same noise: correlated
    a = y * strength_a + shared + rng.normal(0, 0.5, n)
    b = y * strength_b + shared + rng.normal(0, 0.5, n)
    return y, a, b


def test_aucs_and_standard_error_match_the_exact_auc_and_a_bootstrap():
    rng = np.random.default_rng(7)
    y, a, b = _scores(rng)
    result = paired_auc_test(y, a, b)
    assert result.auc_a == pytest.approx(auc(y, a), abs=1e-12)
    assert result.auc_b == pytest.approx(auc(y, b), abs=1e-12)
    assert result.positives + result.negatives == 2000
    diffs = []
    for _ in range(400):
        i = rng.integers(0, y.size, y.size)
        diffs.append(auc(y[i], b[i]) - auc(y[i], a[i]))
    assert result.se == pytest.approx(np.std(diffs), rel=0.15)
    assert result.ci_low < result.diff < result.ci_high and result.p_value < 0.01
    # swapping the models mirrors the difference and keeps its doubt
    swapped = paired_auc_test(y, b, a)
    assert swapped.diff == pytest.approx(-result.diff) and swapped.se == pytest.approx(result.se)


def test_edge_cases():
    y = np.array([0, 1, 0, 1, 1, 0], dtype=np.float32)
    s = np.array([0.1, 0.9, 0.2, 0.8, 0.7, 0.3])
    same = paired_auc_test(y, s, s)
    assert same.diff == 0 and same.se == 0 and same.p_value == 1.0
    one_class = paired_auc_test(np.ones(4), s[:4], s[:4])
    assert np.isnan(one_class.auc_a) and one_class.negatives == 0
    with pytest.raises(ValueError, match="confidence=1.5"):
        paired_auc_test(y, s, s, confidence=1.5)
    with pytest.raises(ValueError, match="must be"):
        paired_auc_test(y, s, s[:3])


def test_gate_outcomes_on_paired_scores():
    rng = np.random.default_rng(3)
    rules = GateConfig(tolerance=0.002, min_positives=30, min_negatives=30)
    y, a, b = _scores(rng)
    better = paired_auc_test(y, a, b)
    decision = gate({"auc": better.auc_b}, {"auc": better.auc_a}, rules, better)
    assert decision.outcome == PROMOTED and "DeLong" in decision.reason
    assert decision.numbers["ci_low"] > 0
    worse = paired_auc_test(y, b, a)
    decision = gate({"auc": worse.auc_b}, {"auc": worse.auc_a}, rules, worse)
    assert decision.outcome == REJECTED and decision.reason.startswith("significantly worse")
    # the same models on 150 rows: the difference is noise
    noise = paired_auc_test(y[:150], a[:150], b[:150])
    decision = gate({"auc": noise.auc_b}, {"auc": noise.auc_a}, rules, noise)
    assert decision.outcome == INCONCLUSIVE and not decision.promote and "not significant" in decision.reason
    promote = rules.model_copy(update={"inconclusive": "promote"})
    assert gate({"auc": noise.auc_b}, {"auc": noise.auc_a}, promote, noise).promote
    # a low-positive sample (TalkingData's 0.2 %): too few labels to tell, whatever the AUCs
    rare_y, rare_a, rare_b = _scores(rng, n=5000, rate=0.003, strength_b=3.0)
    rare = paired_auc_test(rare_y, rare_a, rare_b)
    decision = gate({"auc": rare.auc_b}, {"auc": rare.auc_a}, rules, rare)
    assert decision.outcome == INCONCLUSIVE and f"{rare.positives} positives" in decision.reason
    assert rare.positives < 30
