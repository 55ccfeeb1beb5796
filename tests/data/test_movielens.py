"""MovieLens fetch and replay: verified files, and every rating in exactly one day."""

from __future__ import annotations

import csv
import io
import zipfile
from collections import Counter
from datetime import UTC, datetime

import pytest

from dev.data.movielens import WHEEL_SHA256, FetchError, convert_grouplens_zip, fetch_movielens
from recpipe.digest import file_sha256 as sha256


def test_fetch_verifies_and_reuses_cache(movielens_src):
    for name, digest in WHEEL_SHA256.items():
        assert sha256(movielens_src / name) == digest
    assert (movielens_src / "SOURCE").read_text().startswith("recbole wheel")
    before = (movielens_src / "SOURCE").stat().st_mtime_ns
    assert fetch_movielens(movielens_src.parent) == movielens_src
    assert (movielens_src / "SOURCE").stat().st_mtime_ns == before  # cache hit, no download


def test_fetch_refetches_a_tampered_cache(movielens_src, tmp_path):
    import shutil

    copy = tmp_path / "movielens-100k"
    shutil.copytree(movielens_src, copy)
    (copy / "ml-100k.inter").write_text("user_id:token\n1\n")
    fetched = fetch_movielens(tmp_path, source="wheel")
    assert sha256(fetched / "ml-100k.inter") == WHEEL_SHA256["ml-100k.inter"]


def test_replay_matches_the_source_exactly(movielens_src, movielens_raw):
    expected: Counter[str] = Counter()
    source_rows = set()
    with open(movielens_src / "ml-100k.inter") as f:
        next(f)
        for line in f:
            user, item, rating, ts = line.rstrip("\n").split("\t")
            ds = datetime.fromtimestamp(int(float(ts)), UTC).date().isoformat()
            expected[ds] += 1
            source_rows.add((user, item, int(float(ts)), int(float(rating) >= 4)))
    days = sorted(p for p in (movielens_raw / "events").iterdir() if not p.name.startswith("."))
    assert len(days) == 213 == len(expected)
    seen = set()
    got: Counter[str] = Counter()
    for day in days:
        assert (day / "_SUCCESS").exists()
        ds = day.name.removeprefix("ds=")
        with open(day / "part-00000.csv") as f:
            for row in csv.DictReader(f):
                got[ds] += 1
                assert datetime.fromtimestamp(int(row["timestamp"]), UTC).date().isoformat() == ds
                assert int(row["label"]) == int(float(row["rating"]) >= 4)
                seen.add((row["user_id"], row["item_id"], int(row["timestamp"]), int(row["label"])))
    assert got == expected and sum(got.values()) == 100_000
    assert seen == source_rows  # every rating landed (user, item) pairs are unique in ml-100k
    users = list(csv.DictReader(open(movielens_raw / "dims/users.csv")))
    items = list(csv.DictReader(open(movielens_raw / "dims/items.csv")))
    assert (len(users), len(items)) == (943, 1682)
    assert items[0]["genres"] == "Animation Children's Comedy"


def test_hourly_replay_puts_every_rating_in_exactly_one_hour(movielens_src, movielens_hourly_raw, tmp_path):
    from dev.data.replay import replay_movielens

    hours = sorted((movielens_hourly_raw / "events").glob("ds=*/hh=*"))
    assert len(hours) == 213 * 24
    seen, quiet = 0, []
    for hour in hours:
        assert (hour / "_SUCCESS").exists()
        ds, hh = hour.parent.name.removeprefix("ds="), hour.name.removeprefix("hh=")
        with open(hour / "part-00000.csv") as f:
            rows = list(csv.DictReader(f))
        for row in rows:
            at = datetime.fromtimestamp(int(row["timestamp"]), UTC)
            assert (at.date().isoformat(), f"{at.hour:02d}") == (ds, hh)
        seen += len(rows)
        if not rows:
            quiet.append(hour)
    assert seen == 100_000
    # a quiet hour is delivered too: header only, and finished
    assert quiet and (quiet[0] / "part-00000.csv").read_text().startswith('"user_id"')
    with pytest.raises(ValueError, match="granularity"):
        replay_movielens(movielens_src, tmp_path / "x", granularity="minute")
    assert not (tmp_path / "x").exists()


def test_a_replay_in_shorter_passes_puts_every_rating_in_the_pass_it_falls_in(movielens_src, tmp_path):
    from dev.data.replay import replay_movielens

    counts = replay_movielens(
        movielens_src, tmp_path / "raw", granularity="hour", pass_minutes=30, first_days=3
    )
    assert len(counts) == 3 * 48 and sum(counts.values()) > 0
    days = sorted((tmp_path / "raw" / "events").glob("ds=*"))
    assert len(days) == 3
    for day in days:
        passes = sorted(p.name for p in day.glob("hh=*"))
        assert passes[:3] == ["hh=0000", "hh=0030", "hh=0100"] and len(passes) == 48
        for key in passes:
            with open(day / key / "part-00000.csv") as f:
                for row in csv.DictReader(f):
                    at = datetime.fromtimestamp(int(row["timestamp"]), UTC)
                    start = int(key[3:5]) * 60 + int(key[5:])
                    assert day.name == f"ds={at.date()}" and start <= at.hour * 60 + at.minute < start + 30


def _fake_grouplens(ratings: int) -> bytes:
    genres = "|".join(["0"] * 18 + ["1"])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(
            "ml-100k/u.data",
            "".join(f"{i % 943 + 1}\t{i % 1682 + 1}\t4\t88125094{i % 10}\n" for i in range(ratings)),
        )
        z.writestr("ml-100k/u.user", "".join(f"{u}|24|M|technician|85711\n" for u in range(1, 944)))
        z.writestr(
            "ml-100k/u.item",
            "".join(f"{i}|Movie {i} (1995)|01-Jan-1995||http://x|{genres}\n" for i in range(1, 1683)),
        )
    return buf.getvalue()


def test_grouplens_archive_is_converted_to_the_recbole_layout():
    files = convert_grouplens_zip(_fake_grouplens(100_000))
    inter = files["ml-100k.inter"].splitlines()
    assert inter[0] == "user_id:token\titem_id:token\trating:float\ttimestamp:float"
    assert len(inter) == 100_001
    assert files["ml-100k.item"].splitlines()[1] == "1\tMovie 1\t1995\tWestern"
    assert files["ml-100k.user"].splitlines()[1] == "1\t24\tM\ttechnician\t85711"


@pytest.mark.parametrize(
    "blob, message", [(b"not a zip", "not the GroupLens archive"), (None, "expected 100000 ratings")]
)
def test_grouplens_archive_is_checked(blob, message):
    with pytest.raises(FetchError, match=message):
        convert_grouplens_zip(blob if blob is not None else _fake_grouplens(10))
