"""recpipe's JVM functions for the feature job (Java sources in ``features/jvm/src``).

``scripts/build_jvm.sh`` (run by ``make setup``) compiles them against the venv's Spark into
``build/jvm/recpipe-spark.jar``; a session started with ``session_conf()`` registers them as SQL
functions (``spark.sql.extensions=recpipe.spark.Extensions``). Without the jar (no ``javac``),
or in a session started without it, each function here falls back to Spark's own expression:
the same values, slower.
"""

# Imports inside functions: pyspark is imported where a column is built: the DAG files import
# session_conf without it.

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from features.spark_internals import missing
from recpipe.ids import WHITESPACE_CHARS

if TYPE_CHECKING:  # pyspark is imported where a column is built: DAG files import session_conf
    from pyspark.sql import Column, SparkSession

log = logging.getLogger(__name__)

JAR = Path(__file__).resolve().parents[1] / "build" / "jvm" / "recpipe-spark.jar"
EXTENSIONS = "recpipe.spark.Extensions"
TRIM_WHITESPACE = "recpipe_trim_whitespace"
DAY_FIGURES_TAP = "recpipe_day_figures_tap"
SIGNED_LOG1P = "recpipe_signed_log1p"

_registered: dict[int, bool] = {}


LOCAL_FILE_SYSTEM = "recpipe.spark.LocalFileSystem"


def session_conf(local: bool = False) -> dict[str, str]:
    """Spark settings that load the jar and register its functions ({} when it is not built).
    They must be set before the driver's JVM starts (``spark-submit --jars`` / ``--conf``).

    ``local``: the master runs executors in the driver (``features.session.local_threads``);
    then ``file://`` is also the jar's ``LocalFileSystem``, which sets a written file's
    permissions without starting a ``chmod`` process for each (Hadoop's way without its native
    library). On a cluster the executors may lack the jar, so Hadoop's own stays."""
    if not JAR.is_file():
        return {}
    conf = {"spark.jars": str(JAR), "spark.sql.extensions": EXTENSIONS}
    if local:
        conf |= {"spark.driver.extraClassPath": str(JAR), "spark.hadoop.fs.file.impl": LOCAL_FILE_SYSTEM}
    return conf


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect (client) session: no SparkContext, no JVM here."""
    return not hasattr(spark, "_jsparkSession")


def _key(spark: SparkSession) -> int:
    # a classic session by its JVM session (PySpark may wrap it twice), a Connect one itself
    return id(getattr(spark, "_jsparkSession", spark))


def registered(spark: SparkSession | None = None) -> bool:
    """Whether ``spark`` (default: the active session) has recpipe's functions: the jar was
    loaded where the session's JVM runs (this process, spark-submit's driver, or a Spark
    Connect server started by ``features.connect_server``)."""
    from pyspark.sql import SparkSession

    spark = spark or SparkSession.getActiveSession()
    if spark is None:
        return False
    key = _key(spark)
    if key not in _registered:
        _registered[key] = bool(spark.catalog.functionExists(TRIM_WHITESPACE))
        if not _registered[key]:
            how = " ".join(f"--conf {k}={v}" for k, v in session_conf().items()) or "scripts/build_jvm.sh"
            log.warning("recpipe's JVM functions are not loaded, Spark's own are used (slower): %s", how)
        elif not is_connect(spark) and (gone := missing(spark.sparkContext._jvm)):
            _registered[key] = False
            log.warning(
                "Spark %s lacks internals recpipe's JVM functions use (features/spark_internals.py): %s; "
                "Spark's own expressions are used (the same values, slower)",
                spark.version,
                gone,
            )
    return _registered[key]


def can_tap(spark: SparkSession) -> bool:
    """Whether a ``DayFiguresTap`` can gather ``spark``'s figures: recpipe's functions are
    registered and the session's JVM is in this process (its accumulator is read through
    py4j; a Spark Connect client has no JVM, and takes Spark's observed metrics instead)."""
    return not is_connect(spark) and registered(spark)


@contextmanager
def spark_expressions(spark: SparkSession) -> Iterator[None]:
    """Within it, the functions here build Spark's own expressions in ``spark`` even where
    recpipe's are registered: the reference they are compared with (tests, benchmarks)."""
    key = _key(spark)
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


class DayFiguresTap:
    """A day's figures gathered as a stage reads the rows (``recpipe.spark.DayFiguresTap``),
    without a plan node of their own, so that the stage's parse, filter and features stay one
    piece of generated code (an observed metric ends it: every row is copied there). Only
    where ``registered()``.

    The figures (``figures()``, ``3 + n + 5 * m`` values for n null-counted and m dense
    columns): rows (int), bad rows (int, None over no rows), mean label of the good rows
    (float), per null-counted column its nulls among the good rows (int), per dense column the
    good rows' count (int), sum, sum of squares, min and max (float) of its values as doubles:
    the same values as Spark's ``count`` / ``sum`` / ``avg`` / ``min`` / ``max`` of those
    (``features.figures.day_metrics``), NaN and -0.0 included.

    Use: ``rows.withColumn("_bad", tap.column(...))`` on the frame an action reads once, then
    ``tap.figures()``. A tap belongs to one action: a second run of the frame adds its rows again.
    """

    def __init__(self, spark: SparkSession, null_columns: int, dense_columns: int):
        sc = spark.sparkContext
        self._accumulator = sc._jvm.recpipe.spark.DayFiguresAccumulator(null_columns, dense_columns)
        sc._jsc.sc().register(self._accumulator, "recpipe_day_figures")
        self._null_columns = null_columns

    def column(self, bad: Column, label: Column, null_counted: list[Column], dense: list[Column]) -> Column:
        """``bad`` (boolean) as it is; each row it is computed for adds to the figures.

        Raises:
            pyspark.errors.AnalysisException: the columns do not match the tap's counts.
        """
        from pyspark.sql import functions as F

        args = [F.lit(self._accumulator.id()), F.lit(self._null_columns), bad, label, *null_counted, *dense]
        return F.call_function(DAY_FIGURES_TAP, *args)

    def figures(self) -> list[int | float | None]:
        """The figures of the rows read so far, in the order the class docstring gives."""
        return list(self._accumulator.figures())


def signed_log1p(x: Column) -> Column:
    """The ``log`` normaliser of a filled dense value: ``signum(x) * log1p(abs(x))`` as float.

    ``recpipe.spark.Dense.signedLog1p`` computes it as Spark's expressions do (the same float for
    every double), in one static call: a stage's generated code stays under HotSpot's limit.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if registered():
        return F.call_function(SIGNED_LOG1P, x)
    return (F.signum(x) * F.log1p(F.abs(x))).cast(T.FloatType())
