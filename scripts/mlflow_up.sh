#!/usr/bin/env bash
# make mlflow: the MLflow UI over the project's tracking store (var/mlflow) on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
port="${MLFLOW_PORT:-5000}"
mkdir -p var/mlflow/artifacts
echo "MLflow UI: http://127.0.0.1:$port  (no login: it listens on 127.0.0.1 only). Ctrl-C stops."
# each experiment's runs table (MLflow 3.17 opens an experiment in its GenAI view otherwise)
if [ -f var/mlflow/mlflow.db ]; then
  .venv/bin/python - "$port" <<'PY' || true
import sys
from mlflow import MlflowClient
from recpipe.home import default_tracking_uri
from recpipe.runs.compare import experiment_link
for exp in MlflowClient(default_tracking_uri()).search_experiments():
    if exp.name != "Default":
        print(f"  {exp.name}: {experiment_link(f'http://127.0.0.1:{sys.argv[1]}', exp.experiment_id)}")
PY
fi
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false exec .venv/bin/mlflow server \
  --backend-store-uri "sqlite:///$PWD/var/mlflow/mlflow.db" \
  --artifacts-destination "$PWD/var/mlflow/artifacts" \
  --host 127.0.0.1 --port "$port" --workers 1
