"""``make demo-stream``: replayed MovieLens days of hourly passes through
``recpipe_stream_retrain``, as an Airflow backfill under the real scheduler, from a clean
slate (the stream model's runs, exports, hourly features, Redis rows and registered model are
removed first). Prints each task as it ends, then a table per pass (rows, progressive AUC,
export, bytes), each day's close (the registered version and the gate's decision), a table of
the days' closes (AUC, the champion's AUC on the same rows, promoted, version, rows in the
online tables, the day's delta bytes) and the orchestration overhead: the wall time against
the sum of the tasks' times.

Usage: ``python scripts/demo_stream.py [--day YYYY-MM-DD] [--days N] [--hours N] [--timeout S]``
(``make demo-stream STREAM_DAYS=3``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

HOME = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HOME))

from dev import spark_connect  # noqa: E402
from dev.airflow import run_backfill  # noqa: E402
from dev.env import airflow_env  # noqa: E402
from recpipe.config import load_pipeline_config  # noqa: E402
from recpipe.config.retrain import load_retrain_config  # noqa: E402

CONFIG = "conf/retrain/movielens_stream.yaml"  # one of the deployment's DAGs
DAG_ID = load_retrain_config(HOME / CONFIG).effective_dag_id
ROW = "{:<14} {:>5} {:>9}  {:<9} {:>10} {:>9} {:>10}"
JOBS = ("prepare_features", "evaluate_pass", "train", "export")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--day", default="1997-09-22", help="the replayed day (default: a busy one)")
    parser.add_argument("--days", type=int, default=1, help="consecutive days from --day")
    parser.add_argument("--hours", type=int, default=24, help="passes a day, from 00:00")
    parser.add_argument("--timeout", type=float, default=5400, help="seconds for each 6 passes")
    args = parser.parse_args()
    stream = load_retrain_config(HOME / CONFIG)
    pipeline = load_pipeline_config(HOME / stream.pipeline_config_path, stream.edit_config_json).resolved(
        HOME
    )
    import redis

    client = redis.Redis.from_url(stream.stream.redis_url) if stream.stream.redis_url else None
    if client is not None:
        try:
            client.ping()
        except redis.RedisError as err:
            print(f"no Redis at {stream.stream.redis_url} ({err}): start one (docker compose up -d redis)")
            return 1
    runs, exports = HOME / stream.runs_dir / stream.model_name, HOME / stream.export_dir / stream.model_name
    for path in (runs, exports, Path(pipeline.train_input_path)):
        shutil.rmtree(path, ignore_errors=True)
    if client is not None:
        for key in client.scan_iter(match=f"recpipe:{stream.model_name}:*"):
            client.delete(key)
    from datetime import date, timedelta

    first = date.fromisoformat(args.day)
    days = [(first + timedelta(days=d)).isoformat() for d in range(args.days)]
    passes = [f"{d}T{h:02d}:00" for d in days for h in range(args.hours)]
    env = {**os.environ, **airflow_env(HOME)}
    forget_registered_model(env["MLFLOW_TRACKING_URI"], stream.model_name)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    durations: dict = {}
    start = time.monotonic()
    echo = functools.partial(print, flush=True)
    home = Path(env["AIRFLOW_HOME"])
    with spark_connect.running(env, HOME / "var" / "spark-connect"):  # prepare_features runs there
        states = run_backfill(env, home, DAG_ID, passes, args.timeout, echo, durations, chunk=6)
    wall = time.monotonic() - start
    if any(states.get(p) != "success" for p in passes):
        return 1
    for day in days:
        mine = [p for p in passes if p.startswith(day)]
        print_table(day, mine, runs, exports, pipeline.train_input_path, env["MLFLOW_TRACKING_URI"], stream)
        print_close(env["MLFLOW_TRACKING_URI"], stream.model_name, day)
    print_days(days, runs, exports, env["MLFLOW_TRACKING_URI"], stream.model_name)
    tasks = sum(durations.values())
    jobs = sum(
        v
        for (_, task), v in durations.items()
        if task in ("prepare_features", "evaluate_pass", "train", "export")
    )
    print(
        f"{len(passes)} passes in {wall:.0f} s wall (Airflow included); the tasks' own times sum to "
        f"{tasks:.0f} s, the jobs' (prepare, evaluate, train, export) to {jobs:.0f} s: "
        f"wall / jobs = {wall / max(jobs, 1e-9):.2f}"
    )
    print(f"exports: {exports}/<day>/; model dirs: {runs}/ds=<day>/hh=<HH>/")
    return 0


def forget_registered_model(tracking_uri: str, name: str) -> None:
    """Delete the registered model: its champion's model dir is gone with the runs."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri).delete_registered_model(name)
    except MlflowException:
        pass  # none yet


