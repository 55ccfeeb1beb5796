"""Production-size days through the real steps, each beside its floor measured in the same run.

For each ``--rows`` size, one synthetic Criteo day of the ``kaggle`` profile (the Kaggle data's
cardinalities, Zipf ids, new ids each day: ``recpipe data synth criteo --profile kaggle``) goes
through the commands a DAG runs, one process each, measured whole by ``bench.process_tree``
(wall s, CPU-s of every process including Spark's JVM, the tree's peak RSS):

  features       ``recpipe features``                floor: Spark reading the CSV and writing
                                                          Parquet, nothing else
  train hashed   ``recpipe train --skip_eval``        floor: a bare ``tf.function`` loop, same
  train online   (``ev_params``, growing tables)            model and optimizer, pyarrow batches
  eval           ``recpipe eval`` (the online model)  floor: the bare model's forward pass
  export base    ``recpipe export --base`` (mid-day checkpoint), ``--delta`` (the day's end)
                                                     floor: pyarrow writing the tables' rows
  export hashed  ``recpipe export`` (SavedModel + MLflow Model)   floor: as above
  push           ``recpipe serve push`` base + delta  floor: pipelined HSETs of the same rows

``conf/criteo_deepfm.yaml`` with lazy Adam, 10 % of the day held out for evaluation (the DAG's
split), hashed tables of ``--buckets`` rows, online tables ``{filter_freq: --filter_freq,
max_capacity: 2**24}`` growing from 4,096 rows. Then the goals: each step within 1.5x of its
floor (CPU-s), time linear in rows (largest / smallest size at most 1.1x the row ratio),
training's peak RSS at most 2x its variables and slots + 1 GiB, online tables at >= 0.7x the
hashed tables' examples per CPU-second.

    python bench/production_day.py [--rows 1000000 3000000 10000000] [--filter_freq 2]
        [--only features train ...] [--workdir var/bench/production]

Internal: ``python bench/production_day.py floor {spark,train,eval,export,push} ...`` runs one
floor in its own process (the parent measures it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench import harness  # noqa: E402
from bench.criteo_data import CONFIG, LAZY, bench_edits  # noqa: E402
from bench.process_tree import Measured, checked  # noqa: E402
from bench.results import COMMIT, FOLDER, word  # noqa: E402

DS = "2024-01-01"
BATCH = 1024
HOLDOUT = 10
REDIS = "redis://127.0.0.1:6379/14"  # a database of its own, flushed before each push
RECPIPE = [sys.executable, "-m", "cli"]
STEPS = ("features", "train", "eval", "export", "push")


def edits(work: Path, buckets: int, online: dict | None = None, checkpoint_steps: int = 100_000) -> dict:
    """``--edit_config_json`` for the bench's data, lazy Adam and the day's holdout; ``online``:
    ``model_config.ev_params`` (every id feature gets an online table)."""
    out = bench_edits(work, buckets)
    out.update(
        {
            "data_config.holdout_percent": HOLDOUT,
            "train_config.log_step_count_steps": 200,
            "train_config.save_checkpoints_steps": checkpoint_steps,
            "train_config.save_summary_steps": 1_000_000,
            "train_config.optimizer_config": [LAZY],
        }
    )
    if online is not None:
        out["model_config.ev_params"] = online
    return out


def _config_args(edit: dict) -> list[str]:
    return ["--pipeline_config_path", str(CONFIG), "--edit_config_json", json.dumps(edit)]


# --- the floors, each run in a process of its own -----------------------------------------


def _load_config(edit: dict):
    from recpipe.config import load_pipeline_config

    return load_pipeline_config(CONFIG, edit)


def floor_train(config, evaluate: bool) -> dict:
    """``bench.floors.bare_steps`` over ``bench.criteo_data.parquet_batches``: the training
    step, or with ``evaluate`` the forward pass over the held-out rows. Returns the examples
    and the loss."""
    import itertools

    from bench.criteo_data import parquet_batches
    from bench.floors import bare_steps, run_steps

    batches = parquet_batches(config, DS, holdout=evaluate, batch_size=BATCH)
    first = next(batches)
    train_step, eval_step = bare_steps(config, first)
    return run_steps(eval_step if evaluate else train_step, itertools.chain([first], batches))


def floor_spark(config, out: Path) -> dict:
    """``bench.floors.spark_csv_to_parquet`` of the day's CSV."""
    from bench.floors import spark_csv_to_parquet
    from features.session import get_spark

    spark = get_spark("recpipe-floor")
    spark_csv_to_parquet(spark, config.data_config, str(Path(config.raw_input_path) / f"ds={DS}"), str(out))
    rows = spark.read.parquet(str(out)).count()
    spark.stop()
    return {"rows": rows}


