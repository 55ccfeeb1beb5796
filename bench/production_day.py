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

Internal: ``python bench/production_day.py floor {spark,train,eval,export,push} EDITS ARGS...``
runs one floor in its own process (the parent measures it).
"""

from __future__ import annotations

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
from bench.process_tree import Measured, checked, recpipe  # noqa: E402
from bench.results import word  # noqa: E402

DS = "2024-01-01"
BATCH = 1024
HOLDOUT = 10
REDIS = "redis://127.0.0.1:6379/14"  # a database of its own, flushed before each push
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


# --- the floors (``bench.floors``), each run in a process of its own ------------------------


def floor_main(which: str, edit: str, *args: str) -> int:
    """Run one floor on the config with ``edit`` and print its figures as JSON: ``spark OUT``,
    ``train``, ``eval``, ``export CHECKPOINT OUT``, ``push EXPORT...``."""
    import itertools

    from bench import floors
    from recpipe.config import load_pipeline_config

    config = load_pipeline_config(CONFIG, json.loads(edit))
    if which == "spark":
        from features.session import get_spark

        spark = get_spark("recpipe-floor")
        csv = str(Path(config.raw_input_path) / f"ds={DS}")
        floors.spark_csv_to_parquet(spark, config.data_config, csv, args[0])
        result = {"rows": spark.read.parquet(args[0]).count()}
        spark.stop()
    elif which in ("train", "eval"):
        from bench.criteo_data import parquet_batches

        batches = parquet_batches(config, DS, holdout=which == "eval", batch_size=BATCH)
        first = next(batches)
        train_step, eval_step = floors.bare_steps(config, first)
        step = eval_step if which == "eval" else train_step
        result = floors.run_steps(step, itertools.chain([first], batches))
    elif which == "export":
        result = {"bytes": floors.parquet_rows(args[0], args[1])}
    else:
        import redis

        client = redis.Redis.from_url(REDIS)
        exports = [Path(a) for a in args]
        result = {"rows": floors.hset_rows(client, exports, lambda table, key: f"floor:{table}:{key}")}
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

    def recpipe(self, verb: str, *args: str, online: bool = False, **edit) -> list[str]:
        return recpipe(verb, *args, config=CONFIG, edits=self.edit(online, **edit))

    def measure(self, name: str, argv: list[str], floor: list[str] | None = None, between=None) -> None:
        """Run ``argv``, then ``between()`` (unmeasured), then the floor (``floor_main``'s
        arguments after the edits): one harness round."""
        variants = {name: lambda: _figures(checked(argv, self.logs / f"{name}.log", name))}
        if floor is not None:
            floor_argv = [sys.executable, __file__, "floor", floor[0], json.dumps(self.edit()), *floor[1:]]

            def run_floor():
                if between is not None:
                    between()
                return _figures(checked(floor_argv, self.logs / f"{name}.floor.log", f"{name}'s floor"))

            variants["floor"] = run_floor
        runs = harness.alternate(
            variants, 1, show=lambda line: print(f"{self.rows:,} rows, {line}", flush=True)
        )
        self.figures[name] = {**runs[name][0], "floor": runs["floor"][0] if floor is not None else None}

    def synth(self) -> None:
        if (self.work / "raw" / f"ds={DS}").exists():
            return
        shutil.rmtree(self.work, ignore_errors=True)
        argv = recpipe("data synth criteo", "--profile", "kaggle", "--rows", str(self.rows), "--days", "1",
                       "--start", DS, "--out", str(self.work / "raw"))  # fmt: skip
        m = checked(argv, self.logs / "synth.log", "synth")
        print(f"rows={self.rows:,}: synthesised in {m.wall_s:.0f} s", flush=True)

    def features(self) -> None:
        self.measure(
            "features", self.recpipe("features", "--ds", DS), ["spark", str(self.work / "floor-spark")]
        )

    def train(self) -> None:
        steps = -(-self.train_rows // BATCH)
        for variant, online in (("hashed", False), ("online", True)):
            model_dir = self.work / variant
            shutil.rmtree(model_dir, ignore_errors=True)
            # online: a checkpoint mid-day, so that the day's end exports as a delta of it
            every = steps // 2 if online else 100_000
            argv = self.recpipe("train", "--model_dir", str(model_dir), f"--train_ds={DS}", f"--eval_ds={DS}",
                                "--skip_eval", online=online, checkpoint_steps=every)  # fmt: skip
            self.measure(f"train {variant}", argv, None if online else ["train"])

    def eval(self) -> None:
        for variant, online in (("hashed", False), ("online", True)):
            argv = self.recpipe("eval", "--model_dir", str(self.work / variant), f"--train_ds={DS}",
                                f"--eval_ds={DS}", online=online)  # fmt: skip
            self.measure(f"eval {variant}", argv, None if online else ["eval"])

    def export(self) -> None:
        online, hashed, exports = self.work / "online", self.work / "hashed", self.work / "exports"
        checkpoints = checkpoint_paths(online)
        shutil.rmtree(exports, ignore_errors=True)
        floor_out = str(self.work / "floor-export")
        to = ("--model_dir", str(online), "--export_dir", str(exports))
        base = self.recpipe("export", *to, "--base", DS, "--checkpoint_path", checkpoints[0], online=True)
        self.measure("export base", base, ["export", checkpoints[-1], floor_out])
        self.measure("export delta", self.recpipe("export", *to, "--delta", f"{DS}/12", online=True))
        saved_model = ("--export_dir", str(self.work / "saved_model"), f"--train_ds={DS}")
        argv = self.recpipe("export", "--model_dir", str(hashed), *saved_model)
        self.measure("export hashed", argv, ["export", checkpoint_paths(hashed)[-1], floor_out])

    def push(self) -> None:
        import redis

        from bench.floors import redis_cpu_s

        day = self.work / "exports" / DS
        chain = [str(day / "base"), *sorted(str(p) for p in day.glob("delta-*"))]
        client = redis.Redis.from_url(REDIS, socket_timeout=900)
        client.flushdb()  # millions of keys: seconds, outside what is measured
        marks = [redis_cpu_s(client)]

        def between():
            marks.append(redis_cpu_s(client))
            client.flushdb()
            marks.append(redis_cpu_s(client))

        argv = recpipe("serve push", *chain, "--model", "bench", "--redis_url", REDIS)
        self.measure("push", argv, ["push", *chain], between=between)
        marks.append(redis_cpu_s(client))
        self.server_cpu_s = {"push": marks[1] - marks[0], "floor": marks[3] - marks[2]}
        cpu = self.server_cpu_s
        print(f"{'':>11} Redis server CPU-s: push {cpu['push']:.1f}, floor {cpu['floor']:.1f}")
        client.flushdb()

    def doc(self, goals: dict) -> dict:
        """This size's entry of the results file: each step's figures with this run's commit
        and date, the goals, the push's server CPU and the online tables' summary."""
        from bench.results import COMMIT

        out: dict = {"train_rows": self.train_rows, "goals": goals}
        for name, f in self.figures.items():
            out[word(name)] = {
                **{k: round(f[k], 1) for k in ("wall_s", "cpu_s")}, "peak_rss_mb": round(f["peak_rss_mb"]),
                "floor": f["floor"] and {k: round(f["floor"][k], 1) for k in ("wall_s", "cpu_s")},
                "result": {k: v for k, v in f["result"].items() if k != "online_tables"},
                "commit": COMMIT, "date": time.strftime("%Y-%m-%d", time.gmtime()),
            }  # fmt: skip
        if self.server_cpu_s:
            out["push"]["server_cpu_s"] = self.server_cpu_s
        if tables := self.figures.get("train online"):
            out["online_tables"] = table_summary(tables["result"].get("online_tables", {}))
        return out


def checkpoint_paths(model_dir: Path) -> list[str]:
    """The model dir's checkpoints, oldest first (TensorFlow's ``checkpoint`` file)."""
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(str(model_dir))
    if state is None or not state.all_model_checkpoint_paths:
        raise SystemExit(f"{model_dir}: no checkpoint")
    return list(state.all_model_checkpoint_paths)


def variables_mb(model_dir: Path) -> float:
    """The bytes of a checkpoint's variables (weights and slots), MiB."""
    import numpy as np
    import tensorflow as tf

    reader = tf.train.load_checkpoint(checkpoint_paths(model_dir)[-1])
    dtypes = reader.get_variable_to_dtype_map()
    shapes = reader.get_variable_to_shape_map().items()
    return sum(int(np.prod(shape)) * dtypes[name].size for name, shape in shapes) / 2**20


