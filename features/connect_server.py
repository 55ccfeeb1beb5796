"""A Spark Connect server for the feature job: pyspark's own ``start-connect-server.sh``, with
recpipe's JVM functions loaded and the feature job's static settings, bound to one address.

The deployment runs one (``make airflow``, ``make demo``, compose's ``spark-connect`` service,
the test suite); each pass's ``prepare_features`` is then a client session on a warm JVM
instead of a ``spark-submit`` that starts one (``operators.feature_job``).

``python -m features.connect_server [--port N] [--master local[2]] [--state DIR]`` runs one in the
foreground; ``server()`` starts one for the time of a ``with`` block; ``running()`` starts one
unless the deployment's address already answers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from features import CONNECT_PORT
from features.jvm import session_conf
from features.session import SERVER_CONF, local_threads

PGID_FILE = "server.pgid"


# an operation whose client is gone (the feature job SIGKILLed: it cannot interrupt its own
# queries) is abandoned and interrupted once it has been detached this long; the server ends
# each response stream after 15 s (a live client reattaches at once), so a dead client's
# operation ends within about 40 s
DETACHED_CONF = {
    "spark.connect.execute.reattachable.senderMaxStreamDuration": "15s",
    "spark.connect.execute.manager.detachedTimeout": "20s",
    "spark.connect.execute.manager.maintenanceInterval": "5s",
}


class ServerError(RuntimeError):
    """The server exited or did not answer in time; the message holds its log's tail."""


def command(port: int, master: str, host: str = "127.0.0.1") -> list[str]:
    """``start-connect-server.sh --wait`` (the foreground form) with recpipe's settings."""
    import pyspark

    script = Path(pyspark.__file__).parent / "sbin" / "start-connect-server.sh"
    conf = {
        **SERVER_CONF,
        **session_conf(local=local_threads(master) is not None),
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": host,
        "spark.driver.bindAddress": host,
        **DETACHED_CONF,
    }
    args = ["bash", str(script), "--wait", "--master", master]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


def environment(state: Path, host: str = "127.0.0.1") -> dict[str, str]:
    """The server's environment: its pid file and logs in ``state`` (spark-daemon.sh keeps
    them under the venv's pyspark otherwise, one server per machine), this venv's Python."""
    state.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "SPARK_PID_DIR": str(state),
        "SPARK_LOG_DIR": str(state),
        "SPARK_IDENT_STRING": f"recpipe-{os.getpid()}",
        "SPARK_LOCAL_IP": host,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_DRIVER_MEMORY": os.environ.get("RECPIPE_SPARK_DRIVER_MEMORY", "2g"),
    }


def answers(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


def url(port: int, host: str = "127.0.0.1") -> str:
    """The client's address of a server (``sc://host:port``)."""
    return f"sc://{host}:{port}"


def start(port: int, state: Path, master: str = "local[2]", host: str = "127.0.0.1") -> subprocess.Popen:
    """Start a server in its own process group (output to ``state/server.log``); returns at
    once: ``wait_ready`` waits for it."""
    env = environment(state, host)  # makes state
    log = open(state / "server.log", "ab")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(
        command(port, master, host), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    (state / PGID_FILE).write_text(str(proc.pid))  # its own group: sweep() finds what a kill left
    return proc


def wait_ready(proc: subprocess.Popen, port: int, state: Path, timeout: float = 180, host: str = "127.0.0.1"):
    """Block until the server answers at ``host:port``.

    Raises:
        ServerError: it exited first, or ``timeout`` (seconds) passed.
    """
    deadline = time.monotonic() + timeout
    while not answers(port, host):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (state / "server.log").read_text(errors="replace")[-3000:]
            why = (
                f"exited {proc.returncode}"
                if proc.returncode is not None
                else f"not up after {timeout:.0f} s"
            )
            raise ServerError(f"Spark Connect server on {host}:{port} {why}:\n{tail}")
        time.sleep(0.5)


def _group(pgid: int) -> list[int]:
    """The pids of process group ``pgid`` (read from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def sweep(state: Path) -> list[int]:
    """Stop what a killed run left of a server started in ``state``: its process group
    (``start`` records it), when one of its processes is still a Spark Connect server.
    Returns the group's pids."""
    try:
        pgid = int((Path(state) / PGID_FILE).read_text())
    except (OSError, ValueError):
        return []
    members = _group(pgid)
    for pid in members:
        try:
            if b"SparkConnectServer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.killpg(pgid, signal.SIGKILL)
                return members
        except OSError:
            continue
    return []


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """Stop the server's process group (SIGTERM, then SIGKILL)."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def server(port: int, state: Path, master: str = "local[2]", host: str = "127.0.0.1") -> Iterator[str]:
    """A server for the block's time; yields its ``sc://`` URL."""
    proc = start(port, state, master, host)
    try:
        wait_ready(proc, port, state, host=host)
        yield url(port, host)
    finally:
        stop(proc)


@contextmanager
def running(env: dict[str, str], state: Path) -> Iterator[str]:
    """The server that ``env``'s ``AIRFLOW_CONN_SPARK_CONNECT_DEFAULT`` names:
    used as it is when it answers, else started there (state in ``state``) for the block.
    Yields its ``sc://`` URL."""
    conn = json.loads(env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    host, port = conn["host"], int(conn["port"])
    if answers(port, host):
        yield url(port, host)
        return
    with server(port, state, host=host) as address:
        yield address


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m features.connect_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--port", type=int, default=CONNECT_PORT)
    parser.add_argument("--host", default="127.0.0.1", help="the address it binds (one interface)")
    parser.add_argument("--master", default=os.environ.get("RECPIPE_SPARK_MASTER", "local[2]"))
    parser.add_argument("--state", default=None, help="pid file and logs (default var/spark-connect)")
    args = parser.parse_args(argv)
    state = Path(args.state or Path(os.environ.get("RECPIPE_HOME") or Path.cwd()) / "var" / "spark-connect")
    return serve_foreground(args.port, state, args.master, args.host)


def serve_foreground(port: int, state: Path, master: str, host: str) -> int:
    """Run a server until it exits or this process is told to stop. The JVM runs in a process
    group of its own: SIGTERM or SIGINT here stops that whole group (``start-connect-server.sh
    --wait``'s shell would exit and leave the JVM holding the port), and a watcher ends it if
    this process is killed outright (``recpipe.launch.reaper``). Returns the server's exit code."""
    from recpipe.launch.reaper import Reaper

    proc = start(port, state, master, host)
    reaper = Reaper()
    reaper.watch(proc.pid)
    stopping = []

    def on_signal(signum, frame):
        stopping.append(signum)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        code = proc.wait()
    finally:
        end_group(proc.pid)
        reaper.close()
    return 0 if stopping else code


def end_group(pgid: int, timeout: float = 30) -> None:
    """SIGTERM process group ``pgid``, SIGKILL what is left of it after ``timeout`` seconds;
    returns once none of it is left (its leader may have exited before the rest)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while _group(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not _group(pgid):
            return


if __name__ == "__main__":
    raise SystemExit(main())
