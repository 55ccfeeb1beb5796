"""The operators' pure rules: path confinement, the promotion gate, drift, retention, windows."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from operators.gate import gate
from operators.paths import PathNotAllowedError, confine, project_home
from operators.train import DistributedTrainOperator
from operators.validate import drift
from recpipe.config.retrain import GateConfig
from recpipe.layout import expired_model_dirs


def test_confine_keeps_paths_inside_the_roots():
    assert (
        confine("conf/movielens_deepfm.yaml", "pipeline_config_path")
        == project_home() / "conf/movielens_deepfm.yaml"
    )
    # conf/ holds configs: a run's edits cannot point a model or an export into it
    with pytest.raises(PathNotAllowedError, match="model_dir='conf/m' resolves to"):
        confine("conf/m", "model_dir")
    assert confine("conf/cluster/local.yaml", "cluster_config_path").name == "local.yaml"
    for bad in ("conf/../../etc/passwd", "/etc/passwd", "recpipe/cli.py", "var/../.."):
        with pytest.raises(PathNotAllowedError, match="outside the roots it may name"):
            confine(bad, "model_dir")


PATH_FIELDS = [
    "model_dir",
    "raw_input_path",
    "train_input_path",
    "eval_input_path",
    "quarantine_path",
    "train_config.fine_tune_checkpoint",
    "train_config.fine_tune_ckpt_var_map",
    "data_config.dimension_tables[name=users].path",
]


@pytest.mark.parametrize("field", PATH_FIELDS)
def test_every_config_path_a_run_can_override_is_confined(field, tmp_path):
    """A manual run's ``edit_config_json`` reaches the jobs only through ``load_config`` /
    ``config_args``, which refuse any path of the effective config outside the roots; a
    symlink inside ``var/`` that leads out is resolved first, and refused too."""
    from operators.evaluate import EvalOperator

    link = project_home() / "var" / "pytest-escape"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(tmp_path)
    try:
        for value in ("/root", str(project_home() / "data/../.."), str(link / "x")):
            op = EvalOperator(
                task_id="evaluate",
                pipeline_config_path="conf/movielens_deepfm.yaml",
                model_dir="var/runs/m",
                eval_ds="1997-09-22",
                edit_config_json={field: value},
            )
            with pytest.raises(PathNotAllowedError, match=f"^{re.escape(field)}="):
                op.config_args()
    finally:
        link.unlink()
    ok = EvalOperator(
        task_id="evaluate",
        pipeline_config_path="conf/movielens_deepfm.yaml",
        model_dir="var/runs/m",
        eval_ds="1997-09-22",
        edit_config_json={field: "var/inside"},
    )
    assert "--edit_config_json" in ok.config_args()


def test_the_spark_job_refuses_a_path_outside_the_roots_before_starting_spark():
    done = subprocess.run(
        [
            sys.executable,
            "features/prepare.py",
            "--pipeline_config_path",
            "conf/movielens_deepfm.yaml",
            "--ds",
            "1997-09-22",
            "--confine_paths",
            '--edit_config_json={"raw_input_path": "/root"}',
        ],
        cwd=project_home(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "config error: raw_input_path='/root' resolves to /root, outside" in done.stderr


def _gate(candidate, champion, metric="auc", tolerance=0.002, **rules):
    return gate(
        candidate,
        champion,
        GateConfig(**{"min_positives": 0, "min_negatives": 0, **rules}, metric=metric, tolerance=tolerance),
    )


def test_gate():
    assert _gate({"auc": 0.70}, None).promote
    assert _gate({"auc": 0.699}, {"auc": 0.700}).promote
    decision = _gate({"auc": 0.69}, {"auc": 0.70})
    assert not decision.promote and "worse than champion 0.7000 by 0.0100" in decision.reason
    assert not _gate(None, {"auc": 0.7}).promote
    assert not _gate({"auc": 0.8}, None, "gauc").promote


def test_a_window_without_positives_is_inconclusive_so_the_stuck_gate_counts_it(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from operators.gate import INCONCLUSIVE, class_counts

    scored = tmp_path / "eval_predictions.parquet"
    pq.write_table(pa.table({"label": [0.0] * 50, "probability": [0.1] * 50}), scored)
    held_out = class_counts(str(scored))
    assert held_out == (0, 50)
    for champion in (None, {"auc": None}, {"auc": 0.7}):
        decision = gate({"auc": None}, champion, GateConfig(), None, held_out)
        assert decision.outcome == INCONCLUSIVE and not decision.promote
        assert "0 positives and 50 negatives held out" in decision.reason
    assert gate({"auc": None}, None, GateConfig(inconclusive="promote"), None, held_out).promote
    # with both classes held out, a missing AUC is still a broken model: rejected
    assert gate({"auc": None}, None, GateConfig(), None, (40, 60)).outcome == "rejected"
    assert class_counts(str(tmp_path / "missing.parquet")) is None


def test_the_gate_never_promotes_nan_or_a_model_below_the_floor_champion_or_not():
    for champion in (None, {"auc": 0.70}):
        nan = _gate({"auc": float("nan")}, champion)
        assert not nan.promote and nan.reason == "new auc=nan is not a finite number"
        low = _gate({"auc": 0.45}, champion)
        assert not low.promote and "below the floor gate.min_metric=0.5" in low.reason
    assert _gate({"auc": 0.45}, None, min_metric=0.4).promote
    # a champion that scores NaN on these rows is no comparison: the floor alone decides
    assert _gate({"auc": 0.6}, {"auc": float("nan")}).promote


def test_a_multi_task_gate_reads_its_task_and_guards_the_others_over_random_metrics():
    """``gate.metric: <task>/auc`` decides on that task; ``guard_tasks`` refuses any promotion
    that loses more than the tolerance on a guarded task, whatever the numbers."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    value = st.floats(0.5, 1.0)

    @settings(max_examples=200, deadline=None)
    @given(value, value, value, value)
    def check(new, old, guard_new, guard_old):
        candidate = {"like/auc": new, "rated_high/auc": guard_new, "auc": new}
        champion = {"like/auc": old, "rated_high/auc": guard_old, "auc": old}
        decision = _gate(candidate, champion, "like/auc", guard_tasks=["rated_high"])
        main, guarded = new >= old - 0.002, guard_new >= guard_old - 0.002
        assert decision.promote == (main and guarded)
        if main and not guarded:
            assert decision.reason.startswith("gate.guard_tasks: rated_high/auc=")

    check()
    missing = _gate({"like/auc": 0.7}, None, "like/auc", guard_tasks=["rated_high"])
    assert not missing.promote and "has no finite rated_high/auc" in missing.reason
    with pytest.raises(ValueError, match="metric"):
        GateConfig(metric="like/precision")


