"""A warm process for job processes: ``python -m trainer.*`` forked from a process that has
already imported TensorFlow, instead of each one paying TensorFlow's import (about 3.4
CPU-seconds) again. The same idea as Python's ``multiprocessing`` forkserver with
``set_forkserver_preload``, for whole commands.

``RECPIPE_FORKSERVER`` names the server's socket. When it is set, the local launcher starts
each ``python -m MODULE ...`` process as ``python -m recpipe.forkserver.client python -m
MODULE ...``: a small client (no TensorFlow) that hands its command, working directory,
environment, standard streams and namespaces (network, mounts) to the server, which forks the process
there. The client stays in the launcher's process tree, relays signals to the forked process
and exits with its exit status, so the launcher watches and stops it as it would the process
itself. A client that cannot reach the server, or that the server refuses (another Python,
an environment that differs in a variable read at import, such as ``TF_*`` or ``OMP_*``),
starts the command itself.

Unset (the default), every process starts on its own. ``start()`` runs a server (the test
suite runs one per pytest-xdist worker); ``recpipe.forkserver.server`` is its entry point.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = "RECPIPE_FORKSERVER"
CLIENT = "recpipe.forkserver.client"
# modules a server never forks: launchers of other processes, which gain nothing from it
NOT_FORKED = frozenset({"recpipe.launch.horovodrun", CLIENT})


def socket_path() -> str | None:
    """The configured server's socket (``$RECPIPE_FORKSERVER``), or None when there is none."""
    path = os.environ.get(ENV, "")
    return path if path and path != "off" else None


def forked(argv: list[str]) -> list[str]:
    """``argv`` as the local launcher starts it: through the client when a server is configured
    and ``argv`` is ``[sys.executable, "-m", MODULE, ...]``; otherwise unchanged."""
    if socket_path() is None or len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        return argv
    if argv[2] in NOT_FORKED:
        return argv
    return [sys.executable, "-m", CLIENT, *argv]


class ForkServer:
    """A running server: ``path`` is its socket; ``stop()`` ends it and the processes it forked.

    Args:
        env: the server's environment; the processes it forks must agree with it in every
            variable read at import (``recpipe.forkserver.server.IMPORT_TIME``).
        wait: wait until it listens (clients that come before start their processes themselves).
        timeout_s: seconds to wait for the server to import ``preload`` and listen.
        preload: the modules the server imports before it forks (for trainer jobs
            ``("trainer.preload",)``, a module whose import is the preload).

    Raises:
        RuntimeError: ``wait`` and the server exited or did not listen within ``timeout_s``.
    """

    def __init__(
        self, env: dict[str, str], wait: bool = True, timeout_s: float = 120.0, preload: tuple[str, ...] = ()
    ):
        self._dir = tempfile.mkdtemp(prefix="recpipe-forkserver-")  # mode 0700: this user only
        self.path = str(Path(self._dir) / "socket")
        self.log = Path(self._dir) / "server.log"  # its own import's messages; its errors
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "recpipe.forkserver.server", self.path, str(os.getpid()), *preload],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout_s
        while wait and not os.path.exists(self.path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                self.stop()
                code = self.process.returncode
                raise RuntimeError(f"the fork server did not start (exit code {code}): {tail}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self._dir, ignore_errors=True)


def start(
    environ: dict[str, str] | None = None, wait: bool = True, preload: tuple[str, ...] = ()
) -> ForkServer:
    """Start a server with a job process's environment: ``recpipe.launch.isolation.
    job_environment`` of ``JOB_ENV`` over ``environ`` (default ``os.environ``), importing
    ``preload`` (module names: ``("trainer.preload",)`` for trainer jobs) before it forks."""
    from recpipe.launch.isolation import JOB_ENV, job_environment

    env = job_environment(dict(JOB_ENV), environ)
    env.pop(ENV, None)
    return ForkServer(env, wait=wait, preload=preload)
