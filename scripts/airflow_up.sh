#!/usr/bin/env bash
# make airflow: Airflow's api-server, scheduler, dag-processor and triggerer (LocalExecutor,
# SQLite in var/airflow) and a Spark Connect server on 127.0.0.1, in the foreground; Ctrl-C stops them all.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(.venv/bin/python -m dev.env)"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS:-admin:admin}"
mkdir -p "$AIRFLOW_HOME"
.venv/bin/airflow db migrate > "$AIRFLOW_HOME/db-migrate.log" 2>&1
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' INT TERM EXIT
# the feature job's Spark Connect server (prepare_features is a session on it)
.venv/bin/python -m dev.spark_connect > "$AIRFLOW_HOME/spark-connect.log" 2>&1 &
pids+=($!)
for component in api-server scheduler dag-processor triggerer; do
  .venv/bin/airflow "$component" > "$AIRFLOW_HOME/$component.log" 2>&1 &
  pids+=($!)
done
passwords="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"
for _ in $(seq 90); do [[ -s $passwords ]] && curl -sf "$AIRFLOW__API__BASE_URL/api/v2/monitor/health" > /dev/null && break; sleep 2; done
echo "Airflow UI: $AIRFLOW__API__BASE_URL  (user admin, password in $passwords: $(cat "$passwords" 2>/dev/null))"
echo "logs: $AIRFLOW_HOME/*.log; DAGs: recpipe_daily_retrain (paused at creation), recpipe_train. Ctrl-C stops."
wait
