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


def _drifting_day(rng, passes: int = 8, rows: int = 300):
    """A stream day whose base rate moves (10 % positives in the first pass, 60 % in the last)
    and whose progressive scores come from a model per pass: each pass's model ranks its rows
    well, but its base rate lags the data's (a cold model lowering its bias while the day's
    positives rise), so its scores fall pass by pass while the labels rise. The champion, one
    model, ranks rows less well within a pass but keeps one scale all day."""
    y, candidate, champion, groups = [], [], [], []
    for p in range(passes):
        rate = 0.1 + 0.5 * p / (passes - 1)
        labels = (rng.random(rows) < rate).astype(np.float32)
        y.append(labels)
        candidate.append(labels * 1.5 + rng.normal(0, 1.0, rows) - 0.8 * p)  # drifting down
        champion.append(labels * 0.9 + rng.normal(0, 1.0, rows))
        groups.append(np.full(rows, p))
    return (np.concatenate(v) for v in (y, candidate, champion, groups))


def test_a_stream_day_whose_base_rate_moves_is_gated_within_passes(tmp_path):
    """The pooled AUC of progressive scores ranks the passes by their models' drifting base
    rates and calls the better model worse; within passes (the passes' AUCs by their rows) the
    gate sees each pass's rows ranked by the model that scored them, as the champion's are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from operators.gate import paired_scores
    from recpipe.stats import grouped_auc, stratified_paired_auc_test

    rng = np.random.default_rng(7)
    y, candidate, champion, groups = _drifting_day(rng)
    pooled = paired_auc_test(y, champion, candidate)
    assert pooled.auc_b < pooled.auc_a and pooled.ci_high < 0  # pooled: "significantly worse"
    within = stratified_paired_auc_test(y, champion, candidate, groups)
    assert within.auc_b > within.auc_a and within.ci_low > 0 and within.strata == 8
    assert within.auc_b == pytest.approx(grouped_auc(y, candidate, groups))
    # each stratum's AUC is the plain AUC of its rows; a one-class pass counts for nothing
    first = groups == 0
    assert grouped_auc(y[first], candidate[first], groups[first]) == pytest.approx(
        auc(y[first], candidate[first])
    )
    y_one = np.where(groups == 1, 0.0, y)
    assert stratified_paired_auc_test(y_one, champion, candidate, groups).strata == 7

    # through the gate, from the two evaluations' files as the day's close writes them
    new, old = tmp_path / "day.parquet", tmp_path / "champion.parquet"
    pq.write_table(pa.table({"label": y, "probability": candidate, "pass": groups.astype(np.int32)}), new)
    pq.write_table(pa.table({"label": y, "probability": champion}), old)
    paired, _ = paired_scores(str(old), str(new), 0.95)
    assert paired.strata == 8
    rules = GateConfig(tolerance=0.002, min_positives=30, min_negatives=30)
    decision = gate({"auc": pooled.auc_b}, {"auc": pooled.auc_a}, rules, paired)
    assert decision.outcome == PROMOTED and "within 8 passes" in decision.reason, decision.reason


def test_the_days_pooled_rows_carry_their_pass(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.metrics import pooled_eval

    rng = np.random.default_rng(8)
    y, candidate, _, groups = _drifting_day(rng, passes=3, rows=50)
    files = []
    for p in range(3):
        rows = groups == p
        files.append(tmp_path / f"pass-{p}.parquet")
        pq.write_table(pa.table({"label": y[rows], "probability": candidate[rows]}), files[-1])
    out = pooled_eval(files, tmp_path / "day.parquet")
    table = pq.read_table(out["predictions"])
    assert table.column("pass").to_pylist() == groups.tolist()
    from recpipe.stats import grouped_auc

    assert out["metrics"]["pass_auc"] == pytest.approx(grouped_auc(y, candidate, groups))
    assert out["metrics"]["auc"] == pytest.approx(auc(y, candidate))
