"""What a local multi-process job listens on, read from its processes' sockets: Horovod's
servers on 127.0.0.1 only; TensorFlow's gRPC servers (parameter-server and multi-worker
jobs) on every interface, the one documented exception (README, "What listens where"),
limited to the ports of the job's TF_CONFIG."""

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
from tests.support import ROOT

pytestmark = pytest.mark.slow

STANDIN = "tests.launch.standin"  # joins the job as the trainer would, then waits


def _listening(root: psutil.Process) -> set[tuple[str, int]]:
    out = set()
    for proc in [root, *root.children(recursive=True)]:
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    out.add((conn.laddr.ip, conn.laddr.port))
        except psutil.NoSuchProcess:
            pass
    return out


def _run_and_read(tmp_path: Path, job, ready: str, count: int) -> set[tuple[str, int]]:
    launcher = LocalLauncher(tmp_path / "logs", grace_s=2)
    thread = threading.Thread(target=lambda: _quiet(launcher.run, job), daemon=True)
    thread.start()
    logs = [tmp_path / "logs" / f"{job.name}-{i}.log" for i in range(len(job.argv))]
    deadline = time.monotonic() + 120
    while sum(p.exists() and p.read_text(errors="replace").count(ready) for p in logs) < count:
        alive = thread.is_alive()
        assert alive and time.monotonic() < deadline, [p.read_text()[-1000:] for p in logs if p.exists()]
        time.sleep(0.5)
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


def test_a_parameter_server_job_exposes_only_its_tf_config_ports(tmp_path):
    processes = training_processes(TrainDistribute.PSStrategy, 1, [STANDIN, "chief"], ps=1)
    cluster = json.loads(processes[0].env["TF_CONFIG"])["cluster"]
    server_ports = {int(a.rsplit(":", 1)[1]) for role in ("worker", "ps") for a in cluster[role]}
    job = job_spec("ps", processes, ROOT)
    found = _run_and_read(tmp_path, job, "serving", 2)  # the worker and the ps
    exposed = {port for ip, port in found if not _loopback(ip)}
    assert exposed == server_ports, (found, cluster)  # TensorFlow's gRPC servers, nothing else
