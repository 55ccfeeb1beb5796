"""``make demo-stream``: one replayed MovieLens day of hourly passes through
``recpipe_stream_retrain``, as an Airflow backfill under the real scheduler, from a clean
slate (the stream model's runs, exports, hourly features, Redis rows and registered model are
removed first). Prints each task as it ends, then a table per pass (rows, progressive AUC,
export, bytes), the day's close (the registered version and the gate's decision) and the
orchestration overhead: the day's wall time against the sum of its tasks' times.

Usage: ``python scripts/demo_stream.py [--day YYYY-MM-DD] [--hours N] [--timeout S]``.
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

from recpipe.config import load_pipeline_config  # noqa: E402
from recpipe.config.retrain import load_retrain_config  # noqa: E402
from recpipe.local_airflow import run_backfill  # noqa: E402
from recpipe.localenv import airflow_env  # noqa: E402

DAG_ID = "recpipe_stream_retrain"
CONFIG = "conf/retrain/movielens_stream.yaml"
ROW = "{:<14} {:>5} {:>9}  {:<9} {:>10} {:>9} {:>10}"
JOBS = ("prepare_features", "evaluate_pass", "train", "export")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--day", default="1997-09-22", help="the replayed day (default: a busy one)")
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--timeout", type=float, default=5400, help="seconds for all the passes")
    args = parser.parse_args()
    stream = load_retrain_config(HOME / os.environ.get("RECPIPE_STREAM_CONFIG", CONFIG))
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
    passes = [f"{args.day}T{h:02d}:00" for h in range(args.hours)]
    env = {**os.environ, **airflow_env(HOME)}
    forget_registered_model(env["MLFLOW_TRACKING_URI"], stream.model_name)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    durations: dict = {}
    start = time.monotonic()
    echo = functools.partial(print, flush=True)
    home = Path(env["AIRFLOW_HOME"])
    states = run_backfill(env, home, DAG_ID, passes, args.timeout, echo, durations, chunk=6)
    wall = time.monotonic() - start
    if any(states.get(p) != "success" for p in passes):
        return 1
    print_table(
        args.day, passes, runs, exports, pipeline.train_input_path, env["MLFLOW_TRACKING_URI"], stream
    )
    print_close(env["MLFLOW_TRACKING_URI"], stream.model_name, args.day)
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
    print(f"exports: {exports / args.day}; model dirs: {runs / ('ds=' + args.day)}")
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
