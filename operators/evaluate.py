"""``EvalOperator``: score a checkpoint on a day's held-out rows, as its own task."""

# Imports inside functions defer numpy and pyarrow off the DAG files'
# parse.

from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any

from operators.base import JobOperator
from operators.paths import confine
from recpipe.config.model import Metric
from recpipe.layout import EVAL_RESULT, ModelDir, day_name, ds_partition, parse_ds_range

log = logging.getLogger(__name__)
METRIC_KEYS = tuple(Metric.model_fields)  # eval_config.metrics_set's names


def _metric_key(key: str) -> bool:
    """A metric of ``eval_result.json``: one of ``METRIC_KEYS``, or a multi-task model's
    ``<task>/<metric>``."""
    return key.rsplit("/", 1)[-1] in METRIC_KEYS and key.count("/") <= 1


class EvalOperator(JobOperator):
    """Evaluate ``checkpoint_path`` (or ``model_dir``'s latest, or the registered champion's)
    on ``eval_ds``; days also in ``train_ds`` contribute only their held-out rows.

    Args:
        model_dir: the run's model dir; the result goes to ``<model_dir>/<result_name>`` (templated).
        eval_ds, train_ds: days (``YYYY-MM-DD`` or ``START:END``) (templated).
        checkpoint_path: a checkpoint or model dir (templated; default ``model_dir``).
        champion_of: a registered model name: evaluate the checkpoint of its ``alias`` version
            instead (the tag ``checkpoint`` set at registration); without one, nothing to do.
        result_name: file name of the result in ``model_dir``.
        step: the MLflow nested run's name, and the prefix of the metrics on the parent run.

    Returns (XCom): ``{"metrics": {...} | None, "checkpoint", "num_examples", "global_step",
    "predictions", "mlflow_run_id", "reason", "version"}`` (``predictions``: each row's label and
    probability, Parquet, for the gate's paired test; ``version``: with ``champion_of``, the
    champion version evaluated, or None: the version the gate's move expects to replace).
    """

    template_fields = (*JobOperator.template_fields, "model_dir", "eval_ds", "train_ds", "checkpoint_path")
    ui_color = "#d4f0f7"

    def __init__(
        self,
        *,
        model_dir: str,
        eval_ds: str = "{{ ds }}",
        train_ds: str | None = None,
        checkpoint_path: str | None = None,
        champion_of: str | None = None,
        alias: str = "champion",
        result_name: str = EVAL_RESULT,
        step: str = "eval",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.model_dir = model_dir
        self.eval_ds = eval_ds
        self.train_ds = train_ds
        self.checkpoint_path = checkpoint_path
        self.champion_of = champion_of
        self.alias = alias
        self.result_name = result_name
        self.step = step
        self._version = None  # the champion version evaluated: the gate's compare-and-set expects it

    def _checkpoint(self) -> tuple[str | None, str]:
        if self.champion_of:
            version = self.hook.champion(self.champion_of, self.alias)
            self._version = None if version is None else int(version.version)
            if version is None:
                return None, f"registered model {self.champion_of!r} has no {self.alias!r} yet"
            ckpt = version.tags.get("checkpoint")
            if ckpt:  # a registry tag is input like any other: it must stay in the data roots
                ckpt = str(confine(ckpt, f"{self.alias} version {version.version}'s tag checkpoint"))
            if not ckpt or not Path(ckpt + ".index").exists():
                return None, f"{self.alias} version {version.version} has no checkpoint on disk ({ckpt})"
            return ckpt, f"{self.alias} version {version.version}"
        return str(confine(self.checkpoint_path or self.model_dir, "checkpoint_path")), "model_dir"

    def execute(self, context) -> dict[str, Any]:
        model_dir = confine(self.model_dir, "model_dir")
        checkpoint, what = self._checkpoint()
        if checkpoint is None:
            log.info("nothing to evaluate: %s", what)
            return {"metrics": None, "reason": what, "version": self._version}
        edits = {"eval_ds": self.eval_ds, **({"train_ds": self.train_ds} if self.train_ds else {})}
        config = self.load_config(edits)
        out = ModelDir(model_dir)
        result_path = out.result(self.result_name)
        predictions = out.predictions(self.result_name)
        args = [
            *self.config_args(edits),
            "--model_dir",
            str(model_dir),
            "--checkpoint_path",
            checkpoint,
            "--eval_result_path",
            str(result_path),
            "--predictions_path",
            str(predictions),
        ]
        log.info("evaluating %s (%s) on eval_ds=%s", checkpoint, what, self.eval_ds)
        line = self.run_command(self.step, "trainer.eval", args, out.logs)
        return {
            **self._report(context, config, result_path, predictions, what, line),
            "version": self._version,
        }

    def _report(self, context, config, result_path: Path, predictions: Path, what: str, line=None) -> dict:
        """The XCom of an evaluation whose job wrote ``result_path`` and ``predictions``, its
        metrics logged to MLflow."""
        result = json.loads(result_path.read_text())
        # an undefined metric (NaN: GAUC with no user holding both labels) is None: XCom is JSON
        metrics = {
            k: v if math.isfinite(v) else None
            for k, v in result.items()
            if _metric_key(k) and isinstance(v, (int, float))
        }
        out = {
            "metrics": metrics,
            "checkpoint": result["checkpoint"],
            "global_step": result["global_step"],
            "num_examples": result["num_examples"],
            "predictions": str(predictions),
            "reason": what,
            "dataset": eval_dataset(config, self.eval_ds, predictions),
            "peak_rss_mb": line.get("peak_rss_mb") if isinstance(line, dict) else None,
        }
        out["mlflow_run_id"] = self._track(context, result_path, out)
        return out

    def _track(self, context, result_path: Path, out: dict) -> str:
        step = out["global_step"]
        return self.hook.log_task_run(
            self.parent_run_id(context),
            self.step,
            tags={"checkpoint": out["checkpoint"], "evaluated": out["reason"]},
            metrics=[
                *((k, v, step) for k, v in out["metrics"].items() if v is not None),
                ("num_examples", out["num_examples"], step),
                *((("peak_rss_mb", out["peak_rss_mb"], step),) if out.get("peak_rss_mb") else ()),
            ],
            parent_metrics=[(f"{self.step}.{k}", v, 0) for k, v in out["metrics"].items() if v is not None],
            artifacts=[(result_path, None)],
            datasets=[out["dataset"]],
        )


def eval_dataset(config, eval_ds: str, predictions: Path) -> dict[str, str]:
    """The evaluated rows as an MLflow dataset: ``name`` ``ds=<eval_ds> held-out`` when the
    days are also trained on (their ``holdout_percent`` rows), else ``ds=<eval_ds>``;
    ``digest``: the first 16 hex digits of the SHA-256 of the rows' labels in file order
    (``float32``; the same rows give the same digest for champion and candidate); ``source``:
    the features partition (one day) or the features root (a range)."""
    import pyarrow.parquet as pq

    labels = pq.read_table(predictions, columns=["label"]).column("label").to_numpy()
    days = parse_ds_range(eval_ds, "eval_ds")
    trained = set(parse_ds_range(config.train_ds, "train_ds")) if config.train_ds else set()
    held_out = bool(trained & set(days)) and config.data_config.holdout_percent > 0
    root = Path(config.train_input_path)
    name = day_name(eval_ds) + (" held-out" if held_out else "")
    return eval_dataset_of(name, labels, ds_partition(root, days[0]) if len(days) == 1 else root)


def eval_dataset_of(name: str, labels, source: str | Path) -> dict[str, str]:
    """An MLflow dataset ``{"name", "digest", "source"}`` of scored rows: ``digest``, the
    first 16 hex digits of the SHA-256 of ``labels`` (``[N]``, as float32) in row order."""

    import numpy as np

    digest = hashlib.sha256(np.asarray(labels, dtype="float32").tobytes()).hexdigest()[:16]
    return {"name": name, "digest": digest, "source": str(source)}
