"""A range of days prepared in one Spark job (a backfill): the same partitions, side files and
figures as ``features.prepare.prepare_day`` run day after day, for the cost of about one day.

A day at a time, every day pays Spark's planning and code generation of its own queries
(about 1.7 s on 2 cores for a MovieLens day of ~500 rows, whatever its size); a range reads
every day's raw files at once, takes each day's figures in one grouped aggregation, works out
each day's normalisation window on the driver (the dense moments merge by addition), and
writes every day's features in one write partitioned by day. Each day is then published as
``prepare_day`` publishes it: a temporary directory with its Parquet files, ``_stats.json``
and ``_normalization.json``, renamed over ``ds=YYYY-MM-DD`` with ``_SUCCESS`` last.

The range job takes the clean case only; ``features.prepare.prepare_days`` prepares the range
day by day instead, by ``prepare_day``'s rules, when a day is a pass (``D/HH``), the config
carries behaviour histories (each day's state depends on the day before), or the aggregation
finds a day with rows to quarantine or with no rows (its errors and quarantine are
``prepare_day``'s).
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
from features.schema import SOURCE, check_header, data_files
from features.steps import feature_rows, quarantine, read_raw, window_moments, window_normalization
from recpipe import atomic
from recpipe.config.data import FeatureType
from recpipe.config.pipeline import PipelineConfig
from recpipe.layout import FeaturePartition, ds_partition

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
    if len(days) < 2 or any("/" in d for d in days) or config.data_config.behavior_sequence is not None:
        return None
    dc = config.data_config
    files = {d: data_files(ds_partition(config.raw_input_path, d)) for d in days}
    if dc.input_format != "parquet" and dc.with_header:
        for path in (p for day in days for p in files[day]):
            check_header(path, dc.input_fields, dc.separator)
    rows = read_raw(spark, config, [p for d in days for p in files[d]])
    # the day of each row, from its file's partition directory
    rows = rows.withColumn(DAY, F.regexp_extract(F.col(SOURCE), r"ds=(\d{4}-\d{2}-\d{2})/[^/]*$", 1))
    counted = {
        r[DAY]: r.asDict()
        for r in rows.groupBy(DAY).agg(*figures.day_metrics(config, moments=True)).collect()
    }
    unclean = [d for d in days if not counted.get(d, {}).get("__total") or counted[d]["__bad"]]
    if unclean:
        log.info("%s: quarantined or missing rows; the range is prepared day by day", unclean[0])
        return None

    features = config.feature_config.features
    moments = {d: figures.moments_from_row(counted[d], features) for d in days}
    plans = {}
    for d in days:
        window, earlier = window_moments(spark, config, d, known={k: moments[k] for k in days if k < d})
        dense_stats, normalization = window_normalization(config, earlier, moments[d])
        plans[d] = {"window": [*window, d], "statistics": dense_stats, "features": normalization}

    staging = Path(config.train_input_path) / f"_backfill-{uuid.uuid4().hex[:8]}"  # readers skip _
    try:
        params = _day_params(spark, config, plans)
        by_day = rows.join(F.broadcast(params), on=DAY, how="inner")
        normalization = {
            f.name: {
                "method": plans[days[0]]["features"][f.name]["method"],
                **{k: F.col(_param(f.name, k)) for k in plans[days[0]]["features"][f.name] if k != "method"},
            }
            for f in features
            if f.feature_type == FeatureType.RawFeature
        }
        written = feature_rows(by_day, config, normalization, keep=(DAY,))
        written.write.partitionBy(DAY).mode("overwrite").parquet(str(staging))
        return [_publish(config, d, staging, counted[d], moments[d], plans[d], files[d]) for d in days]
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
    quarantine(None, 0, Path(config.effective_quarantine_path), ds)  # a re-run leaves no old rows
    final = ds_partition(config.train_input_path, ds)
    with atomic.directory(final) as tmp:
        for part in (staging / f"{DAY}={ds}").iterdir():
            part.rename(tmp / part.name)
        written = FeaturePartition(tmp)
        written.stats.write_text(json.dumps(stats, indent=2, sort_keys=True))
        written.normalization.write_text(json.dumps(plan, indent=2, sort_keys=True))
        written.success.touch()  # last: the partition is complete
    log.info("ds=%s: %d rows -> %s (range job)", ds, total, final)
    return stats
