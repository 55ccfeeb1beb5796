"""Stream passes under the running scheduler, timed from their partition landing.

The shipped stream config (``conf/retrain/movielens_stream.yaml``) as a model of its own, in
passes of ``--pass_minutes``, run as one Airflow backfill under a real scheduler, triggerer
and the suite's kind of Spark Connect server. Each pass's run is created with its raw
partition incomplete; once the run waits for it (``wait_for_pass`` deferred to the
triggerer), the partition gets its ``_SUCCESS`` and is announced (``recpipe announce``):
quiet passes (no rows) alternate with busy ones (``--rows`` MovieLens ratings). The sensor
looks only every 60 s, so a wait that ends sooner was ended by the message.

Per pass, from the landing: the wait's end, the first job task's start, the rows applied in
Redis (the push's end; with the last event's distance to the pass's end, the freshness of the
served rows), the run's end, the served model's progressive AUC on the pass's rows; the
tasks' own seconds and the rest of the run's wall time, which is Airflow's scheduling between
tasks; the machine's CPU-seconds from the landing to the run's end (``/proc/stat``: every
process, Airflow's included) and examples per wall second and per CPU-second. Each pass is a
backfill of its own, so that its CPU-seconds are read as it ends. Figures go to
``bench/results/pass_latency.json``.

Variants, one after the other in one run: the scheduler's ``scheduler_idle_sleep_time``
(``--idle_sleep_s``; Airflow's default 1 s, then 0.2 s, the deployment's): a skipped task's
downstream tasks are skipped one scheduler loop at a time, and an idle loop sleeps that long.

    python bench/pass_latency.py [--passes 6] [--rows 10000] [--pass_minutes 15] [--idle_sleep_s 1 0.2]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import threading
import uuid
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.days import config_copy  # noqa: E402

DAY = "1998-01-05"
POKE_S = 60  # the sensor's own looks: far apart, so the message is what ends a wait


def machine_cpu_s() -> float:
    """Every process's CPU-seconds so far (user + nice + system, ``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return (int(fields[0]) + int(fields[1]) + int(fields[2])) / os.sysconf("SC_CLK_TCK")


def write_passes(
    base: Path, starts: list[datetime], rows: list[int], minutes: int
) -> list[tuple[Path, float]]:
    """MovieLens ratings re-timed into each pass (``rows[i]`` of them, 0: a quiet pass), and
    the dimension snapshots; every partition written without its ``_SUCCESS``. Per pass: the
    partition and the seconds from its last event to the pass's end."""
    import numpy as np
    import pyarrow as pa

    from dev.data.csv_files import write_csv_partition
    from dev.data.movielens import fetch_movielens
    from dev.data.replay import EVENT_COLUMNS, read_recbole, write_dims
    from recpipe.layout import pass_partition

    src = fetch_movielens(ROOT / "data")
    write_dims(src, base / "raw")
    inter = read_recbole(src / "ml-100k.inter")
    rng = np.random.default_rng(0)
    out = []
    for start, n in zip(starts, rows, strict=True):
        pick = inter.take(pa.array(rng.integers(0, inter.num_rows, n)))
        rating = np.asarray(pick["rating"].to_pylist(), dtype=float)
        at = int(start.timestamp()) + np.sort(rng.integers(0, minutes * 60, n))
        table = pa.table(
            {
                "user_id": pick["user_id"],
                "item_id": pick["item_id"],
                "rating": rating,
                "timestamp": at,
                "label": (rating >= 4).astype(np.int8),
            }
        ).select(list(EVENT_COLUMNS))
        key = start.strftime("%H" if minutes == 60 else "%H%M")
        partition = write_csv_partition(table, pass_partition(base / "raw" / "events", DAY, key), False)
        out.append((partition, float(minutes * 60 - (at.max() - int(start.timestamp()))) if n else 0.0))
    return out


def main() -> int:
    parser = harness.parser(__doc__, rounds=None, workdir="pass_latency")
    parser.add_argument("--passes", type=int, default=6, help="passes, quiet and busy in turn")
    parser.add_argument("--rows", type=int, default=10_000, help="rows of a busy pass")
    parser.add_argument("--pass_minutes", type=int, default=15)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--idle_sleep_s",
        type=float,
        nargs="+",
        default=[1.0, 0.2],
        help="the scheduler's scheduler_idle_sleep_time of each variant, run one after the other",
    )
    args = parser.parse_args()
    from dev.env import airflow_env
    from features import connect_server as spark_connect

    root = args.workdir
    shutil.rmtree(root, ignore_errors=True)
    variants = []
    env = airflow_env(ROOT, root / "airflow")
    with spark_connect.running(env, root / "spark-connect"):  # one warm server for every variant
        for i, idle in enumerate(args.idle_sleep_s):
            print(f"== scheduler_idle_sleep_time {idle} s", flush=True)
            per_pass = run_variant(root / str(i), idle, args)
            if per_pass is None:
                return 1
            print(harness.table({p["pass"]: p for p in per_pass}, COLUMNS))
            variants.append({"scheduler_idle_sleep_s": idle, **results(args, per_pass)})
    doc = {"variants": variants}
    for v in variants:
        print(v["scheduler_idle_sleep_s"], json.dumps(v["summary"], indent=2))
    harness.finish("pass_latency", doc)
    return 0


