"""A production shape of execution outside Docker: ``prepare_features`` submitted to a Spark
standalone master and worker through ``spark_default``, across hosts. (The CeleryExecutor on
a worker of its own, with PostgreSQL and a password-protected Redis broker, runs in
tests/test_compose.py, as docker-compose.yaml deploys it.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from features.jvm import session_conf
from tests.dags.conftest import DAYS, airflow, new_stack
from tests.support import free_port

pytestmark = pytest.mark.slow


@contextmanager
def spark_standalone(logs: Path, hosts=None):
    """A Spark standalone master and one worker (1 core, 1 GiB) from pyspark's own
    distribution on free ports; yields the master URL. On 127.0.0.1, or with ``hosts``
    (``dev.hosts.Hosts`` naming ``spark-master`` and ``spark-worker``) each on its host's
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
    from dev.hosts import Hosts

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
