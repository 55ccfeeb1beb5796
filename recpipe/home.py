"""Where the project lives on this machine: its checkout (``$RECPIPE_HOME``), its state
(``$RECPIPE_VAR_DIR``) and the MLflow store used when no server is named."""

from __future__ import annotations

import os
from pathlib import Path


def project_home() -> Path:
    """``$RECPIPE_HOME`` or the checkout holding this file, resolved."""
    return Path(os.environ.get("RECPIPE_HOME") or Path(__file__).resolve().parents[1]).resolve()


def var_dir() -> Path:
    """``$RECPIPE_VAR_DIR`` or ``<home>/var``: model dirs, exports, MLflow, Airflow state."""
    return Path(os.environ.get("RECPIPE_VAR_DIR") or project_home() / "var").resolve()


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else the SQLite store ``<var>/mlflow/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{var_dir() / 'mlflow' / 'mlflow.db'}"
