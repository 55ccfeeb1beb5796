"""What recpipe keeps on disk, in one place: day partitions, feature partitions, model dirs
and ``ds`` ranges. Every file name another process reads is defined here and nowhere else.

::

    <raw_input_path>/ds=YYYY-MM-DD/*.csv, _SUCCESS          one raw day (written by the logs)
    <raw_input_path>/ds=YYYY-MM-DD/hh=HH/*.csv, _SUCCESS    or one raw hour: a pass
    <raw_input_path>/ds=YYYY-MM-DD/hh=HHMM/...              or a shorter pass, named by its start
    <train_input_path>/ds=YYYY-MM-DD[/hh=HH]/part-*.parquet  one feature day or pass (features.prepare)
                                    _stats.json, _normalization.json, _SUCCESS
    <runs_dir>/<model_name>/ds=YYYY-MM-DD[/hh=HH]/            a day's or a pass's model dir:
    <model_dir>/model.ckpt-<step>.*, checkpoint              checkpoints (TensorFlow's names)
               train/                                        TensorBoard summaries
               train_metrics.jsonl, eval_history.jsonl       one line per logged step / evaluation
               eval/eval_result-<step>.json, eval_result.json
               best/                                         exporter_type best: the best evaluated checkpoint
               eval_predictions.parquet, champion_eval_*          per-row label, probability (the gate's)
               normalization.json, pipeline.yaml             what serving and MLflow need
               fine_tune.json                                what the job was warm-started from
               train_done.json                               the chief's end-of-training marker
               train_result.json, _SUCCESS                   the train task's result, then done
               export.json                                   the export task's result
               mlflow_model/                                 the export as an MLflow Model (pyfunc)
               logs/<job>-<i>.log                            one log per process of a job
               .lock, .readers                               recpipe.locks: who trains / reads it
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from recpipe.config.errors import ConfigError

SUCCESS = "_SUCCESS"  # written last into a directory that is complete
CHECKPOINT_PREFIX = "model.ckpt"
DAY_KEY, HOUR_KEY = "ds=", "hh="  # partition directory names: ds=YYYY-MM-DD, hh=HH
# an evaluation task's result in a model dir (``ModelDir.result``), by task
EVAL_RESULT = "eval_result.json"
CHAMPION_EVAL_RESULT = "champion_eval_result.json"
# in an export's assets.extra/: each online-store table's inputs of serving_rows (trainer.serving)
SERVING_ROWS = "serving_rows.json"
PIPELINE_ASSET = "pipeline.json"  # in an export's assets.extra/: the effective config
SAVED_MODEL_RECORD = "recpipe_export.json"  # in assets.extra/: which model dir and step it holds
RESERVED_ASSETS = frozenset({SERVING_ROWS, PIPELINE_ASSET, SAVED_MODEL_RECORD})
PASS_EVAL_RESULT = "pass_eval_result.json"  # progressive: the pass's rows before training
DAY_EVAL_RESULT = "day_eval_result.json"  # the day's progressive scores, pooled
EXPORT_RECORD, SERVING_EXPORT_RECORD = "export.json", "serving_export.json"

# A ``ds`` names a day (``YYYY-MM-DD``) or one pass of it (PaddleRec's pass of the online
# trainer): an hour's ``YYYY-MM-DD/HH``, or a shorter pass's ``YYYY-MM-DD/HHMM``, named by its
# start. Every function below that takes a ``ds`` takes any of them.
PASS_MINUTES = (5, 10, 15, 20, 30, 60)  # the pass lengths: each divides the hour
_SHORTEST = PASS_MINUTES[0]


def pass_key(hour: int, minute: int = 0, pass_minutes: int = 60) -> str:
    """A pass's name within its day: ``HH`` for an hour's pass, ``HHMM`` for a shorter one
    (``pass_key(5, 15, 15)`` -> ``0515``).

    Raises:
        ValueError: ``pass_minutes`` not in ``PASS_MINUTES``, or a start that is no pass's.
    """
    if pass_minutes not in PASS_MINUTES:
        raise ValueError(f"a pass lasts one of {PASS_MINUTES} minutes, got {pass_minutes}")
    if not 0 <= hour <= 23 or not 0 <= minute < 60 or minute % pass_minutes:
        raise ValueError(f"{hour:02d}:{minute:02d} starts no pass of {pass_minutes} minutes")
    return f"{hour:02d}" if pass_minutes == 60 else f"{hour:02d}{minute:02d}"


def pass_key_format(pass_minutes: int = 60) -> str:
    """The ``strftime`` format naming the pass that starts at a time (a DAG run's logical date):
    ``%H``, or ``%H%M`` for passes shorter than an hour."""
    pass_key(0, 0, pass_minutes)  # validates
    return "%H" if pass_minutes == 60 else "%H%M"


def split_pass(ds: str) -> tuple[str, int | None]:
    """``1997-09-20/05`` -> (``1997-09-20``, 300); ``1997-09-20/0515`` -> (``1997-09-20``,
    315); ``1997-09-20`` -> (``1997-09-20``, None): the day and its pass's start, in minutes
    after midnight.

    Raises:
        ValueError: a malformed day or pass: an hour outside 00..23, minutes not a multiple of
            5 below 60.
    """
    day, sep, key = ds.partition("/")
    try:
        date.fromisoformat(day)
    except ValueError as err:  # Python's words ("Invalid isoformat string") name no format
        reason = "" if "isoformat" in str(err) else f" ({err})"
        raise ValueError(f"{day!r} is not a date YYYY-MM-DD{reason}") from None
    if not sep:
        return day, None
    if len(key) not in (2, 4) or not key.isdigit():
        raise ValueError(f"{ds!r}: the pass after '/' must be HH (00..23) or HHMM")
    hour, minute = int(key[:2]), int(key[2:] or 0)
    if hour > 23 or minute >= 60 or minute % _SHORTEST:
        raise ValueError(
            f"{ds!r}: the pass after '/' must be HH (00..23) or HHMM (MM a multiple of {_SHORTEST})"
        )
    return day, hour * 60 + minute


def split_ds(ds: str) -> tuple[str, int | None]:
    """``1997-09-20/05`` -> (``1997-09-20``, 5); ``1997-09-20/0515`` -> (``1997-09-20``, 5);
    ``1997-09-20`` -> (``1997-09-20``, None): the day and its pass's hour.

    Raises:
        ValueError: as ``split_pass``.
    """
    day, start = split_pass(ds)
    return day, None if start is None else start // 60


def pass_of(ds: str) -> str | None:
    """A ``ds``'s pass key (``HH`` or ``HHMM``), None for a day."""
    split_pass(ds)
    return ds.partition("/")[2] or None


def pass_step(ds: str) -> int:
    """A pass's place in its day as a number (the MLflow step of its day's curve): an hour's
    pass its hour, a shorter pass its minute of the day (``1997-09-20/0515`` -> 315)."""
    _, start = split_pass(ds)
    key = ds.partition("/")[2]
    return int(key) if len(key) == 2 else start


def day_of(ds: str) -> str:
    """The day of a ``ds``: ``1997-09-20/05`` -> ``1997-09-20``."""
    return ds.partition("/")[0]


def span(ds: str) -> tuple[int, int]:
    """The minutes a ``ds`` covers, ``[start, end)`` counted from 0001-01-01: a day its 1440,
    an hour's pass its 60, a shorter pass (whose length its name does not give) at least its
    first 5; so that a day, its passes and a range of either compare by overlap."""
    day, start = split_pass(ds)
    origin = date.fromisoformat(day).toordinal() * 1440
    if start is None:
        return origin, origin + 1440
    return origin + start, origin + start + (60 if len(ds.partition("/")[2]) == 2 else _SHORTEST)


def overlaps(a: str, b: str) -> bool:
    """Whether two ``ds`` cover a common minute (``span``)."""
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def partition_text(root: str, day: str, hh: str | None = None) -> str:
    """``<root>/ds=<day>[/hh=<hh>]`` as text, the parts as given: a DAG's templated paths
    (``day`` ``{{ ds }}``), which ``ds_partition`` cannot check."""
    return f"{root}/{DAY_KEY}{day}" + (f"/{HOUR_KEY}{hh}" if hh is not None else "")


def day_name(day: str) -> str:
    """A day's partition directory name: ``ds=<day>``."""
    return f"{DAY_KEY}{day}"


def is_pass_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a pass's partition (``.../hh=HH[MM]``), not a day's."""
    return Path(path).name.startswith(HOUR_KEY)


def day_dirs(root: str | os.PathLike) -> list[Path]:
    """The ``ds=`` directories under ``root``, unordered."""
    return [p for p in Path(root).glob(f"{DAY_KEY}*") if p.is_dir()]


def pass_dirs(day_dir: str | os.PathLike) -> list[Path]:
    """The ``hh=`` directories of one day, unordered."""
    return [p for p in Path(day_dir).glob(f"{HOUR_KEY}*") if p.is_dir()]


def ds_partition(root: str | os.PathLike, ds: str) -> Path:
    """``<root>/ds=<day>``, or ``<root>/ds=<day>/hh=<HH>`` for a pass ``<day>/<HH>``."""
    day, sep, key = ds.partition("/")
    return pass_partition(root, day, key) if sep else Path(root) / day_name(day)


def pass_partition(root: str | os.PathLike, ds: str, key: str) -> Path:
    """``<root>/ds=<ds>/hh=<key>``: one pass of a day (``key`` ``HH`` or ``HHMM``, ``pass_key``).

    Raises:
        ValueError: a malformed key.
    """
    split_pass(f"{ds}/{key}")
    return Path(root) / day_name(ds) / f"{HOUR_KEY}{key}"


def partition_ds(path: str | os.PathLike) -> str:
    """``.../ds=1997-09-22`` -> ``1997-09-22``; ``.../ds=1997-09-22/hh=05`` -> ``1997-09-22/05``."""
    path = Path(path)
    if is_pass_dir(path):
        return f"{path.parent.name.removeprefix(DAY_KEY)}/{path.name.removeprefix(HOUR_KEY)}"
    return path.name.removeprefix(DAY_KEY)


def is_finished(directory: str | os.PathLike) -> bool:
    """The directory carries ``_SUCCESS``."""
    return (Path(directory) / SUCCESS).exists()


def parse_ds_range(text: str, field: str = "ds", pass_minutes: int | None = None) -> list[str]:
    """``YYYY-MM-DD`` or ``START:END`` (inclusive) -> the days in it; with passes,
    ``YYYY-MM-DD/HH[:YYYY-MM-DD/HH]`` -> the hours' passes in it (``1997-09-20/22:1997-09-21/01``
    -> ``1997-09-20/22``, ``/23``, ``1997-09-21/00``, ``/01``), and ``.../HHMM`` ends -> the
    passes starting every ``pass_minutes`` in it (default 5, every start a shorter pass can
    have: a reader of the partitions that exist finds each pass whatever its length).

    Raises:
        ConfigError: malformed dates or passes, ends of two kinds (a day and a pass, ``HH`` and
            ``HHMM``), END before START, or ``pass_minutes`` that the ends' starts do not fit
            (names ``field``).
    """
    start, _, end = text.partition(":")
    end = end or start
    try:
        (first, m0), (last, m1) = split_pass(start), split_pass(end)
    except ValueError as err:
        raise ConfigError(
            f"{field}={text!r}: {err}; expected YYYY-MM-DD (a day), YYYY-MM-DD/HH or "
            "YYYY-MM-DD/HHMM (a pass), or START:END of either"
        ) from None
    k0, k1 = start.partition("/")[2], end.partition("/")[2]
    if len(k0) != len(k1):
        raise ConfigError(f"{field}={text!r}: give both ends as days, as HH or as HHMM passes")
    if (last, m1 or 0) < (first, m0 or 0):
        raise ConfigError(f"{field}={text!r}: end before start")
    d0, d1 = date.fromisoformat(first), date.fromisoformat(last)
    days = [(d0 + timedelta(days=k)).isoformat() for k in range((d1 - d0).days + 1)]
    if m0 is None:
        return days
    step = 60 if len(k0) == 2 else (pass_minutes or _SHORTEST)
    if len(k0) == 4 and (step not in PASS_MINUTES[:-1] or m0 % step or m1 % step):
        raise ConfigError(f"{field}={text!r}: no passes of {step} minutes start at both ends")
    keys = [f"{m // 60:02d}" if step == 60 else f"{m // 60:02d}{m % 60:02d}" for m in range(0, 1440, step)]
    passes = [f"{d}/{k}" for d in days for k in keys]
    per_day = len(keys)
    return passes[m0 // step : len(passes) - (per_day - 1 - m1 // step)]


def ds_window(ds: str, days: int) -> str:
    """The ``START:ds`` range of ``days`` days ending on ``ds``."""
    end = date.fromisoformat(ds)
    return f"{(end - timedelta(days=days - 1)).isoformat()}:{ds}"


def finished_partitions(root: str | os.PathLike, days: list[str]) -> list[Path]:
    """The ``ds=`` partitions of ``days`` under ``root`` that carry ``_SUCCESS``, in order."""
    return [p for p in (ds_partition(root, d) for d in days) if is_finished(p)]


@dataclass(frozen=True)
class FeaturePartition:
    """One prepared day: Parquet files plus the Spark job's side files."""

    path: Path

    @classmethod
    def of(cls, root: str | os.PathLike, ds: str) -> FeaturePartition:
        return cls(ds_partition(root, ds))

    @property
    def ds(self) -> str:
        return partition_ds(self.path)

    @property
    def stats(self) -> Path:
        """``_stats.json``: rows, positive rate, nulls, dense moments, quarantine counts."""
        return self.path / "_stats.json"

    @property
    def normalization(self) -> Path:
        """``_normalization.json``: the dense fill / normaliser constants applied."""
        return self.path / "_normalization.json"

    @property
    def success(self) -> Path:
        return self.path / SUCCESS


