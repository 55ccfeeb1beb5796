"""The day's figures: what the feature job counts of a day as it writes it (rows, bad rows, the
good rows' positive rate, nulls per input column, each dense feature's moments), their names
and order, and the two ways a stage gathers them: recpipe's JVM tap
(``features.jvm.DayFiguresTap`` over ``DayFigures.java``, the fast path) and Spark's observed
aggregates (``day_metrics``, the exact fallback; ``tests/features/test_jvm.py`` compares the
two). The dense moments merge across days by addition (``merge_moments``), so a window's
statistics never need the window's raw data again. How retried tasks affect them:
``features.spark_internals``.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from features import jvm
from features.schema import BAD
from recpipe.config.data import FeatureSpec, FeatureType
from recpipe.config.pipeline import PipelineConfig

MOMENTS = ("count", "sum", "sumsq", "min", "max")


def moment_aggs(features: list[FeatureSpec], keep: Column | None = None) -> list[Column]:
    """Aggregations of each RawFeature input's count, sum, sum of squares, min and max.

    Columns are named ``<feature>__<moment>``; rows where ``keep`` is false are ignored.
    These moments merge across days by addition (and min / max), so a window's statistics
    never need the window's raw data again.
    """
    aggs = []
    for f in features:
        if f.feature_type != FeatureType.RawFeature:
            continue
        x = F.col(f.input_names[0]).cast(T.DoubleType())
        if keep is not None:
            x = F.when(keep, x)
        aggs += [
            F.count(x).alias(f"{f.name}__count"),
            F.sum(x).alias(f"{f.name}__sum"),
            F.sum(x * x).alias(f"{f.name}__sumsq"),
            F.min(x).alias(f"{f.name}__min"),
            F.max(x).alias(f"{f.name}__max"),
        ]
    return aggs


def moments_from_row(row: dict, features: list[FeatureSpec]) -> dict[str, dict[str, float | None]]:
    """Pick the ``moment_aggs`` results of each RawFeature out of a collected row."""
    return {
        f.name: {m: row[f"{f.name}__{m}"] for m in MOMENTS}
        for f in features
        if f.feature_type == FeatureType.RawFeature
    }


def merge_moments(days: list[dict[str, dict[str, float | None]]]) -> dict[str, dict[str, float | None]]:
    """Window statistics (count, mean, population std, min, max) from per-day moments."""
    out: dict[str, dict[str, float | None]] = {}
    for name in days[0]:
        parts = [d[name] for d in days if d[name]["count"]]
        n = sum(p["count"] for p in parts)
        if not n:
            out[name] = {"count": 0, "mean": None, "std": None, "min": None, "max": None}
            continue
        mean = sum(p["sum"] for p in parts) / n
        var = max(sum(p["sumsq"] for p in parts) / n - mean * mean, 0.0)
        out[name] = {
            "count": n,
            "mean": mean,
            "std": var**0.5,
            "min": min(p["min"] for p in parts),
            "max": max(p["max"] for p in parts),
        }
    return out


def gathering(rows: DataFrame, config: PipelineConfig, moments: bool) -> tuple[DataFrame, Callable]:
    """(``rows`` gathering the day's figures as an action reads them, a function that returns
    the figures by name once the action is done; see ``figure_names``).

    Where recpipe's JVM functions are registered in this process's JVM, an expression in the
    stage gathers them (``features.jvm.DayFiguresTap``); else (a Spark Connect session
    included) Spark's observed metrics (``day_metrics``), which end the stage's generated code
    with a copy of every row."""
    if jvm.can_tap(rows.sparkSession):
        null_counted, raw = figure_inputs(config, moments)
        tap = jvm.DayFiguresTap(rows.sparkSession, len(null_counted), len(raw))
        label = F.col(config.data_config.label_fields[0])
        values = [F.col(f.input_names[0]) for f in raw]
        bad = tap.column(F.col(BAD), label, [F.col(c) for c in null_counted], values)
        names = figure_names(config, moments)
        return rows.withColumn(BAD, bad), lambda: dict(zip(names, tap.figures(), strict=True))
    observation = Observation("recpipe_day")
    return rows.observe(observation, *day_metrics(config, moments)), lambda: observation.get


def day_metrics(config: PipelineConfig, moments: bool) -> list[Column]:
    """The day's figures as aggregates: row counts, positive rate, nulls per input column and,
    with ``moments``, dense moments, of the good rows. A dense input's nulls are not counted
    apart: its moments' count gives them (the observed aggregates cost ~0.1 us each a row)."""
    dc = config.data_config
    good = ~F.col(BAD)
    null_counted, raw = figure_inputs(config, moments)
    return [
        F.count(F.lit(1)).alias("__total"),
        F.sum(F.col(BAD).cast("long")).alias("__bad"),
        F.mean(F.when(good, F.col(dc.label_fields[0]).cast("double"))).alias("__positive_rate"),
        *[F.sum((good & F.col(c).isNull()).cast("long")).alias(f"__null__{c}") for c in null_counted],
        *moment_aggs(raw, good),
    ]


def figure_inputs(config: PipelineConfig, moments: bool) -> tuple[list[str], list]:
    """(the input columns whose nulls are counted, the RawFeatures whose moments are taken:
    none without ``moments``), in the order of ``day_metrics``' figures."""
    dense = _dense_inputs(config)
    null_counted = [c for c in _input_columns(config) if c not in dense]
    raw = [f for f in config.feature_config.features if f.feature_type == FeatureType.RawFeature]
    return null_counted, raw if moments else []


def figure_names(config: PipelineConfig, moments: bool) -> list[str]:
    """The day's figures' names, in ``day_metrics``' (and ``features.jvm.DayFiguresTap``'s)
    order: ``__total``, ``__bad``, ``__positive_rate``, ``__null__<column>``,
    ``<feature>__<moment>``."""
    null_counted, raw = figure_inputs(config, moments)
    return [
        "__total",
        "__bad",
        "__positive_rate",
        *[f"__null__{c}" for c in null_counted],
        *[f"{f.name}__{m}" for f in raw for m in MOMENTS],
    ]


def _input_columns(config: PipelineConfig) -> list[str]:
    return list(dict.fromkeys(c for f in config.feature_config.features for c in f.input_names))


def _dense_inputs(config: PipelineConfig) -> dict[str, str]:
    """Input column -> the first RawFeature reading it (whose moments count its values)."""
    out: dict[str, str] = {}
    for f in config.feature_config.features:
        if f.feature_type == FeatureType.RawFeature:
            out.setdefault(f.input_names[0], f.name)
    return out


def day_nulls(row: dict, config: PipelineConfig, moments: dict, good: int) -> dict[str, int]:
    """Missing values per input column among the ``good`` rows: ``day_metrics``' collected
    counts, and for a dense input its good rows less its dense ``moments``' count."""
    dense = _dense_inputs(config)
    return {
        c: good - moments[dense[c]]["count"] if c in dense else row[f"__null__{c}"] or 0
        for c in _input_columns(config)
    }


def dense_moments(rows: DataFrame, config: PipelineConfig, keep: Column | None = None) -> dict:
    """The dense moments (``moment_aggs``) of ``rows`` where ``keep``, in one aggregation."""
    features = config.feature_config.features
    return moments_from_row(rows.agg(*moment_aggs(features, keep)).collect()[0].asDict(), features)
