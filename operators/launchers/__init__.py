"""Launchers: how a training, evaluation or export job's processes are started, watched and
stopped. Operators talk to the ``Launcher`` interface only, so the backend (processes on this
machine, or a cluster) is swapped by ``conf/cluster/*.yaml`` without touching them."""

from operators.launchers.base import JobFailedError, JobSpec, Launcher
from operators.launchers.local import LocalLauncher

__all__ = ["JobFailedError", "JobSpec", "Launcher", "LocalLauncher", "launcher_for"]


def launcher_for(cluster, log_dir) -> Launcher:
    """The launcher named by the cluster config's ``launcher`` field.

    Raises:
        ValueError: an unknown launcher.
    """
    if cluster.launcher == "local":
        return LocalLauncher(log_dir)
    if cluster.launcher == "kubernetes":
        from operators.launchers.kubernetes import KubernetesLauncher

        return KubernetesLauncher(log_dir, cluster.kubernetes_conn_id, cluster.poll_interval_s)
    raise ValueError(f"cluster launcher {cluster.launcher!r} is not available (local, kubernetes)")
