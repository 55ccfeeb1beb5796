"""Advisory locks on a model dir (``flock``, released by the kernel when the holder dies, so a
killed process never leaves a stale lock).

- ``<dir>/.lock``: held exclusively by the process that trains the dir (the job's chief). A
  second trainer on the same dir (a zombie attempt and its retry, two manual runs) fails at
  once with the holder named.
- ``<dir>/.readers``: held shared by a job that fine-tunes from the dir, exclusively by
  retention while it deletes the dir; retention skips a dir it cannot lock either way.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recpipe.errors import PipelineError

WRITER = ".lock"
READERS = ".readers"


class LockedError(PipelineError):
    """Another process holds the lock; the message names it (pid, host, command, since when)."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        info = {}
    if not info:
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("since", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} ({info.get('purpose')}, since {since})"


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def _try(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextmanager
def training(model_dir: str | os.PathLike, purpose: str = "") -> Iterator[None]:
    """Hold ``model_dir``'s writer lock for the block, recording this process as its holder.

    Raises:
        LockedError: another live process holds it (the message names that process).
    """
    path = Path(model_dir) / WRITER
    fd = _open(path)
    try:
        if not _try(fd, fcntl.LOCK_EX):
            raise LockedError(
                f"model dir {model_dir} is being trained by {_holder(path)}: a second job must not "
                "write the same checkpoints. Wait for it to end or stop it, then retry"
            )
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "purpose": purpose or " ".join(sys.argv[:2]),
            "since": time.time(),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def reading(model_dir: str | os.PathLike) -> Iterator[None]:
    """Hold a shared readers' lock on ``model_dir`` (retention will not delete it meanwhile).

    Raises:
        LockedError: retention is deleting the dir right now.
    """
    fd = _open(Path(model_dir) / READERS)
    try:
        if not _try(fd, fcntl.LOCK_SH):
            raise LockedError(f"model dir {model_dir} is being deleted by retention; pick another source")
        yield
    finally:
        os.close(fd)


@contextmanager
def deleting(model_dir: str | os.PathLike) -> Iterator[bool]:
    """Try to take both locks of ``model_dir`` exclusively; yields whether it got them (False:
    a job trains it or fine-tunes from it now). Held until the block ends."""
    fds = [_open(Path(model_dir) / name) for name in (READERS, WRITER)]
    try:
        yield all(_try(fd, fcntl.LOCK_EX) for fd in fds)
    finally:
        for fd in fds:
            os.close(fd)
