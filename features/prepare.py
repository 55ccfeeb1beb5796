"""Spark feature preparation of one day: raw logs -> feature Parquet, stats, quarantine.

Run it as ``recpipe features --pipeline_config_path conf/X.yaml --ds YYYY-MM-DD`` or
``spark-submit features/prepare.py --pipeline_config_path conf/X.yaml --ds YYYY-MM-DD``.
A pass (an hour of an hourly raw layout, ``ds=D/hh=HH``, or a shorter pass, ``ds=D/hh=HHMM``) is
prepared the same way with ``--ds YYYY-MM-DD/HH`` or ``--ds YYYY-MM-DD --hh HH``, into
``ds=YYYY-MM-DD/hh=HH/``.

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
import re
import sys
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from features import REMOTE_ENV, figures
from features.backfill import prepare_range
from features.schema import (
    BAD,
    REASON,
    SOURCE,
    RawInputError,
    quarantined,
)
from features.sequence import add_histories, sequence_length_columns, state_root, write_state
from features.session import get_spark
from features.steps import (
    check_partition_output,
    feature_rows,
    partition_output,
    quarantine,
    read_day,
    window_moments,
    window_normalization,
)
from features.transform import needs_statistics
from recpipe import atomic
from recpipe.arguments import ArgumentParser
from recpipe.config.args import add_config_args, config_from_args
from recpipe.config.errors import ConfigError
from recpipe.config.pipeline import PipelineConfig
from recpipe.errors import PipelineError, UsageError, run_command
from recpipe.layout import FeaturePartition, ds_partition, parse_ds_range, split_pass
from recpipe.paths import confine_config

_STARTED = time.perf_counter()  # the job's own time is logged from here

log = logging.getLogger(__name__)


class BadRowsError(PipelineError):
    """Too many raw rows fail the schema; the message names the files and counts."""


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


def _write_features(rows: DataFrame, config: PipelineConfig, out: Path, normalization: dict) -> None:
    """Write the good rows' features to ``out`` (Parquet), normalised by ``normalization``."""
    feature_rows(rows, config, normalization).write.mode("overwrite").parquet(str(out))


def _quarantine(
    parsed: DataFrame, config: PipelineConfig, ds: str, files: list[Path], total: int, bad_count: int
):
    """Write the day's bad rows to its quarantine partition; the count of each reason.

    Raises:
        RawInputError: a day (not a pass) without rows.
        BadRowsError: the share of bad rows is over ``max_bad_row_fraction``.
    """
    dc = config.data_config
    bad = quarantined(parsed, dc.input_fields)
    quarantine_root = Path(config.effective_quarantine_path)
    quarantine(bad, bad_count, quarantine_root, ds)
    if total == 0 and "/" not in ds:  # a quiet hour is a pass with no rows; a day is not
        raise RawInputError(f"raw partition {files[0].parent} holds no rows")
    if bad_count / max(total, 1) > dc.max_bad_row_fraction:
        where = ds_partition(quarantine_root, ds)
        raise BadRowsError(_bad_row_message(bad, bad_count, total, ds, dc.max_bad_row_fraction, where))
    if not bad_count:
        return {}
    return {r[REASON]: r["count"] for r in bad.groupBy(REASON).count().collect()}


def _with_histories(spark: SparkSession, rows: DataFrame, config: PipelineConfig, ds: str):
    """``rows`` with each user's behaviour history (``data_config.behavior_sequence``; the
    good rows', positive ones only where it says so), the users' new state and its figures;
    ``(rows, None, {})`` for a config without one."""
    dc = config.data_config
    seq = dc.behavior_sequence
    if seq is None:
        return rows, None, {}
    good = ~F.col(BAD)
    if seq.positive_only:
        good = good & (F.col(dc.label_fields[0]) > 0)
    return add_histories(spark, rows, seq, dc.all_fields(sequences=False), config.train_input_path, ds, good)


def _publish(out: Path, stats: dict, normalization: dict) -> None:
    """The side files of the partition written at ``out``, ``_SUCCESS`` last: the partition is
    then complete."""
    written = FeaturePartition(out)
    written.stats.write_text(json.dumps(stats, indent=2, sort_keys=True))
    written.normalization.write_text(json.dumps(normalization, indent=2, sort_keys=True))
    written.success.touch()


