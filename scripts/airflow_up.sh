#!/usr/bin/env bash
# make airflow: Airflow's api-server, scheduler, dag-processor and triggerer (LocalExecutor) and
# a Spark Connect server on 127.0.0.1, in the foreground; Ctrl-C stops them all.
# The metadata database: $RECPIPE_AIRFLOW_DATABASE_URL, else the database recpipe_airflow on the
# PostgreSQL at 127.0.0.1 (created here) when it answers, as several models' backfills need
# (SQLite locks under concurrent writers); SQLite in var/airflow only as the fallback.
set -euo pipefail
cd "$(dirname "$0")/.."
db_url="${RECPIPE_AIRFLOW_DATABASE_URL:-}"
psql=(psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -tA)
if [[ -z $db_url ]] && "${psql[@]}" -c 'select 1' > /dev/null 2>&1; then
  if [[ -z $("${psql[@]}" -c "select 1 from pg_database where datname = 'recpipe_airflow'") ]]; then
    "${psql[@]}" -c 'CREATE DATABASE recpipe_airflow' > /dev/null
  fi
  db_url=postgresql+psycopg2://postgres@127.0.0.1:5432/recpipe_airflow
fi
eval "$(.venv/bin/python -m dev.env ${db_url:+--database-url "$db_url"})"
if [[ -z $db_url ]]; then
  echo "metadata database: SQLite in $AIRFLOW_HOME (no PostgreSQL answers on 127.0.0.1:5432): one model at a time" >&2
elif [[ -n ${RECPIPE_AIRFLOW_DATABASE_URL:-} ]]; then
  echo "metadata database: \$RECPIPE_AIRFLOW_DATABASE_URL's" >&2
else
  echo "metadata database: recpipe_airflow on the PostgreSQL at 127.0.0.1:5432" >&2
fi
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS:-admin:admin}"
mkdir -p "$AIRFLOW_HOME"
.venv/bin/airflow db migrate > "$AIRFLOW_HOME/db-migrate.log" 2>&1
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' INT TERM EXIT
# the feature job's Spark Connect server (prepare_features is a session on it)
.venv/bin/python -m features.connect_server > "$AIRFLOW_HOME/spark-connect.log" 2>&1 &
pids+=($!)
for component in api-server scheduler dag-processor; do
  .venv/bin/airflow "$component" > "$AIRFLOW_HOME/$component.log" 2>&1 &
  pids+=($!)
done
# its log server would listen on every interface: the api-server reads the shared log folder
.venv/bin/airflow triggerer --skip-serve-logs > "$AIRFLOW_HOME/triggerer.log" 2>&1 &
pids+=($!)
passwords="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"
for _ in $(seq 90); do [[ -s $passwords ]] && curl -sf "$AIRFLOW__API__BASE_URL/api/v2/monitor/health" > /dev/null && break; sleep 2; done
echo "Airflow UI: $AIRFLOW__API__BASE_URL  (user admin, password in $passwords: $(cat "$passwords" 2>/dev/null))"
echo "logs: $AIRFLOW_HOME/*.log; DAGs: recpipe_daily_retrain (paused at creation), recpipe_train. Ctrl-C stops."
wait
