"""Which data files a path holds, their format, and how many rows they hold: light (pyarrow,
no TensorFlow), for ``recpipe predict`` and for the DAG task that checks its output."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq

from recpipe.errors import UsageError

COMMAND = "recpipe predict"  # the writer named in an output's marker (recpipe.outputs)


class BadInputError(UsageError):
    """A row, column or path of the input cannot be scored: the message names the file, the
    row (1-based, data rows) and the column, and what the model takes."""


def data_files(path: str | os.PathLike, flag: str = "--input_path") -> list[Path]:
    """A file, or the non-empty data files below a partition directory (sorted; names starting
    with ``_`` or ``.`` left out, as Spark and Hive leave them; an empty part file holds no rows
    and is left out too).

    Raises:
        BadInputError: nothing to read there (``flag`` names it).
    """
    path = Path(path)
    if path.is_file():
        return [path]
    files = sorted(
        p for p in path.rglob("*")
        if p.is_file() and p.stat().st_size > 0
        and not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts)
    ) if path.is_dir() else []  # fmt: skip
    if not files:
        raise BadInputError(f"{flag}={path}: no data files there")
    return files


def file_format(files: list[Path], given: str | None = None) -> str:
    """``given``, else ``parquet`` when every file ends in ``.parquet``, else ``csv``."""
    return given or ("parquet" if all(f.suffix == ".parquet" for f in files) else "csv")


def count_rows(path: str | os.PathLike, fmt: str | None = None, with_header: bool = False) -> int:
    """Rows under ``path`` (``data_files``): Parquet from the files' footers, CSV as its non-blank
    lines (a blank line is no row: pyarrow's reader skips it as ``recpipe predict`` reads), less
    a header line per file with ``with_header``.

    Raises:
        BadInputError: nothing there.
    """
    files = data_files(path)
    if file_format(files, fmt) == "parquet":
        return sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    total = 0
    for f in files:
        with open(f, "rb") as handle:
            lines = sum(1 for line in handle if line.rstrip(b"\r\n"))
        total += max(lines - with_header, 0)
    return total
