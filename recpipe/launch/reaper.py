"""What a job started ends with it, however its launcher ends: a small watcher process (standard
library only) in a session of its own, which reads the process groups the launcher starts from
a pipe. The launcher that ends normally says ``done`` and closes the pipe; a launcher that dies
(SIGKILL of the Airflow task, an out-of-memory kill) closes it without a word, and the watcher
then sends SIGTERM to every group it was told of, and SIGKILL after ``grace_s`` seconds: the
job's processes, their children, and the holder of its network namespace.

The same contract as ``prctl(PR_SET_PDEATHSIG)``, for whole process groups (a signal on the
parent's death reaches the direct child only) and from a process the task's own process group
does not hold.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

DONE = b"done\n"


class Reaper:
    """The launcher's side: ``watch(pgid)`` for every process group started, ``close()`` when the
    job is over (its processes already stopped)."""

    def __init__(self, grace_s: float = 5.0):
        read, self._write = os.pipe()
        # this file as a script, without site-packages: it needs the standard library alone,
        # and a job's start pays 0.03 CPU-s for it instead of the package's 0.3
        self.process = subprocess.Popen(
            [sys.executable, "-S", "-I", __file__, str(grace_s)],
            stdin=read,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the task's process group is killed with the task
            close_fds=True,
        )
        os.close(read)

    def watch(self, pgid: int) -> None:
        """End process group ``pgid`` if this process dies before ``close``."""
        os.write(self._write, f"{pgid}\n".encode())

    def close(self) -> None:
        """The job is over: the watcher exits without a signal."""
        if self._write < 0:
            return
        try:
            os.write(self._write, DONE)
        finally:
            os.close(self._write)
            self._write = -1
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _signal(groups: list[int], sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def main() -> None:
    grace_s = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # only the pipe's end counts
        signal.signal(sig, signal.SIG_IGN)
    groups: list[int] = []
    buffer = b""
    while chunk := os.read(0, 4096):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line + b"\n" == DONE:
                return
            groups.append(int(line))
    _signal(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(g) for g in groups):
        time.sleep(0.1)
    _signal(groups, signal.SIGKILL)


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


if __name__ == "__main__":
    main()
