"""The local launcher: logs, failures with the log's tail, and a kill that ends the whole tree."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from operators.launchers import JobFailedError, JobSpec, LocalLauncher


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
