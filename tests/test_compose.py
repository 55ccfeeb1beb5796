"""docker-compose.yaml as an operator runs it (docs/deployment.md's commands, run as written):
secrets generated into ./secrets/, the images built where Docker Hub cannot be reached,
`docker-compose up -d`; every container as its own non-root user holding only its secrets;
then, through the published ports only: day 1 of the daily DAG triggered from
Airflow's UI with a Param, day 2 backfilled and approved on its Required Actions page, the
gate's champion in MLflow behind basic auth (and its UI), rollbacks from `recpipe_champion`'s
form and in the worker container, a stream pass started by `recpipe announce`, a second retrain
config that is a DAG without a rebuild; `docker-compose down -v` leaves no container, network
or volume of the project.

Docker here: dev.dockerd starts an engine of its own when none answers (root, Debian's
docker.io) and puts the machine's network rules back afterwards."""

from __future__ import annotations

import base64
import json
import os
import re
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

# the first test's time holds the deployment's start: on a machine without the images, their
# whole build (13 min measured) before its own 7 to 10
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

TEST = "tests/test_compose.py::test_the_deployment_runs_days_and_a_rollback"
DOWN = "tests/test_compose.py::test_down_leaves_nothing_behind"
DAYS = ["1997-09-20", "1997-09-21"]
DAILY = "recpipe_daily_retrain"
MODEL = "movielens_deepfm"
STREAM = "recpipe_stream_retrain"
PASS = "1997-09-20T17:00"  # 88 ratings
PARTITION = "data/raw/movielens_hourly/events/ds=1997-09-20/hh=17"
ARTIFACTS = ROOT / "var" / "test-artifacts"
UID = 50000  # .env.example's AIRFLOW_UID
# each service's user and the secrets mounted into it (docker-compose.yaml)
USERS = {"postgres": "postgres", "redis": "redis", "embedding-store": "redis"}
SECRETS = {
    "postgres": {"postgres_password"},
    "redis": {"broker_password"},
    "embedding-store": {"store_password"},
    "mlflow": {"postgres_password", "mlflow_admin_password", "mlflow_secret_key"},
    "airflow-init": {"postgres_password"},
    "airflow-api-server": {
        "postgres_password", "airflow_jwt_secret", "airflow_fernet_key", "airflow_passwords"
    },  # fmt: skip
    "airflow-scheduler": {"postgres_password", "airflow_jwt_secret", "broker_password"},
    "airflow-dag-processor": {"postgres_password", "airflow_jwt_secret"},
    "airflow-triggerer": {"postgres_password", "airflow_jwt_secret", "broker_password"},
    "airflow-worker": {"broker_password", "store_password", "mlflow_credentials"},
    "spark-connect": set(),
}


def _secrets(project: Path) -> dict[str, str]:
    """The deployment's secrets, as deploy/fill_secrets.py wrote them (name -> value)."""
    return {p.name: p.read_text().rstrip("\n") for p in (project / "secrets").iterdir()}


def _bash(text: str, cwd: Path, env: dict, timeout: int = 1800) -> subprocess.CompletedProcess:
    """The docs' commands byte for byte: ``docker-compose``, the Compose ``make setup`` installs
    (Debian's 1.29; no package index here has the v2 plugin)."""
    return run_doc_commands(text, cwd, env, timeout)


def _copy_checkout(dest: Path) -> None:
    """The tracked files, as a fresh clone holds them (and the uncommitted edits of this tree)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def _get(url: str, timeout: float = 10):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
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
def deployment(movielens_raw, movielens_hourly_raw, tmp_path_factory):
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
    # the stream DAG's hourly passes; the test's pass lands (and is announced) while it waits
    shutil.copytree(movielens_hourly_raw, project / "data/raw/movielens_hourly")
    (project / PARTITION / "_SUCCESS").unlink()
    # the operator's part: ./data writable by the deployment's user (.env's AIRFLOW_UID)
    _chown(project / "data", UID)
    name = f"recpipe_test_{uuid.uuid4().hex[:6]}"
    ports = {"AIRFLOW_PORT": str(free_port()), "MLFLOW_PORT": str(free_port())}
    with engine() as docker_env:
        env = {**os.environ, **docker_env, **ports, "COMPOSE_PROJECT_NAME": name}
        env.pop("AIRFLOW_HOME", None)
        up = doc_commands("deployment.md", TEST)
        assert doc_commands("howto.md", TEST) == up  # the how-to's copy says the same
        _remove_killed_runs(env)
        try:
            _bash(up, project, env)
            secrets = _secrets(project)
            base = f"http://127.0.0.1:{ports['AIRFLOW_PORT']}"
            _wait_http(base + "/api/v2/monitor/health", 600)
            api = Api(base, password=secrets["airflow_admin_password"])
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


def _chown(path: Path, uid: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, uid, 0, follow_symlinks=False)


def _remove_killed_runs(env: dict) -> None:
    """Remove what an earlier run of this test left when it was killed before ``down -v``:
    its containers' ``restart: unless-stopped`` brings them back with the next engine."""
    script = (
        "docker ps -aq --filter name=recpipe_test_ | xargs -r docker rm -f; "
        "docker network ls -q --filter name=recpipe_test_ | xargs -r docker network rm; "
        "docker volume ls -q --filter name=recpipe_test_ | xargs -r docker volume rm"
    )
    subprocess.run(["bash", "-c", script], env=env, capture_output=True, timeout=300)


