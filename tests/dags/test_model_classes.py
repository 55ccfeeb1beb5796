"""Two models beyond DeepFM in one deployment, under one running scheduler (LocalExecutor):
``conf/movielens_din.yaml`` (the Spark job carries each user's history from day to day) and
``conf/movielens_mmoe.yaml`` (two tasks: each task's metrics reach MLflow and the daily table,
and the gate reads ``like/auc``), each its own DAG from its own retrain config, on its own
schedule, two days each as backfills running at once, their TensorFlow jobs sharing an
Airflow pool of one training slot; a third, broken config in the folder becomes a DAG that
shows its error while the two models run. Each model promotes its own champion and writes
only its own dirs and runs."""

from __future__ import annotations

import json
from datetime import datetime

import pyarrow.parquet as pq
import pytest
import yaml

from tests.dags.conftest import DAYS, new_stack

pytestmark = pytest.mark.slow

EDITS = {"data_config.num_epochs": 1}  # (new_stack trains without the sidecar evaluator)
MODELS = {"din": "movielens_din_test", "mmoe": "movielens_mmoe_test"}
MMOE_GATE = {
    "metric": "like/auc",
    "guard_tasks": ["rated_high"],
    "tolerance": 0.05,
    "min_metric": 0.3,
    "inconclusive": "promote",
}


@pytest.fixture(scope="module")
def models(movielens_raw, tmp_path_factory) -> dict:
    """The folder of three retrain configs, the deployment's backfills of two days for both
    models at once, and what the API server says of their task instances."""
    from dev.airflow import _create_backfill, deployment, follow_runs

    base = tmp_path_factory.mktemp("models")
    stack = new_stack(movielens_raw, base, EDITS, training_window_days=3)
    common = yaml.safe_load((base / "retrain.yaml").read_text())
    var = stack["var"]
    folder = base / "retrain"
    folder.mkdir()
    for kind, conf, schedule, extra in (
        ("din", "conf/movielens_din.yaml", "@daily", {}),
        ("mmoe", "conf/movielens_mmoe.yaml", "0 0 * * 1-5", {"gate": MMOE_GATE}),  # weekdays
    ):
        config = {
            **common,
            **extra,
            "pipeline_config_path": conf,
            "model_name": MODELS[kind],
            "dag_id": f"{kind}_daily",
            "schedule": schedule,
            "pool": "training",
            "tags": [kind],
        }
        config.pop("end_date", None)
        # each model's features and model dir of its own: the two pipelines write different columns
        config["edit_config_json"] = {
            **common["edit_config_json"],
            "train_input_path": str(var / f"features_{kind}"),
            "model_dir": str(var / f"model_{kind}"),
        }
        (folder / f"{kind}.yaml").write_text(yaml.safe_dump(config))
    (folder / "broken.yaml").write_text(
        yaml.safe_dump({**common, "model_name": "broken", "retention_days": 0})
    )
    env = {**stack["env"], "RECPIPE_RETRAIN_CONFIGS": str(folder)}
    extra = {"AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False"}
    states, tasks = {}, {}
    with deployment(env, base / "airflow", extra_env=extra) as api:
        api.set_pool("training", 1, "the cluster's one training slot")
        broken = api.wait_for_dag("broken_config_error")
        for kind in MODELS:
            api.wait_for_dag(f"{kind}_daily")
            _create_backfill(api, f"{kind}_daily", DAYS[:2], print)
        for kind in MODELS:
            states[kind] = follow_runs(api, f"{kind}_daily", DAYS[:2], 1800, print)
            tasks[kind] = [
                t
                for r in api.runs(f"{kind}_daily")
                for t in api.task_instances(f"{kind}_daily", r["dag_run_id"])
            ]
    for model in MODELS.values():
        runs = var / "runs" / model
        second = json.loads((runs / f"ds={DAYS[1]}" / "train_result.json").read_text())
        assert second["fine_tune_checkpoint"] == str(runs / f"ds={DAYS[0]}")
        assert second["fine_tune"]["restored"] > 10 and not second["fine_tune"]["missing"]
    return {**stack, "states": states, "tasks": tasks, "broken": broken}