def floor_export(checkpoint: str, out: Path) -> dict:
    """pyarrow writing the tables' rows: every checkpoint tensor of more than 1,000 rows that
    is not an optimizer slot, as Parquet (a list column per table), with its row index."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    reader = tf.train.load_checkpoint(checkpoint)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    written = 0
    for i, (name, shape) in enumerate(sorted(reader.get_variable_to_shape_map().items())):
        if "OPTIMIZER_SLOT" in name or len(shape) != 2 or shape[0] <= 1000:
            continue
        values = reader.get_tensor(name)
        flat = pa.array(values.reshape(-1), pa.float32())
        column = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        table = pa.table({"id": np.arange(values.shape[0], dtype=np.int64), "row": column})
        pq.write_table(table, out / f"{i}.parquet", compression="none")
        written += values.nbytes
    return {"bytes": written}


def floor_push(exports: list[Path]) -> dict:
    """``bench.floors.hset_rows`` of the exports into the bench's Redis database (the parent
    empties it before and after)."""
    import redis

    from bench.floors import hset_rows

    rows = hset_rows(redis.Redis.from_url(REDIS), exports, lambda table, key: f"floor:{table}:{key}")
    return {"rows": rows}


def floor_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="production_day.py floor")
    parser.add_argument("which", choices=("spark", "train", "eval", "export", "push"))
    parser.add_argument("--edits", default="{}")
    parser.add_argument("--checkpoint")
    parser.add_argument("--out")
    parser.add_argument("--exports", nargs="*", default=[])
    args = parser.parse_args(argv)
    config = _load_config(json.loads(args.edits))
    if args.which == "spark":
        result = floor_spark(config, Path(args.out))
    elif args.which in ("train", "eval"):
        result = floor_train(config, evaluate=args.which == "eval")
    elif args.which == "export":
        result = floor_export(args.checkpoint, Path(args.out))
    else:
        result = floor_push([Path(p) for p in args.exports])
    print(json.dumps(result))
    return 0


# --- the bench ----------------------------------------------------------------------------


KEPT = ("examples_per_sec", "cpu_seconds", "auc", "memory_mb", "bytes", "rows", "phases", "online_tables")


def _figures(m: Measured) -> dict:
    return {"wall_s": m.wall_s, "cpu_s": m.cpu_s, "peak_rss_mb": m.peak_rss_mb,
            "result": {k: v for k, v in m.result.items() if k in KEPT}}  # fmt: skip


class Day:
    """One size: its work dir, its steps' and floors' figures (``figures[step]``: ``wall_s``,
    ``cpu_s``, ``peak_rss_mb``, ``result`` and ``floor``, the same of its floor or None)."""

    def __init__(self, rows: int, root: Path, buckets: int, filter_freq: int):
        self.rows, self.work, self.buckets = rows, root / f"rows={rows}", buckets
        self.online = {"filter_freq": filter_freq, "max_capacity": 1 << 24}
        self.train_rows = rows * (100 - HOLDOUT) // 100
        self.figures: dict[str, dict] = {}
        self.server_cpu_s: dict[str, float] | None = None  # the push's and its floor's Redis CPU-s
        self.logs = self.work / "logs"

    def edit(self, online: bool = False, checkpoint_steps: int = 100_000) -> dict:
        return edits(self.work, self.buckets, self.online if online else None, checkpoint_steps)

    def measure(self, name: str, argv: list[str], floor: list[str] | None, between=None) -> None:
        """Run ``argv``, then ``between()`` (unmeasured), then the floor: one harness round."""
        log = self.logs / f"{name}.log"
        variants = {name: lambda: _figures(checked(argv, log, name))}
        if floor is not None:
            floor_argv, floor_log = (
                [sys.executable, __file__, "floor", *floor],
                self.logs / f"{name}.floor.log",
            )

            def run_floor():
                if between is not None:
                    between()
                return _figures(checked(floor_argv, floor_log, f"{name}'s floor"))

            variants["floor"] = run_floor
        runs = harness.alternate(
            variants, 1, show=lambda line: print(f"{self.rows:,} rows, {line}", flush=True)
        )
        self.figures[name] = {**runs[name][0], "floor": runs["floor"][0] if floor is not None else None}

    def synth(self) -> None:
        marker = self.work / "raw" / f"ds={DS}"
        if marker.exists():
            return
        shutil.rmtree(self.work, ignore_errors=True)
        m = checked(
            [*RECPIPE, "data", "synth", "criteo", "--profile", "kaggle", "--rows", str(self.rows),
             "--days", "1", "--start", DS, "--out", str(self.work / "raw")],
            self.logs / "synth.log", "synth",
        )  # fmt: skip
        print(f"rows={self.rows:,}: synthesised in {m.wall_s:.0f} s", flush=True)

    def features(self) -> None:
        self.measure(
            "features",
            [*RECPIPE, "features", *_config_args(self.edit()), "--ds", DS],
            ["spark", "--edits", json.dumps(self.edit()), "--out", str(self.work / "floor-spark")],
        )

    def train(self) -> None:
        steps = -(-self.train_rows // BATCH)
        for variant, online in (("hashed", False), ("online", True)):
            model_dir = self.work / variant
            shutil.rmtree(model_dir, ignore_errors=True)
            # online: a checkpoint mid-day, so that the day's end exports as a delta of it
            edit = self.edit(online, checkpoint_steps=steps // 2 if online else 100_000)
            floor = None if online else ["train", "--edits", json.dumps(self.edit())]
            self.measure(
                f"train {variant}",
                [*RECPIPE, "train", *_config_args(edit), "--model_dir", str(model_dir),
                 f"--train_ds={DS}", f"--eval_ds={DS}", "--skip_eval"],
                floor,
            )  # fmt: skip

    def eval(self) -> None:
        for variant, online in (("hashed", False), ("online", True)):
            self.measure(
                f"eval {variant}",
                [*RECPIPE, "eval", *_config_args(self.edit(online)), "--model_dir", str(self.work / variant),
                 f"--train_ds={DS}", f"--eval_ds={DS}"],
                ["eval", "--edits", json.dumps(self.edit())] if not online else None,
            )  # fmt: skip

    def export(self) -> None:
        online = self.work / "online"
        checkpoints = _checkpoints(online)
        exports = self.work / "exports"
        shutil.rmtree(exports, ignore_errors=True)
        floor = ["export", "--checkpoint", checkpoints[-1], "--out", str(self.work / "floor-export")]
        self.measure(
            "export base",
            [*RECPIPE, "export", *_config_args(self.edit(True)), "--model_dir", str(online),
             "--export_dir", str(exports), "--base", DS, "--checkpoint_path", checkpoints[0]],
            floor,
        )  # fmt: skip
        self.measure(
            "export delta",
            [*RECPIPE, "export", *_config_args(self.edit(True)), "--model_dir", str(online),
             "--export_dir", str(exports), "--delta", f"{DS}/12"],
            None,
        )  # fmt: skip
        hashed = self.work / "hashed"
        self.measure(
            "export hashed",
            [*RECPIPE, "export", *_config_args(self.edit()), "--model_dir", str(hashed),
             "--export_dir", str(self.work / "saved_model"), f"--train_ds={DS}"],
            ["export", "--checkpoint", _checkpoints(hashed)[-1], "--out", str(self.work / "floor-export")],
        )  # fmt: skip

    def push(self) -> None:
        import redis

        day = self.work / "exports" / DS
        chain = [str(day / "base"), *sorted(str(p) for p in day.glob("delta-*"))]

        def flush():  # millions of keys: seconds, outside what is measured
            redis.Redis.from_url(REDIS, socket_timeout=900).flushdb()

        def server_cpu() -> float:  # the Redis server's CPU-seconds so far (INFO cpu)
            info = redis.Redis.from_url(REDIS).info("cpu")
            return info["used_cpu_user"] + info["used_cpu_sys"]

        flush()
        marks = [server_cpu()]

        def between():
            marks.append(server_cpu())
            flush()
            marks.append(server_cpu())

        self.measure(
            "push",
            [*RECPIPE, "serve", "push", *chain, "--model", "bench", "--redis_url", REDIS],
            ["push", "--exports", *chain],
            between=between,
        )
        marks.append(server_cpu())
        # the server's share, which the pushing process's tree does not hold
        self.server_cpu_s = {"push": marks[1] - marks[0], "floor": marks[3] - marks[2]}
        cpu = self.server_cpu_s
        print(f"{'':>11} Redis server CPU-s: push {cpu['push']:.1f}, floor {cpu['floor']:.1f}")
        flush()


def _checkpoints(model_dir: Path) -> list[str]:
    """The model dir's checkpoints, oldest first (TensorFlow's ``checkpoint`` file)."""
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(str(model_dir))
    if state is None or not state.all_model_checkpoint_paths:
        raise SystemExit(f"{model_dir}: no checkpoint")
    return list(state.all_model_checkpoint_paths)


def variables_mb(model_dir: Path) -> float:
    """The bytes of a checkpoint's variables (weights and slots), MiB."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(_checkpoints(model_dir)[-1])
    dtypes = reader.get_variable_to_dtype_map()
    total = 0
    for name, shape in reader.get_variable_to_shape_map().items():
        n = 1
        for d in shape:
            n *= d
        total += n * dtypes[name].size
    return total / 2**20


