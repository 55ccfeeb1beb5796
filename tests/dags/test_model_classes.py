"""Three models in one deployment, under one running scheduler (LocalExecutor):
``conf/movielens_din.yaml`` daily (the Spark job carries each user's history from day to day),
``conf/movielens_mmoe.yaml`` daily on weekdays (two tasks: each task's metrics reach MLflow and
the daily table, and the gate reads ``like/auc``) and a stream model (two hourly passes of
click logs, the second closing the day), each its own DAG from its own retrain config, their
backfills running at once, their TensorFlow jobs sharing an Airflow pool of one training
slot; a fourth, broken config in the folder is an import error in the UI, naming it, while
the three run. Each model promotes its own champion and writes only its own dirs, runs and
Redis keys."""

from __future__ import annotations

import json
import uuid
from datetime import datetime

import pyarrow.parquet as pq
import pytest
import yaml

from tests.dags.conftest import DAYS, fresh_postgres_db, new_stack
from tests.support import ROOT, write_click_log

pytestmark = pytest.mark.slow

EDITS = {"data_config.num_epochs": 1}  # (new_stack trains without the sidecar evaluator)
MODELS = {"din": "movielens_din_test", "mmoe": "movielens_mmoe_test"}
STREAM_DAG = "stream_passes"
PASSES = [f"{DAYS[0]}T19:00", f"{DAYS[0]}T20:00"]  # the second closes the day
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
    from dev.airflow import _create_backfill, deployment, follow_runs, migrate_db
    from dev.env import database_env
    from tests.support import doc_commands, run_doc_commands

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
    stream = _stream_config(movielens_raw, var, common)
    (folder / "stream.yaml").write_text(yaml.safe_dump(stream))
    (folder / "broken.yaml").write_text(
        yaml.safe_dump({**common, "model_name": "broken", "retention_days": 0})
    )
    extra = {"AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False"}
    states, tasks = {}, {}
    # the pool made as docs/models.md says
    pool_test = (
        "tests/dags/test_model_classes.py::test_the_models_training_jobs_took_the_pools_one_slot_in_turn"
    )
    # PostgreSQL, as production runs several models: Airflow refuses to create a backfill on
    # SQLite while the scheduler writes the runs of another
    with fresh_postgres_db() as db:
        env = {**stack["env"], **database_env(db), "RECPIPE_RETRAIN_CONFIGS": str(folder)}
        env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS", None)
        migrate_db(env)
        run_doc_commands(doc_commands("models.md", pool_test), base, env)
        with deployment(env, base / "airflow", db, extra_env=extra) as api:
            broken = api.wait_for_import_error("recpipe_retrain_configs.py")
            runs = {f"{kind}_daily": DAYS[:2] for kind in MODELS} | {STREAM_DAG: PASSES}
            for dag_id, days in runs.items():
                api.wait_for_dag(dag_id)
                _create_backfill(api, dag_id, days, print)
            for dag_id, days in runs.items():
                states[dag_id] = follow_runs(api, dag_id, days, 1800, print)
                tasks[dag_id] = [
                    t for r in api.runs(dag_id) for t in api.task_instances(dag_id, r["dag_run_id"])
                ]
    for dag_id, instances in tasks.items():  # what a busy machine retried, for the record
        for t in instances:
            if (t.get("try_number") or 1) > 1 or t.get("state") != "success":
                print(dag_id, t.get("logical_date"), t["task_id"], t.get("state"), "try", t.get("try_number"))
    store = _store(stream["model_name"])
    yield {**stack, "states": states, "tasks": tasks, "broken": broken, "stream": stream, "store": store}
    for key in store["client"].scan_iter(match=f"recpipe:{stream['model_name']}:*"):
        store["client"].delete(key)


def _stream_config(movielens_raw, var, common: dict) -> dict:
    """The shipped stream config on two passes of click logs (400 pairs each, clicks by
    occupation), in the deployment's runs and export dirs, a Redis key space of its own."""
    write_click_log(
        movielens_raw, var / "raw_stream", [p.replace("T", "/")[:13] for p in PASSES], 400, 0.7, 0.15
    )
    stream = yaml.safe_load((ROOT / "conf/retrain/movielens_stream.yaml").read_text())
    stream.update(
        model_name=f"movielens_stream_test_{uuid.uuid4().hex[:6]}",  # its Redis keys
        dag_id=STREAM_DAG,
        start_date=DAYS[0],
        runs_dir=common["runs_dir"],
        export_dir=common["export_dir"],
        pool="training",
        tags=["stream"],
        sensor={"mode": "reschedule", "poke_interval_s": 1, "timeout_s": 30},
        tracking={"retries": 0},
        gate={"min_metric": 0.0, "inconclusive": "promote", "tolerance": 0.02},
    )
    stream["stream"]["close_hour"] = int(PASSES[-1][11:13])
    stream["edit_config_json"].update(
        {
            "raw_input_path": str(var / "raw_stream" / "events"),
            "train_input_path": str(var / "features_stream"),
            "model_dir": str(var / "model_stream"),
        }
    )
    return stream


