"""Benchmark: the Spark feature job on synthetic Criteo rows vs reading the CSV with pyarrow.

Prints rows/s of ``prepare_day`` (one day, local[*], includes the JVM-side parse, quarantine
check, dense statistics, and the Parquet write) and of ``pyarrow.csv.read_csv`` on the same
file (the I/O floor), and their ratio. Usage::

    python bench/feature_prep.py [--rows 1000000] [--workdir var/bench/feature_prep]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import pyarrow.csv as pacsv

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workdir", default=str(ROOT / "var/bench/feature_prep"))
    args = parser.parse_args()

    from features.prepare import prepare_day
    from features.session import get_spark
    from recpipe.config import load_pipeline_config
    from recpipe.data.synth import synth_criteo

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

    t0 = time.perf_counter()
    table = pacsv.read_csv(csv_file)
    floor_s = time.perf_counter() - t0
    assert table.num_rows == args.rows

    config = load_pipeline_config(
        ROOT / "conf/criteo_deepfm.yaml",
        {"raw_input_path": str(work / "raw"), "train_input_path": str(work / "features")},
    )
    t0 = time.perf_counter()
    spark = get_spark("recpipe-bench")
    start_s = time.perf_counter() - t0
    prepare_day(spark, config, ds)  # warm-up: JIT and caches, as in a long-lived job
    t0 = time.perf_counter()
    stats = prepare_day(spark, config, ds)
    job_s = time.perf_counter() - t0
    assert stats["rows"] == args.rows
    spark.stop()

    print(f"spark session start: {start_s:.1f}s (not counted)")
    print(f"pyarrow read_csv (I/O floor): {floor_s:.2f}s = {args.rows / floor_s:,.0f} rows/s")
    print(f"spark feature job:            {job_s:.2f}s = {args.rows / job_s:,.0f} rows/s")
    print(f"ratio job / floor: {floor_s / job_s:.3f} (job takes {job_s / floor_s:.1f}x the floor's time)")


if __name__ == "__main__":
    main()
