"""The processes of a training job on this machine, per ``train_distribute``.

- ``NoStrategy`` and ``MirroredStrategy``: one process (Mirrored's replicas live inside it).
- ``MultiWorkerMirroredStrategy``: ``workers`` processes, each with its TF_CONFIG (cluster of
  ``localhost`` ports, its own task index), as TensorFlow's multi-worker guide describes.
- ``HorovodStrategy``: one ``horovodrun -np N --gloo`` process that starts the N ranks.
"""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from operators.launchers.base import JobSpec
from recpipe.config.train import TrainDistribute

SINGLE = {TrainDistribute.NoStrategy, TrainDistribute.MirroredStrategy}


@dataclass(frozen=True)
class Process:
    """One process of a job: its role (``worker 0``), argv and extra environment."""

    role: str
    argv: list[str]
    env: dict[str, str]


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


def training_processes(distribute: TrainDistribute, workers: int, module_args: list[str]) -> list[Process]:
    """The processes that run ``python -m <module_args>`` as a ``distribute`` job.

    Args:
        distribute: the strategy.
        workers: worker processes (Horovod ranks); must be 1 for single-process strategies.
        module_args: ``[module, arg, ...]`` after ``python -m``.

    Raises:
        ValueError: ``workers`` < 1, or > 1 for a single-process strategy, or a strategy the
            local launcher cannot start.
    """
    python = [sys.executable, "-m", *module_args]
    if workers < 1:
        raise ValueError(f"num_workers={workers}: at least one worker is needed")
    if distribute in SINGLE:
        if workers != 1:
            raise ValueError(
                f"num_workers={workers}: {distribute.value} runs in one process (MirroredStrategy "
                "takes train_config.num_gpus_per_worker replicas); use MultiWorkerMirroredStrategy "
                "or HorovodStrategy for several workers"
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
    if distribute == TrainDistribute.HorovodStrategy:
        horovodrun = [
            sys.executable,
            "-m",
            "horovod.runner.launch",
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
    raise ValueError(f"train_distribute {distribute.value}: the local launcher cannot start it yet")


def evaluator_process(module_args: list[str]) -> Process:
    """The separate evaluator (``eval_method: separate``): ``python -m trainer.eval --follow``
    beside the training processes, with no cluster of its own."""
    return Process("evaluator", [sys.executable, "-m", *module_args, "--follow"], {})


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
    )