def prepare_day(spark: SparkSession, config: PipelineConfig, ds: str) -> dict:
    """Prepare the features of day ``ds`` and return its stats (also in ``_stats.json``).
    ``ds`` may be a pass, ``YYYY-MM-DD/HH`` or ``YYYY-MM-DD/HHMM``: one pass's raw partition
    (``ds=D/hh=HH``) to the pass's feature partition, quarantine and side files, by the same
    rules.

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
        ValueError: ``ds`` is neither ``YYYY-MM-DD`` nor a pass of it.
        In all cases no output partition is written for ``ds``.
    """
    split_pass(ds)  # a malformed ds fails before any work
    check_partition_output(config, ds)
    rows, files = read_day(spark, config, ds)
    first_pass = needs_statistics(config.feature_config.features)
    try:
        every_row = figures.dense_moments(rows, config) if first_pass else {}
    except Exception as err:
        raise _read_error(err, files) from err
    window, earlier = window_moments(spark, config, ds)
    window = [*window, ds]
    parsed = rows  # the raw rows, as quarantine keeps them (no history columns)
    rows, new_state, seq_figures = _with_histories(spark, rows, config, ds)
    state_dir = (
        atomic.directory(ds_partition(state_root(config.train_input_path), ds))
        if new_state is not None
        else contextlib.nullcontext()
    )
    with state_dir as state_tmp, partition_output(config, ds) as tmp:
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
        reasons = _quarantine(parsed, config, ds, files, total, bad_count)
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
            "ds": ds, "rows_in": total, "rows": total - bad_count, "rows_quarantined": bad_count,
            "quarantine_reasons": reasons, "positive_rate": counted["__positive_rate"],
            "nulls": figures.day_nulls(counted, config, moments, total - bad_count),
            "dense_moments": moments, "normalization_window": window, "raw_files": [str(p) for p in files],
        }  # fmt: skip
        if new_state is not None:
            # the state is renamed after the features (the with's order): a day whose state
            # is published has its features published too
            write_state(new_state, state_tmp)
            users = spark.read.parquet(str(state_tmp)).count()
            stats["sequence"] = {**seq_figures, "users": users, **_sequence_lengths(spark, config, tmp)}
        _publish(tmp, stats, {"window": window, "statistics": dense_stats, "features": observed})
    where = ds_partition(config.train_input_path, ds)
    log.info("ds=%s: %d rows -> %s (%d quarantined)", ds, stats["rows"], where, bad_count)
    return stats


def prepare_days(spark: SparkSession, config: PipelineConfig, days: list[str]) -> list[dict]:
    """Prepare ``days`` (days or passes, in order) and return each one's stats: whole days in
    one Spark job where ``features.backfill.prepare_range`` can, else one by one.

    Raises:
        As ``prepare_day``; the days before a failing one stay published.
    """
    done = prepare_range(spark, config, days)
    return done if done is not None else [prepare_day(spark, config, d) for d in days]


def _sequence_lengths(spark: SparkSession, config: PipelineConfig, written: Path) -> dict:
    """``sequence_length_columns`` over the features written to ``written``."""
    aggs = sequence_length_columns(config)
    return spark.read.parquet(str(written)).agg(*aggs).first().asDict() if aggs else {}


_HOUR = re.compile(r"\d{2}(?:[0-5][05])?")


def _with_hours(days: list[str], hh: str, pass_minutes: int | None = None) -> list[str]:
    """Each day of ``days`` -> its passes ``hh`` (``HH[MM]`` or ``HH[MM]:HH[MM]``), in order.

    Raises:
        ConfigError: a day that is already a pass, or malformed hours (names ``--hh``).
    """
    start, _, end = hh.partition(":")
    for part in (start, end) if end else (start,):
        if not _HOUR.fullmatch(part) or int(part[:2]) > 23 or int(part[2:] or 0) > 55:
            raise ConfigError(
                f"--hh {hh}: {part!r} is neither an hour HH (00 to 23) nor a pass's start HHMM "
                "(minutes 00 to 55, a multiple of 5)"
            )
    out = []
    for day in days:
        if "/" in day:
            raise ConfigError(f"--hh {hh} with --ds {day}: give the hour once")
        try:
            out += parse_ds_range(f"{day}/{start}:{day}/{end or start}", "--hh", pass_minutes)
        except ConfigError as err:  # said of the range it built: say it of what was typed
            raise ConfigError(f"--hh {hh} with --ds {day}: {str(err).split(': ', 1)[1]}") from None
    return out


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="recpipe features", description="Spark feature preparation")
    add_config_args(parser)
    parser.add_argument(
        "--ds",
        action="append",
        required=True,
        help="YYYY-MM-DD or START:END (repeatable); passes as YYYY-MM-DD/HH[:YYYY-MM-DD/HH], "
        "or YYYY-MM-DD/HHMM for passes shorter than an hour",
    )
    parser.add_argument(
        "--hh", default=None, help="HH[MM] or HH[MM]:HH[MM]: prepare these passes of each --ds day"
    )
    parser.add_argument(
        "--pass_minutes",
        type=int,
        default=None,
        help="the length of the passes an HHMM range names (5, 10, 15, 20 or 30; default: every 5 minutes)",
    )
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    parser.add_argument(
        "--remote",
        default=None,
        help="a Spark Connect server (sc://host:port) to run on instead of a JVM of this job's own; "
        f"a URL with a token goes in ${REMOTE_ENV} (a command line is every user's to read)",
    )
    parser.add_argument("--app_name", default="recpipe-features", help="the Spark application's name")
    parser.add_argument(
        "--confine_paths",
        action="store_true",
        help="refuse a config whose paths leave the project's conf/, data/, var/ (the DAGs pass it)",
    )
    return parser


