"""Spark feature preparation of one day: raw logs -> feature Parquet, stats, quarantine.

Run it as ``recpipe features --pipeline_config_path conf/X.yaml --ds YYYY-MM-DD`` or
``spark-submit features/prepare.py --pipeline_config_path conf/X.yaml --ds YYYY-MM-DD``.
A pass (one hour of an hourly raw layout, ``ds=D/hh=HH``) is prepared the same way with
``--ds YYYY-MM-DD/HH`` or ``--ds YYYY-MM-DD --hh HH``, into ``ds=YYYY-MM-DD/hh=HH/``.

Output, replaced whole on a re-run (temporary directory, then rename)::

    <train_input_path>/ds=YYYY-MM-DD/part-*.parquet  labels + one column per feature
                                     _stats.json         rows, positive rate, nulls, quarantine
                                     _normalization.json dense fill / normaliser constants
                                     _SUCCESS            written last
    <quarantine_path>/ds=YYYY-MM-DD/part-*.json        rejected raw rows with _reason
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import time
from datetime import date, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from features import figures
from features.schema import (
    BAD,
    REASON,
    SOURCE,
    RawInputError,
    check_header,
    data_files,
    parse,
    quarantined,
    read_dimension,
    read_parquet_strings,
    read_strings,
)
from features.sequence import add_histories, state_root, write_state
from features.session import get_spark
from features.transform import feature_columns, needs_statistics, normalization_params
from recpipe import atomic
from recpipe.config.args import add_config_args, config_from_args
from recpipe.config.data import FeatureType
from recpipe.config.errors import ConfigError
from recpipe.config.pipeline import PipelineConfig
from recpipe.errors import PipelineError, run_command
from recpipe.ids import HOLDOUT
from recpipe.layout import FeaturePartition, ds_partition, is_finished, parse_ds_range, split_ds
from recpipe.paths import confine_config

_STARTED = time.perf_counter()  # the job's own time is logged from here

log = logging.getLogger(__name__)


class BadRowsError(PipelineError):
    """Too many raw rows fail the schema; the message names the files and counts."""


def _read_day(spark: SparkSession, config: PipelineConfig, ds: str) -> tuple[DataFrame, list[Path]]:
    """Parsed rows of day ``ds`` (see ``features.schema.parse``) with the dimension columns joined."""
    files = data_files(ds_partition(config.raw_input_path, ds))
    return read_raw(spark, config, files), files


def read_raw(spark: SparkSession, config: PipelineConfig, files: list[Path]) -> DataFrame:
    """Parsed rows of the raw ``files`` (``features.schema.parse``: typed columns, ``_bad``,
    ``_reason``, the source file) with the dimension tables' columns joined.

    Raises:
        RawInputError: a CSV file's header does not match ``data_config.input_fields``, or a
            dimension table is missing.
    """
    dc = config.data_config
    if dc.input_format == "parquet":
        strings = read_parquet_strings(spark, files, dc.input_fields)
    else:
        if dc.with_header:
            for path in files:
                check_header(path, dc.input_fields, dc.separator)
        strings = read_strings(spark, files, dc.input_fields, dc.separator, dc.with_header)
    rows = parse(strings, dc.input_fields, dc.label_fields)
    for table in dc.dimension_tables:
        path = Path(table.path)
        if not path.is_absolute():
            path = Path(config.raw_input_path) / path
        dim = read_dimension(spark, path, table.input_fields, table.separator).dropDuplicates([table.key])
        extra = [f.input_name for f in table.input_fields if f.input_name not in rows.columns]
        rows = rows.join(F.broadcast(dim.select(table.key, *extra)), on=table.key, how="left")
    return rows


def _stored_moments(config: PipelineConfig, ds: str, needed: set[str]) -> dict | None:
    """The dense moments a prepared day or pass stored in its ``_stats.json``, or None."""
    stats_file = FeaturePartition.of(config.train_input_path, ds).stats
    if not stats_file.exists():
        return None
    stored = json.loads(stats_file.read_text()).get("dense_moments", {})
    return stored if set(stored) >= needed else None


def window_moments(
    spark: SparkSession, config: PipelineConfig, ds: str, known: dict[str, dict] | None = None
) -> tuple[list[str], list[dict]]:
    """Dense moments of the window's earlier days (``normalization_window_days``), and for a pass
    ``D/HH`` also of the day's earlier passes: (their names, their moments), oldest first.

    An earlier day's come from ``known`` (day -> moments: a range being prepared in one job),
    else from its ``_stats.json`` when it was prepared whole, else from its
    prepared passes' (for a pass), else from its raw data (one read; for a day only: a pass's
    window never reads raw data, so an hour's job stays an hour's work); a day with none of
    these is left out. The day's earlier passes count when they were prepared."""
    window = config.feature_config.normalization_window_days
    day, hour = split_ds(ds)
    names, moments = [], []
    features = config.feature_config.features
    needed = {f.name for f in features if f.feature_type == FeatureType.RawFeature}
    if not needed:
        return [], []

    def stored_passes(d: str, hours: range) -> None:
        for h in hours:
            found = _stored_moments(config, f"{d}/{h:02d}", needed)
            if found is not None:
                names.append(f"{d}/{h:02d}")
                moments.append(found)

    for k in range(window - 1, 0, -1):
        d = (date.fromisoformat(day) - timedelta(days=k)).isoformat()
        found = (known or {}).get(d) or _stored_moments(config, d, needed)
        if found is not None:
            names.append(d)
            moments.append(found)
        elif hour is not None:
            stored_passes(d, range(24))
        elif is_finished(ds_partition(config.raw_input_path, d)):
            rows, _ = _read_day(spark, config, d)
            names.append(d)
            moments.append(figures.dense_moments(rows, config, ~F.col(BAD)))
    if hour is not None:
        stored_passes(day, range(hour))
    return names, moments


