"""Comparing runs as users do after the daily DAG: the parent run's table and figure of the
last days, ``recpipe runs compare`` for the days and for two runs of different configs, and
MLflow's own UI comparing two runs, rendered in headless Chromium."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.dags.conftest import DAYS, MODEL
from tests.support import RECPIPE, ROOT, mlflow_server, run_ok

pytestmark = pytest.mark.slow
ARTIFACTS = ROOT / "var" / "test-artifacts"


def _client(daily_runs):
    from mlflow import MlflowClient

    return MlflowClient(daily_runs["tracking_uri"], registry_uri=daily_runs["tracking_uri"])


def _train_runs(daily_runs) -> dict[str, object]:
    """Day -> the nested ``train`` run of that day's parent run."""
    client = _client(daily_runs)
    exp = client.get_experiment_by_name(MODEL)
    parents = {
        r.info.run_id: r.data.tags["ds"]
        for r in client.search_runs([exp.experiment_id], "tags.`recpipe.step` = 'parent'")
        if r.data.tags.get("ds") in DAYS
    }
    trains = client.search_runs([exp.experiment_id], "tags.`recpipe.step` = 'train'")
    return {
        parents[r.data.tags["mlflow.parentRunId"]]: r
        for r in trains
        if r.data.tags["mlflow.parentRunId"] in parents
    }


def test_each_parent_run_holds_a_table_and_figure_of_the_last_days(daily_runs):
    client = _client(daily_runs)
    exp = client.get_experiment_by_name(MODEL)
    last = client.search_runs(
        [exp.experiment_id], f"tags.`recpipe.step` = 'parent' and tags.ds = '{DAYS[3]}'"
    )[0]
    folder = Path(client.download_artifacts(last.info.run_id, "history"))
    table = json.loads((folder / "days.json").read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    assert [r["ds"] for r in rows] == DAYS
    assert [r["promoted"] for r in rows] == [True, True, False, True]
    assert rows[0]["outcome"] == "promoted" and rows[2]["outcome"] == "rejected"
    # days 2 and 4 against the champion: promoted outright, or inconclusive under `promote`
    assert {rows[1]["outcome"], rows[3]["outcome"]} <= {"promoted", "inconclusive"}
    assert rows[0]["auc_before"] is None and 0.5 < rows[1]["auc_after"] <= 1
    # the gate's DeLong interval of each day against a champion, around its difference
    assert rows[0]["diff"] is None
    for row in rows[1:]:
        assert row["ci_low"] <= row["diff"] <= row["ci_high"]
        assert abs(row["diff"] - (row["auc_after"] - row["auc_before"])) < 1e-6
        # an interval across zero is what the gate calls inconclusive
        assert (row["outcome"] == "inconclusive") == (row["ci_low"] <= 0 <= row["ci_high"]), row
    assert all(r["rows"] > 100 and 0 < r["positives"] < r["rows"] for r in rows)
    assert (folder / "days.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_recpipe_runs_compare_prints_and_logs_days_and_runs(daily_runs, tmp_path):
    env = {**daily_runs["env"], "MLFLOW_TRACKING_URI": daily_runs["tracking_uri"]}

    def compare(*args):
        return run_ok([*RECPIPE, "runs", "compare", *args], env).stdout

    out = compare("--experiment", MODEL, "--out", str(tmp_path / "days.png"))
    lines = [line.split() for line in out.splitlines()]
    assert [line[0] for line in lines if line and line[0] in DAYS] == DAYS
    assert "rejected" in next(line for line in lines if line and line[0] == DAYS[2])
    assert (tmp_path / "days.png").stat().st_size > 10_000 and "logged to MLflow run" in out
    # two configs over the same days: day 2 (the config's steps) and day 3 (num_steps: 1)
    trains = _train_runs(daily_runs)
    out = compare(
        trains[DAYS[1]].info.run_id, trains[DAYS[2]].info.run_id, "--out", str(tmp_path / "runs.png")
    )
    params = out.split("params that differ")[1]
    assert "train_config.num_steps" in params and "data_config.batch_size" not in params
    assert "final_loss" in out.split("params that differ")[0]
    assert (tmp_path / "runs.png").exists()
    compares = _client(daily_runs).search_runs(
        [trains[DAYS[1]].info.experiment_id], "tags.`recpipe.step` = 'compare'"
    )
    assert len(compares) >= 2


@pytest.fixture(scope="module")
def mlflow_ui(daily_runs, tmp_path_factory):
    """The daily runs' store behind one ``mlflow server`` for the UI tests: its URI."""
    if not Path("/usr/bin/chromium").exists():
        assert not os.environ.get("CI"), "Chromium is missing: scripts/setup.sh installs it"
        pytest.skip("no /usr/bin/chromium")
    base = tmp_path_factory.mktemp("mlflow_ui")
    artifacts = ("--artifacts-destination", str(base / "artifacts"))
    with mlflow_server(base, daily_runs["tracking_uri"], *artifacts) as (uri, _):
        yield uri


def test_mlflow_ui_compares_two_runs_in_chromium(daily_runs, mlflow_ui):
    from tests.dags.airflow_server import screenshot

    trains = _train_runs(daily_runs)
    a, b = trains[DAYS[1]], trains[DAYS[2]]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "mlflow_compare_runs.png"
    runs = json.dumps([a.info.run_id, b.info.run_id])
    url = f"{mlflow_ui}/#/compare-runs?runs={runs}&experiments={json.dumps([a.info.experiment_id])}"
    text = screenshot(url, None, shot, expect="train_config.num_steps")
    assert shot.stat().st_size > 20_000
    assert "train_config.num_steps" in text, text[:3000]  # the params table of both runs


def test_mlflow_ui_opens_the_experiment_on_its_runs_table_in_chromium(daily_runs, mlflow_ui):
    from recpipe.runs.compare import experiment_link
    from tests.dags.airflow_server import screenshot

    exp = _client(daily_runs).get_experiment_by_name(MODEL)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "mlflow_experiment_runs.png"
    text = screenshot(experiment_link(mlflow_ui, exp.experiment_id), None, shot, expect=f"ds={DAYS[0]}")
    assert shot.stat().st_size > 20_000
    # the runs table (not the GenAI traces overview), its runs named by day
    assert "No data available" not in text and "Run Name" in text, text[:3000]
    assert all(f"ds={d}" in text for d in DAYS), text[:3000]
