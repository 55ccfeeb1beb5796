"""Row groups, the unit each worker's input shard is dealt in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group: the unit of sharding."""

    path: Path
    index: int
    rows: int


def row_groups(partitions: list[Path]) -> list[RowGroup]:
    """Every row group of every data file, in a stable order."""
    out = []
    for part in partitions:
        for path in sorted(part.glob("*.parquet")):
            meta = pq.ParquetFile(path).metadata
            out += [RowGroup(path, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    return out


def shard(groups: list[RowGroup], rank: int, world_size: int) -> list[RowGroup]:
    """Row groups of worker ``rank``: disjoint across ranks, together all of them.

    Raises:
        ValueError: rank outside [0, world_size).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    return groups[rank::world_size]