def summary(days: list[Day]) -> dict:
    """Each goal beside its figure, printed; returns them by size (``{rows: {goal: ...}}``) and,
    across sizes, the growth of each step from the smallest size to the largest."""
    out: dict = {}
    for day in days:
        goals = out.setdefault(str(day.rows), {"floor": {}, "rss": {}})
        for name, f in day.figures.items():
            if f["floor"] is not None:
                x = f["cpu_s"] / f["floor"]["cpu_s"]
                goals["floor"][word(name)] = {
                    "cpu_x": x,
                    "wall_x": f["wall_s"] / f["floor"]["wall_s"],
                    "met": x <= 1.5,
                }
        hashed, online = day.figures.get("train hashed"), day.figures.get("train online")
        if hashed and online:
            rate_h, rate_o = day.train_rows / hashed["cpu_s"], day.train_rows / online["cpu_s"]
            goals["online_vs_hashed"] = {
                "per_cpu_s": [rate_o, rate_h],
                "x": rate_o / rate_h,
                "met": rate_o / rate_h >= 0.7,
            }
            for variant, f in (("hashed", hashed), ("online", online)):
                var = variables_mb(day.work / variant)
                goals["rss"][variant] = {
                    "peak_mb": f["peak_rss_mb"], "variables_mb": var, "bound_mb": 2 * var + 1024,
                    "met": f["peak_rss_mb"] <= 2 * var + 1024, "memory_mb": f["result"].get("memory_mb"),
                }  # fmt: skip
    if len(days) > 1:
        small, large = days[0], days[-1]
        ratio = large.rows / small.rows
        out["growth"] = {"rows_x": ratio, "steps": {}}
        for name in small.figures.keys() & large.figures.keys():
            cpu = large.figures[name]["cpu_s"] / small.figures[name]["cpu_s"]
            wall = large.figures[name]["wall_s"] / small.figures[name]["wall_s"]
            out["growth"]["steps"][word(name)] = {"wall_x": wall, "cpu_x": cpu, "met": cpu <= 1.1 * ratio}
    print("goals (floor: CPU x floor <= 1.5; online_vs_hashed: >= 0.7; rss: <= 2x variables + 1 GiB;")
    print("growth: CPU x <= 1.1x the rows' ratio):", json.dumps(out, indent=1))
    return out