@dataclass(frozen=True)
class ModelDir:
    """A training run's directory (see the module docstring for what it holds)."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    checkpoint_state = property(lambda self: self.path / "checkpoint")
    summaries = property(lambda self: self.path / "train")
    train_metrics = property(lambda self: self.path / "train_metrics.jsonl")
    eval_history = property(lambda self: self.path / "eval_history.jsonl")
    best = property(lambda self: self.path / "best")
    eval_result = property(lambda self: self.path / EVAL_RESULT)
    normalization = property(lambda self: self.path / "normalization.json")
    pipeline_config = property(lambda self: self.path / "pipeline.yaml")
    fine_tune = property(lambda self: self.path / "fine_tune.json")
    train_done = property(lambda self: self.path / "train_done.json")
    train_result = property(lambda self: self.path / "train_result.json")
    success = property(lambda self: self.path / SUCCESS)
    export_record = property(lambda self: self.path / EXPORT_RECORD)
    mlflow_model = property(lambda self: self.path / "mlflow_model")
    logs = property(lambda self: self.path / "logs")

    def eval_result_at(self, step: int) -> Path:
        """``eval/eval_result-<step>.json``: one evaluation while training."""
        return self.path / "eval" / f"eval_result-{step}.json"

    def result(self, name: str) -> Path:
        """A named result file of an evaluation task (``champion_eval_result.json``)."""
        return self.path / name

    def tracked(self, result_name: str) -> Path:
        """The MLflow run id that a result was logged to (``mlflow/<result>.run_id``): a re-run
        task that finds it logs nothing twice."""
        return self.path / "mlflow" / f"{result_name}.run_id"

    def predictions(self, result_name: str) -> Path:
        """The per-row labels and probabilities beside a result: ``eval_result.json`` ->
        ``eval_predictions.parquet``."""
        stem = result_name.removesuffix(".json").removesuffix("_result")
        return self.path / f"{stem}_predictions.parquet"


def model_dirs(runs_root: str | os.PathLike) -> list[Path]:
    """Every model dir under ``runs_root``, finished or not, oldest first: ``ds=D`` in the
    daily layout, ``ds=D/hh=HH`` in the hourly one (a ``ds=D`` holding passes is no model dir)."""
    found = []
    for day in day_dirs(runs_root):
        found += pass_dirs(day) or [day]
    return sorted(found, key=partition_ds)


def expired_model_dirs(runs_root: str | os.PathLike, keep_days: int, protected) -> list[Path]:
    """The model dirs retention may delete, oldest first: those of the days before the newest
    ``keep_days`` day dirs, except one that is, holds or lies in a ``protected`` path (the
    champion's model dir or checkpoint, a day or a pass). One rule for both layouts: a pass's
    dir is deleted (and locked, ``recpipe.locks``) as the unit trainers and readers lock.

    Args:
        runs_root: ``<runs_dir>/<model_name>``.
        keep_days: how many of the newest days to keep whole (>= 0).
        protected: paths (resolved or not) that must survive.
    """
    keep = {p.resolve() for p in protected}
    days = sorted(day_dirs(runs_root), reverse=True)
    old = {p.resolve() for p in days[keep_days:]}

    def safe(path: Path) -> bool:
        path = path.resolve()
        return not any(path == k or k.is_relative_to(path) or path.is_relative_to(k) for k in keep)

    return [
        p for p in model_dirs(runs_root) if (p.parent if is_pass_dir(p) else p).resolve() in old and safe(p)
    ]


def finished_model_dirs(runs_root: str | os.PathLike, before: str | None = None) -> list[Path]:
    """The model dirs under ``runs_root`` whose training finished (``_SUCCESS``), oldest first:
    days (``ds=D``) and passes (``ds=D/hh=HH``); with ``before`` (a day or a pass), only those
    dated before it."""
    return [
        p for p in model_dirs(runs_root) if (before is None or partition_ds(p) < before) and is_finished(p)
    ]


def fine_tuned_from(model_dir: str | os.PathLike) -> Path | None:
    """The model dir ``model_dir``'s training was warm-started from (its ``fine_tune.json``
    ``source``: a model dir or a checkpoint prefix in one), resolved; None when it started
    from scratch or records nothing."""
    record = ModelDir(model_dir).fine_tune
    try:
        source = json.loads(record.read_text()).get("source")
    except (OSError, ValueError):
        return None
    if not source:
        return None
    path = Path(source)
    # a checkpoint prefix (model.ckpt-N) names its model dir's file
    return (path.parent if not path.is_dir() and ".ckpt" in path.name else path).resolve()


def day_root(pass_dir: str | os.PathLike) -> Path | None:
    """Where the day's chain of passes that ``pass_dir`` (``.../ds=D/hh=HH``) belongs to
    started: following each pass's ``fine_tuned_from`` back through its own day, the first
    model dir outside that day (a champion, an earlier day's pass), resolved; None when the
    chain started from scratch or a pass records nothing."""
    day = Path(pass_dir).resolve().parent
    seen: set[Path] = set()
    here: Path | None = Path(pass_dir).resolve()
    while here is not None and here.parent == day and here not in seen:
        seen.add(here)
        here = fine_tuned_from(here)
    return here if here is not None and here.parent != day else None
