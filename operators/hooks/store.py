"""The online embedding store's Redis for a task, as Airflow's providers connect: the
connection ``recpipe_store`` (``AIRFLOW_CONN_RECPIPE_STORE``; Airflow's ``RedisHook`` reads its
host, port, password and ``extra.db``), else the core's resolver (``$RECPIPE_REDIS_URL``, then
the retrain config's ``stream.redis_url``: ``recpipe.redis_conn``). Resolved when the task
runs, never while the DAG file is parsed, and no password is an operator argument (a rendered
argument is stored and shown in the UI)."""

from __future__ import annotations

STORE_CONN_ID = "recpipe_store"


def store_client(conn_id: str | None = STORE_CONN_ID, fallback_url: str | None = None):
    """A ``redis.Redis`` of the store (see the module docstring for the order).

    Args:
        conn_id: the Airflow connection; None or undefined: the fallbacks.
        fallback_url: the config's ``redis://host:port/db`` (no password), after
            ``$RECPIPE_REDIS_URL``.

    Raises:
        recpipe.errors.UsageError: no store named anywhere, or a malformed URL (named).
    """
    from airflow.exceptions import AirflowNotFoundException
    from airflow.providers.redis.hooks.redis import RedisHook

    from recpipe import redis_conn
    from recpipe.errors import UsageError

    if conn_id:
        try:
            return RedisHook(redis_conn_id=conn_id).get_conn()
        except AirflowNotFoundException:  # not defined: the fallbacks
            pass
    address = redis_conn.resolve(None, env=redis_conn.STORE_ENV, default=fallback_url)
    if address is None:
        raise UsageError(
            f"no online store: define the Airflow connection {conn_id!r}, set ${redis_conn.STORE_ENV}, "
            "or stream.redis_url in the retrain config"
        )
    return address.client()
