"""Synthetic Criteo logs: schema, partitions, and a planted signal a model can find."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pytest
from sklearn.metrics import roc_auc_score

from dev.data.synth import COLUMNS, synth_criteo, synth_criteo_table


def test_partitions_and_schema(tmp_path):
    counts = synth_criteo(10_001, 3, tmp_path, start="2024-02-28")
    assert list(counts) == ["2024-02-28", "2024-02-29", "2024-03-01"] and sum(counts.values()) == 10_001
    day = pacsv.read_csv(tmp_path / "ds=2024-02-29" / "part-00000.csv")
    assert day.column_names == COLUMNS and (tmp_path / "ds=2024-02-29" / "_SUCCESS").exists()
    assert day.num_rows == counts["2024-02-29"]
    assert 0.1 < day["I1"].null_count / day.num_rows < 0.3
    assert set(pc.unique(day["label"]).to_pylist()) == {0, 1}


def test_signal_is_learnable_and_ids_are_skewed():
    table = synth_criteo_table(60_000, seed=3)
    label = table["label"].to_numpy()
    assert 0.15 < label.mean() < 0.4
    ids = table["C1"].to_numpy(zero_copy_only=False)
    train, test = slice(0, 30_000), slice(30_000, None)
    rates: dict[str, float] = {}
    for value in set(ids[train]):
        rates[value] = label[train][ids[train] == value].mean()
    score = np.array([rates.get(v, label[train].mean()) for v in ids[test]])
    assert roc_auc_score(label[test], score) > 0.6
    top = np.unique(table["C26"].drop_null().to_numpy(zero_copy_only=False), return_counts=True)[1]
    assert top.max() / top.sum() > 0.05  # Zipf-like: the head id is frequent


def test_rejects_empty_requests(tmp_path):
    with pytest.raises(ValueError, match="rows and days must be positive"):
        synth_criteo(0, 1, tmp_path)


def test_the_kaggle_profile_has_the_published_cardinalities_zipf_counts_and_new_ids_daily(tmp_path):
    from dev.data.synth import KAGGLE_CARDINALITIES

    counts = synth_criteo(200_000, 2, tmp_path, profile="kaggle")
    days = [pacsv.read_csv(tmp_path / f"ds={ds}" / "part-00000.csv") for ds in counts]
    assert days[0].column_names == COLUMNS and 0.1 < days[0]["label"].to_numpy().mean() < 0.4
    for c, size in enumerate(KAGGLE_CARDINALITIES, start=1):
        first, second = (set(pc.unique(d[f"C{c}"].drop_null()).to_pylist()) for d in days)
        assert len(first) <= size
        if size > 1000:  # a large field: many distinct ids a day
            assert len(first) > min(0.2 * size, 20_000)
        if size >= 10_000:  # about new_share (0.1) of its frequent ids is renamed the next day
            values, n = np.unique(
                days[0][f"C{c}"].drop_null().to_numpy(zero_copy_only=False), return_counts=True
            )
            head = set(values[n >= 5].tolist())
            assert len(head) > 50 and 0.75 < len(head & second) / len(head) < 0.97
    # Zipf: the head id of the largest field is far more frequent than its average id
    ids, n = np.unique(days[0]["C3"].drop_null().to_numpy(zero_copy_only=False), return_counts=True)
    assert n.max() > 1000 * n.mean() / 100


def test_an_unknown_profile_is_refused(tmp_path):
    with pytest.raises(ValueError, match="profile 'huge'"):
        synth_criteo(10, 1, tmp_path, profile="huge")
