"""docker-compose.yaml (Docker does not run here): it parses, takes its secrets from the env
file, publishes on 127.0.0.1 only, and every setting it passes is one the project, Airflow
or the service's image reads."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.support import ROOT

REFERENCE = re.compile(r"\$\{(\w+)(?::?[-?][^}]*)?\}")
# variables the official images document (postgres) or MLflow's server reads
IMAGE_SETTINGS = {
    "POSTGRES_USER",
    "POSTGRES_PASSWORD",
    "POSTGRES_DB",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION",
    "MLFLOW_BACKEND_STORE_URI",  # mlflow server --backend-store-uri's variable
    "MLFLOW_AUTH_CONFIG_PATH",
    "MLFLOW_AUTH_ADMIN_PASSWORD",
    "MLFLOW_FLASK_SERVER_SECRET_KEY",
    "MLFLOW_TRACKING_USERNAME",  # the MLflow client's basic-auth login
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT",  # the MLflow client: its links name the internal host
    "REDIS_PASSWORD",  # the redis service's own command reads it
    "REDISCLI_AUTH",  # redis-cli (the health check)
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


def _env(service: dict) -> dict:
    return service.get("environment") or {}


def _project_source() -> str:
    files = [
        *ROOT.glob("recpipe/**/*.py"),
        *ROOT.glob("operators/**/*.py"),
        *ROOT.glob("dags/*.py"),
        *ROOT.glob("features/**/*.py"),
        *ROOT.glob("dev/*.py"),
    ]
    return "\n".join(p.read_text() for p in files)


def test_services_of_the_deployment(compose):
    services = compose["services"]
    for name in (
        "postgres",
        "redis",
        "mlflow",
        "airflow-init",
        "airflow-api-server",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
        "airflow-worker",
        "spark-connect",
    ):
        assert name in services, name
    assert _env(services["airflow-worker"])["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert services["airflow-worker"]["build"]["context"] == "."
    for service in services.values():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), port
    # Spark Connect takes no password: it listens on the worker's loopback, in its namespace
    connect = services["spark-connect"]
    assert connect["network_mode"] == "service:airflow-worker"
    assert "--host 127.0.0.1" in connect["command"] and not connect.get("ports")
    conn = json.loads(_env(services["airflow-worker"])["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    port = connect["command"].split("--port ")[1].split()[0]
    assert (conn["host"], str(conn["port"])) == ("127.0.0.1", port)


def test_secrets_come_from_the_env_file(compose):
    text = (ROOT / "docker-compose.yaml").read_text()
    declared = {
        line.split("=")[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    }
    used = set(REFERENCE.findall(text)) - {"GIT_COMMIT"}
    assert used <= declared, used - declared
    for service in compose["services"].values():
        for key, value in _env(service).items():
            if re.search(r"PASSWORD$|SECRET|FERNET", key):
                assert REFERENCE.fullmatch(str(value)), f"{key} must come from .env, not the compose file"
    # the admin password is required (":?"), never defaulted
    assert "${AIRFLOW_ADMIN_PASSWORD:?" in text and "${POSTGRES_PASSWORD:?" in text


def test_every_setting_is_read_by_someone(compose):
    from airflow.configuration import conf

    from operators.hooks.store import STORE_CONN_ID

    source = _project_source()
    retrain = yaml.safe_load((ROOT / "conf/retrain/movielens_daily.yaml").read_text())
    stream = yaml.safe_load((ROOT / "conf/retrain/movielens_stream.yaml").read_text())
    connections = {
        "spark_default": retrain.get("spark_conn_id", "spark_default"),
        "spark_connect_default": retrain.get("spark_connect_conn_id", "spark_connect_default"),
        "fs_default": "fs_default",
        "mlflow_default": retrain["tracking"]["mlflow_conn_id"],
        "recpipe_arrivals": stream["sensor"]["arrivals_conn_id"],
        "recpipe_store": STORE_CONN_ID,  # the online store's pushes and restores
    }
    for name, service in compose["services"].items():
        for key in _env(service):
            if key.startswith("AIRFLOW__"):
                section, option = key.removeprefix("AIRFLOW__").lower().split("__", 1)
                known = conf.configuration_description.get(section, {}).get("options", {})
                assert option in known, f"{name}: {key} is no Airflow option"
            elif key.startswith("AIRFLOW_CONN_"):
                conn = key.removeprefix("AIRFLOW_CONN_").lower()
                assert conn in connections.values(), f"{name}: connection {conn} is not used by the DAGs"
            elif key == "AIRFLOW_ADMIN_PASSWORD":
                assert "AIRFLOW_ADMIN_PASSWORD" in service["command"]
            elif key not in IMAGE_SETTINGS:
                assert f'"{key}"' in source, f"{name}: {key} is not read by the project"
    dockerfile = (ROOT / "Dockerfile").read_text()
    for key in re.findall(r"(RECPIPE_\w+)=", dockerfile):
        assert f'"{key}"' in source, f"Dockerfile: {key} is not read by the project"


def test_no_service_listens_without_a_password_or_shows_one_on_its_command_line(compose, monkeypatch):
    services = compose["services"]
    for name, service in services.items():
        command = service.get("command") or ""
        command = " ".join(command) if isinstance(command, list) else command
        assert not re.search(r"\$\{\w*PASSWORD", command), f"{name}: a password on the command line"
        assert "postgresql" not in command, f"{name}: a database URI on the command line"
    # Redis: requirepass from the environment; the broker URL and the health check log in
    redis = services["redis"]
    assert "requirepass $$REDIS_PASSWORD" in " ".join(redis["command"])
    assert _env(redis)["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    assert _env(redis)["REDISCLI_AUTH"] == "${REDIS_PASSWORD}"
    broker = _env(services["airflow-worker"])["AIRFLOW__CELERY__BROKER_URL"]
    assert broker.startswith("redis://:${REDIS_PASSWORD:?") and broker.endswith("@redis:6379/0")
    # MLflow: basic auth, its admin password and database URI from the environment
    mlflow = services["mlflow"]
    assert "--app-name basic-auth" in mlflow["command"]
    env = _env(mlflow)
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://recpipe:${POSTGRES_PASSWORD}@")
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"].startswith("${MLFLOW_ADMIN_PASSWORD:?")
    ini = ROOT / env["MLFLOW_AUTH_CONFIG_PATH"].removeprefix("/opt/recpipe/")
    assert ini.exists() and "admin_password" not in ini.read_text().replace("# ", "")
    # each request's login is a scrypt check (0.1 CPU-s) unless MLflow's cache keeps it a while
    from mlflow.server.auth.config import read_auth_config

    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(ini))
    assert 0 < read_auth_config().auth_cache_ttl_seconds <= 300
    worker = _env(services["airflow-worker"])
    assert worker["MLFLOW_TRACKING_USERNAME"] == "admin"
    assert worker["MLFLOW_TRACKING_PASSWORD"].startswith("${MLFLOW_ADMIN_PASSWORD:?")


def test_the_wiring_a_new_user_meets(compose):
    # what a read of the file beside the code found: each setting reaches the process that
    # needs it, and the checkout's configs are what the containers read
    from recpipe.redis_conn import ARRIVALS_ENV, parse

    services = compose["services"]
    airflow = [n for n in services if n.startswith("airflow-") and n != "airflow-init"]
    home = "/opt/recpipe"
    assert f"WORKDIR {home}" in (ROOT / "Dockerfile").read_text()
    for name in airflow:
        volumes = services[name]["volumes"]
        # a retrain config dropped into conf/retrain/ is a DAG without a rebuild
        assert f"./conf:{home}/conf:ro" in volumes and f"./dags:{home}/dags:ro" in volumes, name
    worker = _env(services["airflow-worker"])
    assert worker["RECPIPE_RETRAIN_CONFIGS"] == "conf/retrain"
    # the feature jobs' sessions run on .env's SPARK_MASTER, not the server's local[2]
    connect = services["spark-connect"]
    assert _env(connect)["RECPIPE_SPARK_MASTER"] == "${SPARK_MASTER:-local[*]}"
    assert "--master" not in connect["command"]
    assert "SPARK_MASTER=" in (ROOT / ".env.example").read_text()
    # `recpipe announce` in a container publishes where the stream's sensor listens
    arrivals = json.loads(worker["AIRFLOW_CONN_RECPIPE_ARRIVALS"])
    published = parse(worker[ARRIVALS_ENV].replace("${REDIS_PASSWORD}", "x"), ARRIVALS_ENV)
    assert (published.host, published.port, published.db) == (
        arrivals["host"],
        arrivals["port"],
        arrivals["extra"]["db"],
    )
    # `recpipe champion` in a container finds the deployment's MLflow (recpipe.tracking)
    mlflow = json.loads(worker["AIRFLOW_CONN_MLFLOW_DEFAULT"])
    assert (mlflow["host"], mlflow["port"]) == ("mlflow", 5000)
    # the jobs' private network namespaces: unshare needs CAP_SYS_ADMIN, their loopback
    # CAP_NET_ADMIN (tests/test_compose.py runs them)
    assert services["airflow-worker"]["cap_add"] == ["SYS_ADMIN", "NET_ADMIN"]
    # published: the API server and MLflow only
    published_ports = {n for n, svc in services.items() if svc.get("ports")}
    assert published_ports == {"airflow-api-server", "mlflow"}


def test_fill_secrets_generates_each_empty_secret_and_keeps_the_rest(tmp_path):
    import base64
    import subprocess
    import sys

    env = tmp_path / ".env"
    example = (ROOT / ".env.example").read_text()
    env.write_text(example.replace("MLFLOW_SECRET_KEY=", "MLFLOW_SECRET_KEY=kept"))
    fill = [sys.executable, str(ROOT / "deploy/fill_secrets.py"), str(env)]
    assert subprocess.run(fill).returncode == 0
    lines = [line for line in env.read_text().splitlines() if "=" in line and line[0] != "#"]
    values = dict(line.split("=", 1) for line in lines)
    assert all(values.values()), values  # compose refuses to start on an empty one
    assert values["MLFLOW_SECRET_KEY"] == "kept" and values["SPARK_MASTER"] == "local[*]"
    assert len(base64.urlsafe_b64decode(values["AIRFLOW_FERNET_KEY"])) == 32  # a Fernet key
    assert len({values[k] for k in ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "AIRFLOW_ADMIN_PASSWORD")}) == 3
    assert env.stat().st_mode & 0o077 == 0  # the owner's alone
    # a second run changes nothing; an empty key it does not know is refused, the file kept
    before = env.read_text()
    assert subprocess.run(fill).returncode == 0 and env.read_text() == before
    env.write_text(before + "SOMETHING_ELSE=\n")
    done = subprocess.run(fill, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "SOMETHING_ELSE" in done.stderr
    assert env.read_text() == before + "SOMETHING_ELSE=\n"
