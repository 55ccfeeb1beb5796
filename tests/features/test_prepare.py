"""The Spark feature job on real MovieLens days (real Spark, real files)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from features.jvm import session_conf
from features.prepare import BadRowsError, prepare_day
from features.schema import RawInputError
from tests.support import ROOT, run_ok

DAYS = ["1997-09-22", "1997-09-23", "1997-09-24"]


def _rows(config, ds) -> int:
    return pacsv.read_csv(Path(config.raw_input_path) / f"ds={ds}" / "part-00000.csv").num_rows


def _output(config, ds):
    return pq.read_table(Path(config.train_input_path) / f"ds={ds}")


def _parts(config, ds):
    return sorted(p.name for p in (Path(config.train_input_path) / f"ds={ds}").iterdir())


def test_days_conserve_rows_and_write_markers(spark, movielens_config):
    for ds in DAYS:
        stats = prepare_day(spark, movielens_config, ds)
        out_dir = Path(movielens_config.train_input_path) / f"ds={ds}"
        assert (out_dir / "_SUCCESS").exists()
        assert stats["rows"] + stats["rows_quarantined"] == _rows(movielens_config, ds)
        assert stats["rows_quarantined"] == 0 and _output(movielens_config, ds).num_rows == stats["rows"]
        assert json.loads((out_dir / "_stats.json").read_text()) == stats
        assert 0.3 < stats["positive_rate"] < 0.8
    table = _output(movielens_config, DAYS[0])
    assert table.schema.field("genres").type.value_type == "string"
    assert table.column_names == [
        "label",
        "rating",
        "user_id",
        "item_id",
        "gender",
        "occupation",
        "zip_code",
        "genres",
        "age",
        "release_year",
        "_holdout",  # data_config.holdout_percent: 20
    ]
    holdout = pq.read_table(Path(movielens_config.train_input_path), columns=["_holdout"])["_holdout"]
    assert 0.15 < pc.mean(holdout.cast("int8")).as_py() < 0.25
    # a pyarrow reader of the root sees exactly the finished days, with ds as a partition column
    dataset = pads.dataset(movielens_config.train_input_path, partitioning="hive")
    assert dataset.count_rows() == sum(_rows(movielens_config, d) for d in DAYS)


def test_dense_features_follow_the_window_statistics(spark, movielens_config, movielens_raw):
    # DAYS[0]'s moments then come from its _stats.json, the earlier days' from raw data
    prepare_day(spark, movielens_config, DAYS[0])
    prepare_day(spark, movielens_config, DAYS[1])
    out_dir = Path(movielens_config.train_input_path) / f"ds={DAYS[1]}"
    norm = json.loads((out_dir / "_normalization.json").read_text())
    assert norm["window"][-1] == DAYS[1] and norm["window"][0] == "1997-09-20"
    events = [
        pacsv.read_csv(
            movielens_raw / "events" / f"ds={d}" / "part-00000.csv",
            convert_options=pacsv.ConvertOptions(column_types={"user_id": "string"}),
        )
        for d in norm["window"]
    ]
    users = pacsv.read_csv(
        movielens_raw / "dims/users.csv",
        convert_options=pacsv.ConvertOptions(column_types={"user_id": "string"}),
    )
    age_of = dict(zip(users["user_id"].to_pylist(), users["age"].to_pylist(), strict=True))
    ages = np.array([age_of[u] for t in events for u in t["user_id"].to_pylist()], dtype=float)
    assert norm["features"]["age"]["mean"] == pytest.approx(ages.mean())
    assert norm["features"]["age"]["std"] == pytest.approx(ages.std())
    out = _output(movielens_config, DAYS[1])
    day_ages = np.array([age_of[u] for u in out["user_id"].to_pylist()])
    expected = (day_ages - ages.mean()) / ages.std()
    np.testing.assert_allclose(out["age"].to_numpy(), expected, rtol=1e-5, atol=1e-5)
    years = out["release_year"].to_numpy()
    assert years.min() >= 0.0 and years.max() <= 1.0


def test_rerun_is_idempotent_and_ids_are_stable(spark, movielens_config):
    prepare_day(spark, movielens_config, DAYS[0])
    first = _output(movielens_config, DAYS[0]).sort_by([("user_id", "ascending"), ("item_id", "ascending")])
    prepare_day(spark, movielens_config, DAYS[0])
    second = _output(movielens_config, DAYS[0]).sort_by([("user_id", "ascending"), ("item_id", "ascending")])
    assert first.equals(second)
    assert sum(p.endswith(".parquet") for p in _parts(movielens_config, DAYS[0])) >= 1
    assert not [p for p in Path(movielens_config.train_input_path).iterdir() if p.name.startswith(".")]


def test_a_partition_the_job_did_not_write_is_refused_and_left_as_it_was(spark, movielens_config):
    """A ``ds=`` partition holding someone else's files (no marker, no stats of this raw
    partition) is refused before any work, its files untouched; the job's own earlier output,
    with its marker (``recpipe.outputs``), is replaced by a re-run."""
    from recpipe.outputs import MARKER, OutputNotOwnedError

    theirs = Path(movielens_config.train_input_path) / f"ds={DAYS[1]}"
    theirs.mkdir(parents=True, exist_ok=True)
    (theirs / "part-0.parquet").write_bytes(b"another team's rows")
    with pytest.raises(OutputNotOwnedError, match="did not write"):
        prepare_day(spark, movielens_config, DAYS[1])
    assert sorted(p.name for p in theirs.iterdir()) == ["part-0.parquet"]
    assert (theirs / "part-0.parquet").read_bytes() == b"another team's rows"
    ours = Path(movielens_config.train_input_path) / f"ds={DAYS[0]}"
    for _ in range(2):
        prepare_day(spark, movielens_config, DAYS[0])
        marker = json.loads((ours / MARKER).read_text())
        assert marker["command"] == "features" and marker["inputs"][0].endswith(f"ds={DAYS[0]}")


def test_spark_ids_equal_tensorflow_ids_on_raw_values(spark, movielens_config):
    import tensorflow as tf

    from trainer.hashing import clean_ids, hash_ids, split_tags

    prepare_day(spark, movielens_config, DAYS[0])
    out = _output(movielens_config, DAYS[0])
    raw = pacsv.read_csv(
        Path(movielens_config.raw_input_path) / f"ds={DAYS[0]}" / "part-00000.csv",
        convert_options=pacsv.ConvertOptions(column_types={"user_id": "string", "item_id": "string"}),
    )
    # the Spark job keeps the raw row order within its single input file
    for name in ("user_id", "item_id"):
        spark_side = hash_ids(tf.constant(out[name].to_pylist()), 20000).numpy()
        padded = [f"  {v}\t" for v in raw[name].to_pylist()]  # serving may see untrimmed values
        serving_side = hash_ids(clean_ids(tf.constant(padded)), 20000).numpy()
        np.testing.assert_array_equal(spark_side, serving_side)
        assert len(set(spark_side)) > 1
    as_int = hash_ids(clean_ids(tf.constant(raw["user_id"].to_numpy().astype(np.int64))), 20000).numpy()
    np.testing.assert_array_equal(as_int, hash_ids(tf.constant(out["user_id"].to_pylist()), 20000).numpy())
    tags = split_tags(tf.constant([" Action  Comedy ", "", "Drama"]), " ")
    assert tags.to_list() == [[b"Action", b"Comedy"], [], [b"Drama"]]
    assert out["genres"].to_pylist()[0] and all(
        t == t.strip() and t for row in out["genres"].to_pylist() for t in row
    )


def test_ids_are_farmhash_fingerprint64_modulo_the_bucket_count():
    import tensorflow as tf

    from trainer.hashing import FULL_ID_SPACE, hash_ids

    values = tf.constant(["a", "196", "", "05db9164"])
    fingerprints = [int(v) for v in tf.bitcast(tf.fingerprint(values), tf.uint64).numpy()]
    full = hash_ids(values).numpy()
    assert full.dtype == np.int64 and len(set(full)) == 4
    assert full.tolist() == [f % FULL_ID_SPACE for f in fingerprints]
    assert hash_ids(values, 1000).numpy().tolist() == [f % 1000 for f in fingerprints]


def _append(path: Path, lines: list[str]) -> None:
    with open(path, "a") as f:
        f.writelines(line + "\n" for line in lines)


def test_few_bad_rows_are_quarantined_and_counted(spark, movielens_config):
    ds = DAYS[2]
    part = Path(movielens_config.raw_input_path) / f"ds={ds}" / "part-00000.csv"
    n = _rows(movielens_config, ds)
    clean = prepare_day(spark, movielens_config, ds)
    clean_features = _output(movielens_config, ds)
    # a bad row whose dense values (user 1's age, item 2's year) parse: they must not count
    _append(part, ['"1","2",oops,874724710,1'])
    stats = prepare_day(spark, movielens_config, ds)
    assert stats["dense_moments"] == clean["dense_moments"] and stats["nulls"] == clean["nulls"]
    features = _output(movielens_config, ds)
    for column in ("age", "release_year"):  # normalised with the good rows' statistics only
        assert features.column(column).equals(clean_features.column(column))
    assert stats["rows_in"] == n + 1 and stats["rows"] + stats["rows_quarantined"] == n + 1
    assert stats["rows_quarantined"] == 1
    assert stats["quarantine_reasons"] == {"rating: cannot parse 'oops' as DOUBLE": 1}
    rows = [
        json.loads(line)
        for f in (Path(movielens_config.effective_quarantine_path) / f"ds={ds}").glob("*.json")
        for line in f.read_text().splitlines()
    ]
    assert (
        len(rows) == 1 and rows[0]["rating"] == "oops" and rows[0]["_source_file"].endswith("part-00000.csv")
    )


def test_corrupted_file_fails_clearly_and_writes_no_partition(spark, movielens_config):
    ds = DAYS[1]
    part = Path(movielens_config.raw_input_path) / f"ds={ds}" / "part-00000.csv"
    _append(part, ['"1","2",4,not-a-time,1', '"1","2",4', '"3","4",5,874724710,1,extra'] * 5)
    with pytest.raises(BadRowsError) as err:
        prepare_day(spark, movielens_config, ds)
    text = str(err.value)
    assert (
        f"ds={ds}: 15 of" in text
        and "part-00000.csv: 15 rows" in text
        and "max_bad_row_fraction=1.0%" in text
    )
    assert "timestamp: cannot parse 'not-a-time' as INT64" in text
    assert not (Path(movielens_config.train_input_path) / f"ds={ds}").exists()
    reasons = {
        json.loads(line)["_reason"]
        for f in (Path(movielens_config.effective_quarantine_path) / f"ds={ds}").glob("*.json")
        for line in f.read_text().splitlines()
    }
    assert reasons == {
        "timestamp: cannot parse 'not-a-time' as INT64",
        "label: missing label",
        "more columns than data_config.input_fields",
    }


def test_binary_garbage_and_missing_partitions_fail_clearly(spark, movielens_config):
    raw = Path(movielens_config.raw_input_path)
    (raw / f"ds={DAYS[0]}" / "part-00000.csv").write_bytes(bytes(range(256)) * 8)
    with pytest.raises(RawInputError, match=rf"cannot read raw file .*ds={DAYS[0]}/part-00000.csv"):
        prepare_day(spark, movielens_config, DAYS[0])
    with pytest.raises(RawInputError, match=r"raw partition not found: .*ds=2001-01-01"):
        prepare_day(spark, movielens_config, "2001-01-01")
    (raw / f"ds={DAYS[1]}" / "part-00000.csv").write_text("user,item\n1,2\n")
    with pytest.raises(RawInputError, match=r"header \['user', 'item'\] does not match"):
        prepare_day(spark, movielens_config, DAYS[1])
    assert not Path(movielens_config.train_input_path).exists() or not any(
        Path(movielens_config.train_input_path).iterdir()
    )


@pytest.mark.parametrize("name, sample", [("criteo", "criteo_sample.txt"), ("avazu", "avazu_sample.txt")])
def test_criteo_and_avazu_formats(spark, tmp_path, name, sample):
    from recpipe.config import load_pipeline_config

    src = ROOT.parent / "shared/data/format-samples" / sample
    if not src.exists():
        pytest.fail(f"{src} is missing: the shared format samples sit beside the checkout")
    day = tmp_path / "raw" / "ds=2024-01-01"
    day.mkdir(parents=True)
    shutil.copy(src, day / "part-00000.csv")
    config = load_pipeline_config(
        ROOT / f"conf/{name}_deepfm.yaml",
        {"raw_input_path": str(tmp_path / "raw"), "train_input_path": str(tmp_path / "features")},
    )
    stats = prepare_day(spark, config, "2024-01-01")
    n = pacsv.read_csv(src).num_rows
    assert stats["rows"] == n and stats["rows_quarantined"] == 0
    out = pq.read_table(tmp_path / "features" / "ds=2024-01-01")
    assert out.num_rows == n
    if name == "criteo":
        assert stats["nulls"]["I1"] > 0 and not out["I1"].null_count  # missing filled
        assert out["C1"].to_pylist()[0] == "05db9164"


@pytest.mark.slow
def test_spark_submit_runs_the_job(movielens_config, tmp_path):
    import yaml

    config_path = tmp_path / "pipeline.yaml"
    config_path.write_text(yaml.safe_dump(movielens_config.to_dict()))
    spark_submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = run_ok(
        [
            str(spark_submit),
            "--master",
            "local[1]",
            *[arg for key, value in session_conf().items() for arg in ("--conf", f"{key}={value}")],
            str(ROOT / "features/prepare.py"),
            "--pipeline_config_path",
            str(config_path),
            "--ds",
            f"{DAYS[0]}:{DAYS[1]}",  # a range: one job for both days (features.backfill)
            "--data_config.max_bad_row_fraction=0.5",
        ],
        env,
    )
    assert session_conf() == {} or "JVM functions are not loaded" not in done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(p["ds"], p["rows"]) for p in printed] == [(d, _rows(movielens_config, d)) for d in DAYS[:2]]
    for ds in DAYS[:2]:
        assert (Path(movielens_config.train_input_path) / f"ds={ds}" / "_SUCCESS").exists()


def test_recpipe_features_exit_codes():
    """2 for a bad flag or day (before Spark starts), 1 for a pipeline error (no raw partition)."""
    base = [
        sys.executable,
        "-m",
        "cli",
        "features",
        "--pipeline_config_path",
        "conf/movielens_deepfm.yaml",
    ]
    bad_day = subprocess.run(
        [*base, "--ds", "1997-13-01"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert (
        bad_day.returncode == 2
        and "--ds='1997-13-01': '1997-13-01' is not a date YYYY-MM-DD (month" in bad_day.stderr
    )
    missing = subprocess.run(
        [*base, "--ds", "1990-01-01", "--raw_input_path=/nowhere"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert missing.returncode == 1 and "RawInputError" in missing.stderr and "/nowhere" in missing.stderr


def _criteo(tmp_path, name: str, edits: dict, text: str, suffix: str):
    """A one-day raw tree holding ``text`` and the Criteo config pointed at it."""
    from recpipe.config import load_pipeline_config

    day = tmp_path / name / "raw" / "ds=2024-01-01"
    day.mkdir(parents=True)
    (day / f"part-00000.{suffix}").write_text(text)
    return load_pipeline_config(
        ROOT / "conf/criteo_deepfm.yaml",
        {"raw_input_path": str(day.parent), "train_input_path": str(tmp_path / name / "features"), **edits},
    )


def test_headerless_tab_separated_logs_match_the_csv_by_position(spark, tmp_path):
    """Real Criteo logs are headerless TSV: ``with_header: false`` matches the columns to
    ``input_fields`` by position, and a row with a column too many is quarantined."""
    src = (ROOT.parent / "shared/data/format-samples/criteo_sample.txt").read_text().splitlines()
    csv = _criteo(tmp_path, "csv", {}, "\n".join(src) + "\n", "csv")
    rows = [line.replace(",", "\t") for line in src[1:]]
    extra = rows[0] + "\tsurplus"
    tsv = _criteo(
        tmp_path,
        "tsv",
        {"data_config.with_header": False, "data_config.separator": "\t"},
        "\n".join([*rows, extra]) + "\n",
        "txt",
    )
    want, got = prepare_day(spark, csv, "2024-01-01"), prepare_day(spark, tsv, "2024-01-01")
    assert got["rows"] == want["rows"] == len(rows) and got["rows_quarantined"] == 1
    assert got["quarantine_reasons"] == {"more columns than data_config.input_fields": 1}
    assert got["dense_moments"] == want["dense_moments"] and got["nulls"] == want["nulls"]
    a, b = (pq.read_table(Path(c.train_input_path) / "ds=2024-01-01") for c in (csv, tsv))
    assert a.equals(b)
    # with a header expected, the same file is refused, naming its first line
    with_header = tsv.data_config.model_copy(update={"with_header": True})
    with pytest.raises(
        RawInputError, match=r"part-00000.txt: header \['0', '', '3', .*set data_config.with_header: false"
    ):
        prepare_day(spark, tsv.model_copy(update={"data_config": with_header}), "2024-01-01")


def test_parquet_days_read_columns_by_name_check_types_and_quarantine(spark, movielens_config, tmp_path):
    import pyarrow as pa

    from recpipe.config.data import InputType

    ds = "1997-09-20"  # the first day: no earlier days in either window of dense statistics
    csv_day = Path(movielens_config.raw_input_path) / f"ds={ds}"
    types = {InputType.STRING: pa.string(), InputType.INT32: pa.int32(), InputType.INT64: pa.int64()}
    types[InputType.DOUBLE] = pa.float64()
    columns = {f.input_name: types[f.input_type] for f in movielens_config.data_config.input_fields}
    table = pacsv.read_csv(
        csv_day / "part-00000.csv", convert_options=pacsv.ConvertOptions(column_types=columns)
    )
    raw = tmp_path / "pq" / "events"
    shutil.copytree(Path(movielens_config.raw_input_path).parent / "dims", raw.parent / "dims")
    day = raw / f"ds={ds}"
    day.mkdir(parents=True)
    # columns in another order, plus one the config does not declare: matched by name
    pq.write_table(
        table.select(list(reversed(table.column_names))).append_column("extra", table["label"]),
        day / "a.parquet",
    )
    config = movielens_config.model_copy(
        update={
            "raw_input_path": str(raw),
            "train_input_path": str(tmp_path / "pq" / "features"),
            "data_config": movielens_config.data_config.model_copy(update={"input_format": "parquet"}),
        }
    )
    want, got = prepare_day(spark, movielens_config, ds), prepare_day(spark, config, ds)
    assert got["rows"] == want["rows"] == table.num_rows and got["rows_quarantined"] == 0
    assert got["dense_moments"] == want["dense_moments"]
    assert _output(config, ds).equals(_output(movielens_config, ds))

    # a string column is parsed like text: a value that is no INT64 is quarantined
    bad = table.slice(0, 1).set_column(3, "timestamp", pa.array(["soon"]))
    pq.write_table(bad, day / "b.parquet")
    stats = prepare_day(
        spark,
        config.model_copy(
            update={"data_config": config.data_config.model_copy(update={"max_bad_row_fraction": 0.5})}
        ),
        ds,
    )
    assert stats["quarantine_reasons"] == {"timestamp: cannot parse 'soon' as INT64": 1}
    (kept,) = [
        json.loads(line)
        for f in (tmp_path / "pq" / "features_quarantine" / f"ds={ds}").glob("*.json")
        for line in f.read_text().splitlines()
    ]
    assert kept["timestamp"] == "soon" and kept["_source_file"].endswith("b.parquet")
    # a column of a type the field cannot take, or a missing column, names the file
    pq.write_table(table.set_column(4, "label", table["label"].cast(pa.float64())), day / "b.parquet")
    with pytest.raises(
        RawInputError, match=r"b.parquet: column 'label' is double in the file, .* declares INT32"
    ):
        prepare_day(spark, config, ds)
    pq.write_table(table.drop(["rating"]), day / "b.parquet")
    with pytest.raises(
        RawInputError, match=r"b.parquet: columns \['rating'\] of data_config.input_fields are missing"
    ):
        prepare_day(spark, config, ds)


def test_passes_are_prepared_hour_by_hour_with_the_days_earlier_hours_in_the_window(ml_passes):
    from recpipe.layout import parse_ds_range
    from tests.conftest import PASSES

    root = Path(ml_passes.train_input_path)
    raw = Path(ml_passes.raw_input_path)
    passes = parse_ds_range(PASSES)
    for ds in passes:
        day, hh = ds.split("/")
        out = root / f"ds={day}" / f"hh={hh}"
        assert (out / "_SUCCESS").exists()
        stats = json.loads((out / "_stats.json").read_text())
        rows = pacsv.read_csv(raw / f"ds={day}" / f"hh={hh}" / "part-00000.csv").num_rows
        assert stats["ds"] == ds and stats["rows"] == rows == pq.read_table(out).num_rows
    # 15:00 had no rating: a finished, empty pass, not an error
    assert json.loads((root / "ds=1997-09-20/hh=15/_stats.json").read_text())["rows"] == 0
    # the window of a pass: the day's passes prepared before it (no earlier day has features)
    norm = json.loads((root / "ds=1997-09-20/hh=22/_normalization.json").read_text())
    assert norm["window"] == passes
    counts = sum(
        json.loads((root / f"ds=1997-09-20/hh={h}/_stats.json").read_text())["rows"] for h in range(15, 23)
    )
    assert norm["statistics"]["age"]["count"] == counts
    # a pyarrow reader of a day sees its passes, hh as a partition column
    assert pads.dataset(root / "ds=1997-09-20", partitioning="hive").count_rows() == counts


def test_the_command_line_takes_passes_as_ds_slash_hh_or_with_hh(ml_passes, tmp_path):
    from features.prepare import _with_hours
    from recpipe.config import ConfigError

    assert _with_hours(["1997-09-20", "1997-09-21"], "22:23") == [
        "1997-09-20/22",
        "1997-09-20/23",
        "1997-09-21/22",
        "1997-09-21/23",
    ]
    # said of what was typed, in words
    with pytest.raises(ConfigError, match=r"^--hh 00:25: '25' is neither an hour HH \(00 to 23\)"):
        _with_hours(["1997-09-20"], "00:25")
    with pytest.raises(ConfigError, match=r"^--hh 0915:0900 with --ds 1997-09-20: end before start$"):
        _with_hours(["1997-09-20"], "0915:0900")
    with pytest.raises(ConfigError, match="give the hour once"):
        _with_hours(["1997-09-20/05"], "05")


def test_input_fields_default_val_fills_blank_values(spark, tmp_path):
    """EasyRec's ``input_fields.default_val``: a blank count reads as its default (no null,
    so no window-mean fill), a blank category as its default id, a blank label as its
    default instead of quarantining the row."""
    src = (ROOT.parent / "shared/data/format-samples/criteo_sample.txt").read_text().splitlines()
    blank_label = "," + src[1].split(",", 1)[1]  # the first row without its label
    plain = _criteo(tmp_path, "plain", {}, "\n".join(src) + "\n", "csv")
    fields = [f.model_dump() for f in plain.data_config.input_fields]
    for f in fields:
        f["default_val"] = {"label": "0", "I1": "0", "C20": "missing"}.get(f["input_name"])
    text = "\n".join([*src, blank_label]) + "\n"
    filled = _criteo(tmp_path, "filled", {"data_config.input_fields": fields}, text, "csv")
    want, got = prepare_day(spark, plain, "2024-01-01"), prepare_day(spark, filled, "2024-01-01")
    assert want["nulls"]["C20"] > 0 and got["nulls"].get("C20", 0) == 0
    assert got["rows"] == want["rows"] + 1 and got["rows_quarantined"] == 0
    out = pq.read_table(Path(filled.train_input_path) / "ds=2024-01-01").to_pandas()
    at = src[0].split(",").index("C20")
    raw_c20 = [line.split(",")[at] for line in [*src[1:], blank_label]]
    assert (out["C20"] == "missing").sum() == raw_c20.count("") > 0
    assert out["label"].tolist().count(0) == [line[0] for line in src[1:]].count("0") + 1
    with pytest.raises(ValueError, match="default_val: .x. is not a INT32 value"):
        from recpipe.config.data import InputField

        InputField(input_name="I1", input_type="INT32", default_val="x")
