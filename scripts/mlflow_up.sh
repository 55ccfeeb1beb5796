#!/usr/bin/env bash
# make mlflow: the MLflow UI over the project's tracking store (var/mlflow) on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
port="${MLFLOW_PORT:-5000}"
mkdir -p var/mlflow/artifacts
echo "MLflow UI: http://127.0.0.1:$port  (no login: it listens on 127.0.0.1 only). Ctrl-C stops."
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false exec .venv/bin/mlflow server \
  --backend-store-uri "sqlite:///$PWD/var/mlflow/mlflow.db" \
  --artifacts-destination "$PWD/var/mlflow/artifacts" \
  --host 127.0.0.1 --port "$port" --workers 1