def print_close(tracking_uri: str, name: str, day: str) -> None:
    """The day's close: the version registered for ``day`` and the gate's decision."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    for version in client.search_model_versions(f"name = '{name}'"):
        tags = version.tags
        if tags.get("ds") == day:
            print(
                f"\nthe day's close: {name} version {version.version} ({tags.get('export_path')}), "
                f"day AUC {float(tags.get('eval.auc', 'nan')):.4f}: {tags.get('promotion')}, "
                f"{tags.get('promotion_reason')}"
            )


DAY_ROW = "{:<12} {:>8} {:>10}  {:<12} {:>7} {:>11} {:>12}"


def print_days(days, runs, exports, tracking_uri: str, name: str) -> None:
    """One line per day's close: the day's AUC (its passes' progressive scores), the
    champion's on the same rows, the gate's outcome, the version, the rows in the online
    tables at the close, and the bytes of the day's deltas."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    versions = {v.tags.get("ds"): v for v in client.search_model_versions(f"name = '{name}'")}
    print("\n" + DAY_ROW.format("day", "AUC", "champion", "outcome", "version", "table rows", "delta bytes"))
    for day in days:
        version = versions.get(day)
        closes = sorted((runs / f"ds={day}").glob("hh=*/champion_eval_result.json"))
        champion = json.loads(closes[-1].read_text()) if closes else None  # the eval job's result
        deltas = sorted((exports / day).glob("delta-*/manifest.json"))
        last = json.loads(deltas[-1].read_text()) if deltas else None
        used = sum(t["rows_used"] or 0 for t in last["tables"].values()) if last else "-"
        size = sum(f["bytes"] for m in deltas for f in json.loads(m.read_text())["files"].values())
        tags = version.tags if version else {}
        print(
            DAY_ROW.format(
                day,
                f"{float(tags['eval.auc']):.4f}" if "eval.auc" in tags else "-",
                f"{champion['auc']:.4f}" if champion and champion.get("auc") is not None else "-",
                tags.get("promotion", "-"),
                version.version if version else "-",
                used,
                f"{size:,}",
            )
        )


def print_table(day, passes, runs, exports, features, tracking_uri, stream) -> None:
    """One line per pass: rows, the progressive AUC, the export written and its size."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(stream.experiment)
    found = client.search_runs(
        [exp.experiment_id],
        f"tags.`recpipe.step` = 'day' and tags.ds = '{day}' and tags.`airflow.dag_id` = '{DAG_ID}'",
    )
    auc = {}
    if found:
        auc = {m.step: m.value for m in client.get_metric_history(found[0].info.run_id, "pass_auc")}
    head = ("pass", "rows", "pass AUC", "export", "bytes", "rows out", "tombstones")
    print("\n" + ROW.format(*head))
    for p in passes:
        hh = p[11:13]
        stats = json.loads((Path(features) / f"ds={day}" / f"hh={hh}" / "_stats.json").read_text())
        record = runs / f"ds={day}" / f"hh={hh}" / "export.json"
        export = json.loads(record.read_text()) if record.exists() else None
        cells = ["-", "", "", ""]
        if export:
            tables = export["tables"].values()
            cells = [
                Path(export["export"]).name,
                f"{export['bytes']:,}",
                str(sum(t["rows"] for t in tables)),
                str(sum(t["tombstones"] for t in tables)),
            ]
        score = f"{auc[int(hh)]:.4f}" if int(hh) in auc else "-"
        print(ROW.format(f"{day}/{hh}", stats["rows"], score, *cells))


if __name__ == "__main__":
    raise SystemExit(main())
