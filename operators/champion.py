"""``ChampionOperator``: move a model's champion from the Airflow UI (the DAG
``recpipe_champion``): the same moves as ``recpipe champion`` (``recpipe.champion``), by the
user who triggered the run, and for a stream model the online store restored to the new
champion's rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator

from operators.hooks.mlflow import MLflowHook
from operators.hooks.store import STORE_CONN_ID, store_client


class ChampionOperator(BaseOperator):
    """Set (``version``) or roll back the ``alias`` of ``model_name`` with ``reason``.

    Args (templated): ``model_name``, ``action`` (``set`` or ``rollback``), ``version``,
    ``reason``. ``configs``: the deployment's retrain configs by model name (the alias, the
    experiment, and for ``kind: stream`` the store to restore); a model not among them is
    refused. ``mlflow_conn_id``: the MLflow connection; ``redis_conn_id``: the store's
    (``operators.hooks.store``). A retry after a failure halfway (the store unreachable)
    finishes the same move (``recpipe.champion.move``). ``execution_timeout`` defaults to 10
    minutes.

    Returns (XCom): the move (``recpipe.champion.set_champion``'s record), with ``store`` for
    a stream model.

    Raises:
        recpipe.champion.ChampionError: no such model, version or earlier champion, or the
            version's files are gone.
    """

    template_fields = ("model_name", "action", "version", "reason")

    def __init__(self, *, model_name: str, action: str, version, reason: str, configs: dict, **kwargs):
        self.mlflow_conn_id = kwargs.pop("mlflow_conn_id", "mlflow_default")
        self.redis_conn_id = kwargs.pop("redis_conn_id", STORE_CONN_ID)
        kwargs.setdefault("execution_timeout", timedelta(minutes=10))
        super().__init__(**kwargs)
        self.model_name, self.action, self.version, self.reason = model_name, action, version, reason
        self.configs = configs

    def execute(self, context) -> dict[str, Any]:
        from recpipe import champion

        retrain = self.configs.get(self.model_name)
        if retrain is None:
            known = ", ".join(sorted(self.configs)) or "none"
            raise champion.ChampionError(f"{self.model_name!r} is no model of this deployment ({known})")
        run = context.get("dag_run")
        by = getattr(run, "triggering_user_name", None) or "airflow"
        client = MLflowHook(mlflow_conn_id=self.mlflow_conn_id).get_client()
        alias = retrain.gate.alias
        store = None
        if retrain.kind == "stream" and retrain.stream.redis_url:
            store = store_client(self.redis_conn_id, retrain.stream.redis_url)
        record = champion.move(
            client,
            self.model_name,
            self.action,
            self.reason,
            by,
            self.version,
            alias,
            retrain.experiment,
            store,
        )
        self.log.info("%s %s: version %s -> %s by %s (%s)", self.model_name, alias, record["previous"],
                      record["version"], by, self.reason)  # fmt: skip
        return record
