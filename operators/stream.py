"""The intraday retrain's operators (``recpipe_stream_retrain``): progressive validation of a
pass, its base or delta export, the push to the online store, and the check that a pass has
rows at all."""

# Imports inside execute defer pyarrow, numpy and redis off the DAG
# files' parse.

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from operators.base import JobOperator
from operators.evaluate import EvalOperator, eval_dataset_of
from operators.hooks.store import STORE_CONN_ID, store_client
from operators.paths import confine
from operators.warm_start import source
from recpipe import atomic
from recpipe.layout import (
    DAY_EVAL_RESULT,
    PASS_EVAL_RESULT,
    FeaturePartition,
    ModelDir,
    day_name,
    day_of,
    finished_model_dirs,
    is_finished,
    is_pass_dir,
    partition_ds,
    pass_step,
)

log = logging.getLogger(__name__)


def pass_has_rows(features_root: str, pass_ds: str) -> bool:
    """The prepared pass ``pass_ds`` holds rows (a quiet hour holds none: nothing to score, train
    or export). For Airflow's ``ShortCircuitOperator`` (whose context reserves the name ``ds``).

    Raises:
        FileNotFoundError: the pass was not prepared (no ``_stats.json``).
    """
    stats = json.loads(FeaturePartition.of(features_root, pass_ds).stats.read_text())
    log.info("pass %s: %d rows", pass_ds, stats["rows"])
    return stats["rows"] > 0


class ProgressiveEvalOperator(EvalOperator):
    """Progressive validation (PaddleRec's per-pass metric): score the model as it was before
    this pass, the one the pass's training starts from (``operators.warm_start.source``: the
    day's previous pass, a day's first pass the champion), on every row of the pass, as if
    before training on them. A one-process train job scored it already (``recpipe train
    --score_first``, with the model it had restored): this task reports that score; otherwise
    it scores that model in a job of its own. Besides the nested run, AUC, logloss and
    rows go to the day's run (``MLflowHook.day_run``) as ``pass_auc`` / ``pass_logloss`` /
    ``pass_rows`` with the hour as step: one curve a day. A re-run keeps the score it
    logged.

    Args:
        previous_in: the runs root holding the passes' model dirs (templated).
        model_name: the registered model whose champion a day's first pass starts from
            (templated; None: the newest pass before it).
        cold_start_from: another registered model whose champion a pass with nothing to
            start from starts from (``stream.cold_start_from``).
        The rest as ``EvalOperator`` (``eval_ds``: the pass, ``YYYY-MM-DD/HH[MM]``).
    """

    template_fields = (*EvalOperator.template_fields, "previous_in", "model_name")

    def __init__(
        self, *, previous_in: str, model_name: str | None = None, cold_start_from: str | None = None, **kwargs
    ):
        super().__init__(**kwargs)
        self.previous_in = previous_in
        self.model_name = model_name
        self.cold_start_from = cold_start_from

    def execute(self, context) -> dict[str, Any]:
        out = ModelDir(confine(self.model_dir, "model_dir"))
        scored, tracked = out.result(self.result_name), out.tracked(self.result_name)
        if tracked.exists():
            # a re-run: the score was taken before training, and logged
            log.info("pass %s was scored and logged before: keeping %s", self.eval_ds, scored)
            return {"metrics": json.loads(scored.read_text()), "reason": "scored before training"}
        if scored.exists():  # the one-process train job scored it (--score_first)
            what = "the train job's model before its first step"
            config = self.load_config({"eval_ds": self.eval_ds})
            result = self._report(context, config, scored, out.predictions(self.result_name), what)
        else:  # a job of its own, of the model the pass's training started from
            result = super().execute(context)
        if result.get("mlflow_run_id"):
            atomic.write_text(tracked, result["mlflow_run_id"])
        return result

    def _checkpoint(self) -> tuple[str | None, str]:

        root = confine(self.previous_in, "previous_in")
        registered = self.model_name and (self.hook, self.model_name, self.alias)
        found, why = source(
            root, str(self.eval_ds), None, registered, True, cold_start_from=self.cold_start_from
        )
        if found is None:
            return None, f"no model to start {self.eval_ds} from ({why})"
        return str(found), f"the model of pass {partition_ds(found)} ({why})"

    def _track(self, context, result_path: Path, out: dict) -> str:
        run = super()._track(context, result_path, out)
        day = day_of(str(self.eval_ds))
        series = self.hook.day_run(self.experiment_name(), context["dag"].dag_id, day)
        step = pass_step(str(self.eval_ds)) if "/" in str(self.eval_ds) else 0
        metrics = out["metrics"]
        rows = [(f"pass_{k}", metrics[k], step) for k in ("auc", "logloss") if metrics.get(k) is not None]
        self.hook.log_metrics(series, [*rows, ("pass_rows", out["num_examples"], step)])
        return run


