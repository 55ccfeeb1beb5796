"""``DistributedTrainOperator``: one day's (or one manual run's) training job."""

from __future__ import annotations

import json
import logging
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from operators.base import JobOperator
from operators.hooks.mlflow import flatten
from operators.launchers.kubeflow import render
from operators.launchers.topology import evaluator_process, training_processes
from operators.paths import confine
from recpipe.config.model import EvalMethod

log = logging.getLogger(__name__)
DONE = "_SUCCESS"
RESULT = "train_result.json"


def window(ds: str, days: int) -> str:
    """``train_ds`` of a ``days``-day window ending on ``ds``: ``"START:ds"``."""
    end = date.fromisoformat(ds)
    return f"{(end - timedelta(days=days - 1)).isoformat()}:{ds}"


def last_successful_model_dir(runs_root: Path, before: str) -> Path | None:
    """The newest ``ds=`` model dir under ``runs_root`` dated before ``before`` whose training
    finished (``_SUCCESS``), or None."""
    found = sorted(
        p for p in runs_root.glob("ds=*") if p.name.removeprefix("ds=") < before and (p / DONE).exists()
    )
    return found[-1] if found else None


class DistributedTrainOperator(JobOperator):
    """Train a pipeline config into ``model_dir`` with the configured ``train_distribute``.

    Warm start: without ``full_retrain`` the job fine-tunes (``train_config.
    fine_tune_checkpoint``) from the latest checkpoint of the newest finished model dir under
    ``warm_start_root`` dated before ``ds``; from scratch when there is none. A retry resumes
    from ``model_dir``'s own latest checkpoint (``--continue_train``) and a finished
    ``model_dir`` (``_SUCCESS``) is never trained again.

    Args:
        model_dir: this run's model dir, inside the project's roots (templated).
        ds: the day (``YYYY-MM-DD``) whose data ends the window (templated).
        train_ds: days to train on, ``START:END`` (templated; default: the window ending on ds).
        eval_ds: the day(s) evaluated later; their held-out rows are kept out of training
            (templated; default ``ds``).
        training_window_days: window length when ``train_ds`` is not given.
        warm_start_root: where earlier days' model dirs are (``ds=YYYY-MM-DD``) (templated).
        full_retrain: train from scratch (templated; "True"/"False" strings accepted).
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
        "train_distribute",
        "num_workers",
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
        full_retrain: Any = False,
        train_distribute: str | None = None,
        num_workers: Any = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.model_dir = model_dir
        self.ds = ds
        self.train_ds = train_ds
        self.eval_ds = eval_ds
        self.training_window_days = training_window_days
        self.warm_start_root = warm_start_root
        self.full_retrain = full_retrain
        self.train_distribute = train_distribute
        self.num_workers = num_workers

    def job_edits(self) -> dict[str, Any]:
        """The operator's overrides: the days (eval_ds keeps its held-out rows out of training)
        and the strategy."""
        edits: dict[str, Any] = {
            "train_ds": self.train_ds or window(self.ds, self.training_window_days),
            "eval_ds": self.eval_ds or self.ds,
        }
        if self.train_distribute not in (None, "", "None"):
            edits["train_config.train_distribute"] = self.train_distribute
        return edits

    def worker_count(self) -> int:
        """``num_workers`` if given, else the cluster config's ``worker.count``.

        Raises:
            ValueError: not a positive integer.
        """
        if self.num_workers in (None, "", "None"):
            return self.cluster().worker.count
        try:
            workers = int(self.num_workers)
        except ValueError:
            raise ValueError(f"num_workers={self.num_workers!r} is not an integer") from None
        if workers < 1:
            raise ValueError(f"num_workers={workers}: at least one worker is needed")
        return workers

    def warm_start(self, model_dir: Path) -> Path | None:
        """The model dir to fine-tune from, or None (full retrain, or no earlier day)."""
        if _truthy(self.full_retrain) or not self.warm_start_root:
            return None
        root = confine(self.warm_start_root, "warm_start_root")
        found = last_successful_model_dir(root, self.ds)
        return None if found is None or found.resolve() == model_dir else found

    def execute(self, context) -> dict:
        model_dir = confine(self.model_dir, "model_dir")
        edits = self.job_edits()
        source = config = None
        if (model_dir / DONE).exists():
            log.info("%s already finished training: not training it again", model_dir)
            result = json.loads((model_dir / RESULT).read_text())
        else:
            resume = (model_dir / "checkpoint").exists()
            if not resume:
                source = self.warm_start(model_dir)
                if source is not None:
                    edits["train_config.fine_tune_checkpoint"] = str(source)
            config = self.load_config(edits)  # fails here, naming the field, before any job
            common = [
                "--pipeline_config_path",
                str(self.config_path()),
                "--model_dir",
                str(model_dir),
                "--edit_config_json",
                json.dumps(self.edits(edits)),
            ]
            args = [*common, "--skip_eval"]  # the evaluation task scores the final model
            if resume:
                log.info("resuming %s from its latest checkpoint", model_dir)
                args.append("--continue_train")
            else:
                log.info("warm start from %s", source or "nothing (training from scratch)")
            workers = self.worker_count()
            distribute = config.train_config.train_distribute
            separate = config.eval_config.eval_method == EvalMethod.separate
            cluster = self.cluster()
            log.info("%s with %d worker(s) on %s", distribute.value, workers, cluster.launcher)
            if cluster.launcher == "kubernetes":
                name = f"recpipe-{self.dag_id}-{self.ds}-{context['ti'].try_number}"
                manifests = render(name, distribute, cluster, args, common if separate else None, workers)
                summary = self.run_job(
                    "train", "trainer.train_eval", args, model_dir / "logs", manifests=manifests
                )
            else:
                processes = training_processes(
                    distribute, workers, ["trainer.train_eval", *args], ps=cluster.ps.count
                )
                if separate:
                    processes.append(evaluator_process(["trainer.eval", *common]))
                summary = self.run_job("train", "trainer.train_eval", args, model_dir / "logs", processes)
            if not summary or "checkpoint" not in summary:
                raise RuntimeError(f"training in {model_dir} printed no result line")
            result = {
                **summary,
                "model_dir": str(model_dir),
                "fine_tune_checkpoint": str(source)
                if source
                else (summary.get("fine_tune") or {}).get("checkpoint"),
                "train_distribute": config.train_config.train_distribute.value,
                "train_ds": edits["train_ds"],
            }
            tmp = model_dir / f".{RESULT}.tmp"
            tmp.write_text(json.dumps(result, indent=2))
            tmp.replace(model_dir / RESULT)
            (model_dir / DONE).touch()
        result["mlflow_run_id"] = self._track(context, model_dir, result, config or self.load_config(edits))
        return result

    def _track(self, context, model_dir: Path, result: dict, config) -> str:
        hook = self.hook
        parent = self.parent_run_id(context)
        with hook.nested_run(parent, "train", {"model_dir": str(model_dir)}) as run:
            params = flatten(config.to_dict())
            params["recpipe.fine_tune_checkpoint"] = result.get("fine_tune_checkpoint") or ""
            params["recpipe.full_retrain"] = str(_truthy(self.full_retrain))
            hook.log_params(run, params)
            hook.set_tags(parent, {"train_distribute": result["train_distribute"]})
            hook.set_tags(run, {"warm_start_from": result.get("fine_tune_checkpoint") or "none"})
            rows = []
            metrics_file = model_dir / "train_metrics.jsonl"
            if metrics_file.exists():
                for line in metrics_file.read_text().splitlines():
                    entry = json.loads(line)
                    rows += [(k, v, entry["step"]) for k, v in entry.items() if k != "step"]
            history = model_dir / "eval_history.jsonl"  # eval_method separate / master
            if history.exists():
                for line in history.read_text().splitlines():
                    entry = json.loads(line)
                    rows += [(f"eval_{k}", v, entry["step"]) for k, v in entry.items() if k != "step"]
            rows.append(("final_loss", result["loss"], result["global_step"]))
            hook.log_metrics(run, rows)
            if (model_dir / "pipeline.yaml").exists():
                hook.log_artifact(run, model_dir / "pipeline.yaml")
        return run


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)
