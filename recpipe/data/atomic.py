"""Write a directory or file so that readers see all of it or nothing (temp path + rename)."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv


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


def temp_dir_beside(final: Path) -> Path:
    """A new hidden directory next to ``final`` (same filesystem, so rename is atomic)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def write_csv_partition(table: pa.Table, final: Path, success_marker: bool = True) -> None:
    """Write ``table`` as ``final/part-00000.csv`` (+ ``_SUCCESS``), atomically."""
    tmp = temp_dir_beside(final)
    try:
        pacsv.write_csv(table, tmp / "part-00000.csv")
        if success_marker:
            (tmp / "_SUCCESS").touch()
        replace_dir(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_csv_file(table: pa.Table, final: Path) -> None:
    """Write one CSV file atomically."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}"
    pacsv.write_csv(table, tmp)
    os.replace(tmp, final)
