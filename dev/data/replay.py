"""Replay MovieLens ratings as the daily raw event logs a logging system would deliver.

Layout written under ``out``::

    events/ds=YYYY-MM-DD/part-00000.csv   user_id,item_id,rating,timestamp,label
    events/ds=YYYY-MM-DD/_SUCCESS         written last: the day is complete
    dims/users.csv                        user_id,age,gender,occupation,zip_code
    dims/items.csv                        item_id,movie_title,release_year,genres

``ds`` is the UTC date of the rating's unix timestamp; ``label`` is ``rating >= 4``. Each day
is written to a hidden temporary directory and renamed into place, so a reader never sees a
half-written day. With ``granularity="hour"`` each day is 24 hour partitions instead,
``events/ds=YYYY-MM-DD/hh=HH/`` (``HH`` the UTC hour, 00-23), or with ``pass_minutes`` below 60
the passes' partitions ``hh=HHMM/`` (``recpipe.layout.pass_key``), each with its ``_SUCCESS``;
a pass without ratings is an empty file (header only), as a logging system delivers a quiet
hour, so that a pass waiting for it does not wait forever.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dev.data.csv_files import write_csv_file, write_csv_partition
from recpipe.arrivals import announce
from recpipe.layout import ds_partition, pass_key, pass_partition

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


def replay_movielens(
    src: str | Path,
    out: str | Path,
    granularity: str = "day",
    pass_minutes: int = 60,
    announce_url: str | None = None,
    first_days: int | None = None,
) -> dict[str, int]:
    """Write the event partitions (a day or a pass each) and dimension snapshots.

    Args:
        src: directory holding ``ml-100k.inter``, ``ml-100k.user``, ``ml-100k.item``.
        out: output root (``events/`` and ``dims/`` are created below it).
        granularity: ``"day"`` or ``"hour"`` (passes).
        pass_minutes: with ``"hour"``, the passes' length (``recpipe.layout.PASS_MINUTES``):
            60, an hour's partition ``hh=HH``; shorter, ``hh=HHMM`` partitions.
        announce_url: a Redis URL: each partition is announced there once complete
            (``recpipe.arrivals``), as a log exporter would.
        first_days: only the first this many days that have ratings (default: all).

    Returns:
        ``{ds: rows}`` for every day written, or ``{"ds/HH[MM]": rows}`` for every pass of the
        days that have ratings; the rows add up to the source's ratings.

    Raises:
        FileNotFoundError: a source file is missing.
        ValueError: another ``granularity``, or a pass length that does not divide the hour
            (before anything is written).
    """
    if granularity not in ("day", "hour"):
        raise ValueError(f"granularity must be 'day' or 'hour', got {granularity!r}")
    keys = [pass_key(m // 60, m % 60, pass_minutes) for m in range(0, 1440, pass_minutes)]
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
            "minute": pc.cast(pc.strftime(utc, format="%M"), pa.int32()),
        }
    ).sort_by([("ds", "ascending"), ("timestamp", "ascending")])

    write_dims(src, out)  # before any partition is announced: a pass reads them
    (out / "events").mkdir(parents=True, exist_ok=True)
    client = None
    if announce_url:
        from recpipe import redis_conn

        client = redis_conn.resolve(announce_url, flag="--announce", env=redis_conn.ARRIVALS_ENV).client()

    def tell(partition) -> None:
        if client is not None:
            announce(client, partition)

    counts: dict[str, int] = {}
    for ds in pc.unique(events["ds"]).to_pylist()[:first_days]:
        day = events.filter(pc.equal(events["ds"], ds))
        if granularity == "day":
            written = write_csv_partition(day.select(list(EVENT_COLUMNS)), ds_partition(out / "events", ds))
            counts[ds] = day.num_rows
            tell(written)
            continue
        # a pass's key: the hour, and the start minute of a shorter pass
        start = pc.multiply(pc.divide(day["minute"], pass_minutes), pass_minutes)
        at = (
            pc.binary_join_element_wise(day["hh"], pc.utf8_lpad(pc.cast(start, pa.string()), 2, "0"), "")
            if pass_minutes != 60
            else day["hh"]
        )
        for key in keys:
            rows = day.filter(pc.equal(at, key)).select(list(EVENT_COLUMNS))
            tell(write_csv_partition(rows, pass_partition(out / "events", ds, key)))
            counts[f"{ds}/{key}"] = rows.num_rows
    return counts


def write_dims(src: str | Path, out: str | Path) -> None:
    """The dimension snapshots ``<out>/dims/users.csv`` and ``items.csv`` from the source."""
    src, out = Path(src), Path(out)
    users = read_recbole(src / "ml-100k.user")
    items = read_recbole(src / "ml-100k.item").rename_columns(
        ["item_id", "movie_title", "release_year", "genres"]
    )
    write_csv_file(users, out / "dims" / "users.csv")
    write_csv_file(items, out / "dims" / "items.csv")
