"""A private Airflow + MLflow + data root per test session, and the daily DAG run for real
(``airflow dags test``) on four consecutive MovieLens days."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
import yaml

from tests.support import ROOT, spark_connect_url

DAYS = ["1997-09-22", "1997-09-23", "1997-09-24", "1997-09-25"]
MODEL = "movielens_test"
# the daily DAG's four days (daily_runs) train with EasyRec's separate evaluator beside the
# job; the other deployments without it (a TensorFlow process less a day)
SEPARATE = {"eval_config.eval_method": "separate"}


@pytest.fixture(scope="session")
def stack(movielens_raw, tmp_path_factory) -> dict:
    """Env (Airflow home, var dir, retrain config, MLflow URI) of a fresh local deployment;
    its champion scores each day's candidates (``batch_predict``, ``write_candidates``)."""
    base = tmp_path_factory.mktemp("stack")
    var = base / "var"
    write_candidates(movielens_raw, var / "candidates", DAYS)
    scoring = {
        "input_path": f"{var}/candidates/ds={{{{ ds }}}}",
        "output_path": f"{var}/scores/ds={{{{ ds }}}}",
    }
    return new_stack(movielens_raw, base, SEPARATE, batch_predict=scoring)


def write_candidates(raw, out, days: list[str]) -> None:
    """Each day's events joined with the user and item snapshots, as a team's candidate rows
    carry every column the model reads: ``out/ds=<day>/part-00000.csv``, with a header."""
    import pyarrow.csv as pacsv

    ids = pacsv.ConvertOptions(column_types={"user_id": "string", "item_id": "string", "zip_code": "string"})
    users = pacsv.read_csv(raw / "dims" / "users.csv", convert_options=ids)
    items = pacsv.read_csv(raw / "dims" / "items.csv", convert_options=ids)
    for ds in days:
        events = pacsv.read_csv(raw / "events" / f"ds={ds}" / "part-00000.csv", convert_options=ids)
        rows = events.join(users, "user_id", join_type="left outer").join(
            items, "item_id", join_type="left outer"
        )
        (out / f"ds={ds}").mkdir(parents=True)
        pacsv.write_csv(
            rows.sort_by([("timestamp", "ascending"), ("user_id", "ascending")]),
            out / f"ds={ds}" / "part-00000.csv",
        )


def new_stack(movielens_raw, base, edits: dict | None = None, **overrides) -> dict:
    """A fresh local deployment in ``base`` over a copy of the raw logs; its env and paths.
    ``edits`` update the retrain config's ``edit_config_json``; ``overrides`` replace its
    top-level fields."""
    from dev.env import airflow_env

    spark_connect_url()  # prepare_features runs on it
    var = base / "var"
    shutil.copytree(movielens_raw, var / "raw", dirs_exist_ok=True)
    retrain = {
        "pipeline_config_path": "conf/movielens_deepfm.yaml",
        "model_name": MODEL,
        "dag_id": "recpipe_daily_retrain",
        "start_date": DAYS[0],
        "training_window_days": 7,
        "retention_days": 3,
        "runs_dir": str(var / "runs"),
        "export_dir": str(var / "exports"),
        "edit_config_json": {
            "raw_input_path": str(var / "raw" / "events"),
            "train_input_path": str(var / "features"),
            "model_dir": str(var / "model"),
            "data_config.batch_size": 64,
            "data_config.num_epochs": 2,
            "train_config.log_step_count_steps": 5,
            "train_config.save_checkpoints_steps": 10,
            "eval_config.eval_method": "none",
        },
        "sensor": {"mode": "reschedule", "poke_interval_s": 1, "timeout_s": 3},
        "validation": {
            "min_rows": 20,
            "positive_rate_min": 0.2,
            "positive_rate_max": 0.9,
            "drift_tolerance": 0.5,
        },
        # what each day's gate decides can be stated (see the daily DAG's tests): a fresher
        # model that is not significantly worse takes over; the floor sits below a one-step
        # model's AUC, so that the paired test is what rejects it
        "gate": {"metric": "auc", "tolerance": 0.05, "min_metric": 0.3, "inconclusive": "promote"},
        "tracking": {"retries": 0},
        "timeouts": {"default_s": 1800, "tasks": {"train": 3600}},
    }
    retrain["edit_config_json"].update(edits or {})
    retrain.update(overrides)
    (base / "retrain.yaml").write_text(yaml.safe_dump(retrain))
    env = {
        **os.environ,
        **airflow_env(ROOT, base / "airflow"),
        "RECPIPE_VAR_DIR": str(var),
        # this model's DAG alone; recpipe_train's defaults from it too
        "RECPIPE_RETRAIN_CONFIGS": str(base / "retrain.yaml"),
        "RECPIPE_TRAIN_CONFIG": str(base / "retrain.yaml"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{var / 'mlflow' / 'mlflow.db'}",
    }
    from dev.airflow import migrate_db

    migrate_db(env)
    return {"env": env, "var": var, "base": base, "tracking_uri": env["MLFLOW_TRACKING_URI"]}


def airflow(
    env: dict, *args: str, check: bool = True, timeout: int = 900, on: list[str] = ()
) -> subprocess.CompletedProcess:
    """Run the ``airflow`` CLI of this environment (``on``: a prefix that runs it elsewhere,
    e.g. ``ip netns exec NS``); on failure, show the output's tail."""
    proc = subprocess.run(
        [*on, sys.executable, "-m", "airflow", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"airflow {' '.join(args)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    return proc


@pytest.fixture(scope="session")
def daily_runs(stack) -> dict:
    """Day 1 from scratch, day 2 warm-started, day 3 a deliberately worse model (full
    retrain, one step) that is rejected, day 4 warm-started from the champion rather than
    from day 3: each through ``airflow dags test``."""
    env = stack["env"]
    logs = {}
    for ds in DAYS[:2]:
        proc = airflow(env, "dags", "test", "recpipe_daily_retrain", ds)
        logs[ds] = proc.stdout + proc.stderr
    worse = {"full_retrain": True, "edit_config_json": {"train_config.num_steps": 1}}
    logs[DAYS[2]] = airflow(
        env, "dags", "test", "recpipe_daily_retrain", DAYS[2], "-c", json.dumps(worse)
    ).stdout
    proc = airflow(env, "dags", "test", "recpipe_daily_retrain", DAYS[3])
    logs[DAYS[3]] = proc.stdout + proc.stderr
    return {**stack, "logs": logs, "runs": stack["var"] / "runs" / MODEL}


@contextlib.contextmanager
def fresh_postgres_db():
    """A fresh database on the PostgreSQL server at 127.0.0.1 (SQLAlchemy URL), dropped after,
    even when the test fails."""
    name = f"recpipe_airflow_{uuid.uuid4().hex[:8]}"
    psql = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-v", "ON_ERROR_STOP=1", "-c"]
    subprocess.run([*psql, f"CREATE DATABASE {name}"], check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"
    finally:
        subprocess.run([*psql, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"], capture_output=True)


@pytest.fixture
def postgres_db():
    """A fresh PostgreSQL metadata database for one test (``fresh_postgres_db``)."""
    with fresh_postgres_db() as url:
        yield url
