"""Airflow's ``SparkSubmitOperator`` whose ``spark-submit`` gets the feature job's environment
(``recpipe.launch.isolation.job_environment``: the allowlist and Spark's own variables, with the
operator's ``env_vars`` over them), where the provider's hook lays ``env_vars`` over the
worker's whole environment: its connections, the metadata database's URL, the MLflow password.
Imported only by a DAG on the spark-submit path (the provider pulls the Kubernetes client)."""

from __future__ import annotations

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from recpipe.launch.isolation import SPARK_PREFIXES, job_environment


class FeatureSparkSubmitHook(SparkSubmitHook):
    """``SparkSubmitHook`` whose process environment is ``job_environment(env_vars)``; the
    YARN and Kubernetes modes still pass ``env_vars`` to the driver as ``--conf``."""

    def _build_spark_submit_command(self, application: str) -> list[str]:
        command = super()._build_spark_submit_command(application)
        self._env = None  # else the parent's submit lays it over os.environ, replacing our env
        return command

    def submit(self, application: str = "", **popen) -> str | None:
        own = {str(k): str(v) for k, v in (self._env_vars or {}).items()}
        popen["env"] = job_environment(own, prefixes=SPARK_PREFIXES)
        return super().submit(application, **popen)


class FeatureSparkSubmitOperator(SparkSubmitOperator):
    """``SparkSubmitOperator`` (same arguments) running ``FeatureSparkSubmitHook``."""

    def _get_hook(self) -> SparkSubmitHook:
        hook = super()._get_hook()
        # the parent builds the hook from its ~30 arguments; only its class differs here
        hook.__class__ = FeatureSparkSubmitHook
        return hook
