"""A range of days prepared in one Spark job (a backfill): the same partitions, side files and
figures as ``features.prepare.prepare_day`` run day after day, for the cost of about one day.

A day at a time, every day pays Spark's planning and code generation of its own queries
(about 1.7 s on 2 cores for a MovieLens day of ~500 rows, whatever its size); a range reads
every day's raw files at once, takes each day's figures in one grouped aggregation, works out
each day's normalisation window on the driver (the dense moments merge by addition), and
writes every day's features in one write partitioned by day. Each day is then published as
``prepare_day`` publishes it: a temporary directory with its Parquet files, ``_stats.json``
and ``_normalization.json``, renamed over ``ds=YYYY-MM-DD`` with ``_SUCCESS`` last.

Behaviour histories (``data_config.behavior_sequence``) are computed over the range at once
(``features.sequence.add_range_histories``): a row's history is the state before the range,
then the user's events ordered by day and time, as carrying the state from day to day gives;
each day's state is published after its features, as ``prepare_day`` publishes it.

The range job takes the clean case only; ``features.prepare.prepare_days`` prepares the range
day by day instead, by ``prepare_day``'s rules, when a day is a pass (``D/HH``) or a day of
the range holds pass states of histories, or the aggregation finds a day with rows to
quarantine or with no rows (its errors and quarantine are ``prepare_day``'s).
``tests/features/test_backfill.py`` compares both ways file by file.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from features import figures
from features.schema import BAD, SOURCE, check_header, data_files
from features.sequence import ROW, add_range_histories, sequence_length_columns, state_root
from features.steps import (
    check_partition_output,
    feature_rows,
    partition_output,
    quarantine,
    read_raw,
    window_moments,
    window_normalization,
)
from recpipe import atomic
from recpipe.config.data import FeatureType
from recpipe.config.pipeline import PipelineConfig
from recpipe.layout import SUCCESS, FeaturePartition, ds_partition

log = logging.getLogger(__name__)
DAY = "ds"  # partitionBy names each directory ds=<day>, as the layout does


def prepare_range(spark: SparkSession, config: PipelineConfig, days: list[str]) -> list[dict] | None:
    """Prepare ``days`` (``YYYY-MM-DD``, in order) in one Spark job and return each day's
    stats, as ``prepare_day`` run day after day would; None, with nothing written, when the
    range is not for one job (see the module docstring): the caller prepares it day by day
    (``features.prepare.prepare_days``).

    Raises:
        RawInputError: a day's raw partition is missing or unreadable (nothing is written).
    """
    days = list(days)
    dc = config.data_config
    seq = dc.behavior_sequence
    if len(days) < 2 or any("/" in d for d in days):
        return None
    if seq is not None and any(
        any(ds_partition(state_root(config.train_input_path), d).glob("hh=*")) for d in days
    ):
        return None  # a day's pass states order before its own: day by day, as prepare_day orders them
    files = {d: data_files(ds_partition(config.raw_input_path, d)) for d in days}
    for d in days:
        check_partition_output(config, d)
    if dc.input_format != "parquet" and dc.with_header:
        for path in (p for day in days for p in files[day]):
            check_header(path, dc.input_fields, dc.separator)
    rows = read_raw(spark, config, [p for d in days for p in files[d]])
    # the day of each row, from its file's partition directory
    rows = rows.withColumn(DAY, F.regexp_extract(F.col(SOURCE), r"ds=(\d{4}-\d{2}-\d{2})/[^/]*$", 1))
    # a history column is never null (an empty list at least): counted as none, not computed
    counting = rows.select("*", *[F.array().alias(c) for c in seq.columns]) if seq is not None else rows
    counted = {
        r[DAY]: r.asDict()
        for r in counting.groupBy(DAY).agg(*figures.day_metrics(config, moments=True)).collect()
    }
    unclean = [d for d in days if not counted.get(d, {}).get("__total") or counted[d]["__bad"]]
    if unclean:
        log.info("%s: quarantined or missing rows; the range is prepared day by day", unclean[0])
        return None

    features = config.feature_config.features
    moments = {d: figures.moments_from_row(counted[d], features) for d in days}
    plans = _plans(spark, config, days, moments)

    staging = Path(config.train_input_path) / f"_backfill-{uuid.uuid4().hex[:8]}"  # readers skip _
    states, sequence = None, dict.fromkeys(days)
    if seq is not None:
        good = ~F.col(BAD)  # a clean range: every row is good
        if seq.positive_only:
            good = good & (F.col(dc.label_fields[0]) > 0)
        types = dc.all_fields(sequences=False)
        rows, states, source = add_range_histories(
            spark, rows, seq, types, config.train_input_path, days, good, DAY
        )
        sequence = {d: {"state_from": source if i == 0 else days[i - 1]} for i, d in enumerate(days)}
    try:
        params = _day_params(spark, config, plans)
        by_day = rows.join(F.broadcast(params), on=DAY, how="inner")
        keep = (DAY,) if states is None else (DAY, ROW)
        written = feature_rows(by_day, config, _day_columns(plans[days[0]], features), keep=keep)
        if states is not None:  # each day's rows in their logged order (the histories' joins shuffled them)
            written = written.orderBy(DAY, ROW).drop(ROW)
        written.write.partitionBy(DAY).mode("overwrite").parquet(str(staging))
        if states is not None:
            states.write.partitionBy(DAY).mode("overwrite").parquet(str(staging / STATES))
            _sequence_figures(spark, config, staging, sequence)
        out = []
        for d in days:
            out.append(_publish(config, d, staging, counted[d], moments[d], plans[d], files[d], sequence[d]))
            if states is not None:  # after its features, as prepare_day publishes a state
                _publish_state(spark, config, d, staging / STATES, states.schema)
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _plans(spark: SparkSession, config: PipelineConfig, days: list[str], moments: dict) -> dict:
    """Per day, its normalization document as ``prepare_day`` writes it (window, statistics,
    features), each day's window over the range's earlier days' ``moments``."""
    plans = {}
    for d in days:
        window, earlier = window_moments(spark, config, d, known={k: moments[k] for k in days if k < d})
        dense_stats, normalization = window_normalization(config, earlier, moments[d])
        plans[d] = {"window": [*window, d], "statistics": dense_stats, "features": normalization}
    return plans


