"""``DistributedTrainOperator``: one day's (or one manual run's) training job."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from operators.base import JobOperator
from operators.hooks.mlflow import flatten, jsonl_metrics
from operators.paths import confine, project_home
from operators.warm_start import source
from recpipe import atomic
from recpipe.config.model import EvalMethod
from recpipe.launch import training_job
from recpipe.launch.kubeflow import job_name
from recpipe.layout import ModelDir, ds_window

log = logging.getLogger(__name__)


def kubernetes_job_name(dag_id: str, ds: str, run_id: str, try_number: int) -> str:
    """A TFJob / MPIJob name unique per DAG run and attempt: two manual runs of one day differ
    by their run id's hash. DNS-1123 and short enough for ``kubeflow.job_name`` (52 characters)
    to keep whole."""

    suffix = f"-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}-{try_number}"
    return job_name(f"recpipe-{dag_id}-{ds}")[: 52 - len(suffix)].rstrip("-") + suffix


class DistributedTrainOperator(JobOperator):
    """Train a pipeline config into ``model_dir`` with the configured ``train_distribute``.

    Warm start: without ``full_retrain`` the job fine-tunes (``train_config.
    fine_tune_checkpoint``) from a promoted model, never from a rejected one: the model dir of
    ``model_name``'s ``alias`` version, or else of its newest version tagged ``promotion:
    promoted``, dated before ``ds`` and finished (``_SUCCESS``). Only while ``model_name`` has
    no registered version yet (a new deployment) the newest finished model dir under
    ``warm_start_root`` dated before ``ds`` is taken. From scratch when there is none. A retry
    resumes from ``model_dir``'s own latest checkpoint (``--continue_train``) and a finished
    ``model_dir`` (``_SUCCESS``) is never trained again.

    Args:
        model_dir: this run's model dir, inside the project's roots (templated).
        ds: the day (``YYYY-MM-DD``) whose data ends the window (templated).
        train_ds: days to train on, ``START:END`` (templated; default: the window ending on ds).
        eval_ds: the day(s) evaluated later; their held-out rows are kept out of training
            (templated; default ``ds``).
        holdout: False: train on every row of ``train_ds``, no ``eval_ds`` (progressive
            validation scored the pass before it trains on it).
        previous_pass: ``ds`` is a pass (``YYYY-MM-DD/HH``): fine-tune from the newest finished
            pass of the same day before it; a day's first pass follows the rule above (the
            champion, so that a day whose close was rejected is not built on).
        score_first: a stream pass: the one-process job also scores the pass with the model it
            starts from, before training, into this result file of ``model_dir``
            (``recpipe train --score_first``; ``ProgressiveEvalOperator`` reports it).
        export_dir: a stream pass: the one-process job also exports the trained model, the
            day's base or the pass's delta (``--export_dir``, ``--base`` / ``--delta``), and
            records it where ``PassExportOperator`` reports it (templated). A job of several
            processes leaves both to those tasks' own jobs.
        training_window_days: window length when ``train_ds`` is not given.
        warm_start_root: where earlier days' model dirs are (``ds=YYYY-MM-DD``) (templated).
        full_retrain: train from scratch (templated; a bool under native rendering).
        model_name, alias: the registered model whose promoted versions are the warm-start
            sources (templated; without ``model_name``, the newest finished dir).
        cold_start_from: another registered model whose ``alias`` version a run with
            nothing to start from fine-tunes from (a stream's ``stream.cold_start_from``).
        train_distribute, num_workers: the strategy and worker count (templated; default: the
            config's ``train_distribute`` and the cluster config's ``worker.count``).

    Returns (XCom): ``{"model_dir", "checkpoint", "global_step", "loss", "examples_per_sec",
    "fine_tune_checkpoint", "fine_tune", "mlflow_run_id"}``.
    """

    template_fields = (
        *JobOperator.template_fields,
        "model_dir",
        "ds",
        "train_ds",
        "eval_ds",
        "warm_start_root",
        "full_retrain",
        "model_name",
        "train_distribute",
        "num_workers",
        "export_dir",
    )
    ui_color = "#e8d4f7"

    def __init__(
        self,
        *,
        model_dir: str,
        ds: str = "{{ ds }}",
        train_ds: str | None = None,
        eval_ds: str | None = None,
        training_window_days: int = 7,
        warm_start_root: str | None = None,
        full_retrain: bool = False,
        model_name: str | None = None,
        alias: str = "champion",
        train_distribute: str | None = None,
        num_workers: int | None = None,
        holdout: bool = True,
        previous_pass: bool = False,
        score_first: str | None = None,
        export_dir: str | None = None,
        cold_start_from: str | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.score_first, self.export_dir = score_first, export_dir
        self.cold_start_from = cold_start_from
        self.holdout = holdout
        self.previous_pass = previous_pass
        self.model_dir = model_dir
        self.ds = ds
        self.train_ds = train_ds
        self.eval_ds = eval_ds
        self.training_window_days = training_window_days
        self.warm_start_root = warm_start_root
        self.full_retrain = full_retrain
        self.model_name = model_name
        self.alias = alias
        self.train_distribute = train_distribute
        self.num_workers = num_workers

    def job_edits(self) -> dict[str, Any]:
        """The operator's overrides: the days (eval_ds keeps its held-out rows out of training)
        and the strategy."""
        edits: dict[str, Any] = {
            "train_ds": self.train_ds or ds_window(self.ds, self.training_window_days),
            "eval_ds": (self.eval_ds or self.ds) if self.holdout else None,
        }
        if self.train_distribute:
            edits["train_config.train_distribute"] = self.train_distribute
        return edits

    def warm_start(self, model_dir: Path) -> tuple[Path | None, str]:
        """The model dir to fine-tune from (``operators.warm_start.source``), or None: a full
        retrain, no ``warm_start_root``, or nothing promoted before ``ds``.

        Raises:
            MlflowException: the registry could not be read.
        """
        if self.full_retrain or not self.warm_start_root:
            return None, "full retrain" if self.full_retrain else "no warm_start_root"
        root = confine(self.warm_start_root, "warm_start_root")
        model = self.model_name and (self.hook, self.model_name, self.alias)
        return source(root, str(self.ds), model_dir, model, self.previous_pass, self.cold_start_from)

    def execute(self, context) -> dict:
        out = ModelDir(confine(self.model_dir, "model_dir"))
        edits = self.job_edits()
        config = None
        if out.success.exists():
            log.info("%s already finished training: not training it again", out.path)
            result = json.loads(out.train_result.read_text())
        else:
            config, result = self._train(context, out, edits)
        result["mlflow_run_id"] = self._track(context, out, result, config or self.load_config(edits))
        return result

    def _train(self, context, out: ModelDir, edits: dict[str, Any]) -> tuple[Any, dict]:
        resume = out.checkpoint_state.exists()
        source, why = (None, "resume") if resume else self.warm_start(out.path)
        if source is not None:
            edits["train_config.fine_tune_checkpoint"] = str(source)
        config = self.load_config(edits)  # fails here, naming the field, before any job
        common = [*self.config_args(edits), "--model_dir", str(out.path)]
        args = [*common, "--skip_eval"]  # the evaluation task scores the final model
        if resume:
            log.info("resuming %s from its latest checkpoint", out.path)
            args.append("--continue_train")
        else:
            log.info("warm start from %s (%s)", source or "nothing (training from scratch)", why)
        distribute = config.train_config.train_distribute
        cluster = self.cluster()

        def job_of(args: list[str]):
            return training_job(
                kubernetes_job_name(self.dag_id, str(self.ds), context["run_id"], context["ti"].try_number)
                if cluster.launcher == "kubernetes"
                else "train",
                distribute,
                cluster,
                args,
                cwd=project_home(),
                workers=self.num_workers,
                eval_args=common if config.eval_config.eval_method == EvalMethod.separate else None,
                sync_mode=config.train_config.ps_mode,
            )

        job = job_of(args)
        if (self.score_first or self.export_dir) and len(job.argv) == 1 and not job.manifests:
            # one process: it scores, trains and exports the pass with one start and restore,
            # in the fork server's process kept for the model (trainer.warm)
            job = job_of([*args, *self._one_pass_args()])
            job = dataclasses.replace(job, resident=f"{self.dag_id}.{self.task_id}")
        log.info("%s with %s on %s", distribute.value, job.roles or "manifests", cluster.launcher)
        summary = self.run(job, out.logs)
        if not summary or "checkpoint" not in summary:
            raise RuntimeError(f"training in {out.path} printed no result line")
        # a resumed job reports the warm start of its first attempt (``ModelDir.fine_tune``)
        report = summary.get("fine_tune") or {}
        fine_tune = str(source) if source else report.get("source") or report.get("checkpoint")
        result = {
            **summary,
            "model_dir": str(out.path),
            "fine_tune_checkpoint": fine_tune,
            "train_distribute": distribute.value,
            "train_ds": edits["train_ds"],
        }
        if self.degraded:  # e.g. the separate evaluator crashed for good: training is still fine
            result["degraded"] = self.degraded
        if summary.get("export"):  # what the export task reports (it exports only without one)
            atomic.write_text(out.export_record, json.dumps(summary["export"]))
        atomic.write_text(out.train_result, json.dumps(result, indent=2))
        out.success.touch()  # last: a finished model dir is never trained again
        return config, result

    def _one_pass_args(self) -> list[str]:
        """``recpipe train``'s flags that score the pass first and export it after."""
        args = ["--score_first", self.score_first] if self.score_first else []
        if self.export_dir:
            from operators.stream import pass_export_args

            args += pass_export_args(confine(self.export_dir, "export_dir"), str(self.ds))
        return args

    def _track(self, context, out: ModelDir, result: dict, config) -> str:
        params = flatten(config.to_dict())
        params["recpipe.fine_tune_checkpoint"] = result.get("fine_tune_checkpoint") or ""
        params["recpipe.full_retrain"] = str(bool(self.full_retrain))
        metrics = [
            *jsonl_metrics(out.train_metrics),
            *jsonl_metrics(out.eval_history, "eval_"),  # eval_method separate / master
            ("final_loss", result["loss"], result["global_step"]),
            # the job's (chief's) peak resident memory, and up to the end of each phase (MiB)
            *(
                (name, value, result["global_step"])
                for name, value in [
                    ("peak_rss_mb", result.get("peak_rss_mb")),
                    *((f"memory_mb.{k}", v) for k, v in (result.get("memory_mb") or {}).items()),
                ]
                if value is not None
            ),
            # the day's figures of each online table (ev_params), as the last logged step has them
            *(
                (f"day_{name}", value, result["global_step"])
                for name, value in (result.get("online_tables") or {}).items()
            ),
        ]
        return self.hook.log_task_run(
            self.parent_run_id(context),
            "train",
            tags={
                "model_dir": out.path,
                "warm_start_from": result.get("fine_tune_checkpoint") or "none",
                **{f"degraded.{role}": why for role, why in (result.get("degraded") or {}).items()},
            },
            params=params,
            metrics=metrics,
            parent_tags={"train_distribute": result["train_distribute"]},
            artifacts=[(out.pipeline_config, None)],
        )
