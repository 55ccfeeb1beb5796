"""The feature job as the DAGs run it: a Spark Connect session (Spark Connect's client in
``.venv/spark-client``) on the suite's server, against the same day prepared in a JVM of the
test's own: the same rows and the same figures; bad input fails with the file named."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from features.prepare import prepare_day
from operators.feature_job import spark_client_python
from tests.support import ROOT, spark_connect_url

DAY = "1997-09-22"


def _connect_job(config, ds: str) -> subprocess.CompletedProcess:
    command = [
        spark_client_python(ROOT), "-m", "features.prepare", "--pipeline_config_path",
        str(ROOT / "conf/movielens_deepfm.yaml"), "--ds", ds, "--remote", spark_connect_url(),
        "--edit_config_json=" + json.dumps(
            {"raw_input_path": config.raw_input_path, "train_input_path": config.train_input_path}
        ),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RECPIPE_HOME": str(ROOT)}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def _rows(path: Path) -> list:
    return sorted(map(repr, pq.read_table(path).to_pylist()))


def test_a_connect_session_writes_what_a_local_session_writes(spark, movielens_config):
    done = _connect_job(movielens_config, DAY)
    assert done.returncode == 0, done.stderr[-3000:]
    over_connect = Path(movielens_config.train_input_path) / f"ds={DAY}"
    stats = json.loads((over_connect / "_stats.json").read_text())
    normalization = (over_connect / "_normalization.json").read_text()
    rows = _rows(over_connect)
    moved = over_connect.with_name("connect")
    over_connect.rename(moved)

    local = prepare_day(spark, movielens_config, DAY)
    assert stats == local  # figures from observed metrics there, recpipe's accumulator here
    assert normalization == (over_connect / "_normalization.json").read_text()
    assert rows == _rows(over_connect)
    assert (moved / "_SUCCESS").exists() and stats["rows"] > 100


def test_bad_input_over_connect_names_the_file_and_leaves_nothing(movielens_config):
    part = Path(movielens_config.raw_input_path) / f"ds={DAY}" / "part-00000.csv"
    lines = part.read_text().splitlines()
    part.write_text("\n".join([lines[0], *(",".join(["x"] * 3) for _ in range(50))]) + "\n")
    done = _connect_job(movielens_config, DAY)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "recpipe features: BadRowsError" in done.stderr and "part-00000.csv: 50 rows" in done.stderr
    assert not (Path(movielens_config.train_input_path) / f"ds={DAY}").exists()


@pytest.mark.slow
def test_a_server_stopped_with_sigterm_leaves_no_jvm(tmp_path):
    """``python -m features.connect_server`` (compose's spark-connect service, make airflow) stopped
    with SIGTERM, as Docker and systemd stop it: its JVM goes too, and its port is free."""
    import signal
    import subprocess
    import sys
    import time

    from features.connect_server import _group, answers
    from tests.support import free_port

    port, state = free_port(), tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "features.connect_server", "--port", str(port), "--state", str(state)],
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 180
        while not answers(port):
            server_log = state / "server.log"
            log = server_log.read_text(errors="replace") if server_log.exists() else ""
            assert proc.poll() is None and time.monotonic() < deadline, log[-2000:]
            time.sleep(0.5)
        pgid = int((state / "server.pgid").read_text())
        assert any(b"SparkConnectServer" in _cmdline(p) for p in _group(pgid))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert _group(pgid) == [] and not answers(port)
    finally:
        if proc.poll() is None:
            proc.kill()


def _cmdline(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""


# a Spark Connect job whose operation runs until it is stopped: each of its server-side Python
# workers appends to a file as it goes, so whether the server still runs it can be seen
LONG_JOB = r"""
import sys, time
from features.prepare import run_interruptibly
from features.session import get_spark

url, beats = sys.argv[1], sys.argv[2]
spark = get_spark("recpipe-interrupt-test", remote=url)

def beat(batches):
    for batch in batches:
        for _ in range(1200):  # ten minutes, unless interrupted
            with open(beats, "a") as f:
                f.write(".")
            time.sleep(0.5)
        yield batch

def work():
    spark.range(1, numPartitions=1).mapInPandas(beat, "id long").collect()

print("started", flush=True)
try:
    run_interruptibly(work, spark)
finally:
    spark.stop()
"""


def _still_growing(path, wait_s: float) -> bool:
    before = path.stat().st_size if path.exists() else 0
    time.sleep(wait_s)
    return (path.stat().st_size if path.exists() else 0) > before


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "task_sigkilled", "job_sigkilled"])
def test_a_stopped_feature_job_leaves_nothing_running_on_the_server(tmp_path, how):
    """``prepare_features`` on Spark Connect stopped by a timeout or a kill (Airflow's SIGTERM
    to the job, or the task process SIGKILLed while the job runs in a session of its own, as
    ``SubprocessHook`` starts it): the job's operations on the server are interrupted, instead
    of running on beside the retry's."""
    import signal
    import sys

    beats = tmp_path / "beats"
    client = [spark_client_python(ROOT), "-c", LONG_JOB, spark_connect_url(), str(beats)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RECPIPE_HOME": str(ROOT)}
    # the "task": starts the job in a session of its own and waits for it
    task_script = (
        "import subprocess, sys\n"
        "p = subprocess.Popen(sys.argv[1:], start_new_session=True)\n"
        "open(sys.argv[0] + '.pid', 'w').write(str(p.pid))\n"
        "p.wait()\n"
    )
    task_file = tmp_path / "task.py"
    task_file.write_text(task_script)
    task = subprocess.Popen([sys.executable, str(task_file), *client], env=env)
    try:
        deadline = time.monotonic() + 120
        while not beats.exists():
            assert task.poll() is None and time.monotonic() < deadline, "the job never ran"
            time.sleep(0.5)
        assert _still_growing(beats, 2)
        job = int((tmp_path / "task.py.pid").read_text())
        if how == "sigterm":
            os.kill(job, signal.SIGTERM)
        elif how == "job_sigkilled":
            os.kill(job, signal.SIGKILL)
        else:
            task.kill()
        deadline = time.monotonic() + 30
        while Path(f"/proc/{job}").exists() and "zombie" not in _status(job) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{job}").exists() or "zombie" in _status(job), "the job outlived its stop"
        # Spark ends a cancelled task's Python worker after its kill timeout (2 s; about 3 s
        # after the job's exit here): the beats stop within seconds, or the operation runs on;
        # a SIGKILLed job's operation is abandoned once detached for 20 s (about 40 s in all)
        deadline = time.monotonic() + (90 if how == "job_sigkilled" else 30)
        while _still_growing(beats, 3):
            assert time.monotonic() < deadline, "the server still runs the stopped job's operation"
    finally:
        if task.poll() is None:
            task.kill()


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