class PassExportOperator(JobOperator):
    """Export a pass's model: the day's base (``<export_dir>/<day>/base/``, a SavedModel and
    every row) when the day has none yet, else the pass's delta (``delta-<pass>/``, the rows
    touched since the day's previous export, tombstones, dense weights); see
    ``trainer.delta``. A retry reuses what an earlier attempt recorded.

    Args:
        model_dir: the pass's trained model dir (templated).
        export_dir: the model's export root, ``<export_dir>/<model_name>`` (templated).
        ds: the pass, ``YYYY-MM-DD/HH`` or ``YYYY-MM-DD/HHMM`` (templated).

    Returns (XCom): ``{"export", "kind", "global_step", "bytes", "tables", "mlflow_run_id"}``.
    """

    template_fields = (*JobOperator.template_fields, "model_dir", "export_dir", "ds")
    ui_color = "#f7ecd4"

    def __init__(self, *, model_dir: str, export_dir: str, ds: str, **kwargs):
        super().__init__(**kwargs)
        self.model_dir, self.export_dir, self.ds = model_dir, export_dir, ds

    def execute(self, context) -> dict[str, Any]:
        out = ModelDir(confine(self.model_dir, "model_dir"))
        export_dir = confine(self.export_dir, "export_dir")
        done = json.loads(out.export_record.read_text()) if out.export_record.exists() else None
        if done and is_finished(done["export"]):
            # the train job's (one process) or an earlier attempt's
            log.info("reusing the export %s", done["export"])
        else:
            args = [*self.config_args(), "--model_dir", str(out.path)]
            args += pass_export_args(export_dir, str(self.ds))
            done = self.run_command("export", "trainer.export", args, out.logs)
            atomic.write_text(out.export_record, json.dumps(done))
        step = done["global_step"]
        metrics = [("export_bytes", done["bytes"], step)]
        for table, figures in done["tables"].items():
            metrics += [(f"{table}.{k}", v, step) for k, v in figures.items() if v is not None]
        run = self.hook.log_task_run(
            self.parent_run_id(context),
            "export",
            tags={"export_path": done["export"], "kind": done["kind"]},
            metrics=metrics,
            parent_metrics=[("export_bytes", done["bytes"], 0)],
        )
        return {**done, "mlflow_run_id": run}


def pass_export_args(export_dir: str | Path, pass_ds: str) -> list[str]:
    """``--export_dir`` and ``--base`` (the day has no finished base yet) or ``--delta`` for
    the pass ``pass_ds`` (``YYYY-MM-DD/HH[MM]``), as ``recpipe export`` and ``recpipe train``
    take them."""
    from recpipe.exports.files import BASE

    has_base = is_finished(Path(export_dir) / day_of(pass_ds) / BASE)
    return ["--export_dir", str(export_dir), "--delta" if has_base else "--base", pass_ds]


