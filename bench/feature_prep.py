"""Benchmark: the Spark feature job against what reading the day costs, on synthetic Criteo rows.

In one run, on the same CSV file (one day, ``local[*]``), wall and CPU seconds of

  (a) ``pyarrow.csv.read_csv``: the I/O floor;
  (b) a bare Spark CSV -> Parquet conversion with the day's typed schema: what Spark itself
      costs to parse and write the rows;
  (c) the feature job, ``prepare_day``: parse, quarantine check, statistics, features, write;
  (c2) the same with a ``standard`` normaliser on the dense features, whose constants need the
      day's moments before the write: a first pass reads the dense columns (MovieLens' case);
  (c3) (c) with Spark's own expressions instead of recpipe's JVM functions (``features.jvm``:
      the ids' trim, the figures gathered in the stage, the log normaliser): what the job
      costs where ``javac`` was missing.

CPU seconds are this process's plus the Spark JVM's (``/proc/<pid>/stat``). Each Spark
variant runs once to warm up (JIT, caches, as in a long-lived job), then ``--rounds`` times,
alternating; the median is printed. Goal: (c) <= 1.5x (b).

    python bench/feature_prep.py [--rows 1000000] [--rounds 3] [--workdir var/bench/feature_prep]
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pyarrow.csv as pacsv

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402


def main() -> None:
    parser = harness.parser(__doc__, rounds=3, workdir="feature_prep")
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()

    from bench.floors import spark_csv_to_parquet
    from dev.data.synth import synth_criteo
    from features import jvm
    from features.prepare import prepare_day
    from features.session import get_spark
    from recpipe.config import load_pipeline_config
    from recpipe.config.data import FeatureType

    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    ds = "2024-01-01"
    t0 = time.perf_counter()
    synth_criteo(args.rows, 1, work / "raw", start=ds)
    csv_file = work / "raw" / f"ds={ds}" / "part-00000.csv"
    print(
        f"synth: {args.rows} rows, {csv_file.stat().st_size / 2**20:.0f} MiB CSV "
        f"in {time.perf_counter() - t0:.1f}s"
    )
    paths = {"raw_input_path": str(work / "raw"), "train_input_path": str(work / "features")}
    config = load_pipeline_config(ROOT / "conf/criteo_deepfm.yaml", paths)
    dense = [f.name for f in config.feature_config.features if f.feature_type == FeatureType.RawFeature]
    standard = load_pipeline_config(
        ROOT / "conf/criteo_deepfm.yaml",
        {**paths, "train_input_path": str(work / "features_standard")}
        | {f"feature_config.features[input_names={name}].normalizer": "standard" for name in dense},
    )

    floor = harness.Clock().measure(lambda: pacsv.read_csv(csv_file) and None)

    t0 = time.perf_counter()
    spark = get_spark("recpipe-bench")
    start_s = time.perf_counter() - t0
    clock = harness.Clock(spark.sparkContext._gateway.proc.pid)

    def bare() -> None:
        spark_csv_to_parquet(spark, config.data_config, str(csv_file), str(work / "bare"))

    def job() -> None:
        assert prepare_day(spark, config, ds)["rows"] == args.rows

    def job_standard() -> None:
        assert prepare_day(spark, standard, ds)["rows"] == args.rows

    def job_btrim() -> None:
        with jvm.spark_expressions(spark):
            job()

    variants = {"bare": bare, "job": job, "job_standard": job_standard, "job_btrim": job_btrim}
    # warmed up once each (JIT, caches, as in a long-lived job)
    runs = harness.alternate(variants, args.rounds, clock=clock, warm_up=True)
    spark.stop()
    medians = harness.summarize(runs)["variants"]
    measured = {
        "pyarrow_read_csv": floor,
        "spark_bare": medians["bare"],
        "feature_job": medians["job"],
        "feature_job_standard": medians["job_standard"],
        "feature_job_spark_expressions": medians["job_btrim"],
    }
    figures = {
        name: {**m, "rows_per_s": args.rows / m["wall_s"], "rows_per_cpu_s": args.rows / m["cpu_s"]}
        for name, m in measured.items()
    }
    print(f"spark session start: {start_s:.1f}s (not counted); cores: {os.cpu_count()}")
    print(f"recpipe's JVM functions: {'registered' if jvm.registered(spark) else 'not built'}")
    labels = {
        "pyarrow_read_csv": "(a) pyarrow read_csv (I/O floor)",
        "spark_bare": "(b) Spark CSV -> Parquet, bare",
        "feature_job": "(c) feature job (prepare_day)",
        "feature_job_standard": "(c2) feature job, standard",
        "feature_job_spark_expressions": "(c3) feature job, Spark's own",
    }
    columns = {"wall_s": "wall s", "cpu_s": "CPU s", "rows_per_s": "rows/s wall"}
    columns["rows_per_cpu_s"] = "rows/CPU-s"
    print(harness.table({labels[k]: v for k, v in figures.items()}, columns))
    bare = figures["spark_bare"]
    over_bare = {
        name: {k: figures[name][f"{k}_s"] / bare[f"{k}_s"] for k in ("wall", "cpu")}
        for name in ("feature_job", "feature_job_standard", "feature_job_spark_expressions")
    }
    for name, over in over_bare.items():
        print(f"{labels[name]} / (b): wall {over['wall']:.2f}x, CPU {over['cpu']:.2f}x")
    print("goal: (c) / (b) <= 1.5x")
    print(f"(c) / (a): wall {figures['feature_job']['wall_s'] / floor['wall_s']:.1f}x")
    doc = {"rows": args.rows, "rounds": args.rounds, "variants": figures, "over_bare": over_bare}
    harness.finish("feature_prep", doc)


if __name__ == "__main__":
    main()
