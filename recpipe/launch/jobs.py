"""One call from (strategy, workers, ps, evaluator, cluster config) to a job: processes on this
machine or manifests for a cluster; and running it to its result line."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from recpipe.config.cluster import ClusterConfig
from recpipe.config.errors import ConfigError
from recpipe.config.train import SyncMode, TrainDistribute
from recpipe.launch.base import JobSpec, Launcher
from recpipe.launch.isolation import JOB_ENV
from recpipe.launch.kubeflow import render
from recpipe.launch.kubernetes import KubernetesLauncher
from recpipe.launch.local import LocalLauncher
from recpipe.launch.topology import check_sync_mode, evaluator_process, job_spec, training_processes

log = logging.getLogger(__name__)


def launcher_for(
    cluster: ClusterConfig, log_dir: str | os.PathLike, timeout_s: float | None = None
) -> Launcher:
    """The launcher named by the cluster config's ``launcher`` field; it stops the job after
    ``timeout_s`` seconds (None: never).

    Raises:
        ConfigError: an unknown launcher.
    """
    if cluster.launcher == "local":
        return LocalLauncher(log_dir, timeout_s=timeout_s)
    if cluster.launcher == "kubernetes":
        return KubernetesLauncher(log_dir, cluster.kubernetes_conn_id, cluster.poll_interval_s, timeout_s)
    raise ConfigError(f"cluster launcher {cluster.launcher!r} is not available (local, kubernetes)")


def training_job(
    name: str,
    distribute: TrainDistribute,
    cluster: ClusterConfig,
    train_args: list[str],
    *,
    cwd: str | os.PathLike,
    workers: int | None = None,
    ps: int | None = None,
    eval_args: list[str] | None = None,
    sync_mode: SyncMode | None = None,
) -> JobSpec:
    """The job that runs ``python -m trainer.train_eval <train_args>`` as a ``distribute`` job.

    Args:
        name: the job's name (logs, errors; the Kubernetes object's name).
        distribute: the strategy.
        cluster: launcher and resources (``conf/cluster/*.yaml``).
        train_args: the trainer's arguments.
        cwd: the project home every local process runs in.
        workers: worker processes (Horovod ranks); default ``cluster.worker.count``.
        ps: parameter servers; default ``cluster.ps.count``. ``PSStrategy`` takes at least 1 locally;
            ``NoStrategy`` with ps is parameter-server training
            (``TrainDistribute.with_parameter_servers``).
        eval_args: the separate evaluator's ``python -m trainer.eval`` arguments
            (``eval_method: separate``), or None for no evaluator.
        sync_mode: ``train_config.sync_mode`` (a parameter-server job's update mode): checked
            against the ps count here, and written on the Kubernetes TFJob.

    Returns:
        A ``JobSpec``: per process argv and environment (TF_CONFIG, horovodrun) for the local
        launcher, or the rendered TFJob / MPIJob manifests for the Kubernetes one.

    Raises:
        ConfigError: a worker or ps count the strategy cannot run with, a ``sync_mode``
            without ps, or a cluster config the backend cannot render.
    """
    workers = cluster.worker.count if workers is None else workers
    if ps is not None and ps != cluster.ps.count:
        cluster = cluster.model_copy(update={"ps": cluster.ps.model_copy(update={"count": ps})})
    check_sync_mode(distribute, sync_mode, cluster.ps.count)
    if cluster.launcher == "kubernetes":
        manifests = render(name, distribute, cluster, train_args, eval_args, workers, sync_mode)
        return JobSpec(name=name, argv=[], cwd=Path(cwd), env=dict(JOB_ENV), manifests=manifests)
    processes = training_processes(
        distribute, workers, ["trainer.train_eval", *train_args], ps=cluster.ps.count
    )
    if eval_args is not None:
        processes.append(evaluator_process(["trainer.eval", *eval_args]))
    return job_spec(name, processes, cwd, dict(JOB_ENV))


def command_job(name: str, module: str, args: list[str], cwd: str | os.PathLike) -> JobSpec:
    """A one-process job: ``python -m <module> <args>`` (evaluation, export)."""
    return JobSpec(name=name, argv=[[sys.executable, "-m", module, *args]], cwd=Path(cwd), env=dict(JOB_ENV))


def run_job(launcher: Launcher, job: JobSpec) -> Any:
    """Run ``job`` with ``launcher`` and return its result (``job_result`` of the chief's log).

    Raises:
        JobFailedError: a process failed; the message names its role and has its log's tail.
    """
    start = time.perf_counter()
    logs = launcher.run(job)
    # the job's own time, apart from its task's (bench/production_dag.py reads this line)
    log.info("recpipe job %s ran %.2f s", job.name, time.perf_counter() - start)
    return job_result(logs[0])


# horovodrun prefixes each rank's lines: "[0]<stdout>:" (rank 0 prints the result)
_RANK_PREFIX = re.compile(r"^\[\d+(,\d+)?\]<std(out|err)>:")


def job_result(log: Path) -> Any:
    """The last line of a log that is a JSON object (the entry points print their result so),
    or None."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        line = _RANK_PREFIX.sub("", line.strip())
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None