class OnlineStorePushOperator(BaseOperator):
    """Push a base or delta export's rows to the Redis embedding store
    (``recpipe.exports.store.EmbeddingStore.push_chain``): when the store is behind the export (a flushed or
    restarted store, a push lost earlier), the day's chain up to it is pushed in order
    instead; when the store is ahead (this task cleared and re-run after later passes), the
    push is a no-op with a warning, never a roll-back.

    Args:
        export_path: the export directory (templated; the export task's XCom).
        model_name: the model's name in the store (templated).
        redis_conn_id: the store's Airflow connection (``operators.hooks.store``).
        redis_url: the retrain config's ``stream.redis_url``, used when neither the
            connection nor ``$RECPIPE_REDIS_URL`` names the store (no password: that goes in
            the connection).

    Returns (XCom): ``{"rows", "deleted", "stale", "pushed"}`` (``pushed``: the exports
    written).
    """

    template_fields = ("export_path", "model_name")
    ui_color = "#f7d4d4"

    def __init__(
        self,
        *,
        export_path: str,
        model_name: str,
        redis_conn_id: str | None = STORE_CONN_ID,
        redis_url: str | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.export_path, self.model_name = export_path, model_name
        self.redis_conn_id, self.redis_url = redis_conn_id, redis_url

    def execute(self, context) -> dict[str, Any]:
        from recpipe.exports.store import EmbeddingStore

        export = Path(confine(self.export_path, "export_path"))
        client = store_client(self.redis_conn_id, self.redis_url)
        where = client.connection_pool.connection_kwargs
        totals, exports = EmbeddingStore(client, self.model_name).push_chain(export)
        log.info("pushed %s to %s:%s/%s: %s", [p.name for p in exports], where.get("host"), where.get("port"),
                 where.get("db"), totals)  # fmt: skip
        return {**totals, "pushed": [str(p) for p in exports]}


def closes_day(logical_date, close_hour: int, pass_minutes: int = 60) -> bool:
    """The last pass of hour ``close_hour`` closes its day: register the day's model and gate
    it. For Airflow's ``ShortCircuitOperator`` (``logical_date``: the run's, a datetime, the
    pass's start)."""
    return logical_date.hour == close_hour and logical_date.minute + pass_minutes >= 60


class DayEvalOperator(JobOperator):
    """The day's progressive validation as one evaluation, for the day-end gate: every pass of
    ``day`` was scored by the model of the pass before it (``ProgressiveEvalOperator``), so
    their per-row scores joined in pass order are the day's out-of-sample predictions of the
    model as it was served through the day (PaddleRec's pass AUC, taken over the whole day).
    The champion, scored on the same passes (``eval_ds``, the range this returns), is the
    other side of the gate's paired test. The metrics are computed by a job
    (``trainer.pooled_eval``), as every other evaluation's.

    Args:
        runs_root: the runs root holding the passes' model dirs (templated).
        day: ``YYYY-MM-DD`` (templated).
        pass_result_name: the progressive evaluation's result file in each pass dir.

    Returns (XCom): as ``EvalOperator``'s, plus ``model_dir`` (the day's last trained pass: the
    candidate), ``checkpoint`` (its latest) and ``eval_ds`` (``D/HH:D/HH`` or
    ``D/HHMM:D/HHMM``: the scored passes).

    Raises:
        AirflowSkipException: no pass of the day was trained and scored.
    """

    template_fields = (*JobOperator.template_fields, "runs_root", "day")
    ui_color = "#d4f0f7"

    def __init__(self, *, runs_root: str, day: str, pass_result_name: str = PASS_EVAL_RESULT, **kwargs):
        super().__init__(**kwargs)
        self.runs_root, self.day, self.pass_result_name = runs_root, day, pass_result_name

    def execute(self, context) -> dict[str, Any]:
        import pyarrow.parquet as pq

        day = str(self.day)
        runs = finished_model_dirs(confine(self.runs_root, "runs_root"))
        passes = [p for p in runs if p.parent.name == day_name(day) and is_pass_dir(p)]
        scored = [p for p in passes if ModelDir(p).predictions(self.pass_result_name).exists()]
        if not scored:
            self._close_day_run(context, day)
            raise AirflowSkipException(f"no pass of {day} was trained and scored: nothing to register")
        last = ModelDir(passes[-1])
        result_name = DAY_EVAL_RESULT
        predictions = last.predictions(result_name)
        # the metrics are a job's, as every other evaluation's: the worker only lists the passes
        args = ["--out", str(predictions), "--predictions"]
        args += [str(ModelDir(p).predictions(self.pass_result_name)) for p in scored]
        pooled = self.run_command("evaluate_day", "trainer.pooled_eval", args, last.logs)
        metrics = pooled["metrics"]
        labels = pq.read_table(predictions, columns=["label"]).column("label").to_numpy()
        train = json.loads(last.train_result.read_text())
        eval_ds = f"{partition_ds(scored[0])}:{partition_ds(scored[-1])}"
        out = {
            "metrics": metrics,
            "model_dir": str(last.path),
            "checkpoint": train["checkpoint"],
            "global_step": train["global_step"],
            "num_examples": pooled["num_examples"],
            "predictions": str(predictions),
            "eval_ds": eval_ds,
            "passes": [partition_ds(p) for p in scored],
            "reason": f"the progressive scores of {len(scored)} passes",
            # the champion's evaluation of the same passes logs the same name and digest
            "dataset": eval_dataset_of(day_name(eval_ds), labels, self.load_config().train_input_path),
        }
        atomic.write_text(last.result(result_name), json.dumps(out, indent=2))
        step = out["global_step"]
        out["mlflow_run_id"] = self.hook.log_task_run(
            self.parent_run_id(context),
            "evaluate_day",
            tags={"checkpoint": out["checkpoint"], "evaluated": out["reason"]},
            metrics=[
                *((k, v, step) for k, v in metrics.items() if v is not None),
                ("num_examples", out["num_examples"], step),
            ],
            parent_metrics=[(f"evaluate_day.{k}", v, 0) for k, v in metrics.items() if v is not None],
            artifacts=[(last.result(result_name), None)],
            datasets=[out["dataset"]],
        )
        self._close_day_run(context, day, metrics)
        log.info("day %s, passes %s: %s over %d rows", day, eval_ds, metrics, len(labels))
        return out

    def _close_day_run(self, context, day: str, metrics: dict | None = None) -> None:
        """The day closes: its run of per-pass scores (``MLflowHook.day_run``) gets the day's
        pooled metrics (``day_auc``, ...) and ends FINISHED."""
        series = self.hook.day_run(self.experiment_name(), context["dag"].dag_id, day, create=False)
        if series is None:
            return
        rows = [(f"day_{k}", v, 0) for k, v in (metrics or {}).items() if v is not None]
        self.hook.log_metrics(series, rows)
        self.hook.end_run(series)