def run_variant(base: Path, idle_sleep_s: float, args) -> list[dict] | None:
    """The passes under a deployment whose scheduler sleeps ``idle_sleep_s`` between idle
    loops; each pass's figures, or None when a run failed."""
    from dev.airflow import land_when_waited_for, run_backfill
    from dev.env import airflow_env
    from recpipe.launch.topology import free_ports

    first = datetime.fromisoformat(f"{DAY}T08:00:00+00:00")
    starts = [first + timedelta(minutes=args.pass_minutes * i) for i in range(args.passes)]
    rows = [0 if i % 2 == 0 else args.rows for i in range(args.passes)]
    written = write_passes(base, starts, rows, args.pass_minutes)
    partitions = [p for p, _ in written]
    raw = base / "raw" / "events"
    dag_id, model_name = "bench_pass_latency", f"bench_passes_{uuid.uuid4().hex[:6]}"
    config_copy("conf/retrain/movielens_stream.yaml", base / "stream.yaml", {
        "model_name": model_name, "dag_id": dag_id, "start_date": DAY,
        "runs_dir": str(base / "runs"), "export_dir": str(base / "exports"),
        "sensor": {"poke_interval_s": POKE_S, "timeout_s": args.timeout}, "tracking": {"retries": 0},
        "stream": {"pass_minutes": args.pass_minutes},
        "edit_config_json": {"raw_input_path": str(raw), "train_input_path": str(base / "features")},
    })  # fmt: skip
    env = {
        **os.environ,
        **airflow_env(ROOT, base / "airflow"),
        "RECPIPE_RETRAIN_CONFIGS": str(base / "stream.yaml"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{base / 'mlflow.db'}",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": str(idle_sleep_s),
    }
    logicals = [s.strftime("%Y-%m-%dT%H:%M") for s in starts]
    landed: dict = {}
    tis: dict = {}

    def collect(api, part) -> None:  # after each pass (a backfill of one): its tasks, the CPU so far
        cpu = machine_cpu_s()
        (logical,) = part
        (run,) = [r for r in api.runs(dag_id) if r["logical_date"].startswith(logical)]
        tis[logical] = {t["task_id"]: t for t in api.task_instances(dag_id, run["dag_run_id"])}
        tis[logical]["_cpu"] = cpu

    port = free_ports(1)[0]  # the api-server's: the lander asks it when a pass waits
    stop = threading.Event()
    lander = threading.Thread(
        target=land_when_waited_for,
        args=(port, base / "airflow", dag_id, list(zip(logicals, partitions, strict=True)), landed, stop),
        kwargs={"extra": lambda: {"cpu": machine_cpu_s()}, "timeout": args.timeout},
        daemon=True,
    )
    lander.start()
    try:
        states = run_backfill(
            env, base / "airflow", dag_id, logicals, args.timeout, print,
            chunk=1, after_chunk=collect, port=port,
        )  # fmt: skip
    finally:
        stop.set()
    if any(s != "success" for s in states.values()):
        print(f"runs failed: {states}")
        return None
    runs = base / "runs" / model_name
    return [
        {**summarize(lg, n, landed[lg], tis[lg], lag), **served_auc(runs, lg)}
        for lg, n, (_, lag) in zip(logicals, rows, written, strict=True)
    ]


def served_auc(runs: Path, logical: str) -> dict:
    """The pass's progressive AUC: the model served before it (the day's previous pass)
    scored on its rows before training on them (``pass_eval_result.json``; None for a quiet
    pass, or the day's first with no model before it)."""
    day, key = logical[:10], logical[11:].replace(":", "")
    scored = runs / f"ds={day}" / f"hh={key}" / "pass_eval_result.json"
    if not scored.exists():
        return {"served_auc": None}
    return {"served_auc": json.loads(scored.read_text()).get("auc")}


JOBS = ("prepare_features", "evaluate_pass", "train", "export")


def _t(text: str | None) -> float | None:
    return None if text is None else datetime.fromisoformat(text).timestamp()


def summarize(logical: str, rows: int, landed: dict, tis: dict, lag_s: float) -> dict:
    """One pass's figures, in seconds from its landing (``landed["at"]``); ``freshness_s``:
    from the pass's last event to its rows applied in Redis (the push's end), taking the
    partition to land as the pass ends (``lag_s``: last event to the pass's end)."""
    at = landed["at"]
    ran = {k: v for k, v in tis.items() if k != "_cpu" and v.get("end_date")}
    after_wait = [v for k, v in ran.items() if k != "wait_for_pass" and v.get("start_date")]
    end = max(_t(v["end_date"]) for v in ran.values())
    own = sum(v.get("duration") or 0 for v in after_wait)
    wall = end - _t(ran["wait_for_pass"]["end_date"])
    cpu = tis["_cpu"] - landed["cpu"]
    return {
        "pass": logical,
        "rows": rows,
        "wait_end_s": _t(ran["wait_for_pass"]["end_date"]) - at,
        "first_job_start_s": _t(ran["prepare_features"]["start_date"]) - at,
        "run_end_s": end - at,
        "applied_s": _t(ran["push"]["end_date"]) - at if rows and "push" in ran else None,
        "freshness_s": lag_s + _t(ran["push"]["end_date"]) - at if rows and "push" in ran else None,
        "tasks_s": own,
        "jobs_s": sum(ran[j].get("duration") or 0 for j in JOBS if j in ran),
        "task_s": {k: round(v.get("duration") or 0, 2) for k, v in ran.items()},
        "scheduling_s": wall - own,
        "cpu_s": cpu,
        "examples_per_s": rows / (end - at),
        "examples_per_cpu_s": rows / cpu if cpu > 0 else 0.0,
    }


COLUMNS = {"rows": "rows", "wait_end_s": "wait end", "first_job_start_s": "job start", "run_end_s": "run end",
           "tasks_s": "tasks", "jobs_s": "jobs", "scheduling_s": "Airflow", "cpu_s": "CPU-s"}  # fmt: skip


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


STATISTICS = {"median": statistics.median, "p50": statistics.median, "p95": _p95, "max": max}
# (passes, figure, statistics): the summary's key is <passes>_<figure>_<statistic>, over the
# quiet passes, the busy ones, or every pass with the figure ("")
SUMMARY = (
    ("", "wait_end_s", ("p95", "max")),
    ("", "first_job_start_s", ("p95",)),
    ("quiet", "run_end_s", ("median", "max")),
    ("busy", "run_end_s", ("median", "max")),
    ("quiet", "scheduling_s", ("median",)),
    ("busy", "scheduling_s", ("median",)),
    ("busy", "jobs_s", ("median",)),
    # where a busy pass's jobs go: the feature job (a quiet pass's is Spark's planning alone),
    # the train job (it scores and exports too when it is one process), and the two tasks
    # that report its score and export
    ("quiet", "prepare_s", ("median",)),
    ("busy", "prepare_s", ("median",)),
    ("busy", "train_s", ("median",)),
    ("busy", "reports_s", ("median",)),
    ("busy", "cpu_s", ("median",)),
    ("busy", "applied_s", ("p95",)),
    ("", "freshness_s", ("p50", "p95", "max")),  # busy passes only: a quiet one serves no rows
    ("busy", "examples_per_s", ("median",)),
    ("busy", "examples_per_cpu_s", ("median",)),
)
TASKS = {"prepare_s": ["prepare_features"], "train_s": ["train"], "reports_s": ["evaluate_pass", "export"]}


def results(args, per_pass: list[dict]) -> dict:
    """The variant's summary (``SUMMARY``'s statistics, None over no pass) and its passes."""
    groups = {
        "": per_pass,
        "quiet": [p for p in per_pass if not p["rows"]],
        "busy": [p for p in per_pass if p["rows"]],
    }
    for p in per_pass:  # the tasks' own seconds summed, per pass
        p.update({k: sum(p["task_s"].get(t, 0) for t in tasks) for k, tasks in TASKS.items()})
    summary = {"passes": len(per_pass), "busy_rows": args.rows, "pass_minutes": args.pass_minutes}
    for group, figure, names in SUMMARY:
        values = [p[figure] for p in groups[group] if p[figure] is not None]
        for name in names:
            summary["_".join(filter(None, (group, figure, name)))] = (
                STATISTICS[name](values) if values else None
            )
    return {"summary": summary, "passes": per_pass}


if __name__ == "__main__":
    raise SystemExit(main())
