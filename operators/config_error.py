"""The DAG that stands for a retrain config that does not load (``dags/recpipe_retrain.py``):
the other models' DAGs are built and keep scheduling; this one shows the error in the UI."""

from __future__ import annotations

from pathlib import Path

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG


def _fail(message: str) -> None:
    from recpipe.config.errors import ConfigError

    raise ConfigError(message)


def config_error_dag(path: Path, err: Exception) -> DAG:
    """``<stem>_config_error``: no schedule, tag ``config-error``, the error as its
    description and docs, and one task ``config_error`` that fails with it if triggered."""
    message = str(err)
    with DAG(
        dag_id=f"{Path(path).stem}_config_error".replace(" ", "_"),
        description=f"{Path(path).name} does not load: {' '.join(message.split())}"[:500],
        doc_md=f"## `{path}` does not load\n\n```\n{message}\n```\n\nFix the file; the DAG it "
        "defines appears when it loads.",
        schedule=None,
        tags=["recpipe", "config-error"],
    ) as dag:
        PythonOperator(task_id="config_error", python_callable=_fail, op_args=[message], retries=0)
    return dag