def day_goals(day: Day) -> dict:
    """One size's goals beside their figures: each step's CPU against its floor's, the online
    tables' examples per CPU-second against the hashed tables', training's peak RSS."""
    goals: dict = {"floor": {}, "rss": {}}
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
        x = rate_o / rate_h
        goals["online_vs_hashed"] = {"per_cpu_s": [rate_o, rate_h], "x": x, "met": x >= 0.7}
        for variant, f in (("hashed", hashed), ("online", online)):
            var, peak = variables_mb(day.work / variant), f["peak_rss_mb"]
            goals["rss"][variant] = {
                "peak_mb": peak, "variables_mb": var, "bound_mb": 2 * var + 1024,
                "met": peak <= 2 * var + 1024, "memory_mb": f["result"].get("memory_mb"),
            }  # fmt: skip
    return goals


def growth(small: Day, large: Day) -> dict:
    """Each step's growth from the smallest size to the largest (goal: CPU at most 1.1x the
    rows' ratio)."""
    ratio, steps = large.rows / small.rows, {}
    for name in small.figures.keys() & large.figures.keys():
        cpu = large.figures[name]["cpu_s"] / small.figures[name]["cpu_s"]
        wall = large.figures[name]["wall_s"] / small.figures[name]["wall_s"]
        steps[word(name)] = {"wall_x": wall, "cpu_x": cpu, "met": cpu <= 1.1 * ratio}
    return {"rows_x": ratio, "steps": steps}


