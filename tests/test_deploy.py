"""docker-compose.yaml without Docker (tests/test_compose.py runs it): it parses, each service
mounts only the secret files it uses and names no secret itself, it publishes on 127.0.0.1
only, every setting it passes is one the project, Airflow or the service's image reads; the
helpers that hand the secrets over (deploy/secret.py, deploy/redis-start.sh,
deploy/fill_secrets.py) with passwords of every character."""

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
    "POSTGRES_PASSWORD_FILE",
    "POSTGRES_DB",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION",
    "MLFLOW_AUTH_CONFIG_PATH",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT",  # the MLflow client: its links name the internal host
}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|FERNET|TOKEN|_CONN$|BROKER_URL$|RESULT_BACKEND$", re.I)


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


def test_each_service_mounts_only_its_secrets_and_names_none(compose):
    """The compose file and .env hold no secret: a setting that would carry one is a command
    reading a file (``*_CMD``) or a file's path (``*_FILE``); each secret a service's settings,
    command or health check read is mounted into it, and it mounts no other (the table of
    docs/deployment.md, which tests/test_compose.py checks on the running containers)."""
    from tests.test_compose import SECRETS

    text = (ROOT / "docker-compose.yaml").read_text()
    example = (ROOT / ".env.example").read_text()
    declared = {line.split("=")[0] for line in example.splitlines() if line and not line.startswith("#")}
    used = set(REFERENCE.findall(text)) - {"GIT_COMMIT"}
    assert used <= declared, used - declared
    assert not [k for k in declared if SECRET_NAME.search(k)], declared
    assert set(compose["secrets"]) == set().union(*SECRETS.values())
    for name, secret in compose["secrets"].items():
        assert secret == {"file": f"./secrets/{name}"}, name
    for name, service in compose["services"].items():
        for key in _env(service):
            if SECRET_NAME.search(key):
                assert key.endswith(("_CMD", "_FILE")), f"{name}: {key} holds its value itself"
        wiring = json.dumps([_env(service), service.get("command"), service.get("healthcheck")])
        read = set(re.findall(r"/run/secrets/(\w+)", wiring)) | set(re.findall(r"\{(\w+)\}", wiring))
        read |= set(re.findall(r"(?:--raw \w+=|secret.py value |recpipe-redis-start\W+)(\w+)", wiring))
        assert read == SECRETS[name] or name == "airflow-worker", (name, read)
        assert set(service.get("secrets") or []) == SECRETS[name], name
    # the worker's MLflow login: ~/.mlflow/credentials, the image's link to its secret
    assert "ln -s /run/secrets/mlflow_credentials /home/recpipe/.mlflow/credentials" in (
        ROOT / "Dockerfile"
    ).read_text()


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
                section, option = key.removeprefix("AIRFLOW__").removesuffix("_CMD").lower().split("__", 1)
                known = conf.configuration_description.get(section, {}).get("options", {})
                assert option in known, f"{name}: {key} is no Airflow option"
            elif key.startswith("AIRFLOW_CONN_"):
                conn = key.removeprefix("AIRFLOW_CONN_").lower()
                assert conn in connections.values(), f"{name}: connection {conn} is not used by the DAGs"
            elif key.endswith("_PASSWORD_FILE") and key != "POSTGRES_PASSWORD_FILE":
                # recpipe.redis_conn.password_file_env: the URL's variable, then its file's
                assert f'"{key.removesuffix("_PASSWORD_FILE")}_URL"' in source, f"{name}: {key}"
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
        assert not re.search(r"\$\{\w*PASSWORD|:\w{12,}@", command), f"{name}: a password on the command line"
    # Redis: requirepass from its secret on stdin; the broker URL and the health check log in
    for name, secret in (("redis", "broker_password"), ("embedding-store", "store_password")):
        assert services[name]["command"][:2] == ["recpipe-redis-start", secret]
        assert secret in " ".join(services[name]["healthcheck"]["test"])
    broker = _env(services["airflow-worker"])["AIRFLOW__CELERY__BROKER_URL_CMD"]
    assert broker.endswith("url redis://:{broker_password}@redis:6379/0")
    # MLflow: basic auth, its admin password and database URI in its environment only
    mlflow = services["mlflow"]
    assert "--app-name basic-auth" in mlflow["command"] and "secret.py exec" in mlflow["command"]
    for var in ("MLFLOW_BACKEND_STORE_URI", "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert f" {var}=" in mlflow["command"], var
    ini = ROOT / _env(mlflow)["MLFLOW_AUTH_CONFIG_PATH"].removeprefix("/opt/recpipe/")
    assert ini.exists() and "admin_password" not in ini.read_text().replace("# ", "")
    # each request's login is a scrypt check (0.1 CPU-s) unless MLflow's cache keeps it a while
    from mlflow.server.auth.config import read_auth_config

    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(ini))
    assert 0 < read_auth_config().auth_cache_ttl_seconds <= 300


def _secrets_dir(tmp_path, **values: str):
    d = tmp_path / "secrets"
    d.mkdir(exist_ok=True)
    for name, value in values.items():
        (d / name).write_text(value + "\n")
    return d


ODD = 'p/w@x:y#z?%"\\ \'end'  # what password managers and `openssl rand -base64` print


