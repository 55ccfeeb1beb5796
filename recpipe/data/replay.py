"""Replay MovieLens ratings as the daily raw event logs a logging system would deliver.

Layout written under ``out``::

    events/ds=YYYY-MM-DD/part-00000.csv   user_id,item_id,rating,timestamp,label
    events/ds=YYYY-MM-DD/_SUCCESS         written last: the day is complete
    dims/users.csv                        user_id,age,gender,occupation,zip_code
    dims/items.csv                        item_id,movie_title,release_year,genres

``ds`` is the UTC date of the rating's unix timestamp; ``label`` is ``rating >= 4``. Each day
is written to a hidden temporary directory and renamed into place, so a reader never sees a
half-written day.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from recpipe.data.csv_files import write_csv_file, write_csv_partition

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


def replay_movielens(src: str | Path, out: str | Path) -> dict[str, int]:
    """Write the daily event partitions and dimension snapshots.

    Args:
        src: directory holding ``ml-100k.inter``, ``ml-100k.user``, ``ml-100k.item``.
        out: output root (``events/`` and ``dims/`` are created below it).

    Returns:
        ``{ds: rows}`` for every day written; the rows add up to the source's ratings.

    Raises:
        FileNotFoundError: a source file is missing.
    """
    src, out = Path(src), Path(out)
    inter = read_recbole(src / "ml-100k.inter")
    seconds = pc.cast(pc.cast(inter["timestamp"], pa.float64()), pa.int64())
    rating = pc.cast(inter["rating"], pa.float64())
    days = pc.strftime(pc.cast(seconds, pa.timestamp("s", tz="UTC")), format="%Y-%m-%d")
    events = pa.table(
        {
            "user_id": inter["user_id"],
            "item_id": inter["item_id"],
            "rating": rating,
            "timestamp": seconds,
            "label": pc.cast(pc.greater_equal(rating, 4.0), pa.int8()),
            "ds": days,
        }
    ).sort_by([("ds", "ascending"), ("timestamp", "ascending")])

    (out / "events").mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for ds in pc.unique(events["ds"]).to_pylist():
        day = events.filter(pc.equal(events["ds"], ds)).select(list(EVENT_COLUMNS))
        write_csv_partition(day, out / "events" / f"ds={ds}")
        counts[ds] = day.num_rows

    users = read_recbole(src / "ml-100k.user")
    items = read_recbole(src / "ml-100k.item").rename_columns(
        ["item_id", "movie_title", "release_year", "genres"]
    )
    write_csv_file(users, out / "dims" / "users.csv")
    write_csv_file(items, out / "dims" / "items.csv")
    return counts
