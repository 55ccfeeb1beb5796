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
variant runs once to warm up (JIT, caches, as in a long-lived job), then ``--repeats`` times,
alternating; the median is printed. Goal: (c) <= 1.5x (b).

    python bench/feature_prep.py [--rows 1000000] [--repeats 3] [--workdir var/bench/feature_prep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import pyarrow.csv as pacsv

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import write_results  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def _jvm_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class Clock:
    """Wall and CPU seconds of a block: this process plus the Spark JVM ``jvm_pid``."""

    def __init__(self, jvm_pid: int | None = None):
        self.jvm_pid = jvm_pid

    def cpu(self) -> float:
        return time.process_time() + (_jvm_cpu(self.jvm_pid) if self.jvm_pid else 0.0)

    def measure(self, fn) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), self.cpu()
        fn()
        return time.perf_counter() - wall, self.cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=str(ROOT / "var/bench/feature_prep"))
    args = parser.parse_args()

    from pyspark.sql import types as T

    from dev.data.synth import synth_criteo
    from features import jvm
    from features.prepare import prepare_day
    from features.schema import SPARK_TYPES
    from features.session import get_spark
    from recpipe.config import load_pipeline_config
    from recpipe.config.data import FeatureType, Normalizer

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    ds = "2024-01-01"
    t0 = time.perf_counter()
    synth_criteo(args.rows, 1, work / "raw", start=ds)
    csv_file = work / "raw" / f"ds={ds}" / "part-00000.csv"
    print(
        f"synth: {args.rows} rows, {csv_file.stat().st_size / 2**20:.0f} MiB CSV "
        f"in {time.perf_counter() - t0:.1f}s"
    )
    config = load_pipeline_config(
        ROOT / "conf/criteo_deepfm.yaml",
        {"raw_input_path": str(work / "raw"), "train_input_path": str(work / "features")},
    )
    dc = config.data_config
    standard = config.model_copy(
        update={
            "train_input_path": str(work / "features_standard"),
            "feature_config": config.feature_config.model_copy(
                update={
                    "features": [
                        f.model_copy(update={"normalizer": Normalizer.standard})
                        if f.feature_type == FeatureType.RawFeature
                        else f
                        for f in config.feature_config.features
                    ]
                }
            ),
        }
    )

    floor = Clock().measure(lambda: pacsv.read_csv(csv_file))

    t0 = time.perf_counter()
    spark = get_spark("recpipe-bench")
    start_s = time.perf_counter() - t0
    clock = Clock(spark.sparkContext._gateway.proc.pid)
    schema = T.StructType([T.StructField(f.input_name, SPARK_TYPES[f.input_type]) for f in dc.input_fields])

    def bare() -> None:
        df = spark.read.option("header", True).option("sep", dc.separator).schema(schema).csv(str(csv_file))
        df.write.mode("overwrite").parquet(str(work / "bare"))

    def job() -> None:
        assert prepare_day(spark, config, ds)["rows"] == args.rows

    def job_standard() -> None:
        assert prepare_day(spark, standard, ds)["rows"] == args.rows

    def job_btrim() -> None:
        with jvm.spark_expressions(spark):
            job()

    variants = {"bare": bare, "job": job, "job_standard": job_standard, "job_btrim": job_btrim}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for fn in variants.values():  # warm-up
        fn()
    for _ in range(args.repeats):
        for name, fn in variants.items():
            runs[name].append(clock.measure(fn))
    spark.stop()

    def median(name: str) -> tuple[float, float]:
        return statistics.median(w for w, _ in runs[name]), statistics.median(c for _, c in runs[name])

    (bare_w, bare_c), (job_w, job_c), (std_w, std_c) = median("bare"), median("job"), median("job_standard")
    bt_w, bt_c = median("job_btrim")
    print(f"spark session start: {start_s:.1f}s (not counted); cores: {os.cpu_count()}")
    print(f"recpipe's JVM functions: {'registered' if jvm.registered(spark) else 'not built'}")
    print(f"{'':34s} {'wall s':>7s} {'CPU s':>7s} {'rows/s wall':>12s} {'rows/CPU-s':>12s}")
    for label, (w, c) in (
        ("(a) pyarrow read_csv (I/O floor)", floor),
        ("(b) Spark CSV -> Parquet, bare", (bare_w, bare_c)),
        ("(c) feature job (prepare_day)", (job_w, job_c)),
        ("(c2) feature job, standard", (std_w, std_c)),
        ("(c3) feature job, Spark's own", (bt_w, bt_c)),
    ):
        print(f"{label:34s} {w:7.2f} {c:7.2f} {args.rows / w:12,.0f} {args.rows / c:12,.0f}")
    print(f"(c) / (b): wall {job_w / bare_w:.2f}x, CPU {job_c / bare_c:.2f}x (goal <= 1.5x)")
    print(f"(c2) / (b): wall {std_w / bare_w:.2f}x, CPU {std_c / bare_c:.2f}x")
    print(f"(c3) / (b): wall {bt_w / bare_w:.2f}x, CPU {bt_c / bare_c:.2f}x")
    print(f"(c) / (a): wall {job_w / floor[0]:.1f}x")
    measured = {
        "pyarrow_read_csv": floor,
        "spark_bare": (bare_w, bare_c),
        "feature_job": (job_w, job_c),
        "feature_job_standard": (std_w, std_c),
        "feature_job_spark_expressions": (bt_w, bt_c),
    }
    figures = {
        name: {"wall_s": w, "cpu_s": c, "rows_per_s": args.rows / w, "rows_per_cpu_s": args.rows / c}
        for name, (w, c) in measured.items()
    }
    over_bare = {
        name: {"wall": figures[name]["wall_s"] / bare_w, "cpu": figures[name]["cpu_s"] / bare_c}
        for name in ("feature_job", "feature_job_standard", "feature_job_spark_expressions")
    }
    doc = {"rows": args.rows, "repeats": args.repeats, "variants": figures, "over_bare": over_bare}
    print(f"-> {write_results('feature_prep', doc).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
