"""The steps that preparing one day (``features.prepare.prepare_day``) and a range of days in
one job (``features.backfill``) share: reading raw files, the dense moments of the
normalisation window, the normalisation constants, the feature columns, the quarantine."""

from __future__ import annotations

import json
import shutil
from datetime import date, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from features import figures
from features.schema import (
    BAD,
    check_header,
    data_files,
    parse,
    read_dimension,
    read_parquet_strings,
    read_strings,
)
from features.transform import feature_columns, normalization_params
from recpipe import atomic, outputs
from recpipe.config.data import FeatureType
from recpipe.config.pipeline import PipelineConfig
from recpipe.ids import HOLDOUT
from recpipe.layout import FeaturePartition, ds_partition, is_finished, partition_ds, pass_dirs, split_pass


def read_day(spark: SparkSession, config: PipelineConfig, ds: str) -> tuple[DataFrame, list[Path]]:
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
    day, start = split_pass(ds)
    names, moments = [], []
    features = config.feature_config.features
    needed = {f.name for f in features if f.feature_type == FeatureType.RawFeature}
    if not needed:
        return [], []

    def stored_passes(d: str, before: int = 1440) -> None:
        # the prepared passes of day d that start before minute `before`, whatever their length
        found = sorted(partition_ds(p) for p in pass_dirs(ds_partition(config.train_input_path, d)))
        for name in found:
            stored = _stored_moments(config, name, needed) if split_pass(name)[1] < before else None
            if stored is not None:
                names.append(name)
                moments.append(stored)

    for k in range(window - 1, 0, -1):
        d = (date.fromisoformat(day) - timedelta(days=k)).isoformat()
        found = (known or {}).get(d) or _stored_moments(config, d, needed)
        if found is not None:
            names.append(d)
            moments.append(found)
        elif start is not None:
            stored_passes(d)
        elif is_finished(ds_partition(config.raw_input_path, d)):
            rows, _ = read_day(spark, config, d)
            names.append(d)
            moments.append(figures.dense_moments(rows, config, ~F.col(BAD)))
    if start is not None:
        stored_passes(day, start)
    return names, moments


COMMAND = "features"  # the writer named in a partition's marker (recpipe.outputs)


def _owned(config: PipelineConfig, ds: str) -> tuple:
    """``recpipe.outputs``' arguments for day ``ds``'s feature partition."""
    raw = ds_partition(config.raw_input_path, ds)

    def earlier_output(partition: Path) -> bool:
        # a partition written before markers: its _stats.json names raw files of this partition
        try:
            files = json.loads(FeaturePartition(partition).stats.read_text()).get("raw_files") or []
        except (OSError, ValueError, AttributeError):
            return False
        return bool(files) and all(Path(f).resolve().is_relative_to(raw.resolve()) for f in files)

    return ds_partition(config.train_input_path, ds), COMMAND, [raw], "train_input_path", earlier_output


def partition_output(config: PipelineConfig, ds: str):
    """The day's feature partition ``train_input_path/ds=<ds>`` as an output the feature job owns
    (``recpipe.outputs.directory``: a new directory, or this job's earlier output of the same raw
    partition; never the raw partition or a directory holding it).

    Raises:
        recpipe.outputs.OutputNotOwnedError: the partition holds what the job did not write.
    """
    return outputs.directory(*_owned(config, ds))


def check_partition_output(config: PipelineConfig, ds: str) -> None:
    """``partition_output``'s check alone, before the day's work starts.

    Raises:
        recpipe.outputs.OutputNotOwnedError: as ``partition_output``.
    """
    outputs.check(*_owned(config, ds))


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


def feature_rows(
    rows: DataFrame, config: PipelineConfig, normalization: dict, keep: tuple[str, ...] = ()
) -> DataFrame:
    """The good rows' labels (and ``sample_weight``) and features, normalised by
    ``normalization`` (feature -> its ``normalization_params``; a constant may be a column),
    then the columns ``keep``."""
    dc, fc = config.data_config, config.feature_config
    histories = frozenset(dc.behavior_sequence.columns if dc.behavior_sequence else ())
    weight = []
    if dc.sample_weight is not None:  # beside the labels: the trainer reads it with them
        weight = [F.coalesce(F.col(dc.sample_weight).cast("float"), F.lit(1.0)).alias(dc.sample_weight)]
    columns = [
        *[F.col(c) for c in dc.label_fields],
        *weight,
        *feature_columns(fc, dc.all_fields(), normalization, histories),
    ]
    if dc.holdout_percent:
        # a function of the raw row, so a re-run of the day holds out the same rows
        raw = F.xxhash64(*[F.col(f.input_name) for f in dc.input_fields])
        columns.append((F.pmod(raw, F.lit(100)) < dc.holdout_percent).alias(HOLDOUT))
    return rows.filter(~F.col(BAD)).select(*columns, *keep)