def test_each_model_runs_as_its_own_dag_and_a_broken_config_harms_neither(models):
    assert models["states"] == {kind: dict.fromkeys(DAYS[:2], "success") for kind in MODELS}
    assert "config-error" in [t["name"] for t in models["broken"]["tags"]]
    assert "retention_days" in (models["broken"].get("description") or "")


def test_the_models_training_jobs_took_the_pools_one_slot_in_turn(models):
    jobs = [t for kind in MODELS for t in models["tasks"][kind] if t["pool"] == "training"]
    assert {t["task_id"] for t in jobs} >= {"train", "evaluate", "evaluate_champion", "export"}
    spans = sorted(
        (datetime.fromisoformat(t["start_date"]), datetime.fromisoformat(t["end_date"]), t["dag_id"])
        for t in jobs
    )
    assert len({dag for *_, dag in spans}) == 2
    for (_, end, _), (start, _, _) in zip(spans, spans[1:], strict=False):
        assert start >= end  # never two at once
    assert {
        t["pool"] for kind in MODELS for t in models["tasks"][kind] if t["task_id"] == "validate_features"
    } == {"default_pool"}


def test_each_model_promotes_its_own_champion_in_its_own_experiment(models):
    from mlflow import MlflowClient

    from recpipe.champion import current

    client = MlflowClient(models["tracking_uri"])
    for model in MODELS.values():
        champion = current(client, model)
        assert champion is not None and champion.tags["model_dir"].startswith(
            str(models["var"] / "runs" / model)
        )
        assert client.get_experiment_by_name(model) is not None
    assert {d.name for d in (models["var"] / "runs").iterdir()} == set(MODELS.values())


def _parents(stack, model: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(stack["tracking_uri"], registry_uri=stack["tracking_uri"])
    exp = client.get_experiment_by_name(model)
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`recpipe.step` = 'parent'")
    parents = sorted(runs, key=lambda r: r.data.tags["ds"])
    assert [p.data.tags["ds"] for p in parents] == DAYS[:2]
    assert all(p.info.status == "FINISHED" for p in parents)
    return parents


def test_din_retrains_daily_on_histories_carried_from_day_to_day(models):
    stack = models
    features = stack["var"] / "features_din"
    # the window's days were prepared in order, each carrying its users' histories on
    states = sorted(p.name for p in (features / "_sequence_state").iterdir())
    assert {f"ds={d}" for d in DAYS[:2]} <= set(states)
    part = next((features / f"ds={DAYS[1]}").glob("*.parquet"))
    histories = pq.read_table(part, columns=["hist_item_id", "hist_rating"]).to_pydict()
    lengths = [len(h) for h in histories["hist_item_id"]]
    assert max(lengths) == 20 and sum(n > 0 for n in lengths) > 0.5 * len(lengths)
    assert [len(h) for h in histories["hist_rating"]] == lengths
    for parent in _parents(stack, MODELS["din"]):
        assert 0.5 < parent.data.metrics["eval.auc"] < 1.0


def test_mmoe_retrains_daily_with_each_tasks_metrics_in_mlflow_and_the_daily_table(models):
    from mlflow import MlflowClient

    from recpipe.runs.compare import DAY_COLUMNS, day_history

    stack = models
    parents = _parents(stack, MODELS["mmoe"])
    for parent in parents:
        m = parent.data.metrics
        for task in ("like", "rated_high"):
            assert 0.5 < m[f"eval.{task}/auc"] < 1.0, task
        assert m["eval.auc"] == m["eval.like/auc"]
    client = MlflowClient(stack["tracking_uri"], registry_uri=stack["tracking_uri"])
    exp = client.get_experiment_by_name(MODELS["mmoe"])
    days = day_history(client, exp.experiment_id)
    assert list(days.columns) == DAY_COLUMNS + ["like/auc", "rated_high/auc"]
    assert days["ds"].tolist() == DAYS[:2]
    assert days["rated_high/auc"].tolist() == [p.data.metrics["eval.rated_high/auc"] for p in parents]