def quarantine(bad: DataFrame, bad_count: int, root: Path, ds: str) -> None:
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


def _read_error(err: Exception, files: list[Path]) -> RawInputError:
    # a damaged file surfaces as a Java exception at the first action
    return RawInputError(f"cannot read raw partition {files[0].parent}: {str(err).splitlines()[0]}")


def window_normalization(config: PipelineConfig, earlier: list[dict], day_moments: dict) -> tuple[dict, dict]:
    """(window statistics, normalisation constants per RawFeature) from the ``earlier`` days'
    moments and ``day_moments`` (empty: the day's are not known yet, which only a config
    without ``needs_statistics`` can be written with)."""
    fc = config.feature_config
    parts = [*earlier, day_moments] if day_moments else earlier
    dense_stats = figures.merge_moments(parts) if parts else {}
    normalization = {
        f.name: normalization_params(f, dense_stats.get(f.name, {}))
        for f in fc.features
        if f.feature_type == FeatureType.RawFeature
    }
    return dense_stats, normalization


def _write_features(rows: DataFrame, config: PipelineConfig, out: Path, normalization: dict) -> None:
    """Write the good rows' features to ``out`` (Parquet), normalised by ``normalization``."""
    feature_rows(rows, config, normalization).write.mode("overwrite").parquet(str(out))


def feature_rows(
    rows: DataFrame, config: PipelineConfig, normalization: dict, keep: tuple[str, ...] = ()
) -> DataFrame:
    """The good rows' labels and features, normalised by ``normalization`` (feature -> its
    ``normalization_params``; a constant may be a column), then the columns ``keep``."""
    dc, fc = config.data_config, config.feature_config
    histories = frozenset(dc.behavior_sequence.columns if dc.behavior_sequence else ())
    columns = [
        *[F.col(c) for c in dc.label_fields],
        *feature_columns(fc, dc.all_fields(), normalization, histories),
    ]
    if dc.holdout_percent:
        # a function of the raw row, so a re-run of the day holds out the same rows
        raw = F.xxhash64(*[F.col(f.input_name) for f in dc.input_fields])
        columns.append((F.pmod(raw, F.lit(100)) < dc.holdout_percent).alias(HOLDOUT))
    return rows.filter(~F.col(BAD)).select(*columns, *keep)


