"""The production shapes of execution: ``recpipe_daily_retrain`` scheduled and run by the
CeleryExecutor (a real Celery worker on another host than the scheduler and API server, Redis
as the broker and result backend, PostgreSQL as the metadata database), and
``prepare_features`` submitted to a Spark standalone master and worker on 127.0.0.1 through
``spark_default``."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from dev.airflow import deployment
from features.jvm import session_conf
from tests.dags.conftest import DAYS, MODEL, airflow, new_stack
from tests.support import free_port

pytestmark = pytest.mark.slow


def test_the_daily_dag_runs_on_a_celery_worker_on_another_host(movielens_raw, tmp_path_factory, postgres_db):
    """The CeleryExecutor as a cluster runs it: the scheduler, API server, triggerer and DAG
    processor on one host (PostgreSQL the metadata database, its own Redis the broker and the
    result backend, listening on that host's address), the Celery worker on another
    (``tests.hosts``), which reaches only the broker, the result backend and the API server's
    execution API; every task of the day runs there, its jobs too (the feature job a
    ``spark-submit`` of its own: the suite's Spark Connect server is on the other host's
    loopback). And with ``gate.approval: required``: the promotion the gate decides waits for a
    person, who approves it through the API server's Human-in-the-loop endpoint; only then
    does the alias move, and the version names who approved it."""
    import redis

    from recpipe import forkserver
    from tests.hosts import Hosts

    # end_date: the scheduler starts no run of its own (today's) beside the one triggered here
    gate = {
        "metric": "auc",
        "tolerance": 0.05,
        "min_metric": 0.3,
        "inconclusive": "promote",
        "approval": "required",
    }
    stack = new_stack(
        movielens_raw,
        tmp_path_factory.mktemp("celery"),
        end_date=DAYS[0],
        gate=gate,
        spark_connect_conn_id=None,
    )
    queue = f"recpipe-{uuid.uuid4().hex[:8]}"
    home = stack["base"] / "airflow-celery"
    with Hosts(["worker"]) as hosts:
        control = hosts.gateway  # the root namespace, on the hosts' bridge
        store_port, password = free_port(), secrets.token_hex(16)
        store = hosts_redis(control, store_port, password, home / "redis.log")
        try:
            celery = {
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CELERY__BROKER_URL": f"redis://:{password}@{control}:{store_port}/0",
                "AIRFLOW__CELERY__RESULT_BACKEND": f"redis://:{password}@{control}:{store_port}/1",
                "AIRFLOW__OPERATORS__DEFAULT_QUEUE": queue,
            }

            # the worker host's own name (a UTS namespace), which Airflow records per task
            name = "celery-worker-0"
            hosts.write_etc("worker", "hosts", f"127.0.0.1 localhost\n{hosts.address('worker')} {name}\n")

            def on_worker_host(argv, env, log):
                # its jobs start there too, not forked from the control host's warm server
                env = {k: v for k, v in env.items() if k != forkserver.ENV}
                env["SPARK_LOCAL_IP"] = hosts.address("worker")
                named = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name, *argv]
                return hosts.popen("worker", named, log, env=env)

            # the worker's log server stays off: the API server reads the shared log folder
            worker = ("celery", "worker", "--queues", queue, "--concurrency", "2", "--skip-serve-logs")
            with deployment(
                stack["env"],
                home,
                database_url=postgres_db,
                extra_env=celery,
                workers=(worker,),
                host=control,
                start_worker=on_worker_host,
            ) as api:
                api.wait_for_dag("recpipe_daily_retrain")
                api.set_paused("recpipe_daily_retrain", False)
                run = api.trigger("recpipe_daily_retrain", {}, logical_date=f"{DAYS[0]}T00:00:00Z")
                request = api.wait_for_hitl("recpipe_daily_retrain", run["dag_run_id"], "approve_promotion")
                assert request["subject"] == f"Promote {MODEL} version 1?", request
                assert "| new auc | 0." in request["body"], request["body"]  # the gate's table
                assert champion_version(stack) is None  # nothing moves before the answer
                api.answer_hitl("recpipe_daily_retrain", run["dag_run_id"], "approve_promotion", ["Approve"])
                run = api.wait_for_run("recpipe_daily_retrain", run["dag_run_id"])
                tasks = api.task_instances("recpipe_daily_retrain", run["dag_run_id"])
                states = {t["task_id"]: t["state"] for t in tasks}
                assert run["state"] == "success" and run["logical_date"].startswith(DAYS[0]), states
                assert set(states.values()) == {"success"} and len(states) >= 12, states
                assert champion_version(stack) == 1
                applied = api.xcom("recpipe_daily_retrain", run["dag_run_id"], "apply_approval")
                assert applied["promoted"] and applied["by"] == "admin", applied
                assert {t["queue"] for t in tasks} == {queue}
                # every task ran on the worker's host
                assert {t["hostname"] for t in tasks} == {name}, tasks
                text = api.log("recpipe_daily_retrain", run["dag_run_id"], "train")
                assert "warm start from nothing" in text
            # the result backend holds the tasks' Celery results
            results = redis.Redis(host=control, port=store_port, db=1, password=password)
            assert len(list(results.scan_iter(match="celery-task-meta-*"))) >= len(states)
        finally:
            store.terminate()
            store.wait(timeout=30)
    worker_log = (home / "celery-worker.log").read_text()
    # the broker's password is masked in the worker's log
    assert f"Connected to redis://:**@{control}:{store_port}/0" in worker_log, worker_log[-3000:]
    assert password not in worker_log
    # every task instance went through this worker
    assert len(re.findall(r"Task execute_workload\[[-\w]+\] succeeded", worker_log)) >= len(states)


def hosts_redis(address: str, port: int, password: str, log: Path) -> subprocess.Popen:
    """A Redis of the test's own on ``address`` with a password (Redis refuses clients of
    other hosts without one), no snapshot on disk, once it answers."""
    import redis

    log.parent.mkdir(parents=True, exist_ok=True)
    # the password through stdin's config, not the command line that ps shows
    proc = subprocess.Popen(
        ["redis-server", "-", "--bind", address, "--port", str(port), "--save", "", "--appendonly", "no"],
        stdin=subprocess.PIPE,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    proc.stdin.write(f"requirepass {password}\n".encode())
    proc.stdin.close()
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                redis.Redis(host=address, port=port, password=password).ping()
                return proc
            except redis.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
    except BaseException:
        proc.kill()  # the caller never gets it to stop
        proc.wait()
        raise


def champion_version(stack) -> int | None:
    from mlflow import MlflowClient

    from recpipe.champion import current

    found = current(MlflowClient(stack["tracking_uri"]), MODEL)
    return None if found is None else int(found.version)


@contextmanager
def spark_standalone(logs: Path, hosts=None):
    """A Spark standalone master and one worker (1 core, 1 GiB) from pyspark's own
    distribution on free ports; yields the master URL. On 127.0.0.1, or with ``hosts``
    (``tests.hosts.Hosts`` naming ``spark-master`` and ``spark-worker``) each on its host's
    address (``SPARK_LOCAL_IP``: every server, and the executors the worker starts, listen
    there)."""
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    port = free_port()
    logs.mkdir(parents=True, exist_ok=True)
    address = {"master": "127.0.0.1", "worker": "127.0.0.1"}
    if hosts is not None:
        address = {name: hosts.address(f"spark-{name}") for name in address}
    master = ["org.apache.spark.deploy.master.Master", "--host", address["master"], "--port", str(port)]
    master += ["--webui-port", str(free_port())]
    url = f"spark://{address['master']}:{port}"
    worker = ["org.apache.spark.deploy.worker.Worker", url, "--host", address["worker"], "--cores", "1"]
    worker += ["--memory", "1g", "--webui-port", str(free_port()), "--work-dir", str(logs / "work")]
    procs = []
    try:
        for name, args in (("master", master), ("worker", worker)):
            env = {**os.environ, "SPARK_LOCAL_IP": address[name], "PYSPARK_PYTHON": sys.executable}
            command = [str(spark_class), *args]
            if hosts is not None:
                procs.append(hosts.popen(f"spark-{name}", command, logs / f"{name}.log", env=env))
            else:
                out = (logs / f"{name}.log").open("wb")
                procs.append(
                    subprocess.Popen(
                        command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
            text, deadline = "", time.monotonic() + 120
            ready = (
                "Successfully registered with master" if name == "worker" else "I have been elected leader"
            )
            while ready not in text:
                assert time.monotonic() < deadline, f"spark {name} did not start:\n{text[-3000:]}"
                time.sleep(1)
                text = (logs / f"{name}.log").read_text(errors="replace")
        yield url
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait(timeout=60)


def test_prepare_features_runs_on_a_spark_standalone_cluster_across_hosts(movielens_raw, tmp_path_factory):
    """spark-submit, the feature job's other engine, for clusters that schedule applications:
    the master on one host, the worker (and its executor) on another, the driver (the DAG's
    task, ``airflow tasks test``) on a third; each listens on its own host's address."""
    from tests.hosts import Hosts

    stack = new_stack(movielens_raw, tmp_path_factory.mktemp("spark-cluster"), spark_connect_conn_id=None)
    base = stack["base"]
    with (
        Hosts(["spark-master", "spark-worker", "driver"]) as hosts,
        spark_standalone(base / "spark", hosts) as master,
    ):
        env = {
            **stack["env"],
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": master}),
            "SPARK_LOCAL_IP": hosts.address("driver"),
        }
        on = ["ip", "netns", "exec", hosts.namespace("driver")]
        proc = airflow(env, "tasks", "test", "recpipe_daily_retrain", "prepare_features", DAYS[0], on=on)
        # the application ran on the cluster's executor, not in local mode
        apps = list((base / "spark" / "work").glob("app-*"))
    out = proc.stdout + proc.stderr
    assert f"spark-submit --master {master}" in out
    assert len(apps) == 1 and list(apps[0].glob("*/stderr")), apps
    executor_log = "".join(p.read_text() for p in apps[0].glob("*/stderr"))
    # the executor, on the worker's host, fetched the job from the driver on its host
    assert f"spark://CoarseGrainedScheduler@{hosts.address('driver')}:" in executor_log, executor_log[-2000:]
    if session_conf():  # recpipe's JVM functions were shipped to the executor and used
        assert "JVM functions are not loaded" not in out
        assert "recpipe-spark.jar" in executor_log, executor_log[-2000:]
    day = stack["var"] / "features" / f"ds={DAYS[0]}"
    assert (day / "_SUCCESS").exists()
    stats = json.loads((day / "_stats.json").read_text())
    assert stats["rows"] > 100 and stats["rows_quarantined"] == 0