def test_the_paired_test_of_a_task_reads_that_tasks_rows(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from operators.gate import paired_scores
    from recpipe.stats import paired_auc_test

    rng = np.random.default_rng(0)
    y = (rng.random(400) < 0.3).astype(np.float32)
    files = []
    for i in range(2):
        p = np.clip(y * 0.3 + rng.random(400) * 0.7, 0, 1).astype(np.float32)
        cols = {
            "label": y,
            "probability": rng.random(400).astype(np.float32),
            "label_high": y,
            "probability_high": p,
        }
        files.append(tmp_path / f"{i}.parquet")
        pq.write_table(pa.table(cols), files[-1])
    got, why = paired_scores(str(files[0]), str(files[1]), 0.95, task="high")
    old, new = (pq.read_table(f).to_pydict() for f in files)
    want = paired_auc_test(y, np.asarray(old["probability_high"]), np.asarray(new["probability_high"]), 0.95)
    assert why == "" and got.diff == pytest.approx(want.diff) and got.diff > 0 or got.diff < 0
    assert paired_scores(str(files[0]), str(files[1]), 0.95, task="like") == (
        None,
        "no label_like column in both evaluations",
    )


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
        found, _ = op.warm_start((tmp_path / f"ds={ds}").resolve())
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
    gone = expired_model_dirs(tmp_path, 2, {days[1]})
    assert [p.name for p in gone] == ["ds=1997-09-20", "ds=1997-09-22", "ds=1997-09-23"]


def test_kubernetes_job_names_differ_per_dag_run_and_stay_dns_names():
    from operators.train import kubernetes_job_name
    from recpipe.launch.kubeflow import job_name

    a = kubernetes_job_name("recpipe_train", "1997-09-22", "manual__2026-11-23T10:00:00+00:00", 1)
    b = kubernetes_job_name("recpipe_train", "1997-09-22", "manual__2026-11-23T10:00:05+00:00", 1)
    assert a != b and a.startswith("recpipe-recpipe-train-1997-09-22-") and a.endswith("-1")
    long = kubernetes_job_name("d" * 80, "1997-09-22", "r", 12)
    for name in (a, b, long):
        assert job_name(name) == name and len(name) <= 52  # the renderer keeps it whole


def test_job_timeouts_come_from_the_retrain_config():
    from datetime import timedelta

    from operators.base import job_timeout_s
    from recpipe.config.retrain import TimeoutConfig

    timeouts = TimeoutConfig(default_s=600, tasks={"train": 7200})
    assert timeouts.of("train") == timedelta(hours=2) and timeouts.of("export") == timedelta(minutes=10)
    assert job_timeout_s(timedelta(hours=2)) == 7200 - 60 and job_timeout_s(timedelta(seconds=100)) == 90
    assert job_timeout_s(None) is None
