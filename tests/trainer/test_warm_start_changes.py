"""A team changes its cluster between two days: the next day's warm start (EasyRec's
``fine_tune_checkpoint``, the incremental day) loads yesterday's model and optimizer slots
and trains, whichever topology wrote them. Yesterday's checkpoints are read as they were
saved under asynchronous parameter servers and GEO (the workers train on while the chief
saves): every optimizer slot has its weight's shape and is finite, Adam's second moments are
never negative. A table whose shape changed (``hash_bucket_size``, ``embedding_dim``) cannot
be carried over row by row: it is named in the report and starts anew (EasyRec's behaviour);
online tables carry their rows into any ``max_capacity`` (tests/trainer/test_table_growth.py)
and world size (tests/trainer/test_distribute.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.trainer.test_distribute import SPLITS, _train

pytestmark = pytest.mark.slow

EDITS = {
    "train_config.optimizer_config": SPLITS["lazy_adam+adam"],
    "data_config.batch_size": 128,
    "train_config.num_steps": 30,
    "train_config.save_checkpoints_steps": 10,
    "train_config.log_step_count_steps": 10,
}


def _slots_fit_their_weights(model_dir) -> int:
    """Check the latest checkpoint's optimizer slots against their weights (a fused table's
    slot against the rows of the tables it holds); return how many slots there are."""
    from trainer.checkpoints import saved_names
    from trainer.embedding_tables import saved_layout

    reader = tf.train.load_checkpoint(str(model_dir))
    shapes = reader.get_variable_to_shape_map()
    names = saved_names(model_dir)
    rows: dict[str, int] = {}
    for _table, (fused, _offset, n) in saved_layout(reader).items():
        rows[fused] = rows.get(fused, 0) + n
    slots = [n for n, k in names.items() if k.startswith("optimizer_") and "/_variables/" in k]
    for name in slots:
        slot, _, weight = name.partition("/")
        shape = shapes[names[name]]
        if weight in names:
            assert shape == shapes[names[weight]], name
        else:
            assert shape[0] == rows[weight], name
        value = reader.get_tensor(names[name])
        assert np.isfinite(value).all(), name
        if slot == "v":
            assert value.min() >= 0, name
    return len(slots)


def _warm(day: str, **edits) -> dict:
    return {**EDITS, "train_config.fine_tune_checkpoint": day, **edits}


def test_a_day_warm_starts_from_yesterdays_model_after_the_cluster_changed(config_path, tmp_path):
    # day 1: asynchronous PS, one ps, one worker
    day1 = tmp_path / "day1"
    one, _ = _train(config_path, day1, "NoStrategy", 1, ps=1, **EDITS)
    assert one["global_step"] == 30
    slots = _slots_fit_their_weights(day1)
    assert slots >= 10

    # day 2: two ps shards, two workers, GEO: yesterday's tables split over both ps
    day2 = tmp_path / "day2"
    geo = {"train_config.sync_mode": "geo", "train_config.geo_step": 4}
    two, logs = _train(config_path, day2, "NoStrategy", 2, ps=2, **_warm(str(day1), **geo))
    report = two["fine_tune"]
    assert report["missing"] == [] and report["shape_mismatch"] == [], report
    # m and v of every variable (lazy Adam on the tables, Adam on the rest)
    assert report["restored"] > 10 and report["slots_restored"] == 2 * report["restored"]
    assert report["optimizer_iterations"] and min(report["optimizer_iterations"].values()) > 0
    assert two["global_step"] == 30 and np.isfinite(two["loss"])
    assert _slots_fit_their_weights(day2) == slots

    # day 3: one process again, a table given more hash buckets: its rows would hold other
    # ids now, so it starts anew, named; every other weight and slot carries over
    day3 = tmp_path / "day3"
    more = {"feature_config.features[input_names[0]=item_id].hash_bucket_size": 50000}
    three, _ = _train(config_path, day3, "NoStrategy", 1, **_warm(str(day2), **more))
    report = three["fine_tune"]
    changed = [line.split(":")[0] for line in report["shape_mismatch"]]
    assert changed and all("item_id" in name for name in changed), report
    assert report["missing"] == [] and report["slots_restored"] == 2 * report["restored"]
    assert three["global_step"] == 30 and np.isfinite(three["loss"])
