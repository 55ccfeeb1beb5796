"""The operators' pure rules: path confinement, the promotion gate, drift, retention, windows."""

from __future__ import annotations

import pytest

from operators.paths import PathNotAllowedError, confine, project_home
from operators.register import gate
from operators.retention import expired
from operators.train import DistributedTrainOperator
from operators.validate import drift


def test_confine_keeps_paths_inside_the_roots():
    assert confine("conf/movielens_deepfm.yaml", "p") == project_home() / "conf/movielens_deepfm.yaml"
    for bad in ("conf/../../etc/passwd", "/etc/passwd", "recpipe/cli.py", "var/../.."):
        with pytest.raises(PathNotAllowedError, match="outside the project's data roots"):
            confine(bad, "model_dir")


def test_gate():
    assert gate({"auc": 0.70}, None, "auc", 0.002).promote
    assert gate({"auc": 0.699}, {"auc": 0.700}, "auc", 0.002).promote
    decision = gate({"auc": 0.69}, {"auc": 0.70}, "auc", 0.002)
    assert not decision.promote and "worse than champion 0.7000 by 0.0100" in decision.reason
    assert not gate(None, {"auc": 0.7}, "auc", 0.002).promote
    assert not gate({"auc": 0.8}, None, "gauc", 0.002).promote


def test_drift_reports_relative_changes_above_tolerance():
    before = {
        "rows": 100,
        "positive_rate": 0.5,
        "nulls": {"age": 0},
        "dense_moments": {"age": {"count": 100, "sum": 3000.0}},
    }
    today = {
        "rows": 300,
        "positive_rate": 0.55,
        "nulls": {"age": 30},
        "dense_moments": {"age": {"count": 270, "sum": 8100.0}},
    }
    changes, warnings = drift(today, before, 0.25)
    assert changes["drift.rows"] == pytest.approx(2.0)
    assert changes["drift.positive_rate"] == pytest.approx(0.1)
    assert changes["drift.mean.age"] == pytest.approx(0.0)
    assert sorted(w.split(":")[0] for w in warnings) == ["null_share.age", "rows"]


def test_warm_start_source_is_the_newest_finished_day_before_ds(tmp_path, monkeypatch):
    monkeypatch.setenv("RECPIPE_VAR_DIR", str(tmp_path))  # a data root operators may name
    for d in ("1997-09-20", "1997-09-21", "1997-09-22"):
        (tmp_path / f"ds={d}").mkdir()
    (tmp_path / "ds=1997-09-20" / "_SUCCESS").touch()
    (tmp_path / "ds=1997-09-21" / "_SUCCESS").touch()

    def source(ds: str, full_retrain: bool = False) -> str | None:
        op = DistributedTrainOperator(
            task_id="train",
            pipeline_config_path="conf/movielens_deepfm.yaml",
            model_dir=str(tmp_path / f"ds={ds}"),
            ds=ds,
            warm_start_root=str(tmp_path),
            full_retrain=full_retrain,
        )
        found = op.warm_start((tmp_path / f"ds={ds}").resolve())
        return found.name if found else None

    # 09-22 did not finish; a day is never its own source
    assert source("1997-09-23") == "ds=1997-09-21"
    assert source("1997-09-21") == "ds=1997-09-20"
    assert source("1997-09-20") is None
    assert source("1997-09-23", full_retrain=True) is None


def test_retention_keeps_newest_days_and_protected(tmp_path):
    days = [tmp_path / f"ds=1997-09-{d}" for d in range(20, 26)]
    for p in days:
        p.mkdir()
    gone = expired(tmp_path, 2, {days[1].resolve()})
    assert [p.name for p in gone] == ["ds=1997-09-23", "ds=1997-09-22", "ds=1997-09-20"]
