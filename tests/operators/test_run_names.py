"""What a user sees first in MLflow (issue 41), on a real SQLite tracking store: experiments of
the model-training kind, runs named by day (and hour) first, nested runs after their parent's
day, and ``recpipe runs compare`` across two experiments (two registered models)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from airflow.models.dagrun import DagRun
from airflow.utils.types import DagRunType

from operators.hooks.mlflow import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, MLflowHook
from operators.tracking import run_name
from tests.support import RECPIPE, run_ok


@pytest.fixture
def hook(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("RECPIPE_VAR_DIR", str(tmp_path / "var"))
    return MLflowHook(mlflow_conn_id="")


def _context(ds, hour, run_type, run_id="backfill__x", minute=0):
    logical = (
        None if ds is None else datetime.fromisoformat(f"{ds}T{hour:02d}:{minute:02d}:00").replace(tzinfo=UTC)
    )
    dag_run = DagRun(dag_id="recpipe_stream_retrain", run_id=run_id, run_type=run_type, logical_date=logical)
    return {"ds": ds, "logical_date": logical, "run_id": run_id, "dag_run": dag_run}


@pytest.mark.parametrize(
    ("ds", "hour", "run_type", "pass_minutes", "want"),
    [
        ("1997-09-22", 23, DagRunType.BACKFILL_JOB, 60, "ds=1997-09-22 hh=23 backfill"),
        ("1997-09-22", 0, DagRunType.SCHEDULED, 60, "ds=1997-09-22 hh=00 scheduled"),
        ("1997-09-22", 0, DagRunType.SCHEDULED, 15, "ds=1997-09-22 hh=0045 scheduled"),
        ("1997-09-22", 0, DagRunType.SCHEDULED, None, "ds=1997-09-22 scheduled"),
        ("1997-09-22", 5, DagRunType.MANUAL, None, "ds=1997-09-22 manual"),
        (None, 0, DagRunType.MANUAL, None, "manual__2026 manual"),
    ],
)
def test_run_name_leads_with_the_day_and_pass(ds, hour, run_type, pass_minutes, want):
    run_id = "manual__2026" if ds is None else "backfill__x"
    context = _context(ds, hour, run_type, run_id=run_id, minute=45 if pass_minutes == 15 else 0)
    assert run_name(context, pass_minutes) == want


def test_experiments_open_on_runs_and_nested_runs_carry_the_day(hook):
    parent = hook.parent_run(
        "m", "dag", "backfill__1", {"ds": "1997-09-22"}, name="ds=1997-09-22 hh=23 backfill"
    )
    client = hook.get_client()
    exp = client.get_experiment_by_name("m")
    assert exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    child = client.get_run(hook.child_run(parent, "train"))
    assert child.info.run_name == "ds=1997-09-22 hh=23 train"
    # an experiment made before the tag existed gets it when next used
    old = client.create_experiment("older")
    hook.experiment_id("older")
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    # the stream's day series: found, not duplicated; not created when only asked for
    assert hook.day_run("m", "dag", "1997-09-23", create=False) is None
    day = hook.day_run("m", "dag", "1997-09-23")
    assert hook.day_run("m", "dag", "1997-09-23", create=False) == day
    assert client.get_run(day).info.run_name == "ds=1997-09-23 passes"


def _day(hook, experiment, dag_id, ds, auc, before=None, ci=None, outcome="promoted"):
    """A closed day as the register task leaves it on the parent run."""
    parent = hook.parent_run(experiment, dag_id, f"scheduled__{ds}", {"ds": ds}, name=f"ds={ds} scheduled")
    rows = [("eval.auc", auc, 0), ("prepare.rows", 500, 0), ("prepare.positive_rate", 0.5, 0)]
    if before is not None:
        rows.append(("evaluate_champion.auc", before, 0))
        rows += [("gate.diff", auc - before, 0), ("gate.ci_low", ci[0], 0), ("gate.ci_high", ci[1], 0)]
    hook.log_metrics(parent, rows)
    hook.set_tags(parent, {"promotion": outcome, "promoted": outcome != "rejected"})
    hook.end_run(parent)


def test_runs_compare_puts_two_registered_models_days_side_by_side(hook, tmp_path):
    days = ["1997-09-22", "1997-09-23", "1997-09-24"]
    _day(hook, "movielens_deepfm", "recpipe_daily_retrain", days[0], 0.70)
    _day(
        hook,
        "movielens_deepfm",
        "recpipe_daily_retrain",
        days[1],
        0.71,
        0.70,
        (-0.005, 0.025),
        "inconclusive",
    )
    _day(hook, "movielens_deepfm", "recpipe_daily_retrain", days[2], 0.66, 0.71, (-0.07, -0.03), "rejected")
    _day(hook, "movielens_stream", "recpipe_stream_retrain", days[1], 0.69)
    _day(hook, "movielens_stream", "recpipe_stream_retrain", days[2], 0.72, 0.69, (0.01, 0.05))
    # a manual run registers into the daily model's experiment without a gate: not a day
    _day(hook, "movielens_deepfm", "recpipe_train", "2026-11-25", 0.69, outcome="registered")
    out = tmp_path / "days.png"
    # the hook's tracking store and var dir, from this process's environment
    done = run_ok(
        [*RECPIPE, "runs", "compare", "--experiment", "movielens_deepfm", "--experiment", "movielens_stream"]
        + ["--out", str(out)]
    )
    lines = [line.split() for line in done.stdout.splitlines() if line.strip().startswith("1997")]
    by = {(line[0], line[-1]): line for line in lines}
    assert set(by) == {(d, "movielens_deepfm") for d in days} | {(d, "movielens_stream") for d in days[1:]}
    assert (
        "inconclusive" in by[(days[1], "movielens_deepfm")]
        and "rejected" in by[(days[2], "movielens_deepfm")]
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_day_figure_draws_each_days_delong_interval():
    import pandas as pd

    from recpipe.runs.compare import DAY_COLUMNS, day_figure

    rows = [
        ["1997-09-22", None, 0.70, "promoted", 0, True, None, None, None, "1", 500, 250, "a"],
        ["1997-09-23", 0.70, 0.71, "inconclusive", 1, False, 0.01, -0.005, 0.025, "2", 500, 250, "b"],
        ["1997-09-24", 0.70, 0.66, "rejected", 0, False, -0.04, -0.07, -0.01, "3", 500, 250, "c"],
    ]
    fig = day_figure(pd.DataFrame(rows, columns=DAY_COLUMNS), "t")
    top, bottom = fig.axes
    # one error bar per day with a paired test, each spanning its interval, by outcome
    bars = {c.get_label(): c for c in bottom.containers}
    assert set(bars) == {"inconclusive", "rejected"}
    segments = bars["inconclusive"].lines[2][0].get_segments()
    assert [tuple(p[1] for p in s) for s in segments] == [pytest.approx((-0.005, 0.025))]
    assert [t.get_text() for t in bottom.get_xticklabels()] == ["1997-09-22", "1997-09-23", "1997-09-24"]
