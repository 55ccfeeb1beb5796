"""What every recpipe operator shares: the pipeline config with a run's overrides, the MLflow
parent run of the DAG run, and (for jobs) the launcher that ``on_kill`` stops."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from operators.hooks.mlflow import MLflowHook, git_commit
from operators.launchers import JobSpec, LocalLauncher, launcher_for
from operators.launchers.topology import job_spec
from operators.paths import confine, project_home


def parse_edits(value: Any, field: str = "edit_config_json") -> dict[str, Any]:
    """A dict, or its JSON text (as a templated field renders it), -> dotted path -> value.

    Raises:
        ValueError: not a JSON object (the message names ``field``).
    """
    if value in (None, "", "None"):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
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
        experiment: MLflow experiment (default: the pipeline config's file name) (templated).
        mlflow_conn_id: Airflow connection of the tracking server (see ``MLflowHook``).
    """

    template_fields: tuple[str, ...] = ("pipeline_config_path", "edit_config_json", "experiment")

    def __init__(
        self,
        *,
        pipeline_config_path: str,
        edit_config_json: Any = None,
        experiment: str | None = None,
        mlflow_conn_id: str = "mlflow_default",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.pipeline_config_path = pipeline_config_path
        self.edit_config_json = edit_config_json
        self.experiment = experiment
        self.mlflow_conn_id = mlflow_conn_id
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

    def load_config(self, extra: dict[str, Any] | None = None):
        """The effective ``PipelineConfig`` (file + overrides), paths resolved from the home.

        Raises:
            ConfigError: the file or an override is invalid (file and field named).
        """
        from recpipe.config import load_pipeline_config

        return load_pipeline_config(self.config_path(), self.edits(extra))

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
        )


class JobOperator(RecpipeOperator):
    """A recpipe operator that runs a trainer entry point as a job through a launcher.

    Args:
        cluster_config_path: ``conf/cluster/*.yaml``: the launcher and its resources (templated).
    """

    template_fields = (*RecpipeOperator.template_fields, "cluster_config_path")

    def __init__(self, *, cluster_config_path: str = "conf/cluster/local.yaml", **kwargs):
        super().__init__(**kwargs)
        self.cluster_config_path = cluster_config_path
        self._launcher = None

    def cluster(self):
        """The cluster config (``cluster_config_path``)."""
        from recpipe.config import load_cluster_config

        return load_cluster_config(confine(self.cluster_config_path, "cluster_config_path"))

    def run_job(
        self,
        name: str,
        module: str,
        args: list[str],
        log_dir: Path,
        processes: list | None = None,
        manifests: list[dict] | None = None,
    ) -> dict | None:
        """Run ``python -m module args`` (or ``processes``, ``topology.Process`` items, the
        first being the chief) on this machine, or submit ``manifests`` (Kubeflow jobs) through
        the cluster's launcher; return the chief's stdout's last line that parses as JSON (the
        entry points print their result so). Single-process jobs (evaluation, export) run on
        the Airflow worker, which mounts the same storage as the cluster.

        Raises:
            JobFailedError: the job failed; the message names the role and has its log's tail.
        """
        if manifests is not None:
            self._launcher = launcher_for(self.cluster(), log_dir)
        else:
            self._launcher = LocalLauncher(log_dir)
        if manifests is not None:
            job = JobSpec(name=name, argv=[], cwd=project_home(), manifests=manifests)
        elif processes is None:
            job = JobSpec(name=name, argv=[[sys.executable, "-m", module, *args]], cwd=project_home())
        else:
            job = job_spec(name, processes, project_home())
        job = dataclasses.replace(job, env={"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
        try:
            logs = self._launcher.run(job)
        finally:
            self._launcher = None
        return last_json_line(logs[0])

    def on_kill(self) -> None:
        if self._launcher is not None:
            self._launcher.kill()


# horovodrun prefixes each rank's lines: "[0]<stdout>:" (rank 0 prints the result)
_RANK_PREFIX = re.compile(r"^\[\d+(,\d+)?\]<std(out|err)>:")


def last_json_line(path: Path) -> Any:
    """The last line of a log that is a JSON object (the entry points' result), or None."""
    for line in reversed(path.read_text(errors="replace").splitlines()):
        line = _RANK_PREFIX.sub("", line.strip())
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None
