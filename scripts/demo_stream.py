"""``make demo-stream``: replayed MovieLens days of passes (an hour each, or ``--pass_minutes``)
through ``recpipe_stream_retrain``, as an Airflow backfill under the real scheduler, from a clean
slate (the stream model's runs, exports, hourly features, Redis rows and registered model are
removed first). Prints each task as it ends, then a table per pass (rows, progressive AUC,
export, bytes), each day's close (the registered version and the gate's decision), a table of
the days' closes (AUC, the champion's AUC on the same rows, promoted, version, rows in the
online tables, the day's delta bytes) and the orchestration overhead: the wall time against
the sum of the tasks' times.

Passes shorter than an hour (``--pass_minutes 15``; ``make demo-stream PASS_MINUTES=15``) run
the same config with ``stream.pass_minutes`` set, as its own model and DAG
(``movielens_stream_15min``, ``recpipe_stream_retrain_15min``, written to
``var/demo-stream/``), on MovieLens replayed in such passes (``data/raw/movielens_15min``).

Usage: ``python scripts/demo_stream.py [--day YYYY-MM-DD] [--days N] [--hours N]
[--pass_minutes N] [--timeout S]`` (``make demo-stream STREAM_DAYS=3 PASS_MINUTES=15``).
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

from dev.airflow import run_backfill  # noqa: E402
from dev.env import airflow_env  # noqa: E402
from features import connect_server as spark_connect  # noqa: E402
from recpipe.config import load_pipeline_config  # noqa: E402
from recpipe.config.retrain import load_retrain_config  # noqa: E402
from recpipe.layout import PASS_MINUTES, pass_step  # noqa: E402

CONFIG = "conf/retrain/movielens_stream.yaml"  # one of the deployment's DAGs
ROW = "{:<14} {:>5} {:>9}  {:<9} {:>10} {:>9} {:>10}"
JOBS = ("prepare_features", "evaluate_pass", "train", "export")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # a busy day after make demo's 7 days, so that its champion can be the stream's start
    parser.add_argument("--day", default="1997-09-27", help="the replayed day (default: a busy one)")
    parser.add_argument("--days", type=int, default=1, help="consecutive days from --day")
    parser.add_argument("--hours", type=int, default=24, help="hours of passes a day, from 00:00")
    parser.add_argument(
        "--pass_minutes", type=int, default=60, choices=PASS_MINUTES, help="the passes' length"
    )
    parser.add_argument("--timeout", type=float, default=5400, help="seconds for each 6 passes")
    args = parser.parse_args()
    config_file, extra_env = HOME / CONFIG, {}
    if args.pass_minutes != 60:
        config_file = shorter_passes(args.pass_minutes)
        extra_env["RECPIPE_RETRAIN_CONFIGS"] = str(config_file)
    stream = load_retrain_config(config_file)
    dag_id = stream.effective_dag_id
    pipeline = load_pipeline_config(HOME / stream.pipeline_config_path, stream.edit_config_json).resolved(
        HOME
    )
    import redis

    client = redis.Redis.from_url(stream.stream.redis_url) if stream.stream.redis_url else None
    if client is not None:
        try:
            client.ping()
        except redis.RedisError as err:
            print(f"no Redis at {stream.stream.redis_url} ({err}): start one (docker-compose up -d redis)")
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
    starts = range(0, args.hours * 60, args.pass_minutes)
    passes = [f"{d}T{m // 60:02d}:{m % 60:02d}" for d in days for m in starts]
    env = {**os.environ, **airflow_env(HOME), **extra_env}
    forget_registered_model(env["MLFLOW_TRACKING_URI"], stream.model_name)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    durations: dict = {}
    start = time.monotonic()
    echo = functools.partial(print, flush=True)
    home = Path(env["AIRFLOW_HOME"])
    with spark_connect.running(env, HOME / "var" / "spark-connect"):  # prepare_features runs there
        states = run_backfill(env, home, dag_id, passes, args.timeout, echo, durations, chunk=6)
    wall = time.monotonic() - start
    if any(states.get(p) != "success" for p in passes):
        return 1
    for day in days:
        mine = [p for p in passes if p.startswith(day)]
        print_table(day, mine, runs, pipeline.train_input_path, env["MLFLOW_TRACKING_URI"], stream)
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
    print(f"exports: {exports}/<day>/; model dirs: {runs}/ds=<day>/hh=<pass>/")
    return 0


def shorter_passes(minutes: int) -> Path:
    """The stream config with passes of ``minutes`` as a model and DAG of its own, written to
    ``var/demo-stream/``, over MovieLens replayed in such passes (replayed here when missing)."""
    import yaml

    from dev.data.movielens import fetch_movielens
    from dev.data.replay import replay_movielens

    raw = HOME / "data" / "raw" / f"movielens_{minutes}min"
    if not (raw / "events").is_dir():
        print(f"replaying MovieLens in passes of {minutes} minutes -> {raw}", flush=True)
        replay_movielens(fetch_movielens(HOME / "data"), raw, "hour", minutes)
    config = yaml.safe_load((HOME / CONFIG).read_text())
    config["model_name"] = f"movielens_stream_{minutes}min"
    config["dag_id"] = f"recpipe_stream_retrain_{minutes}min"
    config["stream"]["pass_minutes"] = minutes
    config["edit_config_json"].update(
        raw_input_path=str(raw.relative_to(HOME) / "events"),
        train_input_path=f"data/features/movielens_{minutes}min",
    )
    out = HOME / "var" / "demo-stream" / f"movielens_stream_{minutes}min.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


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


def print_table(day, passes, runs, features, tracking_uri, stream) -> None:
    """One line per pass: rows, the progressive AUC, the export written and its size."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(stream.experiment)
    found = client.search_runs(
        [exp.experiment_id],
        f"tags.`recpipe.step` = 'day' and tags.ds = '{day}' "
        f"and tags.`airflow.dag_id` = '{stream.effective_dag_id}'",
    )
    auc = {}
    if found:
        auc = {m.step: m.value for m in client.get_metric_history(found[0].info.run_id, "pass_auc")}
    head = ("pass", "rows", "pass AUC", "export", "bytes", "rows out", "tombstones")
    print("\n" + ROW.format(*head))
    for p in passes:
        key = p[11:13] if stream.stream.pass_minutes == 60 else p[11:].replace(":", "")
        stats = json.loads((Path(features) / f"ds={day}" / f"hh={key}" / "_stats.json").read_text())
        record = runs / f"ds={day}" / f"hh={key}" / "export.json"
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
        step = pass_step(f"{day}/{key}")  # the MLflow step of the day's curve
        score = f"{auc[step]:.4f}" if step in auc else "-"
        print(ROW.format(f"{day}/{key}", stats["rows"], score, *cells))


if __name__ == "__main__":
    raise SystemExit(main())
