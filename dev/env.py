"""The environment of a local Airflow + MLflow (``make airflow``, ``make demo``, the tests).

``python -m dev.env [--home DIR] [--airflow-home DIR]`` prints ``export`` lines for a
shell; ``airflow_env()`` returns the same as a dict. Everything binds 127.0.0.1; state lives in
``var/`` (SQLite for Airflow and MLflow), connections come from ``AIRFLOW_CONN_*`` variables.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from features import CONNECT_PORT as SPARK_CONNECT_PORT

AIRFLOW_PORT = 8080
MLFLOW_PORT = 5000
# SQLite's default busy timeout (5 s) is short for four Airflow components writing at once:
# a backfill's runs were left half created ("database is locked"). Airflow imports this dict.
SQLITE_CONNECT_ARGS = {"timeout": 60}


def spark_connect_conn(port: int, host: str = "127.0.0.1") -> str:
    """An ``AIRFLOW_CONN_*`` value for the Spark Connect server at ``host:port``."""
    return json.dumps({"conn_type": "spark_connect", "host": host, "port": port})


def database_env(url: str) -> dict[str, str]:
    """Airflow's metadata database settings for ``url``: the URL, and for SQLite the connect
    arguments above (for another database they must be absent: psycopg2 refuses ``timeout``)."""
    env = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url}
    if url.startswith("sqlite"):
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] = "dev.env.SQLITE_CONNECT_ARGS"
    return env


def airflow_env(
    home: Path, airflow_home: Path | None = None, database_url: str | None = None
) -> dict[str, str]:
    """Variables for Airflow processes started from the checkout ``home``.

    Args:
        home: the project checkout (``RECPIPE_HOME``).
        airflow_home: state dir (default ``<home>/var/airflow``).
        database_url: metadata DB (default SQLite in ``airflow_home``).
    """
    home = Path(home).resolve()
    ah = Path(airflow_home or home / "var" / "airflow").resolve()
    venv_bin = str(Path(sys.executable).parent)
    return {
        "RECPIPE_HOME": str(home),
        "AIRFLOW_HOME": str(ah),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        # a skipped task's downstream tasks are skipped one scheduler loop at a time, and an idle
        # loop sleeps this long (default 1 s): a quiet pass's skips cost seconds (bench/pass_latency.py).
        # The shorter sleep costs an idle scheduler CPU: the environment's value wins (the test
        # suite, whose schedulers wait beside busy tests, sets Airflow's default)
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": os.environ.get(
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME", "0.2"
        ),
        **database_env(database_url or f"sqlite:///{ah / 'airflow.db'}"),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(AIRFLOW_PORT),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{AIRFLOW_PORT}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{AIRFLOW_PORT}/execution/",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(ah / "logs"),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        # the feature job's Spark Connect server (features.connect_server; the tests start their own)
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": os.environ.get("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT")
        or spark_connect_conn(SPARK_CONNECT_PORT),
        "AIRFLOW_CONN_FS_DEFAULT": json.dumps({"conn_type": "fs", "extra": {"path": "/"}}),
        # raw partitions announced on the local Redis (recpipe.arrivals; the stream config's sensor)
        "AIRFLOW_CONN_RECPIPE_ARRIVALS": os.environ.get("AIRFLOW_CONN_RECPIPE_ARRIVALS")
        or json.dumps({"conn_type": "redis", "host": "127.0.0.1", "port": 6379, "extra": {"db": 0}}),
        "MLFLOW_TRACKING_URI": os.environ.get("MLFLOW_TRACKING_URI")
        or f"sqlite:///{home / 'var' / 'mlflow' / 'mlflow.db'}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        # deploy/airflow: airflow_local_settings, which pre-imports what every task imports
        "PYTHONPATH": os.pathsep.join([str(home), str(home / "deploy" / "airflow")]),
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.env", description=__doc__.splitlines()[0])
    parser.add_argument("--home", default=os.environ.get("RECPIPE_HOME") or Path.cwd())
    parser.add_argument("--airflow-home", default=None)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args(argv)
    env = airflow_env(Path(args.home), args.airflow_home and Path(args.airflow_home), args.database_url)
    for key, value in env.items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
