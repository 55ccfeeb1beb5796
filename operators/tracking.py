"""Closing a failed DAG run's MLflow parent run."""

from __future__ import annotations

import logging
from collections.abc import Callable

from operators.hooks.mlflow import MLflowHook, git_commit

log = logging.getLogger(__name__)


def fail_parent_run(experiment: str, mlflow_conn_id: str = "mlflow_default") -> Callable[[dict], None]:
    """An ``on_failure_callback`` that marks the DAG run's parent run FAILED, tagging the
    failed task. It runs after a task's last try, so no run is left RUNNING; it logs and
    swallows its own errors (a callback must not mask the task's)."""

    def callback(context) -> None:
        try:
            hook = MLflowHook(mlflow_conn_id)
            parent = hook.parent_run(
                experiment,
                context["dag"].dag_id,
                context["run_id"],
                {"ds": context.get("ds") or "none", "git_commit": git_commit()},
            )
            hook.set_tags(parent, {"outcome": "failed", "failed_task": context["ti"].task_id})
            hook.end_run(parent, failed=True)
        except Exception as err:  # noqa: BLE001
            log.warning("could not mark the MLflow parent run failed: %s", err)

    return callback