def spark_remote(given: str | None) -> str | None:
    """The Spark Connect server: ``--remote`` (``given``), else ``$RECPIPE_SPARK_REMOTE``, else None
    (a JVM of the job's own).

    Raises:
        UsageError: ``given`` holds a token (``;token=``): a command line is every user's to read.
    """
    if given is not None and "token=" in given.lower():
        raise UsageError(
            f"--remote holds a token, which any user of this host can read from the process list: "
            f"give the URL in ${REMOTE_ENV}"
        )
    return given or os.environ.get(REMOTE_ENV) or None


def run(args: argparse.Namespace, extra: list[str]) -> list[dict]:
    """Prepare the days ``args`` name (``recpipe features``' parsed arguments, ``extra`` the
    config overrides argparse left); their stats.

    Raises:
        recpipe.config.errors.ConfigError: bad arguments or config (names the field).
        recpipe.errors.PipelineError: bad input (names the file or row); nothing half-written
            is left where a reader looks.
    """
    # bad dates fail first
    days = [d for text in args.ds for d in parse_ds_range(text, "--ds", args.pass_minutes)]
    if args.hh is not None:
        days = _with_hours(days, args.hh, args.pass_minutes)
    home = Path(os.environ.get("RECPIPE_HOME") or Path.cwd())
    config = config_from_args(args, extra).resolved(home)
    if args.confine_paths:  # a DAG run's edit_config_json may name any path
        confine_config(config)

    remote = spark_remote(args.remote)
    spark = get_spark(args.app_name, master=args.master, remote=remote)
    out = []

    def work() -> None:
        # whole days: one job for them all (features.backfill); passes day by day
        for stats in prepare_days(spark, config, days):
            out.append(stats)
            print(json.dumps({k: stats[k] for k in ("ds", "rows", "rows_quarantined", "positive_rate")}))

    if remote is None:
        work()
        return out
    try:
        run_interruptibly(work, spark)
    finally:  # the server keeps a session until it is released
        spark.stop()
    return out


class Stopped(PipelineError):
    """The job was told to stop (a signal, or the task that started it is gone): its
    operations on the Spark Connect server were interrupted."""


def run_interruptibly(work, spark, poll_s: float = 0.5) -> None:
    """Run ``work()`` (Spark Connect calls on ``spark``) in a thread while this one watches: a
    SIGTERM, SIGINT or SIGHUP, or the death of the process that started this one (a task
    SIGKILLed: this process is reparented), interrupts every operation of the session on the
    server (``interruptAll``), so that a stopped task leaves no query running beside its
    retry's. A blocking gRPC call would hold a signal handler off until the query ended; the
    watching thread is free to act.

    Raises:
        Stopped: told to stop; what ``work`` raised otherwise.
    """
    import signal
    import threading

    told: list[str] = []
    parent = os.getppid()
    failure: list[BaseException] = []

    def on_signal(signum, frame):
        told.append(signal.Signals(signum).name)

    def target():
        try:
            work()
        except BaseException as err:  # noqa: BLE001 - handed to the watching thread
            failure.append(err)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    thread = threading.Thread(target=target, name="features", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(poll_s)
            if not told and os.getppid() != parent:
                told.append(f"the parent process {parent} ended")
            if told:
                log.warning("stopping (%s): interrupting this session's operations", told[0])
                spark.interruptAll()
                thread.join(30)
                raise Stopped(f"stopped ({told[0]}); the server's operations of this job were interrupted")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure:
        raise failure[0]


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
