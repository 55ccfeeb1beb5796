"""What recpipe keeps on disk, in one place: day partitions, feature partitions, model dirs
and ``ds`` ranges. Every file name another process reads is defined here and nowhere else.

::

    <raw_input_path>/ds=YYYY-MM-DD/*.csv, _SUCCESS          one raw day (written by the logs)
    <train_input_path>/ds=YYYY-MM-DD/part-*.parquet          one feature day (features.prepare)
                                    _stats.json, _normalization.json, _SUCCESS
    <model_dir>/model.ckpt-<step>.*, checkpoint              checkpoints (TensorFlow's names)
               train/                                        TensorBoard summaries
               train_metrics.jsonl, eval_history.jsonl       one line per logged step / evaluation
               eval/eval_result-<step>.json, eval_result.json
               eval_predictions.parquet, champion_eval_*          per-row label, probability (the gate's)
               normalization.json, pipeline.yaml             what serving and MLflow need
               train_done.json                               the chief's end-of-training marker
               train_result.json, _SUCCESS                   the train task's result, then done
               export.json                                   the export task's result
               mlflow_model/                                 the export as an MLflow Model (pyfunc)
               logs/<job>-<i>.log                            one log per process of a job
               .lock, .readers                               recpipe.locks: who trains / reads it
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from recpipe.config.errors import ConfigError

SUCCESS = "_SUCCESS"  # written last into a directory that is complete
CHECKPOINT_PREFIX = "model.ckpt"


def ds_partition(root: str | os.PathLike, ds: str) -> Path:
    """``<root>/ds=<ds>``."""
    return Path(root) / f"ds={ds}"


def hour_partition(root: str | os.PathLike, ds: str, hh: str | int) -> Path:
    """``<root>/ds=<ds>/hh=<HH>``: one hour of a day (PaddleRec's pass), ``hh`` 0-23."""
    hour = int(hh)
    if not 0 <= hour <= 23:
        raise ValueError(f"hh must be 00..23, got {hh!r}")
    return ds_partition(root, ds) / f"hh={hour:02d}"


def partition_ds(path: str | os.PathLike) -> str:
    """``.../ds=1997-09-22`` -> ``1997-09-22``."""
    return Path(path).name.removeprefix("ds=")


def is_finished(directory: str | os.PathLike) -> bool:
    """The directory carries ``_SUCCESS``."""
    return (Path(directory) / SUCCESS).exists()


def parse_ds_range(text: str, field: str = "ds") -> list[str]:
    """``YYYY-MM-DD`` or ``START:END`` (inclusive) -> the days in it.

    Raises:
        ConfigError: malformed dates, or END before START (names ``field``).
    """
    start, _, end = text.partition(":")
    try:
        first, last = date.fromisoformat(start), date.fromisoformat(end or start)
    except ValueError as err:
        raise ConfigError(f"{field}={text!r}: expected YYYY-MM-DD[:YYYY-MM-DD] ({err})") from None
    if last < first:
        raise ConfigError(f"{field}={text!r}: end before start")
    return [(first + timedelta(days=k)).isoformat() for k in range((last - first).days + 1)]


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
    eval_result = property(lambda self: self.path / "eval_result.json")
    normalization = property(lambda self: self.path / "normalization.json")
    pipeline_config = property(lambda self: self.path / "pipeline.yaml")
    train_done = property(lambda self: self.path / "train_done.json")
    train_result = property(lambda self: self.path / "train_result.json")
    success = property(lambda self: self.path / SUCCESS)
    export_record = property(lambda self: self.path / "export.json")
    mlflow_model = property(lambda self: self.path / "mlflow_model")
    logs = property(lambda self: self.path / "logs")

    def eval_result_at(self, step: int) -> Path:
        """``eval/eval_result-<step>.json``: one evaluation while training."""
        return self.path / "eval" / f"eval_result-{step}.json"

    def result(self, name: str) -> Path:
        """A named result file of an evaluation task (``champion_eval_result.json``)."""
        return self.path / name

    def predictions(self, result_name: str) -> Path:
        """The per-row labels and probabilities beside a result: ``eval_result.json`` ->
        ``eval_predictions.parquet``."""
        stem = result_name.removesuffix(".json").removesuffix("_result")
        return self.path / f"{stem}_predictions.parquet"


def finished_model_dirs(runs_root: str | os.PathLike, before: str | None = None) -> list[Path]:
    """The ``ds=`` model dirs under ``runs_root`` whose training finished (``_SUCCESS``),
    oldest first; with ``before``, only those dated before that day."""
    return sorted(
        p
        for p in Path(runs_root).glob("ds=*")
        if (before is None or partition_ds(p) < before) and is_finished(p)
    )
