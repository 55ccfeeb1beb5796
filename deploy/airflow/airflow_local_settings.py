"""Airflow's local settings for recpipe (``airflow_local_settings``, imported by every Airflow
process at start).

It only imports, in the Airflow processes that fork tasks or parse DAG files (the scheduler,
whose LocalExecutor forks every task; a Celery worker; the DAG processor), the modules that
every recpipe task imports: its DAG file's (the Spark provider's ``SparkSubmitOperator``
module imports the Kubernetes client) and MLflow's client, SciPy's statistics and pyarrow's
Parquet, which the operators import when they run. A task forked from such a process starts
with them loaded: about 1.4 s (the DAG file) to 3.5 s (the gate) of every task on the
development machine (bench/pass_latency.py: the DAG's overhead over its jobs). The API server and the
triggerer import nothing more. Neither TensorFlow nor Spark is imported here: the jobs run
them in processes of their own.

The directory holding this file goes on ``PYTHONPATH`` (``dev.env.airflow_env``, the
Dockerfile). A module that fails to import is logged and skipped: the tasks then import it
themselves, and fail there with the task's own error.
"""

from __future__ import annotations

import importlib
import logging
import sys

__all__: list[str] = []  # nothing for Airflow to take as a setting or a cluster policy

# what a DAG file imports, then what the operators import when they run
PRELOADED = (
    "airflow.providers.apache.spark.operators.spark_submit",
    "operators.retrain_dag",
    "operators.validate",
    "operators.stream",
    "mlflow",
    "scipy.stats",
    "pyarrow.parquet",
)
# the Airflow commands whose processes fork tasks or DAG-file parsers
FORKING = ("scheduler", "worker", "dag-processor")


def _preload(argv: list[str]) -> list[str]:
    """Import ``PRELOADED`` in a forking Airflow command; returns the modules imported."""
    if not any(command in argv[1:3] for command in FORKING):
        return []
    done = []
    for name in PRELOADED:
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception:  # noqa: BLE001 - a speed-up only: the task imports it again itself
            logging.getLogger(__name__).warning("recpipe: could not pre-import %s", name, exc_info=True)
    return done


_preload(sys.argv)
