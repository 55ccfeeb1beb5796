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

from tests.support import ROOT, doc_commands, free_port, run_doc_commands

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
    return run_doc_commands(shim + text, cwd, env, timeout)


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
    from dev.dockerd import can_start, engine

    why = can_start()
    if why:  # a developer's machine without Docker (CI runs as root, setup installs docker.io)
        pytest.skip(why)

    project = tmp_path_factory.mktemp("compose") / "recpipe"
    project.mkdir()
    _copy_checkout(project)
    # the daily DAG's raw days, where the compose file mounts ./data
    shutil.copytree(movielens_raw, project / "data/raw/movielens")
    name = f"recpipe_test_{uuid.uuid4().hex[:6]}"
    ports = {"AIRFLOW_PORT": str(free_port()), "MLFLOW_PORT": str(free_port())}
    with engine() as docker_env:
        env = {**os.environ, **docker_env, **ports, "COMPOSE_PROJECT_NAME": name}
        env.pop("AIRFLOW_HOME", None)
        up = doc_commands("deployment.md", TEST)
        assert doc_commands("howto.md", TEST) == up  # the how-to's copy says the same
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


def _champion(deployment, auth: bool = True) -> str:
    """The version the registered model's ``champion`` alias names, read from MLflow's REST
    API through its published port (basic auth: the admin of .env)."""
    url = f"{deployment['mlflow']}/api/2.0/mlflow/registered-models/alias?name={MODEL}&alias=champion"
    login = ("admin", deployment["secrets"]["MLFLOW_ADMIN_PASSWORD"]) if auth else None
    return json.loads(_get(url, login)[1])["model_version"]["version"]


def test_the_deployment_runs_days_and_a_rollback(deployment):
    """Day 1 of the shipped daily DAG, backfilled through the API, promotes version 1. The
    team then edits its retrain config in the checkout (approval required; no rebuild), and
    day 2's promotion waits for a person, who approves it on the Human-in-the-loop endpoint.
    Every task ran on the Celery worker's container. A rollback in that container, as
    docs/rollback.md writes it, moves the alias back."""
    from dev.airflow import _create_backfill, follow_runs

    api = deployment["api"]
    api.wait_for_dag(DAILY)
    _create_backfill(api, DAILY, DAYS[:1], print)
    _succeeded(api, follow_runs(api, DAILY, DAYS[:1], 1200, print))
    with pytest.raises(urllib.error.HTTPError) as refused:  # MLflow without the password
        _champion(deployment, auth=False)
    assert refused.value.code == 401
    assert _champion(deployment) == "1"

    path = deployment["project"] / "conf/retrain/movielens_daily.yaml"
    conf = yaml.safe_load(path.read_text())
    conf["gate"].update(approval="required", tolerance=0.05, min_metric=0.3)
    path.write_text(yaml.safe_dump(conf))
    deadline = time.monotonic() + 300  # the dag-processor's next parse of the mounted file
    while "approve_promotion" not in api.task_ids(DAILY):
        assert time.monotonic() < deadline, "the edited retrain config did not reach the DAG"
        time.sleep(5)
    _create_backfill(api, DAILY, DAYS[1:], print)
    run = _wait_runs(api, DAILY, DAYS[1])[0]
    request = api.wait_for_hitl(DAILY, run["dag_run_id"], "approve_promotion", timeout=1200)
    assert request["subject"] == f"Promote {MODEL} version 2?", request
    assert _champion(deployment) == "1"  # nothing moves before the answer
    api.answer_hitl(DAILY, run["dag_run_id"], "approve_promotion", ["Approve"])
    run = api.wait_for_run(DAILY, run["dag_run_id"])
    assert run["state"] == "success"
    assert _champion(deployment) == "2"
    # (unpaused, the DAG also has the scheduler's own run of today, waiting for its data)
    ours = [r for r in api.runs(DAILY) if r["logical_date"][:10] in DAYS]
    tasks = [t for r in ours for t in api.task_instances(DAILY, r["dag_run_id"])]
    assert {t["state"] for t in tasks} <= {"success", "skipped"}
    worker = _compose(deployment, "ps -q airflow-worker").stdout.strip()
    assert {t["hostname"] for t in tasks if t["state"] == "success"} == {worker[:12]}
    # the broker's password, which the worker's URL holds, is masked in its log
    log = _compose(deployment, "logs --no-color airflow-worker").stdout
    assert "Connected to redis://:**@redis:6379/0" in log, log[-3000:]
    assert deployment["secrets"]["REDIS_PASSWORD"] not in log

    # docs/rollback.md's command, in the worker container: it finds the deployment's MLflow
    # and store without a flag
    _compose(
        deployment, f"exec -T airflow-worker recpipe champion rollback --model_name {MODEL} --reason test"
    )
    assert _champion(deployment) == "1"
    shown = json.loads(
        _compose(deployment, f"exec -T airflow-worker recpipe champion show --model_name {MODEL}").stdout
    )
    assert str(shown["champion"]["version"]) == "1"


def _succeeded(api, states: dict[str, str]) -> None:
    """Fail with the failed tasks' logs (read through the API) unless every run succeeded."""
    if set(states.values()) == {"success"}:
        return
    logs = []
    for run in (r for r in api.runs(DAILY) if r["logical_date"][:10] in DAYS):
        for t in api.task_instances(DAILY, run["dag_run_id"]):
            if t["state"] == "failed":
                text = api.log(DAILY, run["dag_run_id"], t["task_id"], t.get("try_number") or 1)
                logs.append(f"--- {t['task_id']}:\n{text[-3000:]}")
    pytest.fail(f"runs {states}\n" + "\n".join(logs))


def _wait_runs(api, dag_id: str, ds: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        runs = [r for r in api.runs(dag_id) if r["logical_date"].startswith(ds)]
        if runs:
            return runs
        assert time.monotonic() < deadline, f"no run of {dag_id} for {ds}"
        time.sleep(2)


def test_a_retrain_config_dropped_in_is_a_dag_without_a_rebuild(deployment):
    conf = yaml.safe_load((deployment["project"] / "conf/retrain/movielens_daily.yaml").read_text())
    conf.update(model_name="movielens_second", dag_id="second_daily")
    (deployment["project"] / "conf/retrain/second.yaml").write_text(yaml.safe_dump(conf))
    assert deployment["api"].wait_for_dag("second_daily", timeout=300)["dag_id"] == "second_daily"


def test_down_leaves_nothing_behind(deployment):
    _bash(doc_commands("deployment.md", DOWN), deployment["project"], deployment["env"], timeout=600)
    assert _left(deployment["name"], deployment["env"]) == []
