"""What every recpipe operator shares: the pipeline config with a run's overrides, the MLflow
parent run of the DAG run, and (for jobs) the launcher that ``on_kill`` stops.

The DAGs render templates as native objects (``render_template_as_native_obj``), so Params
arrive typed: ``edit_config_json`` a dict, ``num_workers`` an int, ``full_retrain`` a bool.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from operators.hooks.mlflow import MLflowHook, git_commit
from operators.paths import confine, confine_config, project_home
from operators.tracking import run_name
from recpipe.config import load_cluster_config, load_pipeline_config
from recpipe.errors import EXIT_USAGE
from recpipe.launch import JobFailedError, JobSpec, LocalLauncher, command_job, launcher_for, run_job


def job_timeout_s(execution_timeout: timedelta | None) -> float | None:
    """How long a task's job may run: its ``execution_timeout`` less a margin (a tenth, at
    most 60 s) for the launcher to stop the job and report before Airflow's own timeout."""
    if execution_timeout is None:
        return None
    total = execution_timeout.total_seconds()
    return max(total - min(60.0, total / 10), 1.0)


def parse_edits(value: Any, field: str = "edit_config_json") -> dict[str, Any]:
    """Overrides as a dict of dotted path -> value; JSON text is accepted (a DAG written
    without native rendering, or a trigger conf that holds a string).

    Raises:
        ValueError: neither a dict nor the JSON text of one (the message names ``field``).
    """
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as err:
            raise ValueError(f"{field}: not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise ValueError(f"{field}: expected a JSON object of dotted path -> value, got {value!r}")
    return value


class RecpipeOperator(BaseOperator):
    """Base of the recpipe operators: config loading and MLflow tracking.

    Args:
        pipeline_config_path: ``conf/*.yaml``, inside the project's roots (templated).
        edit_config_json: overrides as EasyRec's ``--edit_config_json``, a dict or JSON text
            (templated).
        experiment: MLflow experiment (default: the pipeline config's file name; the retrain
            DAGs pass their registered model's name) (templated).
        mlflow_conn_id: Airflow connection of the tracking server (see ``MLflowHook``).
        pass_minutes: the DAG runs a pass every this many minutes (a stream): its runs are
            named by day and pass (``run_name``); None for a day a run.
    """

    template_fields: tuple[str, ...] = ("pipeline_config_path", "edit_config_json", "experiment")

    def __init__(
        self,
        *,
        pipeline_config_path: str,
        edit_config_json: Any = None,
        experiment: str | None = None,
        mlflow_conn_id: str = MLflowHook.default_conn_name,
        pass_minutes: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.pipeline_config_path = pipeline_config_path
        self.edit_config_json = edit_config_json
        self.experiment = experiment
        self.mlflow_conn_id = mlflow_conn_id
        self.pass_minutes = pass_minutes
        self._hook: MLflowHook | None = None

    @property
    def hook(self) -> MLflowHook:
        if self._hook is None:
            self._hook = MLflowHook(self.mlflow_conn_id)
        return self._hook

    def edits(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The run's overrides, then ``extra`` (the operator's own, which win)."""
        return {**parse_edits(self.edit_config_json), **(extra or {})}

    def config_path(self) -> Path:
        return confine(self.pipeline_config_path, "pipeline_config_path")

    def config_args(self, extra: dict[str, Any] | None = None) -> list[str]:
        """``--pipeline_config_path P --edit_config_json J`` for a trainer entry point.

        Raises:
            ConfigError, PathNotAllowedError: as ``load_config``.
        """
        self.load_config(extra)  # nothing reaches a job unchecked
        return [
            "--pipeline_config_path",
            str(self.config_path()),
            "--edit_config_json",
            json.dumps(self.edits(extra)),
        ]

    def load_config(self, extra: dict[str, Any] | None = None):
        """The effective ``PipelineConfig`` (file + overrides), paths resolved from the home.

        Raises:
            ConfigError: the file or an override is invalid (file and field named).
            PathNotAllowedError: a path of the config leaves the project's data roots.
        """

        config = load_pipeline_config(self.config_path(), self.edits(extra))
        confine_config(config)  # a run's edit_config_json may name any path
        return config

    def experiment_name(self) -> str:
        return self.experiment or Path(self.pipeline_config_path).stem

    def parent_run_id(self, context) -> str:
        """The MLflow parent run of this DAG run (created by the first task that asks)."""
        return self.hook.parent_run(
            self.experiment_name(),
            context["dag"].dag_id,
            context["run_id"],
            {
                "ds": context.get("ds") or "none",
                "git_commit": git_commit(),
                "pipeline_config": self.pipeline_config_path,
            },
            name=run_name(context, self.pass_minutes),
        )


class JobOperator(RecpipeOperator):
    """A recpipe operator that runs a trainer entry point as a job through a launcher
    (``recpipe.launch``): thin over it, as ``SparkSubmitOperator`` is over its hook.

    Args:
        cluster_config_path: ``conf/cluster/*.yaml``: the launcher and its resources (templated).
    """

    template_fields = (*RecpipeOperator.template_fields, "cluster_config_path")

    def __init__(self, *, cluster_config_path: str = "conf/cluster/local.yaml", **kwargs):
        super().__init__(**kwargs)
        self.cluster_config_path = cluster_config_path
        self._launcher = None
        self.degraded: dict[str, str] = {}

    def cluster(self):
        """The cluster config (``cluster_config_path``)."""

        return load_cluster_config(confine(self.cluster_config_path, "cluster_config_path"))

    def run_command(self, name: str, module: str, args: list[str], log_dir: Path) -> Any:
        """Run ``python -m module args`` as one process on this Airflow worker (evaluation and
        export: the worker mounts the same storage as the cluster); return its result line."""
        return self.run(command_job(name, module, args, project_home()), log_dir)

    def run(self, job: JobSpec, log_dir: Path) -> Any:
        """Run ``job`` with the launcher its kind needs (manifests: the cluster config's;
        processes: this machine's) and return the chief's result line (``recpipe.launch.
        job_result``). The launcher stops the job a little before the task's
        ``execution_timeout``, so the error says what timed out; an optional process that
        failed (the separate evaluator) is logged and kept in ``self.degraded``.

        Raises:
            AirflowFailException: the job exited 2 (its config or arguments refused): the task
                fails without its retries, the message the job's own line naming the field.
            JobFailedError: the job failed; the message names the role and has its log's tail.
            JobTimeoutError: the job ran out of the task's time; every process was stopped.
        """
        timeout = job_timeout_s(self.execution_timeout)
        if job.manifests:
            self._launcher = launcher_for(self.cluster(), log_dir, timeout)
        else:
            self._launcher = LocalLauncher(log_dir, timeout_s=timeout)
        try:
            result = run_job(self._launcher, job)
            self.degraded = dict(getattr(self._launcher, "degraded", {}))
            return result
        except BaseException as err:
            self._launcher.kill()  # Airflow's own timeout lands here too: stop the whole tree
            if isinstance(err, JobFailedError) and err.exit_code == EXIT_USAGE:
                # a bad config or flag: every retry would fail alike
                raise AirflowFailException(f"{job.name}: {err.last_line or err}") from err
            raise
        finally:
            self._launcher = None

    def on_kill(self) -> None:
        if self._launcher is not None:
            self._launcher.kill()
