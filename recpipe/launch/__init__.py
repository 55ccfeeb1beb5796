"""Launchers: how a training, evaluation or export job's processes are started, watched and
stopped, on this machine or on a cluster. No Airflow here: the operators, ``recpipe train
--num_workers N`` and the benchmarks all go through ``training_job`` / ``command_job`` and
``launcher_for``, so the backend (``conf/cluster/*.yaml``'s ``launcher``) is swapped without
touching any of them, as TFX swaps executors.
"""

from recpipe.launch.base import JobFailedError, JobSpec, JobTimeoutError, Launcher
from recpipe.launch.jobs import command_job, job_result, launcher_for, run_job, training_job
from recpipe.launch.local import LocalLauncher

__all__ = [
    "JobFailedError",
    "JobTimeoutError",
    "JobSpec",
    "Launcher",
    "LocalLauncher",
    "command_job",
    "job_result",
    "launcher_for",
    "run_job",
    "training_job",
]
