"""Writes that readers see whole or not at all: a temporary path beside the target, then a
rename (atomic on one filesystem). Every file or directory recpipe leaves for another process
to read (feature partitions, results, markers, exports) is written through these."""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _temp_name(final: Path) -> Path:
    # hidden, unique per writer: two attempts writing at once never share a temporary file
    return final.parent / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextmanager
def file(path: str | os.PathLike) -> Iterator[Path]:
    """Write the yielded temporary path; when the block ends without error it replaces
    ``path`` (parents created) in one rename. On error nothing of it is left."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(final)
    try:
        yield tmp
        os.replace(tmp, final)
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
    old = None
    if final.exists():
        old = final.parent / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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
                os.rename(tmp, final)
                return final
            except OSError as err:
                if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        n += 1