def _store(model: str) -> dict:
    """What Redis holds: the export the stream model's key space serves, its rows, and every
    recpipe key space present."""
    import redis

    from recpipe.exports.store import EmbeddingStore

    client = redis.Redis(host="127.0.0.1", port=6379)
    spaces = {key.decode().split(":")[1] for key in client.scan_iter(match="recpipe:*")}
    online = EmbeddingStore(client, model)
    rows = online.read_rows("user_id")
    return {"client": client, "applied": online.applied(), "rows": rows, "spaces": spaces}


def test_each_model_runs_as_its_own_dag_and_a_broken_config_harms_none(models):
    assert models["states"] == {
        **{f"{kind}_daily": dict.fromkeys(DAYS[:2], "success") for kind in MODELS},
        STREAM_DAG: dict.fromkeys(PASSES, "success"),
    }
    assert "broken.yaml" in models["broken"] and "retention_days" in models["broken"]
    assert "din.yaml" not in models["broken"] and "mmoe.yaml" not in models["broken"]


@pytest.mark.parametrize("kind", MODELS)
def test_each_models_second_day_fine_tunes_from_its_first(models, kind):
    runs = models["var"] / "runs" / MODELS[kind]
    second = json.loads((runs / f"ds={DAYS[1]}" / "train_result.json").read_text())
    assert second["fine_tune_checkpoint"] == str(runs / f"ds={DAYS[0]}")
    assert second["fine_tune"]["restored"] > 10 and not second["fine_tune"]["missing"]


def test_the_models_training_jobs_took_the_pools_one_slot_in_turn(models):
    # those that ran (a pass that does not close the day skips the close's jobs: a skipped
    # task's start and end are the moment it was skipped, and it held no slot)
    jobs = [
        t
        for tasks in models["tasks"].values()
        for t in tasks
        if t["pool"] == "training" and t["state"] in ("success", "failed")
    ]
    assert {t["task_id"] for t in jobs} >= {"train", "evaluate", "evaluate_champion", "export"}
    spans = sorted(
        (
            datetime.fromisoformat(t["start_date"]),
            datetime.fromisoformat(t["end_date"]),
            t["dag_id"],
            t["task_id"],
        )
        for t in jobs
    )
    assert len({span[2] for span in spans}) == 3
    for first, second in zip(spans, spans[1:], strict=False):
        assert second[0] >= first[1], (first, second)  # never two at once
    assert {
        t["pool"] for tasks in models["tasks"].values() for t in tasks if t["task_id"] == "validate_features"
    } == {"default_pool"}


def test_each_model_promotes_its_own_champion_in_its_own_experiment(models):
    from mlflow import MlflowClient

    from recpipe.champion import current

    client = MlflowClient(models["tracking_uri"])
    names = [*MODELS.values(), models["stream"]["model_name"]]
    for model in names:
        champion = current(client, model)
        assert champion is not None and champion.tags["model_dir"].startswith(
            str(models["var"] / "runs" / model)
        )
        assert client.get_experiment_by_name(model) is not None
    assert {d.name for d in (models["var"] / "runs").iterdir()} == set(names)
    assert {d.name for d in (models["var"] / "exports").iterdir()} == set(names)


def test_the_stream_model_serves_its_days_last_pass_from_its_own_redis_keys(models):
    from recpipe.exports.files import apply, chain, read_params

    store, model = models["store"], models["stream"]["model_name"]
    exports = chain(models["var"] / "exports" / model / DAYS[0])
    assert store["applied"]["day"] == DAYS[0]
    assert store["applied"]["name"] == exports[-1].name  # the close's export
    params = read_params(exports[0])
    for export in exports[1:]:
        params = apply(params, read_params(export))
    served = set(params.tables["user_id"].ids.tolist())
    assert served and set(store["rows"]) == served
    # the daily models push nothing: no key space of theirs
    assert not {*MODELS.values()} & store["spaces"] and model in store["spaces"]


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


def test_every_kind_of_export_serves_on_stock_tensorflow(models, tmp_path):
    """DIN's (hashed tables, histories), MMoE's (two tasks) and the stream model's (online
    tables) SavedModels load and score in a process of stock TensorFlow alone."""
    from tests.serving_stock import check_stock_serving, saved_models

    newest = {}  # each model's newest SavedModel: one of each kind, not every day's again
    for export in saved_models(models["var"] / "exports"):
        newest[export.relative_to(models["var"] / "exports").parts[0]] = export
    assert set(newest) == {*MODELS.values(), models["stream"]["model_name"]}, newest
    for export in newest.values():
        assert check_stock_serving(export, tmp_path)["ops"] > 10
