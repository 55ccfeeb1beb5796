"""Repeatable runs: the daily DAG's first two days, run again in a second, fresh deployment,
now as an Airflow backfill under a running scheduler (LocalExecutor; what ``make demo`` does),
give the same metrics, to the bit, as ``airflow dags test`` gave in the first
(``train_config.random_seed`` and ``op_determinism``; see README "Repeatable runs")."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.airflow import run_backfill
from tests.dags.conftest import DAYS, MODEL, SEPARATE, fresh_postgres_db, new_stack

pytestmark = pytest.mark.slow


def _days(tracking_uri: str) -> dict[str, dict]:
    """Per day of the first two: the parent's metrics (the data's, the models' and the gate's:
    no durations) and the loss curve of the day's first train run (the DAG run's own; a task
    retried later by another test adds a second one)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    exp = client.get_experiment_by_name(MODEL)
    out = {}
    parents = "tags.`recpipe.step` = 'parent' and tags.`airflow.dag_id` = 'recpipe_daily_retrain'"
    for run in client.search_runs([exp.experiment_id], filter_string=parents):
        ds = run.data.tags.get("ds")
        if ds not in DAYS[:2]:
            continue
        assert ds not in out, f"two parent runs of {ds}"
        nested = f"tags.`mlflow.parentRunId` = '{run.info.run_id}' and tags.`recpipe.step` = 'train'"
        trains = client.search_runs(
            [exp.experiment_id], filter_string=nested, order_by=["attributes.start_time ASC"]
        )
        curve = [(m.step, m.value) for m in client.get_metric_history(trains[0].info.run_id, "loss")]
        # the first deployment also scores candidates (batch_predict): not a model's figure
        metrics = {k: v for k, v in run.data.metrics.items() if not k.startswith("batch_predict.")}
        out[ds] = {"metrics": metrics, "loss": sorted(curve)}
    return out


def test_two_days_run_again_as_a_backfill_give_identical_metrics(daily_runs, movielens_raw, tmp_path_factory):
    again = new_stack(movielens_raw, tmp_path_factory.mktemp("again"), SEPARATE)  # as daily_runs
    lines: list[str] = []
    home = Path(again["env"]["AIRFLOW_HOME"])
    with fresh_postgres_db() as db:  # a deployment's database, as docker compose runs it
        states = run_backfill(
            again["env"], home, "recpipe_daily_retrain", DAYS[:2], 1500, lines.append, database_url=db
        )
    assert states == dict.fromkeys(DAYS[:2], "success"), "\n".join(lines)
    for ds in DAYS[:2]:  # each of the 9 tasks reported once as it ended, then the run
        tasks = [line.split()[1] for line in lines if line.startswith(f"  ds={ds}  ")]
        assert len(tasks) == len(set(tasks)) == 9, lines
        assert tasks[0] == "wait_for_raw" and tasks[-1] == "retention", tasks
        assert f"ds={ds}: success in" in "\n".join(lines)
    first, second = _days(daily_runs["tracking_uri"]), _days(again["tracking_uri"])
    assert sorted(first) == sorted(second) == DAYS[:2]
    for ds in DAYS[:2]:
        assert {"eval.auc", "eval.logloss", "prepare.rows"} <= set(first[ds]["metrics"])
        assert first[ds]["metrics"] == second[ds]["metrics"], ds
        assert len(first[ds]["loss"]) >= 3
        assert first[ds]["loss"] == second[ds]["loss"], ds
    # day 2 also scored day 1's champion on its rows: the same in both deployments
    assert {"evaluate_champion.auc", "gate.p_value"} <= set(first[DAYS[1]]["metrics"])
