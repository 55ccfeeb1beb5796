"""Behaviour sequences: each event's history of the user's earlier events, without leakage.

For ``data_config.behavior_sequence`` the Spark job adds, to every row of a day (or pass),
the ``fields`` of the same user's last ``max_length`` events before it, oldest first. Two
sources, so that a day never rescans months of logs:

- earlier days: a per-user state, ``<train_input_path>/_sequence_state/ds=D[/hh=HH]/``
  (Parquet, one row a user: the user's last ``max_length`` events up to the end of ``D``),
  written by the day's job beside its features and read by the next one;
- the day itself: the user's events with a strictly earlier time.

An event's own time bounds its history: events at the same time (ties) never enter each
other's history, whatever their order in the file. Within a history, events are ordered by
time, then by their field values (text), so a re-run gives the same lists. The state's
partitions start with ``_``: Spark and pyarrow readers of the feature root skip them.

The design follows DIN's user behaviour features (Zhou et al., 2018, "Deep Interest Network
for Click-Through Rate Prediction"; EasyRec's ``SequenceFeature``, whose logs carry the
history precomputed).
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from features.transform import clean_id
from recpipe.config.data import BehaviorSequence, FeatureType, InputType
from recpipe.config.pipeline import PipelineConfig
from recpipe.layout import SUCCESS, ds_partition, is_finished, split_pass

STATE_DIR = "_sequence_state"
_EVENTS = "_events"  # array<struct<t: long, v: array<string>>>: oldest first
_T, _V = "t", "v"
ROW = "_row"  # a range's rows: each one's place in the files read


def state_root(train_input_path: str | Path) -> Path:
    """``<train_input_path>/_sequence_state``: the per-user states, one partition a day or pass."""
    return Path(train_input_path) / STATE_DIR


def _order(ds: str) -> tuple[str, int]:
    # a whole day's state holds the day's last pass too: it sorts after the day's passes
    day, start = split_pass(ds)
    return day, 1440 if start is None else start


def previous_state(train_input_path: str | Path, ds: str) -> str | None:
    """The latest finished state before ``ds`` (a day ``D`` or a pass ``D/HH``), as its ds,
    or None when there is none (the first day: every history starts empty)."""
    root = state_root(train_input_path)
    if not root.is_dir():
        return None
    found = []
    for day_dir in root.glob("ds=*"):
        day = day_dir.name.removeprefix("ds=")
        if is_finished(day_dir):
            found.append(day)
        found += [f"{day}/{p.name.removeprefix('hh=')}" for p in day_dir.glob("hh=*") if is_finished(p)]
    earlier = [d for d in found if _order(d) < _order(ds)]
    return max(earlier, key=_order) if earlier else None


def _last(col: Column, n: int) -> Column:
    """The last ``n`` elements of an array column (all of them when it is shorter)."""
    return F.slice(col, F.greatest(F.size(col) - F.lit(n) + F.lit(1), F.lit(1)), n)


def _value(i: int):
    """``event -> its i-th field value``, for ``F.transform`` (a one-argument function: a
    second argument would be bound to the element's index)."""
    return lambda e: e.getField(_V)[i]


def _event(seq: BehaviorSequence, types: dict[str, InputType]) -> Column:
    """One event as ``struct<t: long, v: array<string>>``: its time and cleaned field values."""
    values = F.array(*[clean_id(F.col(f), types[f]) for f in seq.fields])
    return F.struct(F.col(seq.time_field).cast(T.LongType()).alias(_T), values.alias(_V))


def _read_state(spark: SparkSession, train_input_path: str | Path, ds: str, event_type) -> tuple:
    """The latest finished state before ``ds`` and its ds (None: an empty state)."""
    source = previous_state(train_input_path, ds)
    if source is not None:
        return spark.read.parquet(str(ds_partition(state_root(train_input_path), source))), source
    schema = T.StructType([T.StructField("user", T.StringType()), T.StructField(_EVENTS, event_type)])
    return spark.createDataFrame([], schema), None


def _histories(
    spark: SparkSession,
    rows: DataFrame,
    seq: BehaviorSequence,
    types: dict[str, InputType],
    train_input_path: str | Path,
    first: str,
    good: Column,
    keys: tuple[str, ...],
) -> tuple[DataFrame, DataFrame, DataFrame, str | None]:
    """The history columns of ``rows``, whose events are ordered by ``(*keys, time)``: a day's
    (no keys) or a range's (the day column first). Returns (rows with the history columns,
    the moments: ``user, *keys, t, cum``, the state before ``first``, its ds or None)."""
    n = seq.max_length
    # the join below shuffles: each row's place, to give the rows back in their logged order
    rows = rows.withColumn("_seq_row", F.monotonically_increasing_id())
    rows = rows.withColumn("_seq_user", clean_id(F.col(seq.user_field), types[seq.user_field]))
    rows = rows.withColumn("_seq_t", F.col(seq.time_field).cast(T.LongType()))
    counts = good & F.col("_seq_t").isNotNull()
    events = rows.filter(counts).select(
        F.col("_seq_user").alias("user"), *keys, _event(seq, types).alias("e")
    )

    # the events grouped by user and time ("moments", each its events in order); a moment's
    # running history: the last n events up to and including it (n moments hold at least n)
    moments = events.groupBy("user", *keys, F.col("e").getField(_T).alias(_T)).agg(
        F.array_sort(F.collect_list("e")).alias("here")
    )
    running = Window.partitionBy("user").orderBy(*keys, _T).rowsBetween(-(n - 1), 0)
    moments = moments.select(
        "user",
        *keys,
        _T,
        F.lit(1).alias("kind"),
        _last(F.flatten(F.collect_list("here").over(running)), n).alias("cum"),
    )
    # each row's history: the running history of the user's last moment strictly before its
    # time (a row sorts before a moment at its own time; a row without a time gets none)
    asked = rows.select(F.col("_seq_user").alias("user"), *keys, F.col("_seq_t").alias(_T)).distinct()
    asked = asked.select(
        "user",
        *keys,
        _T,
        F.lit(0).alias("kind"),
        F.lit(None).cast(moments.schema["cum"].dataType).alias("cum"),
    )
    prior = (
        Window.partitionBy("user")
        .orderBy(*keys, F.col(_T).asc_nulls_first(), "kind")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    today = (
        asked.unionByName(moments)
        .withColumn("prior", F.last("cum", ignorenulls=True).over(prior))
        .filter(F.col("kind") == 0)
    )
    state, source = _read_state(spark, train_input_path, first, moments.schema["cum"].dataType)
    history = today.join(state, "user", "left").select(
        F.col("user").alias("_seq_user"),
        *keys,
        F.col(_T).alias("_seq_t"),
        _both(_EVENTS, "prior", n, state).alias("_seq_h"),
    )
    joined = rows.join(history, ["_seq_user", *keys, "_seq_t"], "left")
    # a day: its rows back in their logged order here; a range keeps each row's place
    # (``ROW``) for its writer to order by (the sort of a write partitioned by day would
    # otherwise replace this one)
    joined = joined.withColumnRenamed("_seq_row", ROW) if keys else joined.orderBy("_seq_row")
    histories = F.coalesce(F.col("_seq_h"), _empty(state))
    columns = [F.transform(histories, _value(i)).alias(seq.column(f)) for i, f in enumerate(seq.fields)]
    out = joined.select(*[c for c in joined.columns if not c.startswith("_seq_")], *columns)
    return out, moments, state, source


def _empty(state: DataFrame) -> Column:
    return F.array().cast(state.schema[_EVENTS].dataType)


def _both(earlier: str, later: str, n: int, state: DataFrame) -> Column:
    """The last ``n`` events of ``earlier`` then ``later`` (either may be null)."""
    empty = _empty(state)
    return _last(F.concat(F.coalesce(F.col(earlier), empty), F.coalesce(F.col(later), empty)), n)


def add_histories(
    spark: SparkSession,
    rows: DataFrame,
    seq: BehaviorSequence,
    types: dict[str, InputType],
    train_input_path: str | Path,
    ds: str,
    good: Column,
) -> tuple[DataFrame, DataFrame, dict]:
    """Add the history columns to ``rows`` (``<prefix><field>``: ``array<string>``, oldest
    first, at most ``max_length``) and build the state at the end of ``ds``. The rows keep
    their order (a config with histories writes a day's rows as one without them does).

    Args:
        rows: the day's parsed rows (with the dimension columns joined).
        types: input type of every column (``data_config.all_fields``).
        ds: the day or pass being prepared.
        good: the rows that count as events (not quarantined); with ``positive_only`` also
            a positive first label is needed.

    Returns:
        (rows with the history columns, the new state: ``user string, _events``, figures:
        ``{"state_from": ds or None}``).
    """
    out, moments, state, source = _histories(spark, rows, seq, types, train_input_path, ds, good, ())
    # the user's last moment's running history: the day's last n events
    ends = moments.groupBy("user").agg(F.max_by("cum", _T).alias("today"))
    new_state = (
        state.join(ends, "user", "full")
        .select("user", _both(_EVENTS, "today", seq.max_length, state).alias(_EVENTS))
        .filter(F.size(_EVENTS) > 0)
    )
    return out, new_state, {"state_from": source}


def add_range_histories(
    spark: SparkSession,
    rows: DataFrame,
    seq: BehaviorSequence,
    types: dict[str, InputType],
    train_input_path: str | Path,
    days: list[str],
    good: Column,
    day: str,
) -> tuple[DataFrame, DataFrame, str | None]:
    """``add_histories`` over consecutive ``days`` in one job: each row's history holds the
    state before ``days[0]``, the user's events of the range's earlier days, then the same
    day's events strictly before the row's time (what preparing the days one after another
    gives, row by row). ``rows``' column ``day`` names each row's day.

    Returns:
        (rows with the history columns and ``ROW``, each row's place in the files: order a
        day's rows by it; the state at the end of each day: ``user string, <day> string,
        _events``; the ds of the state before ``days[0]`` or None).
    """
    out, moments, state, source = _histories(spark, rows, seq, types, train_input_path, days[0], good, (day,))
    # each user's state at each day's end: the running history of their last moment up to
    # that day (carried over days without events), after the state before the range
    ends = moments.groupBy("user", day).agg(F.max_by("cum", _T).alias("today"))
    users = state.select("user").unionByName(ends.select("user")).distinct()
    grid = users.crossJoin(spark.createDataFrame([(d,) for d in days], [day]))
    carried = Window.partitionBy("user").orderBy(day).rowsBetween(Window.unboundedPreceding, 0)
    states = (
        grid.join(ends, ["user", day], "left")
        .withColumn("today", F.last("today", ignorenulls=True).over(carried))
        .join(state, "user", "left")
        .select("user", day, _both(_EVENTS, "today", seq.max_length, state).alias(_EVENTS))
        .filter(F.size(_EVENTS) > 0)
    )
    return out, states, source


def sequence_length_columns(config: PipelineConfig) -> list:
    """Per SequenceFeature over a history column, aggregations of its mean length and share of
    empty histories (``<feature>.mean_length``, ``<feature>.empty_share``)."""
    columns = set(config.data_config.behavior_sequence.columns)
    aggs = []
    for f in config.feature_config.features:
        if f.feature_type == FeatureType.SequenceFeature and f.input_names[0] in columns:
            size = F.size(F.col(f.name))
            aggs += [
                F.mean(size).alias(f"{f.name}.mean_length"),
                F.mean((size == 0).cast("double")).alias(f"{f.name}.empty_share"),
            ]
    return aggs


def write_state(state: DataFrame, path: Path) -> None:
    """Write a state to ``path`` (a temporary directory the caller renames), ``_SUCCESS`` last."""
    state.write.mode("overwrite").parquet(str(path))
    (path / SUCCESS).touch()
