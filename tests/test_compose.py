"""docker-compose.yaml as an operator runs it (docs/deployment.md's commands, run as written):
secrets generated into .env, the images built where Docker Hub cannot be reached, `docker
compose up -d`; then, through the published ports only, a backfill of two days of the daily
DAG, the gate's champion in MLflow behind basic auth, a rollback run in the worker container,
a second retrain config that is a DAG without a rebuild; `docker compose down -v` leaves no
container, network or volume of the project.

Docker here: dev.dockerd starts an engine of its own when none answers (root, Debian's
docker.io) and puts the machine's network rules back afterwards."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from tests.support import ROOT, doc_commands, free_port

pytestmark = pytest.mark.slow

TEST = "tests/test_compose.py::test_the_deployment_runs_days_and_a_rollback"
DOWN = "tests/test_compose.py::test_down_leaves_nothing_behind"
DAYS = ["1997-09-20", "1997-09-21"]
DAILY = "recpipe_daily_retrain"
MODEL = "movielens_deepfm"


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            out[key.strip()] = value.strip()
    return out


def _bash(text: str, cwd: Path, env: dict, timeout: int = 1800) -> subprocess.CompletedProcess:
    # `docker compose` as the docs write it; Debian's docker-compose 1.29 where the plugin is missing
    shim = 'docker() { if [ "$1" = compose ] && ! command docker compose version >/dev/null 2>&1; ' \
        'then shift; docker-compose "$@"; else command docker "$@"; fi; }\n'  # fmt: skip
    done = subprocess.run(
        ["bash", "-e", "-c", shim + text], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{text}\nexited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}"
    return done


def _copy_checkout(dest: Path) -> None:
    """The tracked files, as a fresh clone holds them (and the uncommitted edits of this tree)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def _get(url: str, auth: tuple[str, str] | None = None, timeout: float = 10):
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read()


def _wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if _get(url)[0] == 200:
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        assert time.monotonic() < deadline, f"{url} did not answer in {timeout:.0f} s"
        time.sleep(2)


@pytest.fixture(scope="module")
def deployment(movielens_raw, tmp_path_factory):
    from dev.airflow import Api
    from dev.dockerd import engine

    project = tmp_path_factory.mktemp("compose") / "recpipe"
    project.mkdir()
    _copy_checkout(project)
    # the daily DAG's raw days, where the compose file mounts ./data
    shutil.copytree(movielens_raw.parent.parent, project / "data", dirs_exist_ok=True)
    name = f"recpipe_test_{uuid.uuid4().hex[:6]}"
    ports = {"AIRFLOW_PORT": str(free_port()), "MLFLOW_PORT": str(free_port())}
    with engine() as docker_env:
        env = {**os.environ, **docker_env, **ports, "COMPOSE_PROJECT_NAME": name}
        env.pop("AIRFLOW_HOME", None)
        up = doc_commands("deployment.md", TEST)
        try:
            _bash(up, project, env)
            secrets = _env_file(project / ".env")
            base = f"http://127.0.0.1:{ports['AIRFLOW_PORT']}"
            _wait_http(base + "/api/v2/monitor/health", 600)
            api = Api(base, password=secrets["AIRFLOW_ADMIN_PASSWORD"])
            api.login(timeout=300)
            yield {
                "api": api,
                "project": project,
                "env": env,
                "secrets": secrets,
                "mlflow": f"http://127.0.0.1:{ports['MLFLOW_PORT']}",
                "name": name,
            }
        finally:
            logs = subprocess.run(
                ["bash", "-c", "docker-compose logs --tail 40 2>&1 | tail -400"],
                cwd=project, env=env, capture_output=True, text=True,
            )  # fmt: skip
            print(logs.stdout)
            if _left(name, env):  # a test failed before test_down_leaves_nothing_behind
                _bash(doc_commands("deployment.md", DOWN), project, env, timeout=600)


def _left(name: str, env: dict) -> list[str]:
    """The project's containers, networks and volumes the engine still holds."""
    listing = (
        f"docker ps -aq --filter name={name}; docker network ls -q --filter name={name}; "
        f"docker volume ls -q --filter name={name}"
    )
    return subprocess.run(["bash", "-c", listing], env=env, capture_output=True, text=True).stdout.split()


def _compose(deployment, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return _bash("docker compose " + " ".join(args), deployment["project"], deployment["env"], timeout)


def test_the_deployment_runs_days_and_a_rollback(deployment):
    from dev.airflow import _create_backfill, follow_runs

    api = deployment["api"]
    api.wait_for_dag(DAILY)
    _create_backfill(api, DAILY, DAYS, print)
    states = follow_runs(api, DAILY, DAYS, 1800, print)
    assert states == dict.fromkeys(DAYS, "success")

    # the gate's champion, in MLflow through its published port, behind basic auth
    mlflow = deployment["mlflow"]
    url = f"{mlflow}/api/2.0/mlflow/registered-models/alias?name={MODEL}&alias=champion"
    with pytest.raises(urllib.error.HTTPError) as refused:
        _get(url)
    assert refused.value.code == 401
    status, body = _get(url, ("admin", deployment["secrets"]["MLFLOW_ADMIN_PASSWORD"]))
    champion = json.loads(body)["model_version"]
    assert status == 200 and int(champion["version"]) >= 1

    # docs/rollback.md's command, in the worker container; it finds the deployment's MLflow
    shown = _compose(deployment, "exec -T airflow-worker recpipe champion show --model_name", MODEL)
    assert json.loads(shown.stdout)["champion"]["version"] == champion["version"]


def test_a_retrain_config_dropped_in_is_a_dag_without_a_rebuild(deployment):
    conf = yaml.safe_load((deployment["project"] / "conf/retrain/movielens_daily.yaml").read_text())
    conf.update(model_name="movielens_second", dag_id="second_daily")
    (deployment["project"] / "conf/retrain/second.yaml").write_text(yaml.safe_dump(conf))
    assert deployment["api"].wait_for_dag("second_daily", timeout=300)["dag_id"] == "second_daily"


def test_down_leaves_nothing_behind(deployment):
    _bash(doc_commands("deployment.md", DOWN), deployment["project"], deployment["env"], timeout=600)
    assert _left(deployment["name"], deployment["env"]) == []
