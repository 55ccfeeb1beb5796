"""The local launcher: logs, failures with the log's tail, and a kill that ends the whole tree."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from recpipe.launch import JobFailedError, JobSpec, JobTimeoutError, LocalLauncher


def _job(tmp_path, *scripts: str) -> JobSpec:
    return JobSpec(name="job", argv=[[sys.executable, "-c", s] for s in scripts], cwd=tmp_path)


def test_runs_every_process_and_keeps_one_log_each(tmp_path):
    logs = LocalLauncher(tmp_path / "logs").run(_job(tmp_path, "print('one')", "print('two')"))
    assert [p.read_text().strip() for p in logs] == ["one", "two"]


def test_a_failure_stops_the_others_and_names_the_process_with_its_log_tail(tmp_path):
    slow = "import time; time.sleep(60)"
    bad = "import sys\nfor i in range(100): print('line', i)\nsys.exit(3)"
    start = time.monotonic()
    with pytest.raises(JobFailedError) as err:
        LocalLauncher(tmp_path / "logs", grace_s=2).run(_job(tmp_path, slow, bad))
    assert time.monotonic() - start < 30
    message = str(err.value)
    assert "job process 1 exited with code 3" in message
    assert "line 99" in message and "line 10\n" not in message  # the tail, not the whole log


def test_kill_ends_children_and_grandchildren(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    # the job starts a grandchild that ignores SIGTERM: SIGKILL of the group must still end it
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(120)\n"
    )
    launcher = LocalLauncher(tmp_path / "logs", grace_s=1)
    errors = []
    thread = threading.Thread(target=lambda: _run(launcher, _job(tmp_path, script), errors))
    thread.start()
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    launcher.kill()
    thread.join(30)
    assert not thread.is_alive()
    assert errors and isinstance(errors[0], JobFailedError)
    time.sleep(0.5)
    assert not _alive(grandchild)


def _run(launcher, job, errors):
    try:
        launcher.run(job)
    except Exception as err:  # noqa: BLE001
        errors.append(err)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def test_servers_are_stopped_when_the_tasks_are_done_and_a_worker_is_restarted(tmp_path):
    serve = "import time; print('serving', flush=True); time.sleep(120)"
    task = "import time; time.sleep(4); print('done')"
    # the restartable server dies on its first start only (a marker file tells it apart)
    flaky = (
        f"import pathlib, sys, time; m = pathlib.Path({str(tmp_path / 'ran')!r}); first = not m.exists(); "
        "m.touch(); print('start', flush=True); sys.exit(9) if first else time.sleep(120)"
    )
    job = replace(_job(tmp_path, task, flaky, serve), servers={1, 2}, restart={1})
    start = time.monotonic()
    logs = LocalLauncher(tmp_path / "logs", grace_s=2).run(job)
    assert time.monotonic() - start < 30  # the servers did not hold the job for 120 s
    assert logs[0].read_text().strip() == "done" and logs[2].read_text().startswith("serving")
    assert logs[1].read_text().split() == ["start", "start"]  # started again, one log
    # a server that is not restartable fails the job
    job = replace(_job(tmp_path, "import time; time.sleep(30)", "import sys; sys.exit(4)"), servers={1})
    with pytest.raises(JobFailedError, match="job process 1 exited with code 4"):
        LocalLauncher(tmp_path / "logs2", grace_s=2).run(job)


def test_a_job_past_its_timeout_is_stopped_whole(tmp_path):
    pid_file = tmp_path / "child.pid"
    # a job that never ends, with a child of its own (a hung collective, say)
    never = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "print('waiting for a peer', flush=True)\n"
        "time.sleep(600)\n"
    )
    start = time.monotonic()
    with pytest.raises(JobTimeoutError) as err:
        LocalLauncher(tmp_path / "logs", grace_s=1, timeout_s=3).run(_job(tmp_path, never, never))
    assert 3 <= time.monotonic() - start < 20
    message = str(err.value)
    assert "ran past its timeout of 3 s" in message and "process 0, process 1" in message
    assert "waiting for a peer" in message  # the chief's log tail
    time.sleep(0.5)
    assert not _alive(int(pid_file.read_text()))


def test_a_crashed_optional_process_is_restarted_then_reported_without_failing_the_job(tmp_path):
    train = "import time; time.sleep(5); print('{\"global_step\": 5}')"
    crash = "import sys; print('evaluator starts', flush=True); sys.exit(7)"
    job = replace(_job(tmp_path, train, crash), restart={1}, optional={1}, roles=["worker 0", "evaluator"])
    launcher = LocalLauncher(tmp_path / "logs", grace_s=1)
    logs = launcher.run(job)
    assert logs[0].read_text().strip() == '{"global_step": 5}'
    assert logs[1].read_text().split("\n").count("evaluator starts") == 4  # 1 start + 3 restarts
    assert list(launcher.degraded) == ["evaluator"] and "exited with code 7" in launcher.degraded["evaluator"]
    # the same crash in a process that is not optional fails the job
    with pytest.raises(JobFailedError, match="evaluator exited with code 7"):
        LocalLauncher(tmp_path / "logs2", grace_s=1).run(replace(job, optional=set()))


def _in_namespace(inode: str) -> list[int]:
    """The live processes whose network namespace is ``inode`` (``net:[N]``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "net") == inode and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# a job process that starts a grandchild ignoring SIGTERM, says where it runs, and waits