def table_summary(tables: dict) -> str:
    """The online tables' rows used, capacity and admitted ids in all, and the largest table's."""
    used = {k.rsplit("/", 1)[0]: v for k, v in tables.items() if k.endswith("/rows_used")}
    if not used:
        return "-"
    largest = max(used, key=used.get)
    total = {f: sum(v for k, v in tables.items() if k.endswith(f"/{f}")) for f in ("rows_used", "admitted")}
    # a group's capacity is reported by each of its tables: counted once
    total["capacity"] = round(
        sum(
            v / tables.get(k[: -len("capacity")] + "group_size", 1)
            for k, v in tables.items()
            if k.endswith("/capacity")
        )
    )
    return (
        f"{total['rows_used']:,} rows used of {total['capacity']:,} allocated, "
        f"{total['admitted']:,} admitted; "
        f"largest {largest.rsplit('/', 1)[-1]}: {used[largest]:,} rows"
    )


def save(days: list[Day], goals: dict, args) -> Path:
    """Add the days' figures to ``bench/results/production_day.json`` (``sizes``: ``{rows: {step:
    {wall_s, cpu_s, peak_rss_mb, floor, result}, "goals": ..., "commit": ..., "date": ...}}``);
    sizes and steps measured by earlier runs are kept, each with the commit and date of its own
    run. ``bench/production_dag.py`` reads them."""
    path = FOLDER / "production_day.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    sizes = earlier.get("sizes", {})
    today = time.strftime("%Y-%m-%d", time.gmtime())
    for day in days:
        out = sizes.setdefault(str(day.rows), {})
        for name, f in day.figures.items():
            floor = f["floor"] and {k: round(f["floor"][k], 1) for k in ("wall_s", "cpu_s")}
            out[word(name)] = {
                **{k: round(f[k], 1) for k in ("wall_s", "cpu_s")}, "peak_rss_mb": round(f["peak_rss_mb"]),
                "floor": floor, "result": {k: v for k, v in f["result"].items() if k != "online_tables"},
                "commit": COMMIT, "date": today,
            }  # fmt: skip
        kept = out.setdefault("goals", {})
        for name, value in goals.get(str(day.rows), {}).items():  # a step run alone keeps the others'
            if isinstance(value, dict) and isinstance(kept.get(name), dict):
                kept[name].update(value)
            else:
                kept[name] = value
        if day.server_cpu_s:
            out["push"]["server_cpu_s"] = day.server_cpu_s
        out["train_rows"] = day.train_rows
        if tables := day.figures.get("train online"):
            out["online_tables"] = table_summary(tables["result"].get("online_tables", {}))
    doc = {"sizes": sizes, "buckets": args.buckets, "filter_freq": args.filter_freq}
    growth = earlier.get("growth", {"steps": {}})
    if "growth" in goals:  # the steps this run measured at both sizes; the others' kept
        growth = {**goals["growth"], "steps": {**growth["steps"], **goals["growth"]["steps"]}}
    if growth["steps"]:
        doc["growth"] = growth
    return harness.finish("production_day", doc)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "floor":
        return floor_main(sys.argv[2:])
    parser = harness.parser(__doc__, rounds=None, workdir="production")
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 3_000_000, 10_000_000])
    parser.add_argument("--buckets", type=int, default=100_000, help="rows of each hashed table")
    parser.add_argument("--filter_freq", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS))
    args = parser.parse_args()
    root = args.workdir
    days = []
    start = time.perf_counter()
    for rows in args.rows:
        day = Day(rows, root, args.buckets, args.filter_freq)
        days.append(day)
        day.synth()
        for name in STEPS:
            if name in args.only:
                getattr(day, name)()
        if stats := day.figures.get("train online"):
            print(f"online tables: {table_summary(stats['result'].get('online_tables', {}))}")
    save(days, summary(days), args)
    print(f"{time.perf_counter() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
