"""``make demo``: run ``recpipe_daily_retrain`` for 7 consecutive days as an Airflow backfill
under the real scheduler (LocalExecutor; each day warm-started from the one before), print
each task as it finishes, then each day's AUC before and after training, whether the new model
was promoted, and where everything is.

Usage: ``python scripts/demo.py [--days N] [--first YYYY-MM-DD] [--runner backfill|dags-test]``
(defaults from the retrain config). ``--runner dags-test`` runs the days one by one with
``airflow dags test`` instead (no scheduler): the way the DAG tests run, kept to compare.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

HOME = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HOME))

from dev.airflow import run_backfill  # noqa: E402
from dev.env import airflow_env  # noqa: E402
from features import connect_server as spark_connect  # noqa: E402
from recpipe.config.retrain import load_retrain_config  # noqa: E402

CONFIG = "conf/retrain/movielens_daily.yaml"  # one of the deployment's DAGs
DAG_ID = load_retrain_config(HOME / CONFIG).effective_dag_id


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--first", default=None)
    parser.add_argument("--runner", choices=("backfill", "dags-test"), default="backfill")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds for all the days")
    args = parser.parse_args()
    retrain = load_retrain_config(HOME / CONFIG)
    first = date.fromisoformat(args.first) if args.first else retrain.start_date
    days = [(first + timedelta(days=k)).isoformat() for k in range(args.days)]
    env = {**os.environ, **airflow_env(HOME)}
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with spark_connect.running(env, HOME / "var" / "spark-connect"):  # prepare_features runs there
        if args.runner == "backfill":
            echo = functools.partial(print, flush=True)
            states = run_backfill(env, Path(env["AIRFLOW_HOME"]), DAG_ID, days, args.timeout, echo)
            code = 0 if all(states.get(ds) == "success" for ds in days) else 1
        else:
            code = run_dags_test(days, env, args.timeout)
    print(f"{len(days)} days in {time.monotonic() - start:.0f} s ({args.runner})")
    if code:
        return code
    print_table(retrain, days, env["MLFLOW_TRACKING_URI"])
    return 0


def run_dags_test(days: list[str], env: dict, timeout: float) -> int:
    """``airflow dags test`` of each day in turn, logged to ``var/demo/``. Returns the first
    failure's exit status, else 0."""
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True
    )
    logs = HOME / "var" / "demo"
    logs.mkdir(parents=True, exist_ok=True)
    for ds in days:
        start = time.monotonic()
        log = logs / f"{DAG_ID}-{ds}.log"
        with log.open("w") as out:
            proc = subprocess.run(
                [sys.executable, "-m", "airflow", "dags", "test", DAG_ID, ds],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
        outcome = "ok" if proc.returncode == 0 else "FAILED"
        print(f"ds={ds}: {outcome} in {time.monotonic() - start:.0f} s (log {log})", flush=True)
        if proc.returncode != 0:
            print(log.read_text()[-3000:])
            return proc.returncode
    return 0


def print_table(retrain, days: list[str], tracking_uri: str) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    exp = client.get_experiment_by_name(retrain.experiment)
    parents = client.search_runs(
        [exp.experiment_id],
        filter_string="tags.`recpipe.step` = 'parent' and tags.`airflow.dag_id` = 'recpipe_daily_retrain'",
        order_by=["attributes.start_time DESC"],
    )
    latest = {}
    for run in parents:  # newest run of each day
        latest.setdefault(run.data.tags.get("ds"), run)
    print()
    head = f"{'ds':<12}{'AUC before':>12}{'AUC after':>12}  {'promoted':<9}{'version':>8}{'incl. days':>11}"
    print(f"{head}  reason")
    for ds in days:
        run = latest.get(ds)
        if run is None:
            print(f"{ds:<12}{'-':>12}{'-':>12}  (no run)")
            continue
        m, t = run.data.metrics, run.data.tags
        before = f"{m['evaluate_champion.auc']:.4f}" if "evaluate_champion.auc" in m else "-"
        after = f"{m['eval.auc']:.4f}" if "eval.auc" in m else "-"
        print(
            f"{ds:<12}{before:>12}{after:>12}  {t.get('promoted', '-'):<9}{t.get('model_version', '-'):>8}"
            f"{t.get('inconclusive_days', '-'):>11}  {t.get('promotion_reason', '')}"
        )
    champion = client.get_model_version_by_alias(retrain.model_name, retrain.gate.alias)
    print()
    print("AUC before: yesterday's champion on the held-out rows of the gate's window; after: the new")
    print("model, same rows. incl. days: inconclusive gates in a row (gate.max_inconclusive_days fails).")
    print(f"champion:    {retrain.model_name} version {champion.version} (ds={champion.tags.get('ds')})")
    print(f"model dirs:  {HOME / retrain.runs_dir / retrain.model_name}/ds=YYYY-MM-DD")
    print(f"exports:     {HOME / retrain.export_dir / retrain.model_name}/<version>/")
    from recpipe.runs.compare import experiment_link

    print(f"MLflow:      {tracking_uri} (experiment {retrain.experiment}); browse with `make mlflow`:")
    print(f"             {experiment_link('http://127.0.0.1:5000', exp.experiment_id)}")
    print("Airflow:     var/airflow (SQLite); browse with `make airflow`")


if __name__ == "__main__":
    raise SystemExit(main())
