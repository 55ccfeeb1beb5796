"""Replay MovieLens ratings as the daily raw event logs a logging system would deliver.

Layout written under ``out``::

    events/ds=YYYY-MM-DD/part-00000.csv   user_id,item_id,rating,timestamp,label
    events/ds=YYYY-MM-DD/_SUCCESS         written last: the day is complete
    dims/users.csv                        user_id,age,gender,occupation,zip_code
    dims/items.csv                        item_id,movie_title,release_year,genres

``ds`` is the UTC date of the rating's unix timestamp; ``label`` is ``rating >= 4``. Each day
is written to a hidden temporary directory and renamed into place, so a reader never sees a
half-written day. With ``granularity="hour"`` each day is 24 hour partitions instead,
``events/ds=YYYY-MM-DD/hh=HH/`` (``HH`` the UTC hour, 00-23), each with its ``_SUCCESS``; an
hour without ratings is an empty file (header only), as a logging system delivers a quiet
hour, so that a pass waiting for it does not wait forever.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dev.data.csv_files import write_csv_file, write_csv_partition
from recpipe.layout import ds_partition, hour_partition

EVENT_COLUMNS = ("user_id", "item_id", "rating", "timestamp", "label")


def read_recbole(path: Path) -> pa.Table:
    """Read a RecBole atomic file (tab-separated, ``name:type`` header) with string columns."""
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
    names = [h.split(":")[0] for h in header]
    return pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names}),
    )


def replay_movielens(src: str | Path, out: str | Path, granularity: str = "day") -> dict[str, int]:
    """Write the event partitions (a day or an hour each) and dimension snapshots.

    Args:
        src: directory holding ``ml-100k.inter``, ``ml-100k.user``, ``ml-100k.item``.
        out: output root (``events/`` and ``dims/`` are created below it).
        granularity: ``"day"`` or ``"hour"``.

    Returns:
        ``{ds: rows}`` for every day written, or ``{"ds/HH": rows}`` for every hour of the days
        that have ratings; the rows add up to the source's ratings.

    Raises:
        FileNotFoundError: a source file is missing.
        ValueError: another ``granularity`` (before anything is written).
    """
    if granularity not in ("day", "hour"):
        raise ValueError(f"granularity must be 'day' or 'hour', got {granularity!r}")
    src, out = Path(src), Path(out)
    inter = read_recbole(src / "ml-100k.inter")
    seconds = pc.cast(pc.cast(inter["timestamp"], pa.float64()), pa.int64())
    rating = pc.cast(inter["rating"], pa.float64())
    utc = pc.cast(seconds, pa.timestamp("s", tz="UTC"))
    days = pc.strftime(utc, format="%Y-%m-%d")
    events = pa.table(
        {
            "user_id": inter["user_id"],
            "item_id": inter["item_id"],
            "rating": rating,
            "timestamp": seconds,
            "label": pc.cast(pc.greater_equal(rating, 4.0), pa.int8()),
            "ds": days,
            "hh": pc.strftime(utc, format="%H"),
        }
    ).sort_by([("ds", "ascending"), ("timestamp", "ascending")])

    (out / "events").mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for ds in pc.unique(events["ds"]).to_pylist():
        day = events.filter(pc.equal(events["ds"], ds))
        if granularity == "day":
            write_csv_partition(day.select(list(EVENT_COLUMNS)), ds_partition(out / "events", ds))
            counts[ds] = day.num_rows
            continue
        for hour in range(24):
            hh = f"{hour:02d}"
            rows = day.filter(pc.equal(day["hh"], hh)).select(list(EVENT_COLUMNS))
            write_csv_partition(rows, hour_partition(out / "events", ds, hh))
            counts[f"{ds}/{hh}"] = rows.num_rows

    users = read_recbole(src / "ml-100k.user")
    items = read_recbole(src / "ml-100k.item").rename_columns(
        ["item_id", "movie_title", "release_year", "genres"]
    )
    write_csv_file(users, out / "dims" / "users.csv")
    write_csv_file(items, out / "dims" / "items.csv")
    return counts