CHILD = (
    "import os, subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'])\n"
    "open(sys.argv[1], 'w').write(os.readlink('/proc/self/ns/net'))\n"
    "time.sleep(300)\n"
)


def _wait_for(path: Path, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, path
        time.sleep(0.1)
    return path.read_text()


def _gone(inode: str, timeout_s: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := _in_namespace(inode)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_a_launcher_killed_with_sigkill_leaves_no_process_nor_namespace(tmp_path):
    """The Airflow task running a job is SIGKILLed (its process group with it): the job's
    processes, their children (one ignores SIGTERM) and the namespace's holder end too."""
    import signal
    import subprocess

    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from recpipe.launch import JobSpec, LocalLauncher\n"
        f"child = {CHILD!r}\n"
        "out = Path(sys.argv[1])\n"
        "argv = [[sys.executable, '-c', child, str(out / f'ns-{i}')] for i in range(2)]\n"
        "job = JobSpec(name='job', argv=argv, cwd=out)\n"
        "LocalLauncher(out / 'logs', grace_s=1).run(job)\n"
    )
    task = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], start_new_session=True)
    try:
        inode = _wait_for(tmp_path / "ns-0")
        _wait_for(tmp_path / "ns-1")
        assert inode != os.readlink("/proc/self/ns/net")  # a namespace of its own
        assert len(_in_namespace(inode)) >= 5  # the holder, two processes, two grandchildren
        os.killpg(task.pid, signal.SIGKILL)
        task.wait(10)
        assert _gone(inode) == []
    finally:
        if task.poll() is None:
            task.kill()


def test_a_start_that_fails_halfway_leaves_no_process_nor_namespace(tmp_path, monkeypatch):
    """The second process cannot start (its log cannot be opened): the first, its child and
    the namespace's holder are ended before the error reaches the task."""
    from recpipe.launch import local

    opened = []  # the job's namespace, as its holder was in it: this test's alone

    class Recorded(local.PrivateNetwork):
        def open(self):
            super().open()
            opened.append((self.holder.pid, os.readlink(f"/proc/{self.holder.pid}/ns/net")))
            return self

    monkeypatch.setattr(local, "PrivateNetwork", Recorded)
    job = JobSpec(name="job", argv=[[sys.executable, "-c", CHILD, str(tmp_path / "ns-0")]] * 2, cwd=tmp_path)
    (tmp_path / "logs" / "job-1.log").mkdir(parents=True)
    with pytest.raises(IsADirectoryError):
        LocalLauncher(tmp_path / "logs", grace_s=1).run(job)
    ((holder, inode),) = opened
    assert not _alive(holder)
    assert _gone(inode) == []


def test_without_a_namespace_the_job_fails_closed_unless_the_operator_opts_out(tmp_path, monkeypatch):
    """Where ``unshare`` is refused (here: not found, as in a container without
    CAP_SYS_ADMIN), a job does not fall back to the host's network; ``RECPIPE_JOB_NETWORK=host``
    is the operator's explicit opt-out."""
    from recpipe.launch import isolation

    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    isolation._namespace_argv.cache_clear()
    try:
        with pytest.raises(isolation.IsolationError, match="no private network namespace.*=host"):
            LocalLauncher(tmp_path / "logs").run(_job(tmp_path, "print('one')"))
        monkeypatch.setenv(isolation.NETWORK_ENV, "host")
        logs = LocalLauncher(tmp_path / "logs").run(_job(tmp_path, "print('one')"))
        assert logs[0].read_text().strip() == "one"
    finally:
        isolation._namespace_argv.cache_clear()
