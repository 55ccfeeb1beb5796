"""The MLflow hook against a real tracking server on 127.0.0.1 (runs, metrics, registry,
alias), and the clear failure when the server is down."""

from __future__ import annotations

import os

import pytest

from operators.hooks.mlflow import MLflowHook, TrackingUnavailableError, flatten
from recpipe.registry import move_alias, register_version
from tests import support
from tests.support import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture
def mlflow_server(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with support.mlflow_server(
        tmp_path, store, "--artifacts-destination", str(tmp_path / "artifacts")
    ) as server:
        yield server


def test_runs_metrics_and_registry_through_the_server(mlflow_server, tmp_path, monkeypatch):
    uri, proc = mlflow_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    hook = MLflowHook(mlflow_conn_id="")
    assert hook.tracking_uri() == uri and hook.artifact_root() is None
    parent = hook.parent_run("exp", "dag", "run-1", {"ds": "1997-09-22"})
    assert hook.parent_run("exp", "dag", "run-1", {}) == parent  # found again, not duplicated
    child = hook.child_run(parent, "train")
    hook.log_params(child, flatten({"a": {"b": [{"c": 1}, {"c": 2}]}, "d": [1, 2]}))
    assert hook.log_metrics(child, [("loss", 0.7 - 0.1 * s, s) for s in range(3)]) == 3
    model = tmp_path / "export" / "1"
    model.mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"x" * 100)
    hook.log_artifact(child, model, "model")
    hook.end_run(child)
    source = hook.artifact_uri(child, "model")
    version = register_version(hook.get_client(), "m", source, child, {"ds": "1997-09-22"})
    move_alias(hook.get_client(), "m", version.version, None, by="test", reason="first", action="set")
    assert hook.champion("m").version == version.version and hook.champion("other") is None
    client = hook.get_client()
    run = client.get_run(child)
    assert run.data.params == {"a.b.0.c": "1", "a.b.1.c": "2", "d": "[1, 2]"}
    assert [m.value for m in client.get_metric_history(child, "loss")] == pytest.approx([0.7, 0.6, 0.5])
    assert [a.path for a in client.list_artifacts(child, "model")] == ["model/saved_model.pb"]

    # retries on a registered model: the version an attempt registered is found by its tags
    assert [v.version for v in hook.versions("m", {"ds": "1997-09-22"})] == [version.version]
    assert hook.versions("m", {"ds": "1997-09-23"}) == [] and hook.versions("other") == []

    # the evaluated rows as a dataset input; a retried task logging it again adds no second one
    for _ in range(2):
        hook.log_dataset(child, "ds=1997-09-22 held-out", "0123456789abcdef", "/data/features/ds=1997-09-22")
    (entry,) = client.get_run(child).inputs.dataset_inputs
    assert (entry.dataset.name, entry.dataset.digest) == ("ds=1997-09-22 held-out", "0123456789abcdef")
    assert entry.dataset.source == '{"uri": "/data/features/ds=1997-09-22"}'

    os.killpg(proc.pid, 15)
    proc.wait(30)
    # a registry that cannot be read is an error, never "no champion" (which promotes anything)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with pytest.raises(Exception) as err:
        hook.champion("m")
    assert "Connection" in repr(err.value) or "connect" in str(err.value).lower(), repr(err.value)
    with pytest.raises(TrackingUnavailableError, match=f"MLflow tracking server {uri} is unreachable"):
        MLflowHook(mlflow_conn_id="").get_client()


def test_the_deployments_basic_auth_server_refuses_strangers_and_serves_the_hook(tmp_path, monkeypatch):
    """``mlflow server --app-name basic-auth`` with the ini docker-compose ships (its user
    store moved to tmp): no user, no alias moves; the operators' hook logs in from the env."""
    import requests

    ini = (ROOT / "deploy/mlflow_basic_auth.ini").read_text()
    ini = ini.replace("sqlite:////var/lib/recpipe/mlflow/basic_auth.db", f"sqlite:///{tmp_path / 'auth.db'}")
    assert str(tmp_path) in ini
    (tmp_path / "auth.ini").write_text(ini)
    env = {
        "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "auth.ini"),
        "MLFLOW_AUTH_ADMIN_PASSWORD": "s3cret-for-the-test",
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "csrf-key-for-the-test",
    }
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ("--app-name", "basic-auth", "--artifacts-destination", str(tmp_path / "artifacts"))
    with support.mlflow_server(tmp_path, store, *args, env=env) as (uri, _):
        search = uri + "/api/2.0/mlflow/registered-models/search"
        assert requests.get(search, timeout=10).status_code == 401
        assert requests.get(search, auth=("admin", "wrong"), timeout=10).status_code == 401
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret-for-the-test")
        hook = MLflowHook(mlflow_conn_id="")
        run = hook.child_run(hook.parent_run("exp", "dag", "run-1", {}), "export")
        source = hook.artifact_uri(run, "model")
        version = register_version(hook.get_client(), "m", source, run, {"ds": "1997-09-22"})
        move_alias(hook.get_client(), "m", version.version, None, by="test", reason="first", action="set")
        assert hook.champion("m").version == version.version
        # a login is verified once a minute (auth_cache_ttl_seconds): a wrong password after
        # the right one is still refused
        assert requests.get(search, auth=("admin", "s3cret-for-the-test"), timeout=10).status_code == 200
        assert requests.get(search, auth=("admin", "wrong"), timeout=10).status_code == 401


def test_task_processes_opening_a_new_sqlite_store_at_once_all_get_it(tmp_path):
    """Several tasks' first MLflow call on a fresh SQLite database, at the same moment: MLflow
    creates the tables on first use, and without the hook's lock two creators collided ("table
    logged_models already exists", a failed task in a three-model deployment)."""
    import subprocess
    import sys

    uri = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    code = (
        "import sys, time; from operators.hooks.mlflow import MLflowHook; "
        "t = float(sys.argv[1]); time.sleep(max(0.0, t - time.time())); "
        "MLflowHook(mlflow_conn_id='').experiment_id('race')"
    )
    start = __import__("time").time() + 8  # past every process's imports: they start together
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(start)], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    errors = [p.communicate(timeout=180)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e[-600:] for e in errors]


def test_a_runs_link_is_the_published_ui_in_the_model_training_view(monkeypatch, tmp_path):
    """Where the tracking URI is a compose-internal host, the link a task logs names the
    connection's ``ui_url`` and opens MLflow's model-training view, not its GenAI one."""
    import json

    from mlflow import MlflowClient

    from operators.hooks.mlflow import MLflowHook

    conn = {"conn_type": "http", "host": "mlflow", "port": 5000, "extra": {"ui_url": "http://127.0.0.1:5005/"}}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(conn))
    hook = MLflowHook()
    assert hook.tracking_uri() == "http://mlflow:5000" and hook.ui_url() == "http://127.0.0.1:5005"
    # the run itself in a real MLflow store (no server named mlflow answers here)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    hook._client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = hook._client.create_experiment("links", artifact_location=(tmp_path / "a").as_uri())
    run = hook._client.create_run(experiment).info.run_id
    link = hook.run_link(run)
    assert link == f"http://127.0.0.1:5005/#/experiments/{experiment}/runs/{run}?workflowType=machine_learning"