def _day_columns(plan: dict, features) -> dict:
    """The raw features' normalization with each parameter a column of the day's row (the
    broadcast ``_day_params``), the methods as in ``plan`` (the same every day)."""
    return {
        f.name: {
            "method": plan["features"][f.name]["method"],
            **{k: F.col(_param(f.name, k)) for k in plan["features"][f.name] if k != "method"},
        }
        for f in features
        if f.feature_type == FeatureType.RawFeature
    }


STATES = "_states"  # under the staging folder: the range's states, partitioned by day


def _sequence_figures(spark: SparkSession, config: PipelineConfig, staging: Path, sequence: dict) -> None:
    """Add each day's ``users`` (its state's rows) and history lengths (as
    ``features.sequence.sequence_length_columns`` takes them) to ``sequence`` (day -> figures)."""
    users = spark.read.parquet(str(staging / STATES)).groupBy(DAY).count().collect()
    for r in users:
        sequence[str(r[DAY])]["users"] = r["count"]  # the partition value read back as a date
    for d in sequence:
        sequence[d].setdefault("users", 0)
    aggs = sequence_length_columns(config)
    if aggs:
        for r in spark.read.parquet(str(staging)).groupBy(DAY).agg(*aggs).collect():
            sequence[str(r[DAY])].update({k: v for k, v in r.asDict().items() if k != DAY})


def _publish_state(spark: SparkSession, config: PipelineConfig, ds: str, staged: Path, schema) -> None:
    """Move day ``ds``'s state from ``staged`` to ``_sequence_state/ds=<ds>``, ``_SUCCESS`` last
    (a day whose state is empty gets an empty Parquet file, as ``prepare_day`` writes it)."""
    with atomic.directory(ds_partition(state_root(config.train_input_path), ds)) as tmp:
        part = staged / f"{DAY}={ds}"
        if part.is_dir():
            for f in part.iterdir():
                f.rename(tmp / f.name)
        else:
            fields = [f for f in schema.fields if f.name != DAY]
            spark.createDataFrame([], T.StructType(fields)).write.mode("overwrite").parquet(str(tmp))
        (tmp / SUCCESS).touch()


def _param(feature: str, key: str) -> str:
    return f"__norm__{feature}__{key}"


def _day_params(spark: SparkSession, config: PipelineConfig, plans: dict[str, dict]):
    """One row a day: each RawFeature's normalisation constants (``fill``, ``mean``, ...) as
    double columns, joined to the rows so that one expression normalises every day."""
    names = [
        (f.name, k)
        for f in config.feature_config.features
        if f.feature_type == FeatureType.RawFeature
        for k in next(iter(plans.values()))["features"][f.name]
        if k != "method"
    ]
    schema = T.StructType(
        [T.StructField(DAY, T.StringType())] + [T.StructField(_param(f, k), T.DoubleType()) for f, k in names]
    )
    data = [(d, *(float(plan["features"][f][k]) for f, k in names)) for d, plan in plans.items()]
    return spark.createDataFrame(data, schema)


def _publish(
    config: PipelineConfig,
    ds: str,
    staging: Path,
    counted: dict,
    moments: dict,
    plan: dict,
    files: list[Path],
    sequence: dict | None = None,
) -> dict:
    """Move day ``ds``'s written files from ``staging`` into its partition with its side
    files, as ``prepare_day`` publishes a day; its stats."""
    total = counted["__total"]
    stats = {
        "ds": ds,
        "rows_in": total,
        "rows": total,
        "rows_quarantined": 0,
        "quarantine_reasons": {},
        "positive_rate": counted["__positive_rate"],
        "nulls": figures.day_nulls(counted, config, moments, total),
        "dense_moments": moments,
        "normalization_window": plan["window"],
        "raw_files": [str(p) for p in files],
    }
    if sequence is not None:
        stats["sequence"] = sequence
    quarantine(None, 0, Path(config.effective_quarantine_path), ds)  # a re-run leaves no old rows
    final = ds_partition(config.train_input_path, ds)
    with partition_output(config, ds) as tmp:
        for part in (staging / f"{DAY}={ds}").iterdir():
            part.rename(tmp / part.name)
        written = FeaturePartition(tmp)
        written.stats.write_text(json.dumps(stats, indent=2, sort_keys=True))
        written.normalization.write_text(json.dumps(plan, indent=2, sort_keys=True))
        written.success.touch()  # last: the partition is complete
    log.info("ds=%s: %d rows -> %s (range job)", ds, total, final)
    return stats
