"""``recpipe_daily_retrain`` on production-size days: an Airflow backfill under the scheduler.

``--days`` synthetic Criteo days of ``--rows`` rows each (``kaggle`` profile) run through the
daily DAG with ``conf/retrain/criteo_daily.yaml`` (each day fine-tuned from the champion on
that day alone, lazy Adam, 10 % held out for the gate), LocalExecutor, its own Airflow home
under ``var/bench/production_dag/``. Printed: each task's time per day, beside the figure
``bench/production_day.py`` measured for the same command on a day of the same size
(``var/bench/production/results.json``: run it first with ``--rows`` equal to this one's), and
what the DAG adds over its jobs (goal: at most +10 %): a day's run (first task start to last
task end) against the sum of its jobs' own times in that run (each job logs ``recpipe job <name>
ran <s> s``, read from the task logs: what is left is Airflow's, the tasks that run no job and
each task's time around its job), and against the sum of the bench's figures for the same
commands (measured in another run, apart from Airflow's processes).

    python bench/production_dag.py [--rows 3000000] [--days 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from datetime import date, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dev.airflow import run_backfill  # noqa: E402
from dev.env import airflow_env  # noqa: E402

DAG_ID = "recpipe_daily_retrain"
RETRAIN = "conf/retrain/criteo_daily.yaml"
WORK = ROOT / "var/bench/production_dag"  # the retrain config's raw and feature paths
FIRST = "2024-01-01"
# the DAG's tasks that run a job, and the bench step that runs the same command
JOBS = {
    "prepare_features": "features",
    "evaluate_champion": "eval hashed",
    "train": "train hashed",
    "evaluate": "eval hashed",
    "export": "export hashed",
}


def synth(rows: int, days: int) -> None:
    stamp = WORK / "rows"
    wanted = f"{rows} {days}"
    if stamp.exists() and stamp.read_text() == wanted:
        return
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "recpipe.cli", "data", "synth", "criteo", "--profile", "kaggle",
         "--rows", str(rows * days), "--days", str(days), "--start", FIRST, "--out", str(WORK / "raw")],
        check=True,
    )  # fmt: skip
    stamp.write_text(wanted)
    print(f"{days} days of {rows:,} rows synthesised in {time.perf_counter() - start:.0f} s", flush=True)


JOB_LINE = re.compile(r"recpipe job \S+ ran ([0-9.]+) s")


def job_seconds(logs: Path, ds: str, task: str) -> float | None:
    """The job's own seconds in a task's last attempt (its ``recpipe job ... ran`` line in the
    Airflow task log), or None for a task that ran no job."""
    attempts = sorted(logs.glob(f"dag_id={DAG_ID}/run_id=*{ds}*/task_id={task}/attempt=*.log"))
    if not attempts:
        return None
    found = JOB_LINE.findall(attempts[-1].read_text(errors="replace"))
    return float(found[-1]) if found else None


def dag_runs(db: Path) -> dict[str, float]:
    """Each backfill run's seconds from its first task's start to its last task's end, by
    ``ds``, from the Airflow metadata database (SQLite)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT substr(r.logical_date, 1, 10), min(t.start_date), max(t.end_date) "
            "FROM dag_run r JOIN task_instance t ON t.run_id = r.run_id AND t.dag_id = r.dag_id "
            "WHERE r.dag_id = ? GROUP BY r.run_id",
            (DAG_ID,),
        ).fetchall()
    out = {}
    for ds, first, last in rows:
        if first and last:
            out[ds] = (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000, help="rows a day")
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=3 * 3600)
    parser.add_argument("--bench", default=str(ROOT / "var/bench/production/results.json"))
    args = parser.parse_args()
    synth(args.rows, args.days)
    days = [(date.fromisoformat(FIRST) + timedelta(days=k)).isoformat() for k in range(args.days)]
    airflow_home = WORK / "airflow"
    shutil.rmtree(airflow_home, ignore_errors=True)
    for stale in (ROOT / "var/runs/criteo_deepfm", ROOT / "var/exports/criteo_deepfm", WORK / "features"):
        shutil.rmtree(stale, ignore_errors=True)
    env = {
        **os.environ,
        **airflow_env(ROOT, airflow_home),
        "RECPIPE_RETRAIN_CONFIG": RETRAIN,
        # MLflow of its own: the bench's registered model does not mix with the demo's
        "MLFLOW_TRACKING_URI": f"sqlite:///{WORK / 'mlflow.db'}",
    }
    airflow_home.mkdir(parents=True)
    durations: dict = {}
    start = time.perf_counter()
    states = run_backfill(
        env, airflow_home, DAG_ID, days, args.timeout, lambda line: print(line, flush=True), durations
    )
    wall = time.perf_counter() - start
    print(f"\n{len(days)} days in {wall:.0f} s: {states}")
    bench = (
        json.loads(Path(args.bench).read_text()).get(str(args.rows), {}) if Path(args.bench).exists() else {}
    )
    if not bench:
        print(f"no figures for {args.rows:,} rows in {args.bench}: run bench/production_day.py first")
    runs = dag_runs(airflow_home / "airflow.db")
    tasks = list(dict.fromkeys(task for _, task in durations))
    logs = airflow_home / "logs"
    jobs = {(ds, t): job_seconds(logs, ds, t) for ds in days for t in tasks}
    print("\ntask s (the job's own s) by day; the bench's figure for the same command")
    print(f"{'task':<22}" + "".join(f"{ds:>20}" for ds in days) + f"{'bench step':>16}{'bench s':>9}")
    for task in tasks:
        line = f"{task:<22}"
        for ds in days:
            job = jobs[(ds, task)]
            took = durations.get((ds, task), float("nan"))
            line += f"{took:12.1f}" + (f" ({job:5.1f})" if job else " " * 8)
        step = JOBS.get(task)
        if step and step in bench:
            line += f"{step:>16}{bench[step]['wall_s']:9.1f}"
        print(line)
    print(f"{'the run':<22}" + "".join(f"{runs.get(ds, float('nan')):12.1f}        " for ds in days))
    for k, ds in enumerate(days):
        own = sum(v for (d, _), v in jobs.items() if d == ds and v)
        print(
            f"ds={ds}: the run {runs[ds]:.1f} s, its jobs {own:.1f} s: the DAG adds {runs[ds] - own:.1f} s, "
            f"+{100 * (runs[ds] / own - 1):.1f} % (goal <= +10 %)"
        )
        # the first day has no champion to score: evaluate_champion runs no job
        ran = [t for t in JOBS if not (k == 0 and t == "evaluate_champion")]
        if all(JOBS[t] in bench for t in ran):
            bench_s = sum(bench[JOBS[t]]["wall_s"] for t in ran)
            extra = 100 * (runs[ds] / bench_s - 1)
            print(f"{'':>14}against the bench's jobs ({bench_s:.0f} s, run apart): +{extra:.0f} %")
    return 0 if all(states.get(ds) == "success" for ds in days) else 1


if __name__ == "__main__":
    raise SystemExit(main())