def _left(name: str, env: dict) -> list[str]:
    """The project's containers, networks and volumes the engine still holds."""
    listing = (
        f"docker ps -aq --filter name={name}; docker network ls -q --filter name={name}; "
        f"docker volume ls -q --filter name={name}"
    )
    return subprocess.run(["bash", "-c", listing], env=env, capture_output=True, text=True).stdout.split()


def _compose(deployment, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return _bash("docker-compose " + " ".join(args), deployment["project"], deployment["env"], timeout)


def _champion(deployment, auth: bool = True) -> str:
    """The version the registered model's ``champion`` alias names, read from MLflow's REST
    API through its published port (basic auth: the admin of .env)."""
    path = f"registered-models/alias?name={MODEL}&alias=champion"
    return _mlflow(deployment, path, auth=auth)["model_version"]["version"]


def _mlflow(deployment, path: str, body: dict | None = None, auth: bool = True) -> dict:
    """MLflow's REST API through its published port, as its admin (basic auth) or, without
    ``auth``, as a stranger."""
    req = urllib.request.Request(
        f"{deployment['mlflow']}/api/2.0/mlflow/{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    if auth:
        login = "admin:" + deployment["secrets"]["mlflow_admin_password"]
        req.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_the_deployment_runs_days_and_a_rollback(deployment):
    """In Airflow's UI (headless Chromium), day 1 of the shipped daily DAG is backfilled from
    its trigger form with a Param (an override of the retrain config's train_config), which the
    day's train run uses; it promotes version 1. The team then edits its retrain config in the
    checkout (approval required; no rebuild), and day 2's promotion waits for a person, who
    approves it on the task's Required Actions page. Every task ran on the Celery worker's
    container. A rollback from ``recpipe_champion``'s form moves the alias back, and so does
    docs/rollback.md's command in the worker container; MLflow's UI shows the day's run."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    from dev.airflow import _create_backfill
    from operators.approval import GATE_FIGURES
    from tests.browser import Browser

    api, secrets = deployment["api"], deployment["secrets"]
    api.wait_for_dag(DAILY)
    override = {"train_config.log_step_count_steps": 7}
    with Browser(ARTIFACTS) as browser:
        ui = browser.airflow(api.base, "admin", secrets["airflow_admin_password"])
        # day 1 from the DAG's form (its Backfill: unpausing also starts today's scheduled run,
        # whose wait for today's data a single run of 1997 would queue behind)
        ui.backfill(DAILY, f"{DAYS[0]} 00:00", f"{DAYS[0]} 00:00", {"edit_config_json": override})
        run = api.wait_for_run(DAILY, _wait_runs(api, DAILY, DAYS[0])[0]["dag_run_id"], timeout=1200)
        _succeeded(api, {DAYS[0]: run["state"]})
        assert run["logical_date"].startswith(DAYS[0]) and run["conf"]["edit_config_json"] == override
        with pytest.raises(urllib.error.HTTPError) as refused:  # MLflow without the password
            _champion(deployment, auth=False)
        assert refused.value.code == 401
        assert _champion(deployment) == "1"
        experiment = _mlflow(deployment, f"experiments/get-by-name?experiment_name={MODEL}")["experiment"]
        ids = [experiment["experiment_id"]]
        parent = f"tags.`recpipe.step` = 'parent' and tags.ds = '{DAYS[0]}'"
        (day,) = _mlflow(deployment, "runs/search", {"experiment_ids": ids, "filter": parent})["runs"]
        nested = f"tags.`mlflow.parentRunId` = '{day['info']['run_id']}' and tags.`recpipe.step` = 'train'"
        (train,) = _mlflow(deployment, "runs/search", {"experiment_ids": ids, "filter": nested})["runs"]
        params = {p["key"]: p["value"] for p in train["data"]["params"]}
        assert params["train_config.log_step_count_steps"] == "7"  # the form's override

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
        # the page asks one question; each figure once, rounded to 4 decimals, explained
        page_text = ui.required_action(DAILY, run["dag_run_id"], "approve_promotion")
        browser.screenshot(ui.page, "compose_approval")
        assert not re.search(r"\d\.\d{5,}", page_text), page_text
        for label in GATE_FIGURES.values():
            assert page_text.count(label) <= 1, (label, page_text)
        assert page_text.count("The gate found") == 1 and "promoted (" not in page_text, page_text
        ui.answer(DAILY, run["dag_run_id"], "approve_promotion", "Approve")
        run = api.wait_for_run(DAILY, run["dag_run_id"])
        assert run["state"] == "success"
        assert _champion(deployment) == "2"

        # no model is chosen for the operator: one who fills only the reason moves nothing
        shown = ui.choice_shown("recpipe_champion", "model_name")
        models = [yaml.safe_load(p.read_text())["model_name"] for p in path.parent.glob("*.yaml")]
        assert MODEL in models and not [m for m in models if m in shown], shown
        rollback = ui.trigger("recpipe_champion", {"model_name": MODEL, "reason": "a rollback from the UI"})
        assert api.wait_for_run("recpipe_champion", rollback, timeout=600)["state"] == "success"
        assert _champion(deployment) == "1"

        login = {"username": "admin", "password": secrets["mlflow_admin_password"]}
        page = browser.page(http_credentials=login)
        experiment_id, run_name = experiment["experiment_id"], train["info"]["run_name"]
        try:
            for attempt in range(2):
                page.goto(
                    f"{deployment['mlflow']}/#/experiments/{experiment_id}/runs/{train['info']['run_id']}"
                )
                # a visible one: the page may hold the name hidden too (a collapsed list), which the
                # first match in the document's order can be when a slow server answers in another order
                try:
                    page.get_by_text(run_name).filter(visible=True).first.wait_for(timeout=90_000)
                    break
                except PlaywrightTimeoutError:
                    # MLflow's page shows "Something went wrong" when one of its own requests
                    # failed (seen once, on a loaded machine): a user loads it again
                    if attempt or not page.get_by_text("Something went wrong").is_visible():
                        raise
        finally:
            shot = browser.screenshot(page, "compose_mlflow_run")
        assert shot.stat().st_size > 20_000

    # (unpaused, the DAG also has the scheduler's own run of today, waiting for its data)
    ours = [r for r in api.runs(DAILY) if r["logical_date"][:10] in DAYS]
    tasks = [t for r in ours for t in api.task_instances(DAILY, r["dag_run_id"])]
    assert {t["state"] for t in tasks} <= {"success", "skipped"}
    worker = _compose(deployment, "ps -q airflow-worker").stdout.strip()
    assert {t["hostname"] for t in tasks if t["state"] == "success"} == {worker[:12]}
    # the broker's password, which the worker's URL holds, is masked in its log
    log = _compose(deployment, "logs --no-color airflow-worker").stdout
    assert "Connected to redis://:**@redis:6379/0" in log, log[-3000:]
    assert deployment["secrets"]["broker_password"] not in log

    # docs/rollback.md's commands, in the worker container: they find the deployment's MLflow
    # and store without a flag
    worker_recpipe = f"exec -T airflow-worker recpipe champion {{}} --model_name {MODEL}"
    _compose(deployment, worker_recpipe.format("set") + " --version 2 --reason test --by Ana")
    assert _champion(deployment) == "2"
    _compose(deployment, worker_recpipe.format("rollback") + " --reason test --by Ana")
    assert _champion(deployment) == "1"
    shown = json.loads(_compose(deployment, worker_recpipe.format("show")).stdout)
    assert str(shown["champion"]["version"]) == "1"
    # the person, not root; the form's rollback by its logged-in user
    assert [m["by"] for m in shown["history"][-3:]] == ["admin", "Ana", "Ana"], shown["history"]
    # what the deployment wrote into ./data (the days' features) is AIRFLOW_UID's, not root's
    written = [p for p in (deployment["project"] / "data" / "features").rglob("*")]
    assert written and {p.stat().st_uid for p in written} == {UID}, written[:5]


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


def test_an_announced_stream_pass_starts_within_seconds(deployment):
    """docs/howto.md's announcement, run in the worker container: the stream pass waiting for
    its partition goes on within seconds, where the sensor looks once a minute; it starts
    from the daily model's champion and pushes to the deployment's embedding store."""
    from datetime import datetime

    from dev.airflow import _create_backfill
    from recpipe.arrivals import CHANNEL

    api = deployment["api"]
    api.wait_for_dag(STREAM)
    _create_backfill(api, STREAM, [PASS], print)
    run_id = _wait_runs(api, STREAM, PASS)[0]["dag_run_id"]
    login = "REDISCLI_AUTH=$(cat /run/secrets/broker_password)"
    subscribed = f"exec -T redis sh -c '{login} redis-cli PUBSUB NUMSUB {CHANNEL}'"
    deadline = time.monotonic() + 600
    while not (
        api.task_instance(STREAM, run_id, "wait_for_pass")["state"] == "deferred"
        and _compose(deployment, subscribed).stdout.split()[-1] != "0"  # the triggerer listens
    ):
        assert time.monotonic() < deadline, "wait_for_pass did not defer"
        time.sleep(2)
    time.sleep(1)  # past the trigger's first look
    (deployment["project"] / PARTITION / "_SUCCESS").touch()
    landed = time.time()
    out = _compose(deployment, f"exec -T airflow-worker recpipe announce {PARTITION}").stdout
    assert "announced" in out, out
    run = api.wait_for_run(STREAM, run_id, timeout=900)
    wait = api.task_instance(STREAM, run_id, "wait_for_pass")
    ended = datetime.fromisoformat(wait["end_date"]).timestamp()
    assert ended - landed < 30, (landed, wait)  # poke_interval_s: 60
    if run["state"] != "success":
        failed = [t for t in api.task_instances(STREAM, run_id) if t["state"] == "failed"]
        pytest.fail(
            "\n".join(api.log(STREAM, run_id, t["task_id"], t.get("try_number") or 1)[-3000:] for t in failed)
        )


def test_a_retrain_config_dropped_in_is_a_dag_without_a_rebuild(deployment):
    conf = yaml.safe_load((deployment["project"] / "conf/retrain/movielens_daily.yaml").read_text())
    conf.update(model_name="movielens_second", dag_id="second_daily")
    (deployment["project"] / "conf/retrain/second.yaml").write_text(yaml.safe_dump(conf))
    assert deployment["api"].wait_for_dag("second_daily", timeout=300)["dag_id"] == "second_daily"


def test_the_image_holds_no_ssh_host_keys(deployment):
    """openssh-server's package makes host keys when it installs; the image removes them, so
    that no two MPIJob pods (of any deployment) share them: each worker makes its own."""
    listing = "docker run --rm --entrypoint sh recpipe:latest -c 'ls /etc/ssh; ls /usr/sbin/sshd'"
    done = _bash(listing, deployment["project"], deployment["env"], timeout=300)
    names = done.stdout.split()
    assert "/usr/sbin/sshd" in names and not [n for n in names if n.startswith("ssh_host_")], names


def test_each_container_runs_as_its_own_user_with_only_its_secrets(deployment):
    """``docker inspect`` of every container (airflow-init's, exited, too): its user (none is
    root: the recpipe image's services run as AIRFLOW_UID, group 0), the secrets mounted into it (compose's
    ``secrets:``, each under /run/secrets), and no secret's value in its environment,
    command or labels."""
    env, name = deployment["env"], deployment["name"]
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={name}"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    out = subprocess.run(["docker", "inspect", *ids], env=env, capture_output=True, text=True, check=True)
    inspected = json.loads(out.stdout)
    values = [v for v in deployment["secrets"].values() if len(v) >= 16]
    seen = {}
    for c in inspected:
        service = c["Config"]["Labels"]["com.docker.compose.service"]
        seen[service] = c["Config"]["User"]
        assert c["Config"]["User"] == USERS.get(service, f"{UID}:0"), (service, c["Config"]["User"])
        mounted = {m["Destination"] for m in c["Mounts"] if m["Destination"].startswith("/run/secrets/")}
        assert mounted == {f"/run/secrets/{s}" for s in SECRETS[service]}, (service, mounted)
        shown = json.dumps([c["Config"]["Env"], c["Config"]["Cmd"], c["Config"]["Labels"], c["Args"]])
        assert not [v for v in values if v in shown], f"{service} holds a secret in its config"
        assert c["HostConfig"]["CapAdd"] in (None, [], ["SYS_ADMIN"], ["CAP_SYS_ADMIN"]), service
    assert set(seen) == set(SECRETS), seen
    # the processes too: no container runs anything as root (the entrypoints drop nothing)
    for c in (c for c in inspected if c["State"]["Running"]):
        columns = ["-o", "pid,uid,args"]  # (docker top needs the pid column)
        top = subprocess.run(
            ["docker", "top", c["Id"], *columns], env=env, capture_output=True, text=True, check=True
        ).stdout.splitlines()[1:]
        assert top and not [line for line in top if line.split()[1] in ("0", "root")], top


def test_down_leaves_nothing_behind(deployment):
    _bash(doc_commands("deployment.md", DOWN), deployment["project"], deployment["env"], timeout=600)
    assert _left(deployment["name"], deployment["env"]) == []
