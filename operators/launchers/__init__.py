"""Launchers: how a training, evaluation or export job's processes are started, watched and
stopped. Operators talk to the ``Launcher`` interface only, so the backend (processes on this
machine, or a cluster) is swapped by ``conf/cluster/*.yaml`` without touching them."""

from operators.launchers.base import JobFailedError, JobSpec, Launcher
from operators.launchers.local import LocalLauncher

__all__ = ["JobFailedError", "JobSpec", "Launcher", "LocalLauncher", "launcher_for"]


def launcher_for(kind: str, log_dir) -> Launcher:
    """The launcher named by a cluster config's ``launcher`` field.

    Raises:
        ValueError: an unknown launcher, or one this build does not provide yet.
    """
    if kind == "local":
        return LocalLauncher(log_dir)
    raise ValueError(f"cluster launcher {kind!r} is not available (known here: local)")