def table_summary(tables: dict) -> str:
    """The online tables' rows used, capacity and admitted ids in all, and the largest table's."""
    used = {k.rsplit("/", 1)[0]: v for k, v in tables.items() if k.endswith("/rows_used")}
    if not used:
        return "-"
    largest = max(used, key=used.get)
    total = {f: sum(v for k, v in tables.items() if k.endswith(f"/{f}")) for f in ("rows_used", "admitted")}
    # a group's capacity is reported by each of its tables: counted once
    capacity = sum(
        v / tables.get(k[: -len("capacity")] + "group_size", 1)
        for k, v in tables.items()
        if k.endswith("/capacity")
    )
    return (
        f"{total['rows_used']:,} rows used of {round(capacity):,} allocated, {total['admitted']:,} admitted; "
        f"largest {largest.rsplit('/', 1)[-1]}: {used[largest]:,} rows"
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "floor":
        return floor_main(*sys.argv[2:])
    parser = harness.parser(__doc__, rounds=None, workdir="production")
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 3_000_000, 10_000_000])
    parser.add_argument("--buckets", type=int, default=100_000, help="rows of each hashed table")
    parser.add_argument("--filter_freq", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS))
    args = parser.parse_args()
    days, start = [], time.perf_counter()
    for rows in args.rows:
        day = Day(rows, args.workdir, args.buckets, args.filter_freq)
        days.append(day)
        day.synth()
        for name in STEPS:
            if name in args.only:
                getattr(day, name)()
        if stats := day.figures.get("train online"):
            print(f"online tables: {table_summary(stats['result'].get('online_tables', {}))}")
    goals = {str(day.rows): day_goals(day) for day in days}
    if len(days) > 1:
        goals["growth"] = growth(days[0], days[-1])
    print("goals (floor: CPU x floor <= 1.5; online_vs_hashed: >= 0.7; rss: <= 2x variables + 1 GiB;")
    print("growth: CPU x <= 1.1x the rows' ratio):", json.dumps(goals, indent=1))
    # sizes and steps measured by earlier runs are kept, each with its own run's commit and date
    sizes = {str(day.rows): day.doc(goals[str(day.rows)]) for day in days}
    doc = {"sizes": sizes, "buckets": args.buckets, "filter_freq": args.filter_freq}
    if "growth" in goals:
        doc["growth"] = goals["growth"]
    harness.finish("production_day", doc, keep_earlier=True)
    print(f"{time.perf_counter() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
