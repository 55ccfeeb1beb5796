"""recpipe's JVM functions for the feature job (Java sources in ``features/jvm/src``).

``scripts/build_jvm.sh`` (run by ``make setup``) compiles them against the venv's Spark into
``build/jvm/recpipe-spark.jar``; a session started with ``session_conf()`` registers them as SQL
functions (``spark.sql.extensions=recpipe.spark.Extensions``). Without the jar (no ``javac``),
or in a session started without it, each function here falls back to Spark's own expression:
the same values, slower.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from recpipe.ids import WHITESPACE_CHARS

if TYPE_CHECKING:  # pyspark is imported where a column is built: DAG files import session_conf
    from pyspark.sql import Column, SparkSession

log = logging.getLogger(__name__)

JAR = Path(__file__).resolve().parents[1] / "build" / "jvm" / "recpipe-spark.jar"
EXTENSIONS = "recpipe.spark.Extensions"
TRIM_WHITESPACE = "recpipe_trim_whitespace"
DAY_FIGURES = "recpipe_day_figures"

_registered: dict[int, bool] = {}


def session_conf() -> dict[str, str]:
    """Spark settings that load the jar and register its functions ({} when it is not built).
    They must be set before the driver's JVM starts (``spark-submit --jars`` / ``--conf``)."""
    if not JAR.is_file():
        return {}
    return {"spark.jars": str(JAR), "spark.sql.extensions": EXTENSIONS}


def registered(spark: SparkSession | None = None) -> bool:
    """Whether ``spark`` (default: the active session) has recpipe's functions."""
    from pyspark.sql import SparkSession

    spark = spark or SparkSession.getActiveSession()
    if spark is None:
        return False
    key = id(spark._jsparkSession)
    if key not in _registered:
        _registered[key] = bool(spark.catalog.functionExists(TRIM_WHITESPACE))
        if not _registered[key]:
            how = " ".join(f"--conf {k}={v}" for k, v in session_conf().items()) or "scripts/build_jvm.sh"
            log.warning("recpipe's JVM functions are not loaded, Spark's own are used (slower): %s", how)
    return _registered[key]


@contextmanager
def spark_expressions(spark: SparkSession) -> Iterator[None]:
    """Within it, the functions here build Spark's own expressions in ``spark`` even where
    recpipe's are registered: the reference they are compared with (tests, benchmarks)."""
    key = id(spark._jsparkSession)
    registered(spark)
    saved, _registered[key] = _registered[key], False
    try:
        yield
    finally:
        _registered[key] = saved


def trim_whitespace(col: Column) -> Column:
    """``col`` (string) without ``recpipe.ids.WHITESPACE_CHARS`` at either end; null stays null.

    The same values as ``F.btrim(col, WHITESPACE_CHARS)``, which copies every value it
    examines (Spark 4.3): ``recpipe.spark.Ids.trimWhitespace`` returns a value with no such
    character at either end as it is, and is compiled into the stage as a static call.
    """
    from pyspark.sql import functions as F

    if registered():
        return F.call_function(TRIM_WHITESPACE, col)
    return F.btrim(col, F.lit(WHITESPACE_CHARS))


def day_figures(bad: Column, label: Column, null_counted: list[Column], dense: list[Column]) -> Column:
    """One aggregate of a day's figures (``recpipe.spark.DayFigures``), a struct of
    ``3 + len(null_counted) + 5 * len(dense)`` fields: rows (long), bad rows (long, null over
    no rows), mean label of the good rows (double), per ``null_counted`` column its nulls among
    the good rows (long), per ``dense`` column the good rows' count (long), sum, sum of
    squares, min and max (double) of its values cast to double.

    The same values as Spark's ``count`` / ``sum`` / ``avg`` / ``min`` / ``max`` of those
    (``features.prepare._day_metrics``) at one update a row instead of one per aggregate;
    only where ``registered()``.
    """
    from pyspark.sql import functions as F

    return F.call_function(DAY_FIGURES, F.lit(len(null_counted)), bad, label, *null_counted, *dense)
