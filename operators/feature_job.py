"""The Spark feature job as a DAG task, and the sensor waiting for its raw partition, set up
from a retrain config (``recpipe.config.retrain``) the same way in every DAG.

The job runs ``features/prepare.py`` either as a client session on a long-running Spark
Connect server (``spark_connect_conn_id``, the default: a pass prepares in the time of its
rows) or through Airflow's ``SparkSubmitOperator`` (``spark_connect_conn_id: null``: a JVM a
run, for clusters that schedule Spark applications themselves)."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from features import REMOTE_ENV
from features.jvm import session_conf
from operators.sensors import RawPartitionSensor
from recpipe.errors import EXIT_USAGE


def raw_partition_sensor(task_id: str, marker: str, retrain) -> RawPartitionSensor:
    """Wait for ``marker`` (a raw partition's ``_SUCCESS``, templated) by ``retrain.sensor``'s
    mode, interval, timeout and arrival messages. Its timeout is never retried (Airflow fails
    an ``AirflowSensorTimeout`` at once: the timeout is the wait); anything else is, once: a
    deferred wait whose partition arrived within a second can resume before a busy scheduler
    has processed the deferral's own executor event, and Airflow then fails the running task
    ("state changed externally"); the retry finds the partition at once."""
    return RawPartitionSensor(
        task_id=task_id,
        execution_timeout=retrain.timeouts.of(task_id),
        filepath=marker,
        mode=retrain.sensor.mode,
        deferrable=retrain.sensor.deferrable,
        poke_interval=retrain.sensor.poke_interval_s,
        timeout=retrain.sensor.timeout_s,
        arrivals_conn_id=retrain.sensor.arrivals_conn_id,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )


def spark_client_python(home: Path) -> str:
    """The Python of Spark Connect's client: ``$RECPIPE_SPARK_CLIENT_PYTHON``, else
    ``<home>/.venv/spark-client/bin/python`` (scripts/setup.sh builds it from
    requirements-spark-client.lock: pyspark 4.3's client needs protobuf 6, which TensorFlow
    2.18 refuses, so it cannot share TensorFlow's environment)."""
    return os.environ.get("RECPIPE_SPARK_CLIENT_PYTHON") or str(
        home / ".venv" / "spark-client" / "bin" / "python"
    )


class SparkConnectFeatureOperator(BaseOperator):
    """``features/prepare.py`` with ``application_args`` and ``name`` (the Spark application's,
    templated) as a Spark Connect session
    on the server of connection ``conn_id`` (conn type ``spark_connect``, the Spark provider's
    ``SparkConnectHook``): a Python process of Spark Connect's client
    (``spark_client_python``) run by Airflow's ``SubprocessHook``; no JVM starts for it.

    Raises (in ``execute``): ``AirflowFailException`` (no retry) with the job's last line when
    it exits 2 (its config or flags refused: the field is named); ``AirflowException`` with
    that line for any other non-zero exit.
    """

    template_fields = ("application_args", "name")

    def __init__(self, *, conn_id: str, application_args: list[str], name: str, home: Path, **kwargs):
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.application_args = application_args
        self.name = name
        self.home = home
        self._hook = None

    def execute(self, context) -> None:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
        from airflow.providers.standard.hooks.subprocess import SubprocessHook

        url = SparkConnectHook(self.conn_id).get_connection_url()
        command = [
            spark_client_python(self.home), "-m", "features.prepare", *self.application_args,
            "--app_name", self.name,
        ]  # fmt: skip
        self.log.info("prepare_features on Spark Connect %s", url.split(";")[0])
        # the URL may carry a token: in the job's environment, never on its command line; and
        # the job gets the allowlisted variables only, none of the worker's secrets
        env = feature_job_environment(self.home, {REMOTE_ENV: url})
        self._hook = SubprocessHook()
        result = self._hook.run_command(command, env=env, cwd=str(self.home))
        if result.exit_code == EXIT_USAGE:  # a bad config or flag: every retry would fail alike
            raise AirflowFailException(f"prepare_features: {result.output}")
        if result.exit_code != 0:
            raise AirflowException(f"prepare_features exited {result.exit_code}: {result.output}")

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.send_sigterm()


def feature_job_environment(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The feature job's environment: ``recpipe.launch.isolation.job_environment`` (the
    allowlisted variables and Spark's own, ``SPARK_PREFIXES``; no secret's name among them)
    with the project's paths and ``extra``."""
    from recpipe.launch.isolation import SPARK_PREFIXES, job_environment

    own = {"PYTHONPATH": str(home), "RECPIPE_HOME": str(home), **(extra or {})}
    return job_environment(own, prefixes=SPARK_PREFIXES)


def feature_job(home: Path, retrain, ds: str, edits_arg: str, name: str) -> BaseOperator:
    """``prepare_features``: ``features/prepare.py --ds <ds>`` (a day or a pass, templated)
    with the run's overrides (``edits_arg``, the ``--edit_config_json=...`` argument) and paths
    confined to the project; on ``retrain.spark_connect_conn_id``'s Spark Connect server, or
    without one through ``spark-submit`` on ``retrain.spark_conn_id``."""
    args = [
        "--pipeline_config_path",
        str(home / retrain.pipeline_config_path),
        "--ds",
        ds,
        "--confine_paths",
        edits_arg,
    ]
    if retrain.spark_connect_conn_id is not None:
        return SparkConnectFeatureOperator(
            task_id="prepare_features",
            execution_timeout=retrain.timeouts.of("prepare_features"),
            conn_id=retrain.spark_connect_conn_id,
            application_args=args,
            name=name,
            home=home,
        )
    # imported here: it pulls the Kubernetes client, about a second of every task's DAG parse
    from operators.spark_submit import FeatureSparkSubmitOperator

    return FeatureSparkSubmitOperator(
        task_id="prepare_features",
        execution_timeout=retrain.timeouts.of("prepare_features"),
        conn_id=retrain.spark_conn_id,
        application=str(home / "features" / "prepare.py"),
        application_args=args,
        name=name,
        # the job's own variables, strings as given (a templated field of a DAG rendering native
        # objects: "1" would become 1), over feature_job_environment's allowlist
        env_vars={
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": str(home),
            "RECPIPE_HOME": str(home),
        },
        # recpipe's JVM functions load with the driver's JVM, before the job's Python starts;
        # the driver's address is the task host's SPARK_LOCAL_IP (features/session.py), read
        # where the task runs, not where this DAG file is parsed
        conf={"spark.ui.enabled": "false", **session_conf()},
    )
