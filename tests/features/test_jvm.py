"""recpipe's JVM functions (features/jvm) against Spark's own expressions, on real Spark."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from features import jvm
from features.prepare import prepare_day
from tests.support import ROOT

DS = "2024-01-01"
SAMPLE = ROOT.parent / "shared/data/format-samples/criteo_sample.txt"


@pytest.fixture(scope="module")
def registered(spark):
    if not jvm.JAR.is_file() and shutil.which("javac") is None:
        pytest.skip("no javac: scripts/build_jvm.sh built no jar, the job uses Spark's expressions")
    assert jvm.registered(spark), f"{jvm.JAR} is built but the session has no {jvm.TRIM_WHITESPACE}"
    return spark


def _edge_day(path: Path) -> None:
    """The Criteo sample plus rows with whitespace around ids, odd dense values and a bad row."""
    with SAMPLE.open() as f:
        rows = list(csv.reader(f))
    header, first = rows[0], rows[1]
    ids = [i for i, name in enumerate(header) if name.startswith("C")]
    dense = [i for i, name in enumerate(header) if name.startswith("I")]
    edges = [" a ", "\tb", "c\f", "\x0bd\x0b", "\u00a0e\u00a0", " ", "", "f g", " \t\f", "日本 "]
    values = ["nan", "-0", "inf", "-inf", " 5 ", "", "1e308", "-7", "0.5", "3"]
    for k in range(len(edges)):
        row = list(first)
        for j, i in enumerate(ids):
            row[i] = edges[(k + j) % len(edges)]
        for j, i in enumerate(dense):
            row[i] = values[(k + j) % len(values)]
        rows.append(row)
    bad = list(first)
    bad[dense[0]] = "oops"  # quarantined: its other values must not count
    rows.append(bad)
    path.mkdir(parents=True)
    with (path / "part-00000.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)


@pytest.mark.parametrize("name", ["criteo", "movielens"])
def test_the_job_writes_the_same_features_and_stats_as_with_spark_s_expressions(
    registered, tmp_path, name, movielens_raw
):
    from recpipe.config import load_pipeline_config

    if name == "criteo":  # figures observed by the write; ids with whitespace at either end
        raw, ds = tmp_path / "raw", DS
        _edge_day(raw / f"ds={ds}")
    else:  # a first pass for the moments, tags trimmed inside Spark's transform()
        raw, ds = movielens_raw / "events", "1997-09-22"
    outputs = {}
    for variant in ("jvm", "spark"):
        out = tmp_path / variant
        config = load_pipeline_config(
            ROOT / f"conf/{name}_deepfm.yaml",
            {
                "raw_input_path": str(raw),
                "train_input_path": str(out / "features"),
                "model_dir": str(out / "m"),
            },
        )
        if variant == "jvm":
            stats = prepare_day(registered, config, ds)
        else:
            with jvm.spark_expressions(registered):
                stats = prepare_day(registered, config, ds)
        table = pq.read_table(out / "features" / f"ds={ds}")
        outputs[variant] = (
            stats,
            table.sort_by([(c, "ascending") for c in table.column_names if c != "genres"]),
        )
    (stats, table), (ref_stats, ref_table) = outputs["jvm"], outputs["spark"]
    assert json.dumps(stats, sort_keys=True) == json.dumps(ref_stats, sort_keys=True)  # NaN, -0.0 too
    for column in table.column_names:  # repr: NaN equals NaN
        assert repr(table[column].to_pylist()) == repr(ref_table[column].to_pylist()), column
    if name == "criteo":
        assert stats["rows_quarantined"] == 1 and stats["nulls"]["C1"] >= 1
        ids = set(table["C1"].to_pylist())
        assert {"a", "b", "c", "\x0bd\x0b", "\u00a0e\u00a0", "", "f g", "日本"} <= ids


@pytest.mark.parametrize("codegen", [True, False])
def test_the_tap_s_figures_equal_spark_s_aggregates_on_edge_values(registered, codegen):
    from pyspark.sql import functions as F

    nan = float("nan")
    rows = [
        (False, 1, "a", None, 1.0, 3),
        (False, 0, None, "b", -0.0, None),
        (True, 1, None, None, 100.0, 7),  # bad: counted in total and bad only
        (False, None, "x", "y", nan, -2),
        (None, 1, None, None, 5.0, 1),  # neither bad nor good
        (False, 1, "q", None, None, 4),
    ]
    df = registered.createDataFrame(
        rows * 50, "bad boolean, label int, c1 string, c2 string, x double, y long"
    )
    df = df.repartition(3)  # each task's figures merged on the driver
    good = ~F.col("bad")
    spark_aggs = [
        F.count(F.lit(1)),
        F.sum(F.col("bad").cast("long")),
        F.mean(F.when(good, F.col("label").cast("double"))),
        *[F.sum((good & F.col(c).isNull()).cast("long")) for c in ("c1", "c2")],
    ]
    for c in ("x", "y"):
        x = F.when(good, F.col(c).cast("double"))
        spark_aggs += [F.count(x), F.sum(x), F.sum(x * x), F.min(x), F.max(x)]
    conf = {"spark.sql.codegen.wholeStage": str(codegen).lower()}
    conf["spark.sql.codegen.factoryMode"] = "FALLBACK" if codegen else "NO_CODEGEN"
    saved = {k: registered.conf.get(k) for k in conf}
    for k, v in conf.items():
        registered.conf.set(k, v)
    whole = []
    try:
        for part in (df, df.limit(0), df.filter("bad")):
            expected = list(part.agg(*spark_aggs).collect()[0])
            tap = jvm.DayFiguresTap(registered, 2, 2)
            bad = tap.column(
                F.col("bad"), F.col("label"), [F.col("c1"), F.col("c2")], [F.col("x"), F.col("y")]
            )
            kept = part.select(bad.alias("bad")).filter("bad is null or not bad").count()
            assert kept == part.filter("bad is null or not bad").count()  # the flag as it was
            assert repr(tap.figures()) == repr(expected)  # NaN and -0.0 as Spark gives them
            whole.append(tap.figures())
    finally:
        for k, v in saved.items():
            registered.conf.set(k, v)
    assert repr(whole[0][:3]) == "[300, 50, 0.6666666666666666]"


def test_the_criteo_write_is_one_compiled_stage(registered, tmp_path):
    # parse, figures, quarantine filter and features in one piece of generated code that
    # HotSpot compiles (no row copied between them): what keeps the job near a bare conversion
    from features.figures import gathering
    from features.steps import feature_rows, read_day, window_normalization
    from recpipe.config import load_pipeline_config

    raw = tmp_path / "raw"
    _edge_day(raw / f"ds={DS}")
    config = load_pipeline_config(
        ROOT / "conf/criteo_deepfm.yaml",
        {"raw_input_path": str(raw), "train_input_path": str(tmp_path / "f")},
    )
    rows, _ = read_day(registered, config, DS)
    tapped, figures = gathering(rows, config, moments=True)
    frame = feature_rows(tapped, config, window_normalization(config, [], {})[1])
    plan = frame._jdf.queryExecution().executedPlan()
    debug = registered.sparkContext._jvm.org.apache.spark.sql.execution.debug.package
    seq = debug.codegenStringSeq(plan)  # a Scala Seq of (stage, code, byte-code stats)
    stages = [seq.apply(i) for i in range(seq.size())]
    limit = int(registered.conf.get("spark.sql.codegen.hugeMethodLimit"))
    assert len(stages) == 1, plan.toString()
    assert stages[0]._3().maxMethodCodeSize() <= limit <= 8000
    assert "CollectMetrics" not in plan.toString()
    assert frame.count() == figures()["__total"] - 1 == len(SAMPLE.read_text().splitlines()) - 1 + 10


def test_trim_whitespace_equals_btrim(registered):
    from pyspark.sql import functions as F

    from recpipe.ids import WHITESPACE_CHARS

    values = [
        None,
        "",
        " ",
        "a",
        " a ",
        "\ta\n",
        "\r\fa b\f",
        "\u00a0a\u00a0",
        "\x0b",
        "日本 ",
        " \t\r\n\f",
        "ab",
    ]
    df = registered.createDataFrame([(v,) for v in values], "x string")
    got = df.select(
        jvm.trim_whitespace(F.col("x")).alias("a"), F.btrim("x", F.lit(WHITESPACE_CHARS)).alias("b")
    )
    rows = got.collect()
    assert [r.a for r in rows] == [r.b for r in rows]
    assert [r.a for r in rows][:6] == [None, "", "", "a", "a", "a"]


def test_a_local_session_sets_file_permissions_as_hadoop_does_without_a_chmod_process(registered, tmp_path):
    """``file://`` in a local session is the jar's ``LocalFileSystem``: a written table's files
    and folders get Hadoop's modes (0644 and 0755 under its umask 022), and a permission set
    through it lands, the sticky bit included (through Hadoop's own ``chmod``)."""
    spark = registered
    hadoop = spark.sparkContext._jvm.org.apache.hadoop
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    fs = hadoop.fs.Path(f"file://{tmp_path}").getFileSystem(conf)
    assert fs.getClass().getName() == jvm.LOCAL_FILE_SYSTEM
    table = spark.range(10).selectExpr("id", "id % 2 as part")
    table.write.partitionBy("part").parquet(str(tmp_path / "out"))
    written = list((tmp_path / "out").rglob("*"))
    assert {oct(p.stat().st_mode & 0o7777) for p in written if p.is_file()} == {"0o644"}
    assert {oct(p.stat().st_mode & 0o7777) for p in written if p.is_dir()} == {"0o755"}
    for mode in ("600", "750", "644", "1777"):
        target = tmp_path / f"f{mode}"
        target.write_text("x")
        fs.setPermission(hadoop.fs.Path(f"file://{target}"), hadoop.fs.permission.FsPermission(mode))
        assert target.stat().st_mode & 0o7777 == int(mode, 8), mode
