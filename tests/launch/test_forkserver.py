"""recpipe.forkserver: job processes forked from a warm process behave as processes started on
their own would (argv, environment, network namespace, exit status, signals), and a client
killed with SIGKILL leaves no orphan. The suite's own server (tests/conftest.py) serves here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from recpipe import forkserver
from recpipe.launch import JobFailedError, JobSpec, LocalLauncher
from recpipe.launch.isolation import job_environment

PROBE = [sys.executable, "-m", "tests.launch.forked_probe"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server():
    """A server of this module's own, so that it is listening before the first test."""
    started = forkserver.start(wait=True, preload=("trainer.preload",))
    yield started
    started.stop()


def _wait_for(path: Path, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return json.loads(path.read_text())


def _gone(pid: int, timeout: float = 10) -> bool:
    """``pid`` ended (a zombie counts: only its parent can reap it) within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _sleeping(server, probe: list[str], report: Path, **env: str) -> subprocess.Popen:
    """A client, in a session of its own, whose probe writes ``report`` and sleeps."""
    return subprocess.Popen(
        [sys.executable, "-m", forkserver.CLIENT, *probe, str(report), "sleep"],
        cwd=ROOT,
        env=job_environment({forkserver.ENV: server.path, **env}),
        start_new_session=True,
    )


def test_a_job_process_is_forked_warm_and_sees_its_own_argv_env_and_namespace(server, tmp_path, monkeypatch):
    monkeypatch.setenv(forkserver.ENV, server.path)
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "fernet-s3cret")
    report = tmp_path / "report.json"
    job = JobSpec(name="probe", argv=[[*PROBE, str(report)]], cwd=ROOT, envs=[{"TF_CONFIG": '{"x": 1}'}])
    launcher = LocalLauncher(tmp_path / "logs")
    launcher.run(job)
    seen = _wait_for(report)
    assert seen["warm"] is True and seen["main"] == "__main__"
    assert seen["argv"] == [str(report)] and seen["cwd"] == str(ROOT)
    assert seen["env"]["TF_CONFIG"] == '{"x": 1}' and "AIRFLOW__CORE__FERNET_KEY" not in seen["env"]
    assert seen["netns"] != os.readlink("/proc/self/ns/net")  # the job's private namespace
    assert "probe wrote" in (tmp_path / "logs" / "probe-0.log").read_text()  # the client's stdout


def test_the_exit_code_comes_back_and_fails_the_job(server, tmp_path, monkeypatch):
    monkeypatch.setenv(forkserver.ENV, server.path)
    report = tmp_path / "report.json"
    job = JobSpec(name="probe", argv=[[*PROBE, str(report), "3"]], cwd=ROOT)
    with pytest.raises(JobFailedError, match="exited with code 3"):
        LocalLauncher(tmp_path / "logs").run(job)
    assert _wait_for(report)["warm"] is True


def test_an_environment_read_at_import_that_differs_starts_the_process_itself(server, tmp_path):
    report = tmp_path / "report.json"
    env = job_environment({forkserver.ENV: server.path, "OMP_NUM_THREADS": "7"})
    client = [sys.executable, "-m", forkserver.CLIENT, *PROBE, str(report)]
    out = subprocess.run(client, cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "OMP_NUM_THREADS" in out.stderr and "not forked" in out.stderr
    assert _wait_for(report)["warm"] is False


def test_a_launcher_that_imported_scikit_learn_is_still_forked(server, tmp_path):
    # sklearn and joblib setdefault KMP_* at import in the launching process (a test, a task):
    # the whole suite's DAG runs were started unforked while the server compared them
    report = tmp_path / "report.json"
    kmp = {"KMP_DUPLICATE_LIB_OK": "True", "KMP_INIT_AT_FORK": "FALSE"}
    env = job_environment({forkserver.ENV: server.path, **kmp})
    client = [sys.executable, "-m", forkserver.CLIENT, *PROBE, str(report)]
    out = subprocess.run(client, cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "not forked" not in out.stderr, out.stderr
    seen = _wait_for(report)
    assert seen["warm"] is True and {k: seen["env"].get(k) for k in kmp} == kmp


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_the_client_ends_the_forked_process(server, tmp_path, sig):
    report = tmp_path / "report.json"
    client = _sleeping(server, PROBE, report)
    try:
        forked = _wait_for(report)
        assert forked["warm"] is True and psutil.pid_exists(forked["pid"])
        os.killpg(client.pid, sig)
        assert client.wait(30) == -sig  # the client ends as the forked process did
        assert _gone(forked["pid"]), "the forked process outlived its client"
    finally:
        client.kill()


def test_concurrent_clients_are_each_forked(server, tmp_path):
    env = job_environment({forkserver.ENV: server.path})
    reports = [tmp_path / f"r{i}.json" for i in range(4)]
    results: list[int] = []

    def one(path: Path) -> None:
        client = [sys.executable, "-m", forkserver.CLIENT, *PROBE, str(path)]
        results.append(subprocess.run(client, cwd=ROOT, env=env).returncode)

    threads = [threading.Thread(target=one, args=(p,)) for p in reports]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [0, 0, 0, 0]
    seen = [_wait_for(p) for p in reports]
    assert all(s["warm"] for s in seen) and len({s["pid"] for s in seen}) == 4


def test_pythonpath_and_the_projects_modules_are_the_requests_own(server, tmp_path):
    """A process whose PYTHONPATH names another folder imports from it, this project's modules
    too (another checkout's ``trainer``, not the one the server preloaded)."""
    extra = tmp_path / "extra"
    (extra / "trainer").mkdir(parents=True)
    (extra / "trainer" / "__init__.py").write_text("")
    (extra / "elsewhere_probe.py").write_text(
        "import json, sys, tensorflow, trainer\n"
        "json.dump({'trainer': trainer.__file__, 'path': sys.path[:3]}, open(sys.argv[1], 'w'))\n"
    )
    report = tmp_path / "report.json"
    env = job_environment({forkserver.ENV: server.path, "PYTHONPATH": f"{extra}{os.pathsep}{ROOT}"})
    client = [sys.executable, "-m", forkserver.CLIENT, sys.executable, "-m", "elsewhere_probe", str(report)]
    out = subprocess.run(client, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "not forked" not in out.stderr, out.stderr
    seen = json.loads(report.read_text())
    assert seen["path"] == [str(tmp_path), str(extra), str(ROOT)]
    assert seen["trainer"] == str(extra / "trainer" / "__init__.py")


def test_a_forked_process_killed_by_sigkill_ends_its_client_the_same_way(server, tmp_path):
    # trainer.server_watch ends a worker whose peer is lost with SIGKILL: its launcher must see
    # -9, as for a process started on its own
    report = tmp_path / "report.json"
    env = job_environment({forkserver.ENV: server.path})
    client = [sys.executable, "-m", forkserver.CLIENT, *PROBE, str(report), "kill"]
    out = subprocess.run(client, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert _wait_for(report)["warm"] is True and "Traceback" not in out.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="joining another mount namespace needs root")
def test_a_client_in_its_own_mounts_has_its_process_forked_there(server, tmp_path):
    # ``ip netns exec`` mounts a host's own /etc/hosts in a mount namespace of its own: the
    # TFJob stand-in's replicas resolve their Services by it
    report = tmp_path / "report.json"
    hosts = tmp_path / "hosts"
    hosts.write_text("198.51.100.7 job-worker-0.ranking.svc\n")
    env = job_environment({forkserver.ENV: server.path})
    mount = f'mount --bind {hosts} /etc/hosts && exec "$@"'
    client = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh"]
    client += [sys.executable, "-m", forkserver.CLIENT, *PROBE, str(report)]
    out = subprocess.run(client, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "not forked" not in out.stderr, out.stderr
    seen = _wait_for(report)
    assert seen["warm"] is True and seen["mntns"] != os.readlink("/proc/self/ns/mnt")
    assert seen["hosts"] == hosts.read_text() and seen["cwd"] == str(ROOT)


RESIDENT_PROBE = [sys.executable, "-m", "tests.launch.resident_probe"]


def _resident_run(server, tmp_path: Path, name: str, *probe_args: str, resident: str = "probe") -> tuple:
    """One request for the resident ``resident``: (its report, its stdout, its exit code)."""
    report = tmp_path / f"{name}.json"
    env = job_environment({forkserver.ENV: server.path, "RECPIPE_RESIDENT": resident})
    client = [sys.executable, "-m", forkserver.CLIENT, *RESIDENT_PROBE, str(report), *probe_args]
    out = subprocess.run(client, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert "not forked" not in out.stderr, out.stderr
    return _wait_for(report), out.stdout, out.returncode


def test_a_resident_runs_its_requests_in_one_process_each_with_its_own_streams_and_status(server, tmp_path):
    first, out1, code1 = _resident_run(server, tmp_path, "a1", resident="streams")
    second, out2, code2 = _resident_run(server, tmp_path, "a2", resident="streams")
    assert (code1, code2) == (0, 0)
    assert second["pid"] == first["pid"] and (first["runs"], second["runs"]) == (1, 2)
    # each client's stdout holds its own request's line only, and reached its end
    assert out1 == f"run 1 of process {first['pid']}\n" and out2 == f"run 2 of process {first['pid']}\n"
    other, _, _ = _resident_run(server, tmp_path, "b1", resident="another")
    assert other["pid"] != first["pid"] and other["runs"] == 1
    failed, _, code = _resident_run(server, tmp_path, "a3", "3", resident="streams")
    assert code == 3 and failed["pid"] == first["pid"] and failed["runs"] == 3
    # a failed request ends its resident: the next one starts a new process
    assert _gone(first["pid"])
    after, _, code = _resident_run(server, tmp_path, "a4", resident="streams")
    assert code == 0 and after["pid"] != first["pid"] and after["runs"] == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_a_residents_client_ends_the_resident(server, tmp_path, sig):
    name = f"signal-{sig}"
    kept, _, _ = _resident_run(server, tmp_path, "warm", resident=name)
    report = tmp_path / "sleeping.json"
    client = _sleeping(server, RESIDENT_PROBE, report, RECPIPE_RESIDENT=name)
    try:
        busy = _wait_for(report)
        assert busy["pid"] == kept["pid"] and busy["runs"] == 2
        os.killpg(client.pid, sig)
        assert client.wait(30) == -sig
        assert _gone(kept["pid"]), "the resident outlived its request's client"
    finally:
        client.kill()
    after, _, _ = _resident_run(server, tmp_path, "after", resident=name)
    assert after["pid"] != kept["pid"] and after["runs"] == 1


def test_a_request_while_the_resident_is_busy_gets_a_process_of_its_own(server, tmp_path):
    kept, _, _ = _resident_run(server, tmp_path, "warm", resident="busy")
    report = tmp_path / "sleeping.json"
    client = _sleeping(server, RESIDENT_PROBE, report, RECPIPE_RESIDENT="busy")
    try:
        assert _wait_for(report)["pid"] == kept["pid"]
        meanwhile, _, code = _resident_run(server, tmp_path, "meanwhile", resident="busy")
        assert code == 0 and meanwhile["pid"] != kept["pid"] and meanwhile["runs"] == 1
    finally:
        client.terminate()
        client.wait(30)


def test_a_resident_runs_the_deployed_code_after_a_change(server, tmp_path):
    """A module of the project changed between two passes (a deploy): the second pass runs the
    new code in a new process, and the resident that held the old code ends."""
    checkout = tmp_path / "checkout"
    for package in ("trainer", "recpipe"):
        (checkout / package).mkdir(parents=True)
        (checkout / package / "__init__.py").write_text("")
    (checkout / "trainer" / "code.py").write_text("VERSION = 1\n")
    (checkout / "code_probe.py").write_text(
        "import json, os, sys\n"
        "import trainer.code\n"
        "sys.recpipe_probe_runs = getattr(sys, 'recpipe_probe_runs', 0) + 1\n"
        "out = {'pid': os.getpid(), 'runs': sys.recpipe_probe_runs, 'version': trainer.code.VERSION}\n"
        "json.dump(out, open(sys.argv[1], 'w'))\n"
    )
    env = job_environment(
        {forkserver.ENV: server.path, "RECPIPE_RESIDENT": "deployed", "PYTHONPATH": str(checkout)}
    )

    def run_pass(name: str) -> dict:
        report = tmp_path / f"{name}.json"
        client = [sys.executable, "-m", forkserver.CLIENT, sys.executable, "-m", "code_probe", str(report)]
        out = subprocess.run(client, cwd=checkout, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "not forked" not in out.stderr, out.stderr
        return json.loads(report.read_text())

    first, second = run_pass("first"), run_pass("second")
    assert second["pid"] == first["pid"] and second["runs"] == 2 and second["version"] == 1
    (checkout / "trainer" / "code.py").write_text("VERSION = 22\n")  # the deploy
    third = run_pass("third")
    assert third["version"] == 22 and third["pid"] != first["pid"] and third["runs"] == 1
    assert _gone(first["pid"]), "the resident of the old code outlived the deploy"


def test_a_resident_job_runs_in_the_launchers_network_and_ends_when_idle(tmp_path, monkeypatch):
    """A launcher's resident job has no namespace of its own (it would end with the job); the
    server ends a resident idle for ``RECPIPE_RESIDENT_IDLE_S``."""
    server = forkserver.start(
        {**os.environ, "RECPIPE_RESIDENT_IDLE_S": "2"}, wait=True, preload=("trainer.preload",)
    )
    try:
        monkeypatch.setenv(forkserver.ENV, server.path)
        report = tmp_path / "report.json"
        job = JobSpec(name="probe", argv=[[*RESIDENT_PROBE, str(report)]], cwd=ROOT, resident="launched")
        LocalLauncher(tmp_path / "logs").run(job)
        seen = _wait_for(report)
        assert seen["netns"] == os.readlink("/proc/self/ns/net") and psutil.pid_exists(seen["pid"])
        assert "run 1 of process" in (tmp_path / "logs" / "probe-0.log").read_text()
        assert _gone(seen["pid"], timeout=30), "an idle resident was not ended"
    finally:
        server.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_another_user_cannot_reach_the_server(server):
    """The server forks for its own user only: its socket lies in a directory only that user
    may enter (mode 0700), so another user's connect is refused by the kernel."""
    import shutil

    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is missing")
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except PermissionError:\n"
        "    print('refused')\n"
        "else:\n"
        "    print('connected')\n"
    )
    user = ["--reuid=65534", "--regid=65534", "--clear-groups"]
    argv = [setpriv, *user, sys.executable, "-I", "-c", probe, server.path]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "refused", done.stdout + done.stderr
    assert (os.stat(Path(server.path).parent).st_mode & 0o777) == 0o700
