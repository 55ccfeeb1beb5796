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

import json
import logging
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
    read_dimension,
    read_strings,
    typed_and_bad,
)
from features.transform import dense_statistics, feature_columns, normalization_params
from recpipe.config.data import FeatureType
from recpipe.config.pipeline import PipelineConfig
from recpipe.data.atomic import replace_dir, temp_dir_beside

log = logging.getLogger(__name__)


class BadRowsError(RuntimeError):
    """Too many raw rows fail the schema; the message names the files and counts."""


def _read_day(spark: SparkSession, config: PipelineConfig, ds: str) -> tuple[DataFrame, DataFrame, list[Path]]:
    dc = config.data_config
    files = data_files(Path(config.raw_input_path) / f"ds={ds}")
    for path in files:
        check_header(path, dc.input_fields, dc.separator)
    raw = read_strings(spark, files, dc.input_fields, dc.separator)
    good, bad = typed_and_bad(raw, dc.input_fields, dc.label_fields)
    for table in dc.dimension_tables:
        path = Path(table.path)
        if not path.is_absolute():
            path = Path(config.raw_input_path) / path
        dim = read_dimension(spark, path, table.input_fields, table.separator).dropDuplicates([table.key])
        extra = [f.input_name for f in table.input_fields if f.input_name not in good.columns or f.input_name == table.key]
        good = good.join(F.broadcast(dim.select(*extra)), on=table.key, how="left")
    return good, bad, files


def _window_days(config: PipelineConfig, ds: str) -> list[str]:
    window = config.feature_config.normalization_window_days
    day = date.fromisoformat(ds)
    days = [(day - timedelta(days=k)).isoformat() for k in range(window - 1, -1, -1)]
    root = Path(config.raw_input_path)
    return [d for d in days if d == ds or (root / f"ds={d}" / "_SUCCESS").exists()]


def _quarantine(bad: DataFrame, bad_count: int, root: Path, ds: str) -> None:
    final = root / f"ds={ds}"
    if bad_count == 0:
        shutil.rmtree(final, ignore_errors=True)
        return
    tmp = temp_dir_beside(final)
    bad.write.mode("overwrite").json(str(tmp / "rows"))
    for part in (tmp / "rows").iterdir():
        part.rename(tmp / part.name)
    (tmp / "rows").rmdir()
    replace_dir(tmp, final)


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


def prepare_day(spark: SparkSession, config: PipelineConfig, ds: str) -> dict:
    """Prepare the features of day ``ds`` and return its stats (also in ``_stats.json``).

    Raises:
        RawInputError: the raw partition or a dimension table is missing or unreadable.
        BadRowsError: the share of quarantined rows exceeds ``max_bad_row_fraction``.
        In both cases no output partition is written for ``ds``.
    """
    dc, fc = config.data_config, config.feature_config
    date.fromisoformat(ds)  # a malformed ds fails before any work
    good, bad, files = _read_day(spark, config, ds)
    good = good.cache()
    bad = bad.cache()
    try:
        rows_out, bad_count = good.count(), bad.count()
    except Exception as err:  # a damaged file surfaces as a Java exception here
        raise RawInputError(f"cannot read raw partition {files[0].parent}: {str(err).splitlines()[0]}") from err
    total = rows_out + bad_count
    quarantine_root = Path(config.effective_quarantine_path)
    _quarantine(bad, bad_count, quarantine_root, ds)
    if total == 0 or bad_count / total > dc.max_bad_row_fraction:
        if total == 0:
            raise RawInputError(f"raw partition {files[0].parent} holds no rows")
        raise BadRowsError(
            _bad_row_message(bad, bad_count, total, ds, dc.max_bad_row_fraction, quarantine_root / f"ds={ds}")
        )

    window = _window_days(config, ds)
    frames = [good] + [_read_day(spark, config, d)[0] for d in window if d != ds]
    window_df = frames[0]
    for frame in frames[1:]:
        window_df = window_df.unionByName(frame)
    dense_stats = dense_statistics(window_df, fc.features)
    normalization = {f.name: normalization_params(f, dense_stats[f.name]) for f in fc.features if f.feature_type == FeatureType.RawFeature}

    columns = [f.input_names[0] for f in fc.features]
    nulls_and_rate = good.agg(
        F.mean(F.col(dc.label_fields[0]).cast("double")).alias("__positive_rate"),
        *[F.sum(F.col(c).isNull().cast("long")).alias(c) for c in dict.fromkeys(columns)],
    ).collect()[0].asDict()
    reasons = {r[REASON]: r["count"] for r in bad.groupBy(REASON).count().collect()}
    stats = {
        "ds": ds,
        "rows_in": total,
        "rows": rows_out,
        "rows_quarantined": bad_count,
        "quarantine_reasons": reasons,
        "positive_rate": nulls_and_rate.pop("__positive_rate"),
        "nulls": nulls_and_rate,
        "normalization_window": window,
        "raw_files": [str(p) for p in files],
    }

    types = dc.all_fields()
    out = good.select(*[F.col(c) for c in dc.label_fields], *feature_columns(fc, types, normalization))
    final = Path(config.train_input_path) / f"ds={ds}"
    tmp = temp_dir_beside(final)
    try:
        out.write.mode("overwrite").parquet(str(tmp))
        (tmp / "_stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True))
        norm_doc = {"window": window, "statistics": dense_stats, "features": normalization}
        (tmp / "_normalization.json").write_text(json.dumps(norm_doc, indent=2, sort_keys=True))
        (tmp / "_SUCCESS").touch()
        replace_dir(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        good.unpersist()
        bad.unpersist()
    log.info("ds=%s: %d rows -> %s (%d quarantined)", ds, rows_out, final, bad_count)
    return stats


def main(argv: list[str] | None = None) -> int:
    """Entry point for spark-submit and ``recpipe features``."""
    from recpipe.cli import features_main

    return features_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
