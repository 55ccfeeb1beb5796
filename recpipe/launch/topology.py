"""The processes of a training job on this machine, per ``train_distribute``.

- ``NoStrategy`` and ``MirroredStrategy``: one process (Mirrored's replicas live inside it).
- ``MultiWorkerMirroredStrategy``: ``workers`` processes, each with its TF_CONFIG (cluster of
  ``localhost`` ports, its own task index), as TensorFlow's multi-worker guide describes.
- ``HorovodStrategy``, ``EmbeddingParallelStrategy``: one ``horovodrun -np N --gloo`` process
  that starts the N ranks.
- ``PSStrategy``, and ``NoStrategy`` with ps: the chief (the trainer, coordinating) and
  ``workers`` + ``ps`` servers (``trainer.distribute.server``), each with its TF_CONFIG; the
  servers are stopped when the chief is done; a worker that dies is started again (training
  goes on with the others meanwhile, TensorFlow's fault tolerance).
"""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from recpipe.config.errors import ConfigError
from recpipe.config.train import SyncMode, TrainDistribute
from recpipe.launch.base import JobSpec

SINGLE = {TrainDistribute.NoStrategy, TrainDistribute.MirroredStrategy}


@dataclass(frozen=True)
class Process:
    """One process of a job: its role (``worker 0``), argv and extra environment."""

    role: str
    argv: list[str]
    env: dict[str, str]
    server: bool = False  # serves until the other processes are done, then is stopped
    restart: bool = False  # started again when it dies
    optional: bool = False  # its failure is reported, not the job's


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now (the OS picks them)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def check_sync_mode(distribute: TrainDistribute, sync_mode: SyncMode | None, ps: int) -> None:
    """Refuse a parameter-server mode (``train_config.sync_mode`` other than ``async``) for a
    job without ps, before any process starts.

    Raises:
        ConfigError: naming ``train_config.sync_mode`` and how to give the job ps.
    """
    if sync_mode is None or distribute.with_parameter_servers(ps):
        return
    sync_mode = SyncMode(sync_mode)
    if sync_mode == SyncMode.async_:
        return
    spelt = " (sync_replicas: true)" if sync_mode == SyncMode.sync else ""
    raise ConfigError(
        f"train_config.sync_mode: {sync_mode.value}{spelt} runs on parameter servers, and this "
        f"{distribute.value} job has none: give it ps (recpipe train --num_ps M, or the cluster "
        "config's ps.count)"
    )


def training_processes(
    distribute: TrainDistribute, workers: int, module_args: list[str], ps: int = 0
) -> list[Process]:
    """The processes that run ``python -m <module_args>`` as a ``distribute`` job.

    Args:
        distribute: the strategy.
        workers: worker processes (Horovod ranks); must be 1 for single-process strategies
            other than ``NoStrategy`` with ps.
        module_args: ``[module, arg, ...]`` after ``python -m``.
        ps: parameter servers (the cluster config's ``ps.count``): ``PSStrategy`` takes at
            least 1; with ``NoStrategy``, more than 0 makes it a parameter-server job.

    Raises:
        ConfigError: ``workers`` < 1, or > 1 for a single-process strategy; a strategy the
            local launcher cannot start.
    """
    python = [sys.executable, "-m", *module_args]
    if workers < 1:
        raise ConfigError(f"num_workers={workers}: at least one worker is needed")
    if distribute.with_parameter_servers(ps):
        return _parameter_server(workers, max(ps, 1), python)
    if distribute in SINGLE:
        if workers != 1:
            raise ConfigError(
                f"num_workers={workers}: {distribute.value} runs in one process (MirroredStrategy "
                "takes train_config.num_gpus_per_worker replicas); use MultiWorkerMirroredStrategy "
                "HorovodStrategy or EmbeddingParallelStrategy for several workers"
            )
        return [Process("worker 0", python, {})]
    if distribute == TrainDistribute.MultiWorkerMirroredStrategy:
        cluster = {"worker": [f"localhost:{p}" for p in free_ports(workers)]}
        return [
            Process(
                f"worker {i}",
                python,
                {
                    "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
                    "RECPIPE_LOCAL_PROCESSES": str(workers),
                },
            )
            for i in range(workers)
        ]
    if distribute.uses_horovod:
        horovodrun = [
            sys.executable,
            "-m",
            "recpipe.launch.horovodrun",  # horovodrun with its servers on 127.0.0.1
            "-np",
            str(workers),
            "-H",
            f"localhost:{workers}",
            "--gloo",
            "--network-interfaces",
            "lo",
            "--gloo-timeout-seconds",
            "1800",  # a master evaluation holds the other ranks at their next collective
        ]
        return [Process("horovodrun", [*horovodrun, *python], {"RECPIPE_LOCAL_PROCESSES": str(workers)})]
    raise ConfigError(f"train_distribute {distribute.value}: the local launcher cannot start it")


def _parameter_server(workers: int, ps: int, python: list[str]) -> list[Process]:
    ports = free_ports(1 + workers + ps)
    cluster = {
        "chief": [f"localhost:{ports[0]}"],
        "worker": [f"localhost:{p}" for p in ports[1 : 1 + workers]],
        "ps": [f"localhost:{p}" for p in ports[1 + workers :]],
    }

    def env(kind: str, i: int) -> dict[str, str]:
        tf_config = {"cluster": cluster, "task": {"type": kind, "index": i}}
        return {"TF_CONFIG": json.dumps(tf_config), "RECPIPE_LOCAL_PROCESSES": str(workers + 1)}

    server = [sys.executable, "-m", "trainer.distribute.server"]
    return [
        Process("chief", python, env("chief", 0)),
        *(
            Process(f"worker {i}", server, env("worker", i), server=True, restart=True)
            for i in range(workers)
        ),
        *(Process(f"ps {i}", server, env("ps", i), server=True) for i in range(ps)),
    ]


def evaluator_process(module_args: list[str]) -> Process:
    """The separate evaluator (``eval_method: separate``): ``python -m trainer.eval --follow``
    beside the training processes, with no cluster of its own. It is restarted when it dies
    (it skips the steps already in ``eval_history.jsonl``) and, past its restarts, reported
    without failing the training job."""
    argv = [sys.executable, "-m", *module_args, "--follow"]
    return Process("evaluator", argv, {}, restart=True, optional=True)


def job_spec(
    name: str, processes: list[Process], cwd: str | Path, env: dict[str, str] | None = None
) -> JobSpec:
    """The ``JobSpec`` of ``processes`` (the chief first), ``env`` added to every one."""
    return JobSpec(
        name=name,
        argv=[p.argv for p in processes],
        cwd=Path(cwd),
        env=env or {},
        envs=[p.env for p in processes],
        roles=[p.role for p in processes],
        servers={i for i, p in enumerate(processes) if p.server},
        restart={i for i, p in enumerate(processes) if p.restart},
        optional={i for i, p in enumerate(processes) if p.optional},
    )