def prepare_day(spark: SparkSession, config: PipelineConfig, ds: str) -> dict:
    """Prepare the features of day ``ds`` and return its stats (also in ``_stats.json``).
    ``ds`` may be a pass, ``YYYY-MM-DD/HH``: one hour's raw partition (``ds=D/hh=HH``) to the
    hour's feature partition, quarantine and side files, by the same rules.

    The day is parsed in full once, by the write: its figures (counts, nulls, the good rows'
    dense moments) are gathered as it runs (``_gathering``). When a dense feature's
    fill or normaliser depends on the window's statistics (``needs_statistics``), they must
    be known before the write, so a first pass reads the dense columns alone (Spark parses
    no other column) for their moments over every row, and the write gathers no moments:
    when no row is quarantined these are the good rows' moments; when some are, an
    aggregation takes the good rows' and the features are written again if their
    normalisation changes. Dense statistics of the window's earlier days come from their
    stored moments.

    Raises:
        RawInputError: the raw partition or a dimension table is missing or unreadable.
        BadRowsError: the share of quarantined rows exceeds ``max_bad_row_fraction``.
        ValueError: ``ds`` is neither ``YYYY-MM-DD`` nor ``YYYY-MM-DD/HH``.
        In all cases no output partition is written for ``ds``.
    """
    dc = config.data_config
    split_ds(ds)  # a malformed ds fails before any work
    rows, files = _read_day(spark, config, ds)
    first_pass = needs_statistics(config.feature_config.features)
    try:
        every_row = figures.dense_moments(rows, config) if first_pass else {}
    except Exception as err:
        raise _read_error(err, files) from err
    window, earlier = window_moments(spark, config, ds)
    window.append(ds)
    final = ds_partition(config.train_input_path, ds)
    seq = dc.behavior_sequence
    parsed = rows  # the raw rows, as quarantine keeps them (no history columns)
    new_state, seq_figures = None, {}
    if seq is not None:
        good = ~F.col(BAD)
        if seq.positive_only:
            good = good & (F.col(dc.label_fields[0]) > 0)
        rows, new_state, seq_figures = add_histories(
            spark, rows, seq, dc.all_fields(sequences=False), config.train_input_path, ds, good
        )
    state_dir = (
        atomic.directory(ds_partition(state_root(config.train_input_path), ds))
        if seq is not None
        else contextlib.nullcontext()
    )
    with state_dir as state_tmp, atomic.directory(final) as tmp:
        _, normalization = window_normalization(config, earlier, every_row)
        gathering, day_figures = figures.gathering(rows, config, moments=not first_pass)
        try:
            _write_features(gathering, config, tmp, normalization)
        except Exception as err:
            if first_pass:  # the first pass read the files: a failure here is not theirs
                raise
            raise _read_error(err, files) from err
        counted = day_figures()
        total, bad_count = counted["__total"], counted["__bad"] or 0
        bad = quarantined(parsed, dc.input_fields)
        quarantine_root = Path(config.effective_quarantine_path)
        quarantine(bad, bad_count, quarantine_root, ds)
        if total == 0 and "/" not in ds:  # a quiet hour is a pass with no rows; a day is not
            raise RawInputError(f"raw partition {files[0].parent} holds no rows")
        if bad_count / max(total, 1) > dc.max_bad_row_fraction:
            where = ds_partition(quarantine_root, ds)
            raise BadRowsError(_bad_row_message(bad, bad_count, total, ds, dc.max_bad_row_fraction, where))
        reasons = {}
        if bad_count:
            reasons = {r[REASON]: r["count"] for r in bad.groupBy(REASON).count().collect()}
        if not first_pass:
            moments = figures.moments_from_row(counted, config.feature_config.features)
        elif bad_count:  # the first pass's moments counted the quarantined rows' dense values
            moments = figures.dense_moments(parsed, config, ~F.col(BAD))
        else:
            moments = every_row
        dense_stats, observed = window_normalization(config, earlier, moments)
        if observed != normalization:
            _write_features(rows, config, tmp, observed)
        stats = {
            "ds": ds,
            "rows_in": total,
            "rows": total - bad_count,
            "rows_quarantined": bad_count,
            "quarantine_reasons": reasons,
            "positive_rate": counted["__positive_rate"],
            "nulls": figures.day_nulls(counted, config, moments, total - bad_count),
            "dense_moments": moments,
            "normalization_window": window,
            "raw_files": [str(p) for p in files],
        }
        if new_state is not None:
            # the state is renamed after the features (the with's order): a day whose state
            # is published has its features published too
            write_state(new_state, state_tmp)
            stats["sequence"] = {
                **seq_figures,
                "users": spark.read.parquet(str(state_tmp)).count(),
                **_sequence_lengths(spark, config, tmp),
            }
        written = FeaturePartition(tmp)
        written.stats.write_text(json.dumps(stats, indent=2, sort_keys=True))
        norm_doc = {"window": window, "statistics": dense_stats, "features": observed}
        written.normalization.write_text(json.dumps(norm_doc, indent=2, sort_keys=True))
        written.success.touch()  # last: the partition is complete
    log.info("ds=%s: %d rows -> %s (%d quarantined)", ds, stats["rows"], final, bad_count)
    return stats


