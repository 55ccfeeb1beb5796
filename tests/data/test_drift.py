"""The drifting synthetic stream: ids enter and fade day by day, and carry a learnable signal."""

from __future__ import annotations

import numpy as np
import pyarrow.csv as pacsv
import pytest
from sklearn.metrics import roc_auc_score

from dev.data.drift import COLUMNS, drift_day, synth_drift


def test_partitions_schema_and_drift(tmp_path):
    counts = synth_drift(3_000, 3, tmp_path, users=2_000, items=500, user_drift=500, item_drift=50)
    assert counts == {"2024-01-01": 3_000, "2024-01-02": 3_000, "2024-01-03": 3_000}
    days = [pacsv.read_csv(tmp_path / f"ds={ds}" / "part-00000.csv").to_pandas() for ds in counts]
    assert list(days[0].columns) == COLUMNS and (tmp_path / "ds=2024-01-03" / "_SUCCESS").exists()
    users = [set(d.user_id) for d in days]
    assert 0.3 < len(users[1] & users[0]) / len(users[1]) < 0.95  # some stay, some are new
    first_ids = [int(u[1:]) for u in users[2]]
    assert min(first_ids) >= 2 * 500  # day 2's window starts 2 drifts on
    assert 0.15 < days[0].label.mean() < 0.5


def test_ids_carry_signal_from_one_day_to_the_next():
    a = drift_day(0, 40_000, 5_000, 1_000, 200, 20).to_pandas()
    b = drift_day(1, 40_000, 5_000, 1_000, 200, 20).to_pandas()
    rate = a.groupby("user_id").label.agg(["sum", "count"])
    prior = a.label.mean()
    smoothed = ((rate["sum"] + 5 * prior) / (rate["count"] + 5)).to_dict()
    score = np.array([smoothed.get(u, prior) for u in b.user_id])
    assert roc_auc_score(b.label, score) > 0.6


def test_rejects_empty_requests(tmp_path):
    with pytest.raises(ValueError, match="rows and days must be positive"):
        synth_drift(0, 3, tmp_path)


def test_slices_drift_within_the_day_in_time_order():
    day = drift_day(1, 20_000, 2_000, 500, 400, 40, slices=96, start="2024-01-01").to_pandas()
    assert list(day.columns) == [*COLUMNS, "timestamp"]
    ts = day.timestamp.to_numpy()
    midnight = 1704153600  # 2024-01-02 00:00 UTC
    assert ts.min() >= midnight and ts.max() < midnight + 86400 and (np.diff(ts) >= 0).all()
    first_ids = np.array([int(u[1:]) for u in day.user_id])
    morning, evening = first_ids[ts < midnight + 3 * 3600], first_ids[ts >= midnight + 21 * 3600]
    # the window slides with the clock: evening ids start ~0.875 of a drift later than morning's
    assert evening.min() >= 400 + 0.85 * 400 and morning.min() < 400 + 0.15 * 400
