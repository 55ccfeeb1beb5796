"""Which MLflow a command talks to, resolved as the DAGs resolve it, and a client that fails in
seconds when that server does not answer.

Order: the ``--tracking_uri`` flag, ``$MLFLOW_TRACKING_URI``, the Airflow connection
``mlflow_default`` as the deployment defines it in the environment
(``$AIRFLOW_CONN_MLFLOW_DEFAULT``, JSON or URI form, as ``operators.hooks.mlflow.MLflowHook``
reads it), else the project's SQLite store ``<var>/mlflow/mlflow.db`` (never a new
``./mlflow.db`` in the current directory, MLflow's own default).
"""

from __future__ import annotations

import json
import os
from urllib.parse import urlsplit

from recpipe.errors import PipelineError, UsageError
from recpipe.home import default_tracking_uri

CONN_ENV = "AIRFLOW_CONN_MLFLOW_DEFAULT"


class TrackingUnavailableError(PipelineError):
    """The MLflow tracking server does not answer (its URI and the error are named).

    Attributes:
        uri, reason: the server, and why it did not answer (``ErrorType: message``).
    """

    def __init__(self, message: str, uri: str, reason: str):
        super().__init__(message)
        self.uri, self.reason = uri, reason


def _from_connection(value: str) -> str | None:
    """The tracking URI of an Airflow connection in its environment form (JSON or URI)."""
    value = value.strip()
    if value.startswith("{"):
        try:
            conn = json.loads(value)
        except json.JSONDecodeError as err:
            raise UsageError(f"${CONN_ENV}: not JSON ({err})") from None
        extra = conn.get("extra") or {}
        if isinstance(extra, str):
            extra = json.loads(extra or "{}")
        if extra.get("tracking_uri"):
            return extra["tracking_uri"]
        if not conn.get("host"):
            return None
        port = f":{conn['port']}" if conn.get("port") else ""
        return f"{conn.get('schema') or 'http'}://{conn['host']}{port}"
    parts = urlsplit(value)
    if not parts.hostname:
        return None
    scheme = "https" if parts.scheme == "https" else "http"
    return f"{scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def redacted(uri: str) -> str:
    """``uri`` without the user part of its address (``user:password@``), for messages."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]).geturl()


def tracking_uri(given: str | None = None, flag: str = "--tracking_uri") -> str:
    """The tracking URI, in the order of the module docstring.

    Raises:
        UsageError: ``given`` (a command line's) holds a password, which any user of the host
            can read from the process list (the message does not repeat it).
    """
    if given:
        try:
            password = urlsplit(given).password
        except ValueError:
            raise UsageError(f"{flag}={redacted(given)}: not a URI") from None
        if password is not None:
            raise UsageError(
                f"{flag} holds a password, which any user of this host can read from the process list: "
                "give the URI in $MLFLOW_TRACKING_URI (a database's) or the password in "
                "$MLFLOW_TRACKING_PASSWORD (a server's)"
            )
        return given
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    conn = os.environ.get(CONN_ENV)
    return (conn and _from_connection(conn)) or default_tracking_uri()


def probe(uri: str, timeout_s: float = 5.0) -> None:
    """Ask an HTTP tracking server's ``/health``; nothing to do for a database URI.

    Raises:
        TrackingUnavailableError: no answer within ``timeout_s`` seconds, or an error status.
    """
    import urllib.error
    import urllib.request

    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as answer:
            answer.read()
    except (urllib.error.URLError, OSError) as err:
        reason = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
        raise TrackingUnavailableError(
            f"MLflow at {redacted(uri)} does not answer ({reason}); start it, or name another with "
            "--tracking_uri / $MLFLOW_TRACKING_URI",
            uri,
            reason,
        ) from None


def probe_database(uri: str, timeout_s: float = 5.0) -> None:
    """Connect once to a database tracking store (PostgreSQL, MySQL: not SQLite, a file).

    Raises:
        TrackingUnavailableError: the database does not answer within ``timeout_s`` seconds
            or refuses the login (one line, the password left out).
    """
    if uri.startswith(("http://", "https://", "sqlite:", "file:")) or "://" not in uri:
        return
    import sqlalchemy

    args = {"connect_timeout": int(max(timeout_s, 1))} if uri.startswith(("postgresql", "mysql")) else {}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=args)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as err:  # noqa: BLE001 - drivers raise their own kinds; one line either way
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        raise TrackingUnavailableError(
            f"the MLflow database {redacted(uri)} does not answer ({reason}); start it, or name another "
            "with --tracking_uri / $MLFLOW_TRACKING_URI",
            uri,
            reason,
        ) from None


def client(given: str | None = None, timeout_s: float = 5.0):
    """An ``mlflow.MlflowClient`` of ``tracking_uri(given)``, its server probed first, and its
    HTTP requests limited to ``timeout_s`` seconds and no retries (a command answers at once).

    Raises:
        TrackingUnavailableError: see ``probe``.
    """
    uri = tracking_uri(given)
    probe(uri, timeout_s)
    probe_database(uri, timeout_s)
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(max(timeout_s, 1))))
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)
