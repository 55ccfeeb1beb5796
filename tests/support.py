"""What several test modules share that is not a fixture: the checkout's root, the MovieLens
days the trainer tests use, config edits, running a command, and free ports. Fixtures live in
the ``conftest.py`` files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recpipe.launch.topology import free_ports

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
# the first month of MovieLens days, prepared once per session (tests/trainer/conftest.py)
EARLY = ("1997-09-20", "1997-10-20")
# the recpipe command of this checkout (its console script may point at another install)
RECPIPE = [sys.executable, "-m", "cli"]


def run_ok(command: list[str], env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``command`` in the checkout (text output captured); fail the test with its stderr's
    tail unless it exits 0."""
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def spark_connect_url(timeout: float = 300) -> str:
    """The suite's Spark Connect server (``AIRFLOW_CONN_SPARK_CONNECT_DEFAULT``; started by
    tests/conftest.py), once it answers; fails the test after ``timeout`` seconds."""
    from features.connect_server import answers, url

    conn = json.loads(os.environ["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    deadline = time.monotonic() + timeout
    while not answers(conn["port"], conn["host"]):
        assert time.monotonic() < deadline, f"no Spark Connect server at {conn['host']}:{conn['port']}"
        time.sleep(0.5)
    return url(conn["port"], conn["host"])


def processes_writing_to(prefix: str) -> list[int]:
    """Live processes whose standard output is a file whose path starts with ``prefix``: a
    launched job's processes (each one's stdout is its log), forked ones
    (``recpipe.forkserver``) too, and never another test's."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            out = os.readlink(f"/proc/{entry}/fd/1") if entry.isdigit() else ""
        except OSError:
            continue
        if out.startswith(prefix):
            found.append(int(entry))
    return found


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    return free_ports(1)[0]


def with_edits(config, edits: dict):
    """A copy of ``config`` with EasyRec-style edits applied and validated."""
    from recpipe.config import apply_edits
    from recpipe.config.loader import validate
    from recpipe.config.pipeline import PipelineConfig

    return validate(PipelineConfig, apply_edits(config.to_dict(), edits), "test config")


def train_args(config_path: Path, model_dir: Path, edits: dict, *extra: str) -> list[str]:
    """``trainer.train_eval`` / ``recpipe train`` arguments: train on the early days with
    ``edits``, skip the final evaluation."""
    return [
        "--pipeline_config_path",
        str(config_path),
        "--model_dir",
        str(model_dir),
        f"--train_ds={EARLY[0]}:{EARLY[1]}",
        "--skip_eval",
        "--edit_config_json",
        json.dumps(edits),
        *extra,
    ]


@contextmanager
def mlflow_server(
    tmp_path: Path, backend_store_uri: str, *args: str, env: dict | None = None
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real ``mlflow server`` on a free 127.0.0.1 port (``args`` added to its command),
    yielded as ``(uri, process)`` once ``/health`` answers; stopped afterwards."""
    import urllib.request

    port = free_port()
    cmd = [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri", backend_store_uri]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1", *args]
    full_env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}
    log_path = tmp_path / f"mlflow-server-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(uri + "/health", timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-2000:]
                time.sleep(1)
        yield uri, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
        proc.wait(30)


def write_click_log(
    movielens_raw: Path,
    out: Path,
    partitions: list[str],
    rows: int | dict[str, int],
    p_student: float,
    p_other: float,
    seed=0,
) -> dict[str, int]:
    """Raw click logs in the replay's layout (``events/ds=D[/hh=HH]/``, ``dims/`` copied from
    ``movielens_raw``): ``rows`` uniform (user, item) pairs of MovieLens per partition (a day or
    a pass; a dict: by partition, 0 for a quiet hour), clicked with probability ``p_student``
    by students and ``p_other`` by the other users, so that the occupation alone carries the
    signal. Returns the clicks per partition."""
    import shutil
    from datetime import date

    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from dev.data.csv_files import write_csv_partition
    from recpipe.layout import ds_partition, split_pass

    if not (out / "dims").exists():
        shutil.copytree(movielens_raw / "dims", out / "dims")
    users = pacsv.read_csv(out / "dims" / "users.csv").to_pydict()
    student = np.array([o == "student" for o in users["occupation"]])
    ids = np.array(users["user_id"])
    rng = np.random.default_rng(seed)
    clicks = {}
    for ds in partitions:
        day, minute = split_pass(ds)
        n = rows[ds] if isinstance(rows, dict) else rows
        pick = rng.integers(0, len(ids), n)
        label = (rng.random(n) < np.where(student[pick], p_student, p_other)).astype(np.int8)
        start = (date.fromisoformat(day) - date(1970, 1, 1)).days * 86400 + 60 * (minute or 0)
        # a day, an hour's pass, or (its length not in its name) the first 5 minutes of a shorter one
        span = 86400 if minute is None else 3600 if len(ds.partition("/")[2]) == 2 else 300
        table = pa.table(
            {
                "user_id": ids[pick],
                "item_id": rng.integers(1, 1683, n),
                "rating": np.full(n, 3.0),
                "timestamp": np.sort(rng.integers(start, start + span, n)),
                "label": label,
            }
        )
        write_csv_partition(table, ds_partition(out / "events", ds))
        clicks[ds] = int(label.sum())
    return clicks


def doc_commands(page: str, test: str) -> str:
    """The shell block(s) of ``docs/<page>`` marked ``<!-- commands: run by <test> -->``, as
    written there (``docs/hooks/commands.py``). Fails the test when the page marks none."""
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    from commands import marked

    texts = marked((ROOT / "docs" / page).read_text(), test)
    assert texts, f"docs/{page} marks no block 'run by {test}'"
    return "\n".join(texts)


def run_doc_commands(text: str, cwd: Path, env: dict | None = None, timeout: int = 120):
    """Run a page's commands with bash (``set -e``: each must succeed), ``recpipe`` and
    ``airflow`` found on PATH as a user's activated venv finds them; returns the run."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    done = subprocess.run(
        ["bash", "-e", "-c", text], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{text}\nexited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
    return done


class RedisServer:
    """A redis-server on 127.0.0.1 that keeps nothing on disk: a restart empties it. With
    ``password`` it requires that password (given on its stdin as config, never on its command
    line)."""

    def __init__(self, password: str | None = None):
        self.port = free_port()
        self.password = password
        self.proc = None
        self.start()

    def start(self) -> None:
        import redis

        config = f'bind 127.0.0.1\nport {self.port}\nsave ""\nappendonly no\n'
        if self.password is not None:
            config += (
                "requirepass " + self.password.replace("\\", "\\\\").replace('"', '\\"').join('""') + "\n"
            )
        self.proc = subprocess.Popen(
            ["redis-server", "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.proc.stdin.write(config.encode())
        self.proc.stdin.close()
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
