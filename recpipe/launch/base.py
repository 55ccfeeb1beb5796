"""The launcher interface and the job description operators hand to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from recpipe.errors import PipelineError
from recpipe.forkserver.resident import ENV as RESIDENT_ENV


@dataclass(frozen=True)
class JobSpec:
    """One job: a role name and, per process, its argv.

    Attributes:
        name: a label for logs and errors (``train``, ``eval``, ...).
        argv: the command of each process, e.g. ``[["python", "-m", "trainer.train_eval", ...]]``.
        cwd: working directory of every process (the project home).
        env: variables added to the inherited environment.
        envs: per process, variables added on top of ``env`` (TF_CONFIG differs by task).
        roles: per process, its name in logs and errors (default ``process <i>``).
        manifests: for a cluster launcher, the rendered Kubernetes objects (``kubeflow.render``).
        servers: indices of processes that serve until the others are done (parameter-server
            workers and ps); they are stopped then.
        restart: indices of processes started again when they die, as Kubernetes restarts a
            pod (parameter-server workers: TensorFlow's coordinator runs their steps on the
            others meanwhile and takes them back when they return).
        optional: indices of processes whose failure (after their restarts) does not fail
            the job: it is logged and reported in ``Launcher.degraded`` (the separate
            evaluator: a crashed evaluator must not throw away a healthy training job).
        resident: a one-process job's resident name (``recpipe.forkserver.resident``): with
            a fork server, its process runs in the server's process kept for that name,
            which outlives the job; so it runs in the launcher's network, not a namespace of
            the job's own (one process: it starts no TensorFlow server).
    """

    name: str
    argv: list[list[str]]
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    envs: list[dict[str, str]] | None = None
    roles: list[str] | None = None
    manifests: list[dict] | None = None
    servers: set[int] = field(default_factory=set)
    restart: set[int] = field(default_factory=set)
    optional: set[int] = field(default_factory=set)
    resident: str | None = None

    def role(self, i: int) -> str:
        return self.roles[i] if self.roles else f"process {i}"

    def process_env(self, i: int) -> dict[str, str]:
        resident = {RESIDENT_ENV: self.resident} if self.resident else {}
        return {**self.env, **(self.envs[i] if self.envs else {}), **resident}


class JobFailedError(PipelineError):
    """A process of the job exited non-zero; the message names it and holds its log's tail.

    Attributes:
        exit_code: the failed process's exit code where known (2: the job refused its config
            or arguments, ``recpipe.errors``: a retry would fail the same way), else None.
        last_line: the last non-empty line of its log (its error, naming the field), or "".
    """

    def __init__(self, message: str, exit_code: int | None = None, last_line: str = ""):
        super().__init__(message)
        self.exit_code, self.last_line = exit_code, last_line


class JobTimeoutError(JobFailedError):
    """The job ran past its launcher's ``timeout_s``; every process of it was stopped."""


class Launcher(Protocol):
    """Start a job, wait for it, stop it: the operators' only view of where jobs run."""

    def run(self, job: JobSpec) -> list[Path]:
        """Run ``job`` to completion and return its log files.

        Raises:
            JobFailedError: a process failed (all others are stopped first).
            JobTimeoutError: the launcher's ``timeout_s`` passed (all processes stopped).
        """

    def kill(self) -> None:
        """Stop every process of the running job and their children; idempotent, never raises."""
