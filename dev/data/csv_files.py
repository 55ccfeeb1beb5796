"""CSV partitions and files of raw logs, written atomically (``recpipe.atomic``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from recpipe import atomic
from recpipe.layout import SUCCESS


def write_csv_partition(table: pa.Table, final: Path, success_marker: bool = True) -> Path:
    """Write ``table`` as ``final/part-00000.csv`` (+ ``_SUCCESS``), atomically; ``final``."""
    with atomic.directory(final) as tmp:
        pacsv.write_csv(table, tmp / "part-00000.csv")
        if success_marker:
            (tmp / SUCCESS).touch()
    return Path(final)


def write_csv_file(table: pa.Table, final: Path) -> None:
    """Write one CSV file atomically."""
    with atomic.file(final) as tmp:
        pacsv.write_csv(table, tmp)


def write_days(
    out: str | Path, start: str, days: int, day_table: Callable[[int], pa.Table], rows: int
) -> dict[str, int]:
    """Write ``day_table(d)`` for d in ``range(days)`` as ``out/ds=<start + d>/`` partitions
    (synthetic logs of ``rows`` rows in all or a day).

    Returns:
        ``{ds: rows}``.

    Raises:
        ValueError: ``rows`` or ``days`` is not positive (before anything is written).
    """
    if rows <= 0 or days <= 0:
        raise ValueError(f"rows and days must be positive (got rows={rows}, days={days})")
    first, counts = date.fromisoformat(start), {}
    for d in range(days):
        ds = (first + timedelta(days=d)).isoformat()
        table = day_table(d)
        write_csv_partition(table, Path(out) / f"ds={ds}")
        counts[ds] = table.num_rows
    return counts
