"""``recpipe_daily_retrain`` with the models beyond DeepFM, two days each through ``airflow dags
test``: ``conf/movielens_din.yaml`` (the Spark job carries each user's history from day to
day) and ``conf/movielens_mmoe.yaml`` (two tasks: each task's metrics reach MLflow and the
daily table, and the gate reads ``like/auc``)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.dags.conftest import DAYS, airflow, new_stack

pytestmark = pytest.mark.slow

# no sidecar evaluator: a process less a day
EDITS = {"data_config.num_epochs": 1, "eval_config.eval_method": "none"}


def _two_days(movielens_raw, base, conf: str, model: str, **overrides) -> dict:
    stack = new_stack(
        movielens_raw,
        base,
        EDITS,
        pipeline_config_path=conf,
        model_name=model,
        training_window_days=3,
        **overrides,
    )
    logs = {}
    for ds in DAYS[:2]:
        proc = airflow(stack["env"], "dags", "test", "recpipe_daily_retrain", ds)
        logs[ds] = proc.stdout + proc.stderr
    runs = stack["var"] / "runs" / model
    second = json.loads((runs / f"ds={DAYS[1]}" / "train_result.json").read_text())
    assert second["fine_tune_checkpoint"] == str(runs / f"ds={DAYS[0]}")
    assert second["fine_tune"]["restored"] > 10 and not second["fine_tune"]["missing"]
    return {**stack, "logs": logs, "model": model}


def _parents(stack) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(stack["tracking_uri"], registry_uri=stack["tracking_uri"])
    exp = client.get_experiment_by_name(stack["model"])
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`recpipe.step` = 'parent'")
    parents = sorted(runs, key=lambda r: r.data.tags["ds"])
    assert [p.data.tags["ds"] for p in parents] == DAYS[:2]
    assert all(p.info.status == "FINISHED" for p in parents)
    return parents


def test_din_retrains_daily_on_histories_carried_from_day_to_day(movielens_raw, tmp_path):
    stack = _two_days(movielens_raw, tmp_path, "conf/movielens_din.yaml", "movielens_din_test")
    features = stack["var"] / "features"
    # the window's days were prepared in order, each carrying its users' histories on
    states = sorted(p.name for p in (features / "_sequence_state").iterdir())
    assert {f"ds={d}" for d in DAYS[:2]} <= set(states)
    part = next((features / f"ds={DAYS[1]}").glob("*.parquet"))
    histories = pq.read_table(part, columns=["hist_item_id", "hist_rating"]).to_pydict()
    lengths = [len(h) for h in histories["hist_item_id"]]
    assert max(lengths) == 20 and sum(n > 0 for n in lengths) > 0.5 * len(lengths)
    assert [len(h) for h in histories["hist_rating"]] == lengths
    for parent in _parents(stack):
        assert 0.5 < parent.data.metrics["eval.auc"] < 1.0


def test_mmoe_retrains_daily_with_each_tasks_metrics_in_mlflow_and_the_daily_table(movielens_raw, tmp_path):
    from mlflow import MlflowClient

    from recpipe.runs.compare import DAY_COLUMNS, day_history

    stack = _two_days(
        movielens_raw,
        tmp_path,
        "conf/movielens_mmoe.yaml",
        "movielens_mmoe_test",
        gate={
            "metric": "like/auc",
            "guard_tasks": ["rated_high"],
            "tolerance": 0.05,
            "min_metric": 0.3,
            "inconclusive": "promote",
        },
    )
    parents = _parents(stack)
    for parent in parents:
        m = parent.data.metrics
        for task in ("like", "rated_high"):
            assert 0.5 < m[f"eval.{task}/auc"] < 1.0, task
        assert m["eval.auc"] == m["eval.like/auc"]
    client = MlflowClient(stack["tracking_uri"], registry_uri=stack["tracking_uri"])
    exp = client.get_experiment_by_name(stack["model"])
    days = day_history(client, exp.experiment_id)
    assert list(days.columns) == DAY_COLUMNS + ["like/auc", "rated_high/auc"]
    assert days["ds"].tolist() == DAYS[:2]
    assert days["rated_high/auc"].tolist() == [p.data.metrics["eval.rated_high/auc"] for p in parents]
