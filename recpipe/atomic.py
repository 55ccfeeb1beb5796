"""Writes that readers see whole or not at all: a temporary path beside the target, flushed to
disk (``fsync``), then a rename (atomic on one filesystem), then the parent directory flushed,
so that a power loss never leaves an empty file behind a ``_SUCCESS``. Every file or directory
recpipe leaves for another process to read (feature partitions, results, markers, exports) is
written through these; ``sweep`` removes what interrupted writes and deletions leave."""

from __future__ import annotations

import errno
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _temp_name(final: Path) -> Path:
    # hidden, unique per writer: two attempts writing at once never share a temporary file
    return final.parent / f"{TMP}{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


TMP, OLD, DELETING = ".tmp-", ".old-", ".deleting-"
STALE_TMP_S = 3600  # a temporary path of a writer on another host is swept after this long


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's entries to disk (``fsync``; directories too, so that
    a rename into them survives a power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """``fsync_path`` every file and directory under ``root``, ``root`` last."""
    for dirpath, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))


def sweep(parent: str | os.PathLike) -> list[Path]:
    """Remove, directly under ``parent``, the leftovers of interrupted writes and deletions:
    ``.old-*`` and ``.deleting-*`` directories, and ``.tmp-*`` paths whose writer is gone (its
    pid not alive here) or older than ``STALE_TMP_S``. Returns what was removed."""
    removed = []
    for path in Path(parent).glob(".*"):
        name = path.name
        if name.startswith(TMP):
            pid = name.rsplit("-", 2)[-2] if name.count("-") >= 3 else ""
            alive = pid.isdigit() and pid_alive(int(pid))
            try:
                old = time.time() - path.lstat().st_mtime > STALE_TMP_S
            except FileNotFoundError:
                continue
            if alive and not old:
                continue
        elif not name.startswith((OLD, DELETING)):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def file(path: str | os.PathLike) -> Iterator[Path]:
    """Write the yielded temporary path; when the block ends without error it replaces
    ``path`` (parents created) in one rename. On error nothing of it is left."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(final)
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, final)
        fsync_path(final.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (``file``); returns ``path`` as a ``Path``."""
    with file(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def copy_file(source: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Copy ``source`` to ``path`` atomically (``file``)."""
    with file(path) as tmp:
        shutil.copyfile(source, tmp)
    return Path(path)


def temp_dir_beside(final: Path) -> Path:
    """A new hidden directory next to ``final`` (same filesystem, so rename is atomic)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(final)
    tmp.mkdir()
    return tmp


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished ``tmp`` directory to ``final``, replacing an older ``final``.

    The old directory is first renamed aside, so ``final`` is either the old or the new
    complete directory, or briefly absent; never a mix.
    """
    fsync_tree(tmp)
    old = None
    if final.exists():
        old = final.parent / f"{OLD}{final.name}-{uuid.uuid4().hex[:8]}"
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_path(final.parent)
    for leftover in [old, *final.parent.glob(f"{OLD}{final.name}-*")]:  # an earlier crash's too
        if leftover is not None:
            shutil.rmtree(leftover, ignore_errors=True)


@contextmanager
def directory(final: str | os.PathLike) -> Iterator[Path]:
    """Fill the yielded temporary directory; when the block ends without error it replaces
    ``final`` whole (``replace_dir``). On error nothing of it is left."""
    final = Path(final)
    tmp = temp_dir_beside(final)
    try:
        yield tmp
        replace_dir(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish_numbered(tmp: Path, root: Path, first: int) -> Path:
    """Rename the finished directory ``tmp`` to ``root/<n>``, ``n`` the smallest number
    >= ``first`` and above every numbered directory in ``root`` that no other writer holds.

    A rename onto an existing non-empty directory fails (``ENOTEMPTY``), so two writers that
    picked the same number at once both succeed with distinct numbers and neither replaces
    the other's directory (TF Serving's integer versions).

    Returns:
        The published directory.
    """
    n = max([first, *(int(p.name) + 1 for p in root.iterdir() if p.name.isdigit())])
    while True:
        final = root / str(n)
        if not final.exists():
            try:
                fsync_tree(tmp)
                os.rename(tmp, final)
                fsync_path(root)
                return final
            except OSError as err:
                if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        n += 1
