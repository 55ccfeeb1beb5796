"""The MLflow parent run of a DAG run: its name, and closing it when the DAG run fails."""

from __future__ import annotations

import logging
from collections.abc import Callable

from operators.hooks.mlflow import MLflowHook, git_commit
from recpipe.layout import pass_key_format

log = logging.getLogger(__name__)


def run_name(context, pass_minutes: int | None = None) -> str:
    """A DAG run's parent run name, what a user scans the runs table for first: the day (and,
    for a stream of ``pass_minutes`` passes, the pass), then how it ran: ``ds=1997-09-22 hh=23
    backfill``, ``ds=1997-09-22 hh=2345 scheduled``. A run without a logical date (a manual
    trigger may have none) is named by its run id."""
    ds, logical = context.get("ds"), context.get("logical_date")
    dag_run = context.get("dag_run")
    how = getattr(getattr(dag_run, "run_type", None), "value", None) or str(
        getattr(dag_run, "run_type", "run")
    )
    if not ds:
        return f"{context['run_id']} {how}"
    if pass_minutes is None or logical is None:
        return f"ds={ds} {how}"
    return f"ds={ds} hh={logical.strftime(pass_key_format(pass_minutes))} {how}"


def fail_parent_run(
    experiment: str, mlflow_conn_id: str = "mlflow_default", pass_minutes: int | None = None
) -> Callable[[dict], None]:
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
                name=run_name(context, pass_minutes),
            )
            hook.set_tags(parent, {"outcome": "failed", "failed_task": context["ti"].task_id})
            hook.end_run(parent, failed=True)
        except Exception as err:  # noqa: BLE001
            log.warning("could not mark the MLflow parent run failed: %s", err)

    return callback
