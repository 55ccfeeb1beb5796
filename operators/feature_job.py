"""The Spark feature job as a DAG task: Airflow's ``SparkSubmitOperator`` over
``features/prepare.py``, and the sensor waiting for its raw partition, set up from a retrain
config (``recpipe.config.retrain``) the same way in every DAG."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from features.jvm import session_conf
from operators.sensors import RawPartitionSensor


def raw_partition_sensor(task_id: str, marker: str, retrain) -> RawPartitionSensor:
    """Wait for ``marker`` (a raw partition's ``_SUCCESS``, templated) by ``retrain.sensor``'s
    mode, interval and timeout; never retried (its timeout is the wait)."""
    return RawPartitionSensor(
        task_id=task_id,
        execution_timeout=retrain.timeouts.of(task_id),
        filepath=marker,
        mode=retrain.sensor.mode,
        deferrable=retrain.sensor.deferrable,
        poke_interval=retrain.sensor.poke_interval_s,
        timeout=retrain.sensor.timeout_s,
        retries=0,
    )


def feature_job(home: Path, retrain, ds: str, edits_arg: str, name: str) -> SparkSubmitOperator:
    """``prepare_features``: ``spark-submit features/prepare.py --ds <ds>`` (a day or a pass,
    templated) on ``retrain.spark_conn_id``, with the run's overrides (``edits_arg``, the
    ``--edit_config_json=...`` argument) and paths confined to the project."""
    return SparkSubmitOperator(
        task_id="prepare_features",
        execution_timeout=retrain.timeouts.of("prepare_features"),
        conn_id=retrain.spark_conn_id,
        application=str(home / "features" / "prepare.py"),
        application_args=[
            "--pipeline_config_path",
            str(home / retrain.pipeline_config_path),
            "--ds",
            ds,
            "--confine_paths",
            edits_arg,
        ],
        name=name,
        env_vars={
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": str(home),
            "RECPIPE_HOME": str(home),
            "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        },
        # recpipe's JVM functions load with the driver's JVM, before the job's Python starts
        conf={"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1", **session_conf()},
    )
