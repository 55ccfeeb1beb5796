"""``recpipe_daily_retrain`` on production-size days: an Airflow backfill under the scheduler.

``--days`` synthetic Criteo days of ``--rows`` rows each (``kaggle`` profile) run through the
daily DAG with ``conf/retrain/criteo_daily.yaml`` (each day fine-tuned from the champion on
that day alone, lazy Adam, 10 % held out for the gate), LocalExecutor, its own Airflow home
under ``var/bench/production_dag/``. Printed: each task's time per day, beside the figure
``bench/production_day.py`` measured for the same command on a day of the same size
(``bench/results/production_day.json``: run it first with ``--rows`` equal to this one's), and
what the DAG adds over its jobs (goal: at most +10 %): a day's run (first task start to last
task end) against the sum of its jobs' own times in that run (each job logs ``recpipe job <name>
ran <s> s``, read from the task logs: what is left is Airflow's, the tasks that run no job and
each task's time around its job), and against the sum of the bench's figures for the same
commands (measured in another run, apart from Airflow's processes). With ``--online`` the
model trains online tables (``model_config.ev_params: {filter_freq: 2, max_capacity: 2**24}``,
as ``bench/production_day.py``). The second goal: a day's run, from the partition landing (the
sensor's start) to the champion's alias moved (``register_and_gate``'s end), within 10 minutes.
The figures go to ``bench/results/production_dag.json``.

    python bench/production_dag.py [--rows 3000000] [--days 3] [--online]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.days import config_copy, day_range  # noqa: E402
from bench.process_tree import checked, recpipe  # noqa: E402
from dev.airflow import run_backfill  # noqa: E402
from dev.env import airflow_env  # noqa: E402
from features import connect_server as spark_connect  # noqa: E402

RETRAIN = "conf/retrain/criteo_daily.yaml"
DAG_ID = "criteo_deepfm_daily"  # the config's dag_id (its default, <model_name>_<kind>)
WORK = ROOT / "var/bench/production_dag"  # the retrain config's raw and feature paths
FIRST = "2024-01-01"
# the DAG's tasks that run a job, and the bench step that runs the same command
JOBS = {
    "prepare_features": "features",
    "evaluate_champion": "eval_hashed",
    "train": "train_hashed",
    "evaluate": "eval_hashed",
    "export": "export_hashed",
}
ONLINE_JOBS = {
    **JOBS,
    "evaluate_champion": "eval_online",
    "train": "train_online",
    "evaluate": "eval_online",
    "export": "export_base",
}
ONLINE = {"filter_freq": 2, "max_capacity": 1 << 24}
GOAL_S = 600  # from the partition landing to the champion's alias moved


def synth(rows: int, days: int) -> None:
    stamp = WORK / "rows"
    if stamp.exists() and stamp.read_text() == f"{rows} {days}":
        return
    shutil.rmtree(WORK, ignore_errors=True)
    size = ("--rows", str(rows * days), "--days", str(days), "--start", FIRST)
    argv = recpipe("data synth criteo", "--profile", "kaggle", *size, "--out", str(WORK / "raw"))
    m = checked(argv, WORK / "synth.log", "recpipe data synth")
    stamp.write_text(f"{rows} {days}")
    print(f"{days} days of {rows:,} rows synthesised in {m.wall_s:.0f} s", flush=True)


JOB_LINE = re.compile(r"recpipe job \S+ ran ([0-9.]+) s")
SPARK_SUBMIT = "Spark-Submit cmd:"  # SparkSubmitHook logs it as it starts spark-submit


def _events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _at(event: dict) -> datetime:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))


def job_seconds(logs: Path, ds: str, task: str) -> float | None:
    """The job's own seconds in a task's last attempt, from the Airflow task log (JSON events):
    its ``recpipe job ... ran`` line; for ``spark-submit``, from the event that starts it to that
    line (the job's Python measures itself from its own start, after spark-submit's JVM has
    started it). None for a task that ran no job."""
    attempts = sorted(logs.glob(f"dag_id={DAG_ID}/run_id=*{ds}*/task_id={task}/attempt=*.log"))
    if not attempts:
        return None
    events = _events(attempts[-1])
    done = [e for e in events if JOB_LINE.search(str(e.get("event", "")))]
    if not done:
        return None
    submit = [e for e in events if str(e.get("event", "")).startswith(SPARK_SUBMIT)]
    if submit:
        return (_at(done[-1]) - _at(submit[-1])).total_seconds()
    return float(JOB_LINE.search(str(done[-1]["event"])).group(1))


def task_instances(db: Path) -> list[tuple[str, str, str | None, str | None, float | None]]:
    """The backfill's task instances as ``(ds, task, start, end, duration s)``, in the order
    they started, from the Airflow metadata database (SQLite)."""
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT substr(r.logical_date, 1, 10), t.task_id, t.start_date, t.end_date, t.duration "
            "FROM dag_run r JOIN task_instance t ON t.run_id = r.run_id AND t.dag_id = r.dag_id "
            "WHERE r.dag_id = ? ORDER BY t.start_date",
            (DAG_ID,),
        ).fetchall()


def dag_runs(instances) -> dict[str, float]:
    """Each run's seconds from its first task's start to its last task's end, by ``ds``."""
    spans: dict[str, list[str]] = {}
    for ds, _, first, last, _ in instances:
        if first and last:
            span = spans.setdefault(ds, [first, last])
            span[0], span[1] = min(span[0], first), max(span[1], last)
    return {
        ds: (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds()
        for ds, (first, last) in spans.items()
    }


def retrain_config(online: bool) -> str:
    """The retrain config the DAG runs: ``conf/retrain/criteo_daily.yaml``, or a copy of it
    under the bench's folder whose model trains online tables."""
    if not online:
        return RETRAIN
    path = config_copy(
        RETRAIN, WORK / "criteo_daily_online.yaml", {"edit_config_json": {"model_config.ev_params": ONLINE}}
    )
    return str(path.relative_to(ROOT))


def landing_to_alias(instances) -> dict[str, float]:
    """Seconds from the sensor's start (the partition is there) to ``register_and_gate``'s end
    (the champion's alias moved, or kept), by ``ds``."""
    start = {ds: first for ds, task, first, _, _ in instances if task == "wait_for_raw" and first}
    end = {ds: last for ds, task, _, last, _ in instances if task == "register_and_gate" and last}
    return {
        ds: (datetime.fromisoformat(end[ds]) - datetime.fromisoformat(start[ds])).total_seconds()
        for ds in start
        if ds in end
    }


def backfill(rows: int, days: list[str], airflow_home: Path, timeout: float, online: bool) -> dict[str, str]:
    """Run the days as a backfill in a fresh Airflow home; returns each day's state."""
    synth(rows, len(days))
    config = retrain_config(online)
    shutil.rmtree(airflow_home, ignore_errors=True)
    for stale in (ROOT / "var/runs/criteo_deepfm", ROOT / "var/exports/criteo_deepfm", WORK / "features"):
        shutil.rmtree(stale, ignore_errors=True)
    env = {
        **os.environ,
        **airflow_env(ROOT, airflow_home),
        "RECPIPE_RETRAIN_CONFIGS": config,  # this model's DAG alone
        # MLflow of its own: the bench's registered model does not mix with the demo's
        "MLFLOW_TRACKING_URI": f"sqlite:///{WORK / 'mlflow.db'}",
    }
    airflow_home.mkdir(parents=True)
    start = time.perf_counter()
    with spark_connect.running(env, WORK / "spark-connect"):  # prepare_features runs there
        states = run_backfill(
            env, airflow_home, DAG_ID, days, timeout, lambda line: print(line, flush=True), {}
        )
    print(f"\n{len(days)} days in {time.perf_counter() - start:.0f} s: {states}")
    return states


def main() -> int:
    parser = harness.parser(__doc__, rounds=None)
    parser.add_argument("--rows", type=int, default=3_000_000, help="rows a day")
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=3 * 3600)
    parser.add_argument("--online", action="store_true", help="the model trains online tables")
    parser.add_argument("--bench", default=str(ROOT / "bench/results/production_day.json"))
    parser.add_argument("--report", action="store_true", help="only report the last run's figures")
    args = parser.parse_args()
    days = day_range(FIRST, args.days)
    airflow_home = WORK / "airflow"
    states = {}
    if not args.report:
        states = backfill(args.rows, days, airflow_home, args.timeout, args.online)
    jobs_of = ONLINE_JOBS if args.online else JOBS
    bench = (
        json.loads(Path(args.bench).read_text())["sizes"].get(str(args.rows), {})
        if Path(args.bench).exists()
        else {}
    )
    if not bench:
        print(f"no figures for {args.rows:,} rows in {args.bench}: run bench/production_day.py first")
    instances = task_instances(airflow_home / "airflow.db")
    runs, landed = dag_runs(instances), landing_to_alias(instances)
    durations = {(ds, task): took or 0.0 for ds, task, _, _, took in instances}
    tasks = list(dict.fromkeys(task for _, task in durations))
    by_day = {}
    for k, ds in enumerate(days):
        jobs = {t: job_seconds(airflow_home / "logs", ds, t) for t in tasks}
        own = sum(v for v in jobs.values() if v)
        tasks_of = {
            t: {"s": durations.get((ds, t)), "job_s": jobs[t], "bench_step": jobs_of.get(t)} for t in tasks
        }
        by_day[ds] = {"run_s": runs[ds], "jobs_s": own, "dag_adds": runs[ds] / own - 1,
                      "landing_to_alias_s": landed.get(ds), "tasks": tasks_of}  # fmt: skip
        # the first day has no champion to score: evaluate_champion runs no job
        ran = [t for t in jobs_of if not (k == 0 and t == "evaluate_champion")]
        if all(jobs_of[t] in bench for t in ran):
            by_day[ds]["bench_jobs_s"] = sum(bench[jobs_of[t]]["wall_s"] for t in ran)
    print("\ntask s (the job's own s) by day, and the bench's figure for the same command (production_day)")
    rows = {t: {ds: by_day[ds]["tasks"][t]["s"] for ds in days} for t in tasks}
    for t in tasks:
        rows[t].update({f"{ds} job": by_day[ds]["tasks"][t]["job_s"] for ds in days})
        if jobs_of.get(t) in bench:
            rows[t]["bench"] = bench[jobs_of[t]]["wall_s"]
    rows = {t: {k: v for k, v in r.items() if v is not None} for t, r in rows.items()}
    print(harness.table(rows, {**{c: c for ds in days for c in (ds, f"{ds} job")}, "bench": "bench s"}))
    for ds, day in by_day.items():
        print(f"ds={ds}: the run {day['run_s']:.1f} s, its jobs {day['jobs_s']:.1f} s: the DAG adds "
              f"+{100 * day['dag_adds']:.1f} % (goal <= +10 %); from the landing to the alias moved "
              f"{day['landing_to_alias_s'] or float('nan'):.1f} s (goal <= {GOAL_S} s); the bench's jobs, "
              f"run apart: {day.get('bench_jobs_s', float('nan')):.0f} s")  # fmt: skip
    if not args.report:
        bench_steps = {step: bench[step]["wall_s"] for step in set(jobs_of.values()) if step in bench}
        doc = {"rows": args.rows, "online": args.online, "states": states, "days": by_day}
        doc.update(bench_steps=bench_steps, goals={"dag_adds": 0.10, "landing_to_alias_s": GOAL_S})
        harness.finish(f"production_dag_{'online' if args.online else 'hashed'}_{args.rows}", doc)
    return 0 if args.report or all(states.get(ds) == "success" for ds in days) else 1


if __name__ == "__main__":
    raise SystemExit(main())
