"""A range of days in one Spark job (``features.prepare.prepare_days``, through
``features.backfill.prepare_range``) against the same days
prepared one by one (``prepare_day``): the same Parquet rows, ``_stats.json`` and
``_normalization.json``, file by file, on real MovieLens days."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from features.prepare import prepare_day, prepare_days
from features.schema import RawInputError
from tests.support import ROOT, with_edits

# seven days and a window of four: the window fills up inside the range
FIRST = "1997-09-20"
N, WINDOW = 7, 4


def _days(config, n: int) -> list[str]:
    days = sorted(p.name[3:] for p in Path(config.raw_input_path).iterdir() if p.name.startswith("ds="))
    return [d for d in days if d >= FIRST][:n]


def _day(root: Path, ds: str) -> dict:
    part = root / f"ds={ds}"
    return {
        "rows": pq.read_table(part),
        "stats": json.loads((part / "_stats.json").read_text()),
        "normalization": json.loads((part / "_normalization.json").read_text()),
        # the write job's id is in each part file's name
        "jobs": {re.sub(r"^part-\d+-(.+?)\.c\d+.*$", r"\1", p.name) for p in part.glob("part-*.parquet")},
    }


@pytest.fixture(scope="module")
def one_by_one(spark, movielens_raw, tmp_path_factory):
    """Seven days prepared one at a time: the reference."""
    from recpipe.config import load_pipeline_config

    root = tmp_path_factory.mktemp("one_by_one")
    paths = {"raw_input_path": str(movielens_raw / "events"), "train_input_path": str(root / "features")}
    edits = {**paths, "model_dir": str(root / "m"), "feature_config.normalization_window_days": WINDOW}
    config = load_pipeline_config(ROOT / "conf/movielens_deepfm.yaml", edits)
    days = _days(config, N)
    for ds in days:
        prepare_day(spark, config, ds)
    return config, days


def test_a_range_in_one_job_equals_the_days_one_by_one(spark, one_by_one, tmp_path):
    reference, days = one_by_one
    config = with_edits(reference, {"train_input_path": str(tmp_path / "features")})
    # the first two days as the DAG prepares them; the range then reads their stored moments
    for ds in days[:2]:
        prepare_day(spark, config, ds)
    stats = prepare_days(spark, config, days[2:])
    assert [s["ds"] for s in stats] == days[2:]
    jobs = set()
    for ds in days:
        want, got = _day(Path(reference.train_input_path), ds), _day(Path(config.train_input_path), ds)
        assert got["rows"].equals(want["rows"]), ds
        assert got["stats"] == want["stats"], ds
        assert got["normalization"] == want["normalization"], ds
        if ds in days[2:]:
            jobs |= got["jobs"]
    assert len(jobs) == 1  # five days, one write
    assert stats[0]["normalization_window"] == days[:3]  # two stored days, then the range's
    assert stats[-1]["normalization_window"] == days[-WINDOW:]
    assert sorted(p.name for p in Path(config.train_input_path).iterdir()) == [f"ds={d}" for d in days]


def test_a_range_with_a_bad_row_is_prepared_day_by_day_and_quarantines_it(spark, one_by_one, tmp_path):
    import shutil

    reference, days = one_by_one
    raw = tmp_path / "raw"
    shutil.copytree(Path(reference.raw_input_path).parent, raw)
    config = with_edits(
        reference, {"raw_input_path": str(raw / "events"), "train_input_path": str(tmp_path / "features")}
    )
    bad_day = days[1]
    with (raw / "events" / f"ds={bad_day}" / "part-00000.csv").open("a") as f:
        f.write("not-a-user,1,2,3\n")
    stats = prepare_days(spark, config, days[:3])
    assert [s["rows_quarantined"] for s in stats] == [0, 1, 0]
    assert (Path(config.effective_quarantine_path) / f"ds={bad_day}").is_dir()
    # the first day, before the bad one, is the reference's row for row
    assert _day(Path(config.train_input_path), days[0])["rows"].equals(
        _day(Path(reference.train_input_path), days[0])["rows"]
    )


def test_a_missing_day_fails_the_range_before_anything_is_written(spark, one_by_one, tmp_path):
    reference, days = one_by_one
    config = with_edits(reference, {"train_input_path": str(tmp_path / "features")})
    with pytest.raises(RawInputError, match="ds=1997-09-19"):
        prepare_days(spark, config, ["1997-09-19", *days[:2]])
    assert not (tmp_path / "features").exists() or not any((tmp_path / "features").iterdir())


def _states(root: Path, ds: str):
    part = root / "_sequence_state" / f"ds={ds}"
    assert (part / "_SUCCESS").exists(), ds
    return pq.read_table(part).sort_by("user")


def test_histories_over_a_range_in_one_job_equal_the_days_one_by_one(spark, movielens_raw, tmp_path):
    """conf/movielens_din.yaml (each user's last 20 rated films): the first two days one by
    one, then three in one job, against all five one by one: the same rows with the same
    histories, the same stats (their history figures too) and each day's state, user by user."""
    from recpipe.config import load_pipeline_config

    def config(name: str):
        paths = {"raw_input_path": str(movielens_raw / "events"), "train_input_path": str(tmp_path / name)}
        return load_pipeline_config(
            ROOT / "conf/movielens_din.yaml", {**paths, "model_dir": str(tmp_path / "m")}
        )

    reference, ranged = config("one_by_one"), config("range")
    days = _days(reference, 5)
    for ds in days:
        prepare_day(spark, reference, ds)
    for ds in days[:2]:
        prepare_day(spark, ranged, ds)
    stats = prepare_days(spark, ranged, days[2:])
    jobs = set()
    for ds in days:
        want, got = _day(Path(reference.train_input_path), ds), _day(Path(ranged.train_input_path), ds)
        assert got["rows"].equals(want["rows"]), ds
        assert got["stats"] == want["stats"], ds
        assert _states(Path(ranged.train_input_path), ds).equals(
            _states(Path(reference.train_input_path), ds)
        )
        if ds in days[2:]:
            jobs |= got["jobs"]
    assert len(jobs) == 1  # the range's features in one write
    assert stats[0]["sequence"]["state_from"] == days[1] and stats[0]["sequence"]["users"] > 0
    hist = [c for c in got["rows"].column_names if c.startswith("hist")]
    assert hist and any(len(h) for h in got["rows"].column(hist[0]).to_pylist())  # histories carried
