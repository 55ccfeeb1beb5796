"""The on-disk layout and the atomic writes every writer goes through."""

from __future__ import annotations

import pytest

from recpipe import atomic
from recpipe.config import ConfigError
from recpipe.layout import (
    ModelDir,
    ds_partition,
    ds_window,
    finished_model_dirs,
    finished_partitions,
    overlaps,
    parse_ds_range,
    partition_ds,
    pass_key,
    pass_key_format,
    pass_partition,
    split_ds,
    split_pass,
)


def test_ds_ranges_and_windows():
    assert parse_ds_range("2020-02-28:2020-03-01") == ["2020-02-28", "2020-02-29", "2020-03-01"]
    assert parse_ds_range("2020-02-28") == ["2020-02-28"]
    with pytest.raises(ConfigError, match="eval_ds='2020-03-01:2020-02-01': end before start"):
        parse_ds_range("2020-03-01:2020-02-01", "eval_ds")
    with pytest.raises(ConfigError, match="expected YYYY-MM-DD"):
        parse_ds_range("yesterday")
    assert ds_window("1997-09-23", 7) == "1997-09-17:1997-09-23"
    assert pass_partition("/raw", "1997-09-23", "07").as_posix() == "/raw/ds=1997-09-23/hh=07"
    with pytest.raises(ValueError, match="HH"):
        pass_partition("/raw", "1997-09-23", "24")


def test_only_finished_partitions_and_model_dirs_are_taken(tmp_path):
    for ds, done in (("1997-09-20", True), ("1997-09-21", False), ("1997-09-22", True)):
        ds_partition(tmp_path, ds).mkdir()
        if done:
            ModelDir(ds_partition(tmp_path, ds)).success.touch()
    days = parse_ds_range("1997-09-19:1997-09-22")
    assert [p.name for p in finished_partitions(tmp_path, days)] == ["ds=1997-09-20", "ds=1997-09-22"]
    assert finished_partitions(tmp_path / "nowhere", days) == []
    assert [p.name for p in finished_model_dirs(tmp_path)] == ["ds=1997-09-20", "ds=1997-09-22"]
    assert [p.name for p in finished_model_dirs(tmp_path, before="1997-09-22")] == ["ds=1997-09-20"]


def test_atomic_writes_leave_the_old_file_or_directory_when_the_writer_fails(tmp_path):
    target = atomic.write_text(tmp_path / "a" / "result.json", "old")
    assert target.read_text() == "old"
    atomic.write_text(target, "new")
    assert target.read_text() == "new"
    final = tmp_path / "ds=1997-09-22"
    with atomic.directory(final) as tmp:
        (tmp / "part-0").write_text("1")
    with pytest.raises(RuntimeError), atomic.directory(final) as tmp:
        (tmp / "part-0").write_text("2")
        raise RuntimeError("the writer died")
    assert (final / "part-0").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "ds=1997-09-22"]  # no temporary left
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["result.json"]


def test_a_ds_may_name_a_pass_an_hour_of_a_day():
    assert parse_ds_range("1997-09-20/22:1997-09-21/01") == [
        "1997-09-20/22",
        "1997-09-20/23",
        "1997-09-21/00",
        "1997-09-21/01",
    ]
    assert parse_ds_range("1997-09-20/05") == ["1997-09-20/05"]
    assert len(parse_ds_range("1997-09-20/00:1997-09-26/23")) == 7 * 24
    with pytest.raises(ConfigError, match="train_ds='1997-09-20/05:1997-09-21': give both ends"):
        parse_ds_range("1997-09-20/05:1997-09-21", "train_ds")
    with pytest.raises(ConfigError, match="00..23"):
        parse_ds_range("1997-09-20/24")
    with pytest.raises(ConfigError, match="end before start"):
        parse_ds_range("1997-09-20/05:1997-09-20/04")
    part = ds_partition("/f", "1997-09-20/05")
    assert part.as_posix() == "/f/ds=1997-09-20/hh=05"
    assert partition_ds(part) == "1997-09-20/05" and partition_ds("/f/ds=1997-09-20") == "1997-09-20"
    assert overlaps("1997-09-20/05", "1997-09-20") and not overlaps("1997-09-20/05", "1997-09-20/06")


def test_passes_shorter_than_an_hour_are_named_by_their_start():
    assert [pass_key(5, m, 15) for m in (0, 15, 30, 45)] == ["0500", "0515", "0530", "0545"]
    assert pass_key(5, 0, 60) == "05" and pass_key_format(15) == "%H%M" and pass_key_format() == "%H"
    for bad in ((5, 10, 15), (5, 0, 7), (24, 0, 60)):
        with pytest.raises(ValueError):
            pass_key(*bad)
    assert split_pass("1997-09-20/0515") == ("1997-09-20", 315) and split_ds("1997-09-20/0515")[1] == 5
    with pytest.raises(ValueError, match="multiple of 5"):
        split_pass("1997-09-20/0517")
    # a range of short passes: every start, at the passes' length (default every 5 minutes)
    got = parse_ds_range("1997-09-20/2330:1997-09-21/0015", pass_minutes=15)
    assert got == ["1997-09-20/2330", "1997-09-20/2345", "1997-09-21/0000", "1997-09-21/0015"]
    assert len(parse_ds_range("1997-09-20/0000:1997-09-20/2355")) == 288
    with pytest.raises(ConfigError, match="give both ends"):
        parse_ds_range("1997-09-20/05:1997-09-20/0515")
    with pytest.raises(ConfigError, match="no passes of 15 minutes"):
        parse_ds_range("1997-09-20/0505:1997-09-20/0530", pass_minutes=15)
    part = ds_partition("/f", "1997-09-20/0515")
    assert part.as_posix() == "/f/ds=1997-09-20/hh=0515" and partition_ds(part) == "1997-09-20/0515"
    # keys of one length sort as their starts; a short pass lies in its hour and its day
    assert sorted(["1997-09-20/1000", "1997-09-20/0945", "1997-09-20/0930"])[0] == "1997-09-20/0930"
    assert overlaps("1997-09-20/0515", "1997-09-20/05") and overlaps("1997-09-20/0515", "1997-09-20")
    assert not overlaps("1997-09-20/0515", "1997-09-20/0520")