def _sequence_lengths(spark: SparkSession, config: PipelineConfig, written: Path) -> dict:
    """Per SequenceFeature over a history column: its mean length and its share of empty
    histories in the written features (``<feature>.mean_length``, ``<feature>.empty_share``)."""
    columns = set(config.data_config.behavior_sequence.columns)
    names = [
        f.name
        for f in config.feature_config.features
        if f.feature_type == FeatureType.SequenceFeature and f.input_names[0] in columns
    ]
    if not names:
        return {}
    aggs = []
    for name in names:
        size = F.size(F.col(name))
        aggs += [
            F.mean(size).alias(f"{name}.mean_length"),
            F.mean((size == 0).cast("double")).alias(f"{name}.empty_share"),
        ]
    return spark.read.parquet(str(written)).agg(*aggs).first().asDict()


def _with_hours(days: list[str], hh: str) -> list[str]:
    """Each day of ``days`` -> its passes ``hh`` (``HH`` or ``HH:HH``), in order.

    Raises:
        ConfigError: a day that is already a pass, or malformed hours (names ``--hh``).
    """
    start, _, end = hh.partition(":")
    out = []
    for day in days:
        if "/" in day:
            raise ConfigError(f"--hh={hh!r} with --ds {day}: give the hour once")
        out += parse_ds_range(f"{day}/{start}:{day}/{end or start}", "--hh")
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recpipe features", description="Spark feature preparation")
    add_config_args(parser)
    parser.add_argument(
        "--ds",
        action="append",
        required=True,
        help="YYYY-MM-DD or START:END (repeatable); passes as YYYY-MM-DD/HH[:YYYY-MM-DD/HH]",
    )
    parser.add_argument(
        "--hh", default=None, help="HH or HH:HH: prepare these hours (passes) of each --ds day"
    )
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    parser.add_argument(
        "--remote",
        default=None,
        help="a Spark Connect server (sc://host:port) to run on instead of a JVM of this job's own",
    )
    parser.add_argument("--app_name", default="recpipe-features", help="the Spark application's name")
    parser.add_argument(
        "--confine_paths",
        action="store_true",
        help="refuse a config whose paths leave the project's conf/, data/, var/ (the DAGs pass it)",
    )
    return parser


def run(args: argparse.Namespace, extra: list[str]) -> list[dict]:
    """Prepare the days ``args`` name (``recpipe features``' parsed arguments, ``extra`` the
    config overrides argparse left); their stats.

    Raises:
        recpipe.config.errors.ConfigError: bad arguments or config (names the field).
        recpipe.errors.PipelineError: bad input (names the file or row); nothing half-written
            is left where a reader looks.
    """
    days = [d for text in args.ds for d in parse_ds_range(text, "--ds")]  # bad dates fail first
    if args.hh is not None:
        days = _with_hours(days, args.hh)
    home = Path(os.environ.get("RECPIPE_HOME") or Path.cwd())
    config = config_from_args(args, extra).resolved(home)
    if args.confine_paths:  # a DAG run's edit_config_json may name any path
        confine_config(config)

    from features.backfill import prepare_range  # it builds on this module

    spark = get_spark(args.app_name, master=args.master, remote=args.remote)
    out = []
    try:
        # whole days: one job for them all (features.backfill); passes day by day
        for stats in prepare_range(spark, config, days):
            out.append(stats)
            print(json.dumps({k: stats[k] for k in ("ds", "rows", "rows_quarantined", "positive_rate")}))
    finally:
        if args.remote is not None:  # the server keeps a session until it is released
            spark.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    """``spark-submit features/prepare.py`` / ``recpipe features``: prepare one or more days.

    Relative paths of the config resolve against ``$RECPIPE_HOME`` (the DAG's spark-submit
    runs elsewhere). Exit codes: ``recpipe.errors``.
    """
    argv = sys.argv[1:] if argv is None else argv
    args, extra = _parser().parse_known_args(argv)  # --help and usage errors before logging starts

    def job() -> int:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("py4j").setLevel(logging.WARNING)
        run(args, extra)
        # the job's own time, apart from its task's (bench/production_dag.py reads this line)
        log.info("recpipe job features ran %.2f s", time.perf_counter() - _STARTED)
        return 0

    return run_command(job, "recpipe features")


if __name__ == "__main__":
    raise SystemExit(main())
