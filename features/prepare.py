"""Spark feature preparation of one day: raw logs -> feature Parquet, stats, quarantine.

Run it as ``recpipe features --pipeline_config_path conf/X.yaml --ds YYYY-MM-DD`` or
``spark-submit features/prepare.py --pipeline_config_path conf/X.yaml --ds YYYY-MM-DD``.

Output, replaced whole on a re-run (temporary directory, then rename)::

    <train_input_path>/ds=YYYY-MM-DD/part-*.parquet  labels + one column per feature
                                     _stats.json         rows, positive rate, nulls, quarantine
                                     _normalization.json dense fill / normaliser constants
                                     _SUCCESS            written last
    <quarantine_path>/ds=YYYY-MM-DD/part-*.json        rejected raw rows with _reason
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
from datetime import date, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from features.schema import (
    REASON,
    SOURCE,
    RawInputError,
    check_header,
    data_files,
    parse,
    quarantined,
    read_dimension,
    read_strings,
)
from features.transform import (
    feature_columns,
    merge_moments,
    moment_aggs,
    moments_from_row,
    normalization_params,
)
from recpipe import atomic
from recpipe.config.args import add_config_args, config_from_args
from recpipe.config.data import FeatureType
from recpipe.config.pipeline import PipelineConfig
from recpipe.errors import PipelineError, run_command
from recpipe.ids import HOLDOUT
from recpipe.layout import FeaturePartition, ds_partition, is_finished, parse_ds_range

log = logging.getLogger(__name__)


class BadRowsError(PipelineError):
    """Too many raw rows fail the schema; the message names the files and counts."""


def _read_day(spark: SparkSession, config: PipelineConfig, ds: str) -> tuple[DataFrame, list[Path]]:
    """Parsed rows of day ``ds`` (see ``features.schema.parse``) with the dimension columns joined."""
    dc = config.data_config
    files = data_files(ds_partition(config.raw_input_path, ds))
    for path in files:
        check_header(path, dc.input_fields, dc.separator)
    rows = parse(read_strings(spark, files, dc.input_fields, dc.separator), dc.input_fields, dc.label_fields)
    for table in dc.dimension_tables:
        path = Path(table.path)
        if not path.is_absolute():
            path = Path(config.raw_input_path) / path
        dim = read_dimension(spark, path, table.input_fields, table.separator).dropDuplicates([table.key])
        extra = [f.input_name for f in table.input_fields if f.input_name not in rows.columns]
        rows = rows.join(F.broadcast(dim.select(table.key, *extra)), on=table.key, how="left")
    return rows, files


def _window_moments(spark: SparkSession, config: PipelineConfig, ds: str) -> tuple[list[str], list[dict]]:
    """Per-day dense moments of the window's earlier days: from their ``_stats.json`` when the
    day was prepared, else from their raw data (one pass each)."""
    window = config.feature_config.normalization_window_days
    day = date.fromisoformat(ds)
    days, moments = [], []
    features = config.feature_config.features
    needed = {f.name for f in features if f.feature_type == FeatureType.RawFeature}
    if not needed:
        return [], []
    for k in range(window - 1, 0, -1):
        d = (day - timedelta(days=k)).isoformat()
        stats_file = FeaturePartition.of(config.train_input_path, d).stats
        if stats_file.exists():
            stored = json.loads(stats_file.read_text()).get("dense_moments", {})
            if set(stored) >= needed:
                days.append(d)
                moments.append(stored)
                continue
        if not is_finished(ds_partition(config.raw_input_path, d)):
            continue
        rows, _ = _read_day(spark, config, d)
        row = rows.agg(*moment_aggs(features, F.col(REASON) == "")).collect()[0]
        days.append(d)
        moments.append(moments_from_row(row.asDict(), features))
    return days, moments


def _quarantine(bad: DataFrame, bad_count: int, root: Path, ds: str) -> None:
    final = ds_partition(root, ds)
    if bad_count == 0:
        shutil.rmtree(final, ignore_errors=True)
        return
    with atomic.directory(final) as tmp:
        bad.write.mode("overwrite").json(str(tmp / "rows"))
        for part in (tmp / "rows").iterdir():
            part.rename(tmp / part.name)
        (tmp / "rows").rmdir()


def _bad_row_message(bad: DataFrame, bad_count: int, total: int, ds: str, limit: float, where: Path) -> str:
    per_file = bad.groupBy(SOURCE).count().orderBy(F.desc("count")).collect()
    reasons = bad.groupBy(REASON).count().orderBy(F.desc("count")).limit(3).collect()
    files = ", ".join(f"{r[SOURCE]}: {r['count']} rows" for r in per_file)
    why = "; ".join(f"{r[REASON]} ({r['count']})" for r in reasons)
    return (
        f"ds={ds}: {bad_count} of {total} raw rows ({bad_count / max(total, 1):.1%}) fail the schema, "
        f"over data_config.max_bad_row_fraction={limit:.1%}. Files: {files}. Top reasons: {why}. "
        f"Rows kept in {where}"
    )


def _day_aggregates(rows: DataFrame, config: PipelineConfig) -> dict:
    """One pass over the day: row counts, positive rate, nulls and dense moments of good rows."""
    dc, fc = config.data_config, config.feature_config
    good = F.col(REASON) == ""
    columns = dict.fromkeys(f.input_names[0] for f in fc.features)
    row = (
        rows.agg(
            F.count(F.lit(1)).alias("__total"),
            F.sum((~good).cast("long")).alias("__bad"),
            F.mean(F.when(good, F.col(dc.label_fields[0]).cast("double"))).alias("__positive_rate"),
            *[F.sum((good & F.col(c).isNull()).cast("long")).alias(f"__null__{c}") for c in columns],
            *moment_aggs(fc.features, good),
        )
        .collect()[0]
        .asDict()
    )
    return {
        "total": row["__total"],
        "bad": row["__bad"] or 0,
        "positive_rate": row["__positive_rate"],
        "nulls": {c: row[f"__null__{c}"] or 0 for c in columns},
        "dense_moments": moments_from_row(row, fc.features),
    }


def prepare_day(spark: SparkSession, config: PipelineConfig, ds: str) -> dict:
    """Prepare the features of day ``ds`` and return its stats (also in ``_stats.json``).

    The raw data are read twice: one aggregate pass (counts, nulls, dense moments) and the
    write. Dense statistics of the window's earlier days come from their stored moments.

    Raises:
        RawInputError: the raw partition or a dimension table is missing or unreadable.
        BadRowsError: the share of quarantined rows exceeds ``max_bad_row_fraction``.
        In both cases no output partition is written for ``ds``.
    """
    dc, fc = config.data_config, config.feature_config
    date.fromisoformat(ds)  # a malformed ds fails before any work
    rows, files = _read_day(spark, config, ds)
    try:
        day = _day_aggregates(rows, config)
    except Exception as err:  # a damaged file surfaces as a Java exception here
        raise RawInputError(
            f"cannot read raw partition {files[0].parent}: {str(err).splitlines()[0]}"
        ) from err
    total, bad_count = day["total"], day["bad"]
    bad = quarantined(rows, dc.input_fields)
    quarantine_root = Path(config.effective_quarantine_path)
    _quarantine(bad, bad_count, quarantine_root, ds)
    if total == 0:
        raise RawInputError(f"raw partition {files[0].parent} holds no rows")
    if bad_count / total > dc.max_bad_row_fraction:
        where = ds_partition(quarantine_root, ds)
        raise BadRowsError(_bad_row_message(bad, bad_count, total, ds, dc.max_bad_row_fraction, where))

    window, earlier = _window_moments(spark, config, ds)
    window.append(ds)
    dense_stats = merge_moments([*earlier, day["dense_moments"]]) if day["dense_moments"] else {}
    normalization = {name: normalization_params(fc.feature(name), s) for name, s in dense_stats.items()}
    reasons = {}
    if bad_count:
        reasons = {r[REASON]: r["count"] for r in bad.groupBy(REASON).count().collect()}
    stats = {
        "ds": ds,
        "rows_in": total,
        "rows": total - bad_count,
        "rows_quarantined": bad_count,
        "quarantine_reasons": reasons,
        "positive_rate": day["positive_rate"],
        "nulls": day["nulls"],
        "dense_moments": day["dense_moments"],
        "normalization_window": window,
        "raw_files": [str(p) for p in files],
    }

    columns = [*[F.col(c) for c in dc.label_fields], *feature_columns(fc, dc.all_fields(), normalization)]
    if dc.holdout_percent:
        # a function of the raw row, so a re-run of the day holds out the same rows
        raw = F.xxhash64(*[F.col(f.input_name) for f in dc.input_fields])
        columns.append((F.pmod(raw, F.lit(100)) < dc.holdout_percent).alias(HOLDOUT))
    out = rows.filter(F.col(REASON) == "").select(*columns)
    final = ds_partition(config.train_input_path, ds)
    with atomic.directory(final) as tmp:
        out.write.mode("overwrite").parquet(str(tmp))
        written = FeaturePartition(tmp)
        written.stats.write_text(json.dumps(stats, indent=2, sort_keys=True))
        norm_doc = {"window": window, "statistics": dense_stats, "features": normalization}
        written.normalization.write_text(json.dumps(norm_doc, indent=2, sort_keys=True))
        written.success.touch()  # last: the partition is complete
    log.info("ds=%s: %d rows -> %s (%d quarantined)", ds, stats["rows"], final, bad_count)
    return stats


def main(argv: list[str] | None = None) -> int:
    """``spark-submit features/prepare.py`` / ``recpipe features``: prepare one or more days.

    Relative paths of the config resolve against ``$RECPIPE_HOME`` (the DAG's spark-submit
    runs elsewhere). Exit codes: ``recpipe.errors``.
    """
    parser = argparse.ArgumentParser(prog="recpipe features", description="Spark feature preparation")
    add_config_args(parser)
    parser.add_argument("--ds", action="append", required=True, help="YYYY-MM-DD or START:END (repeatable)")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    args, extra = parser.parse_known_args(argv)

    def run() -> int:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("py4j").setLevel(logging.WARNING)
        days = [d for text in args.ds for d in parse_ds_range(text, "--ds")]  # bad dates fail first
        home = Path(os.environ.get("RECPIPE_HOME") or Path.cwd())
        config = config_from_args(args, extra).resolved(home)
        from features.session import get_spark

        spark = get_spark(master=args.master)
        for ds in days:
            stats = prepare_day(spark, config, ds)
            print(json.dumps({k: stats[k] for k in ("ds", "rows", "rows_quarantined", "positive_rate")}))
        return 0

    return run_command(run, "recpipe features")


if __name__ == "__main__":
    raise SystemExit(main())
