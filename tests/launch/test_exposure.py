"""What a local multi-process job exposes: Horovod's servers listen on 127.0.0.1 only;
TensorFlow's gRPC servers (parameter-server and multi-worker jobs) listen on every interface,
but inside the job's own network namespace, so no other host (nor this host's other
processes) can reach them; and no process of a job sees the worker's secrets."""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from pathlib import Path

import psutil
import pytest

from recpipe.config.train import TrainDistribute
from recpipe.launch import LocalLauncher
from recpipe.launch.topology import job_spec, training_processes
from tests.support import ROOT, processes_writing_to

pytestmark = pytest.mark.slow

STANDIN = "tests.launch.standin"  # joins the job as the trainer would, then waits


def _listen_table(pid: int) -> dict[int, tuple[str, int]]:
    """Listening TCP sockets of ``pid``'s network namespace, by inode: (ip, port). Read from
    ``/proc/<pid>/net``, since psutil reads its own namespace's table."""
    out = {}
    for name, width in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))  # per 32-bit word
            out[int(fields[9])] = (str(ipaddress.ip_address(raw)), int(hex_port, 16))
    return out


def _forked(root: psutil.Process) -> list[psutil.Process]:
    """What the fork server forked for ``root`` (``recpipe.forkserver``): processes outside its
    tree that write to the same log."""
    try:
        log = str(Path(f"/proc/{root.pid}/fd/1").readlink())
    except OSError:
        return []
    found = []
    for pid in processes_writing_to(log):
        try:
            found.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return found


def _listening(root: psutil.Process) -> set[tuple[str, int]]:
    out = set()
    for proc in {root, *root.children(recursive=True), *_forked(root)}:
        try:
            table = _listen_table(proc.pid)
            for fd in Path(f"/proc/{proc.pid}/fd").iterdir():
                target = fd.readlink().name if fd.is_symlink() else ""
                if target.startswith("socket:["):
                    inode = int(target[len("socket:[") : -1])
                    if inode in table:
                        out.add(table[inode])
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            pass
    return out


def _start(tmp_path: Path, job, ready: str, count: int) -> tuple[LocalLauncher, threading.Thread]:
    launcher = LocalLauncher(tmp_path / "logs", grace_s=2)
    thread = threading.Thread(target=lambda: _quiet(launcher.run, job), daemon=True)
    thread.start()
    logs = [tmp_path / "logs" / f"{job.name}-{i}.log" for i in range(len(job.argv))]
    deadline = time.monotonic() + 120
    while sum(p.exists() and p.read_text(errors="replace").count(ready) for p in logs) < count:
        alive = thread.is_alive()
        assert alive and time.monotonic() < deadline, [p.read_text()[-1000:] for p in logs if p.exists()]
        time.sleep(0.5)
    return launcher, thread


def _run_and_read(tmp_path: Path, job, ready: str, count: int) -> set[tuple[str, int]]:
    launcher, thread = _start(tmp_path, job, ready, count)
    try:
        found = set()
        for proc in launcher._procs:
            found |= _listening(psutil.Process(proc.pid))
        return found
    finally:
        launcher.kill()
        thread.join(30)


def _quiet(fn, *args):
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - killed on purpose
        pass


def _loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip.split("%")[0]).is_loopback


def test_a_horovod_job_listens_on_loopback_only(tmp_path):
    processes = training_processes(TrainDistribute.HorovodStrategy, 2, [STANDIN, "horovod"])
    job = job_spec("hvd", processes, ROOT)
    found = _run_and_read(tmp_path, job, "ready rank", 2)
    assert found, "the job listened on nothing (the rendezvous server was not seen)"
    assert all(_loopback(ip) for ip, _ in found), found


def test_a_parameter_server_job_is_reachable_only_from_its_own_namespace_and_sees_no_secret(
    tmp_path, monkeypatch
):
    import socket

    # what a CeleryExecutor worker of docker-compose.yaml holds in its environment
    secrets = {
        "AIRFLOW__CORE__FERNET_KEY": "fernet-s3cret",
        "AIRFLOW__API_AUTH__JWT_SECRET": "jwt-s3cret",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:pg-s3cret@db/airflow",
        "AIRFLOW_CONN_MLFLOW_DEFAULT": "http://user:mlflow-s3cret@mlflow:5000",
        "RECPIPE_REDIS_URL": "redis://:redis-s3cret@store:6379/0",
        "MLFLOW_TRACKING_PASSWORD": "mlflow-s3cret",
    }
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    processes = training_processes(TrainDistribute.PSStrategy, 1, [STANDIN, "chief"], ps=1)
    cluster = json.loads(processes[0].env["TF_CONFIG"])["cluster"]
    server_ports = {int(a.rsplit(":", 1)[1]) for role in ("worker", "ps") for a in cluster[role]}
    job = job_spec("ps", processes, ROOT)
    launcher, thread = _start(tmp_path, job, "serving", 2)  # the worker and the ps
    try:
        mine = Path("/proc/self/ns/net").readlink()
        spaces = {Path(f"/proc/{p.pid}/ns/net").readlink() for p in launcher._procs}
        assert len(spaces) == 1 and mine not in spaces  # one namespace, the job's own
        found = set()
        for proc in launcher._procs:
            found |= _listening(psutil.Process(proc.pid))
        assert {port for _, port in found} >= server_ports  # they serve, inside it
        for port in server_ports:  # from outside the job, on this very host: nothing there
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
        for proc in launcher._procs:
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace")
            assert "TF_CONFIG=" in environ and "PATH=" in environ
            leaked = [key for key, value in secrets.items() if key in environ or value in environ]
            assert leaked == [], leaked
    finally:
        launcher.kill()
        thread.join(30)


def test_the_environment_allowlist_keeps_what_jobs_need_and_drops_secrets():
    from recpipe.launch.isolation import job_environment

    environ = {
        "PATH": "/usr/bin",
        "TF_USE_LEGACY_KERAS": "1",
        "OMP_NUM_THREADS": "2",
        "RECPIPE_HOME": "/srv/recpipe",
        "RECPIPE_REDIS_URL": "redis://:pw@h/0",
        "RECPIPE_REDIS_PASSWORD": "pw",
        "AIRFLOW__CORE__FERNET_KEY": "k",
        "AWS_SECRET_ACCESS_KEY": "k",
        "PGPASSWORD": "pw",
    }
    env = job_environment({"TF_CONFIG": "{}"}, environ)
    assert env == {
        "PATH": "/usr/bin",
        "TF_USE_LEGACY_KERAS": "1",
        "OMP_NUM_THREADS": "2",
        "RECPIPE_HOME": "/srv/recpipe",
        "TF_CONFIG": "{}",
    }
