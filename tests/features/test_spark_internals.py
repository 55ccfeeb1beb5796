"""The fence around Spark's internal API (features/spark_internals.py), and the day's figures
when a task of the write fails once and is retried."""

from __future__ import annotations

import re
from contextlib import nullcontext
from pathlib import Path

import pytest

from features import jvm, spark_internals
from features.figures import dense_moments, gathering
from features.prepare import _write_features
from features.steps import read_day, window_normalization
from tests.support import ROOT

SOURCES = ROOT / "features" / "jvm" / "src"
# Spark's public API: not fenced
PUBLIC = ("org.apache.spark.sql.types.",)


def test_spark_still_has_every_internal_the_jvm_functions_use(spark):
    import pyspark

    gone = spark_internals.missing(spark.sparkContext._jvm)
    assert not gone, (
        f"Spark {pyspark.__version__} (recpipe checked {spark_internals.SPARK_VERSION}) no longer has "
        f"{gone}, which recpipe's JVM functions (features/jvm/src) use: update them and "
        "features/spark_internals.py. Until then the feature job uses Spark's own expressions "
        "(the same values, slower)."
    )


def test_every_spark_class_the_java_sources_import_is_listed():
    imported = set()
    for source in SOURCES.rglob("*.java"):
        imported |= set(re.findall(r"^import (org\.apache\.spark\.[\w.]+);", source.read_text(), re.M))
    unlisted = {c for c in imported if not c.startswith(PUBLIC)} - set(spark_internals.INTERNAL_API)
    assert imported and not unlisted, f"list these in features/spark_internals.py: {sorted(unlisted)}"


def test_a_changed_internal_is_named_and_the_job_falls_back(spark, monkeypatch):
    monkeypatch.setitem(
        spark_internals.INTERNAL_API,
        "org.apache.spark.util.AccumulatorContext",
        ("get", "removedInSomeRelease"),
    )
    monkeypatch.setitem(spark_internals.INTERNAL_API, "org.apache.spark.sql.catalyst.Gone", ())
    gone = spark_internals.missing(spark.sparkContext._jvm)
    assert gone == [
        "org.apache.spark.util.AccumulatorContext.removedInSomeRelease",
        "org.apache.spark.sql.catalyst.Gone",
    ]
    if jvm.session_conf():  # the jar is loaded: a session that lacks an internal does not use it
        monkeypatch.setattr(jvm, "_registered", {})
        assert jvm.registered(spark) is False


def _fail_once(marker: Path):
    """A pass-through of a column's value whose first attempt of partition 0 fails."""

    def passthrough(value):
        from pyspark import TaskContext

        task = TaskContext.get()
        if task.partitionId() == 0 and task.attemptNumber() == 0:
            marker.touch()
            raise RuntimeError("recpipe test: this task fails once")
        return value

    return passthrough


@pytest.mark.parametrize("gatherer", ["tap", "observed"])
def test_a_task_that_fails_once_counts_its_rows_once(spark, movielens_config, tmp_path, gatherer):
    from pyspark.sql import functions as F

    if gatherer == "tap" and not jvm.registered(spark):
        pytest.skip("no jar: the job observes its figures with Spark's metrics")
    assert spark.sparkContext.master == "local[2,2]"  # a failed task gets a second attempt
    config, ds = movielens_config, "1997-09-22"
    label = config.data_config.label_fields[0]

    def figures(rows, out):  # as features.prepare.prepare_day gathers them
        with jvm.spark_expressions(spark) if gatherer == "observed" else nullcontext():
            _, normalization = window_normalization(config, [], dense_moments(rows, config))
            tapped, read = gathering(rows, config, moments=False)
            _write_features(tapped, config, out, normalization)
            return read()

    rows, _ = read_day(spark, config, ds)
    clean = figures(rows, tmp_path / "clean")
    marker = tmp_path / "failed-once"
    failing = F.udf(_fail_once(marker), rows.schema[label].dataType)(F.col(label))
    retried = figures(rows.withColumn(label, failing), tmp_path / "retried")
    assert marker.exists(), "no task failed: the test proves nothing"
    assert clean["__total"] > 100 and retried == clean