def test_secret_urls_hold_any_password_and_exec_keeps_it_off_the_command_line(tmp_path):
    """deploy/secret.py: a URL built with the password percent-encoded parses back to it (as
    SQLAlchemy and redis-py read it); ``exec`` sets it in the command's environment only; a
    missing secret is one line and exit 2."""
    import subprocess
    import sys

    from sqlalchemy.engine import make_url

    d = _secrets_dir(tmp_path, db=ODD)
    env = {"RECPIPE_SECRETS_DIR": str(d), "PATH": "/usr/bin:/bin"}
    tool = [sys.executable, str(ROOT / "deploy/secret.py")]
    run = lambda *a: subprocess.run([*tool, *a], env=env, capture_output=True, text=True)  # noqa: E731
    url = run("url", "postgresql+psycopg2://recpipe:{db}@postgres:5432/airflow").stdout
    assert make_url(url).password == ODD and make_url(url).host == "postgres" and not url.endswith("\n")
    assert run("value", "db").stdout == ODD
    shell = ["sh", "-c", 'echo "$P"; ps -o args= $$']
    shown = run("exec", "--url", "U=redis://:{db}@h:1/0", "--raw", "P=db", "--", *shell)
    assert shown.stdout.splitlines()[0] == ODD and ODD not in shown.stdout.splitlines()[1]
    missing = run("url", "x://{nope}@h")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "secret nope" in missing.stderr


def test_redis_starts_with_a_password_of_any_character(tmp_path):
    """deploy/redis-start.sh, as the compose file runs it, with this machine's redis-server:
    the password (quotes and backslashes too) on its stdin; a client logs in with it."""
    import subprocess
    import time

    import redis

    from tests.support import free_port

    d = _secrets_dir(tmp_path, broker_password=ODD)
    port = free_port()
    proc = subprocess.Popen(
        ["sh", str(ROOT / "deploy/redis-start.sh"), "broker_password", f"port {port}", f"dir {tmp_path}"],
        env={"RECPIPE_SECRETS_DIR": str(d), "PATH": "/usr/bin:/bin:/usr/sbin"},
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert redis.Redis(port=port, password=ODD).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
                time.sleep(0.2)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, password="wrong").ping()
        ps = subprocess.run(["ps", "-o", "args=", "-p", str(proc.pid)], capture_output=True, text=True)
        assert "p/w@x" not in ps.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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
    published = parse(worker[ARRIVALS_ENV], ARRIVALS_ENV)
    assert (published.host, published.port, published.db) == (
        arrivals["host"],
        arrivals["port"],
        arrivals["extra"]["db"],
    )
    # `recpipe champion` in a container finds the deployment's MLflow (recpipe.tracking)
    mlflow = json.loads(worker["AIRFLOW_CONN_MLFLOW_DEFAULT"])
    assert (mlflow["host"], mlflow["port"]) == ("mlflow", 5000)
    # the jobs' private network namespaces, made by a non-root user in a user namespace: Docker's
    # seccomp profile lets unshare through with CAP_SYS_ADMIN in the bounding set only
    assert services["airflow-worker"]["cap_add"] == ["SYS_ADMIN"]
    assert all(svc.get("user") for svc in services.values())
    # the deployment runs production modules only, never the development kit (dev/)
    assert not [n for n, svc in services.items() if " dev." in f" {svc.get('command')}"]
    # published: the API server and MLflow only
    published_ports = {n for n, svc in services.items() if svc.get("ports")}
    assert published_ports == {"airflow-api-server", "mlflow"}


def test_fill_secrets_generates_each_missing_secret_and_keeps_the_rest(tmp_path):
    import base64
    import subprocess
    import sys

    d = _secrets_dir(tmp_path, mlflow_secret_key="kept", postgres_password="")
    fill = [sys.executable, str(ROOT / "deploy/fill_secrets.py"), str(d)]
    assert subprocess.run(fill, capture_output=True).returncode == 0
    values = {p.name: p.read_text().rstrip("\n") for p in d.iterdir()}
    from tests.test_compose import SECRETS

    assert set(values) >= set().union(*SECRETS.values()) and all(values.values()), values
    assert values["mlflow_secret_key"] == "kept"
    assert len(base64.urlsafe_b64decode(values["airflow_fernet_key"])) == 32  # a Fernet key
    assert len({values[k] for k in ("postgres_password", "broker_password", "store_password")}) == 3
    assert f"mlflow_tracking_password = {values['mlflow_admin_password']}" in values["mlflow_credentials"]
    assert json.loads(values["airflow_passwords"]) == {"admin": values["airflow_admin_password"]}
    assert d.stat().st_mode & 0o077 == 0  # the directory: its owner's alone
    # a second run changes nothing; a changed admin password carries into the derived files
    assert subprocess.run(fill, capture_output=True).returncode == 0
    assert {p.name: p.read_text().rstrip("\n") for p in d.iterdir()} == values
    (d / "airflow_admin_password").write_text("chosen\n")
    assert subprocess.run(fill, capture_output=True).returncode == 0
    assert json.loads((d / "airflow_passwords").read_text()) == {"admin": "chosen"}
    (tmp_path / "afile").write_text("")
    done = subprocess.run([*fill[:2], str(tmp_path / "afile")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
