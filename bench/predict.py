"""``recpipe predict`` against its floor, and its memory as the input grows.

A DeepFM export (EasyRec's ``tests/config/easyrec/deepfm_criteo.config`` imported, its
variables as built: scoring costs the same trained or not) scores ``--rows`` Criteo-like TSV
rows (a label, two dense and three categorical columns), batches of ``--batch_size``:

  floor        the SavedModel's signature called on tensors built beforehand: no reading,
               parsing, casting or writing (in this process);
  local        ``recpipe predict`` in one process, TSV in, Parquet out;
  local_quarter  the same on the first quarter of the rows: the peak memory should not move;
  spark        ``recpipe predict --master local[2]``: Spark reads, two Python workers score.

Each command variant runs as its own process; its wall time, the CPU-seconds of it and the
processes it waited for, and its peak resident memory are recorded (Spark's Python workers
are the JVM's children: its CPU-seconds hold them only as the JVM reaps them). Figures go to
``bench/results/predict.json``.

    python bench/predict.py [--rows 1000000] [--batch_size 4096]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.results import write_results  # noqa: E402

CONFIG = ROOT / "tests" / "config" / "easyrec" / "deepfm_criteo.config"


def _export(var: str | Path) -> Path:
    from recpipe.config.easyrec import import_config
    from recpipe.config.loader import validate
    from recpipe.config.pipeline import PipelineConfig
    from trainer.input import sample_inputs
    from trainer.models.builders import build_model
    from trainer.serving import write_saved_model

    var = Path(var)
    data = import_config(CONFIG.read_text(), str(CONFIG))
    data |= {
        "model_dir": str(var / "model"),
        "raw_input_path": str(var / "raw"),
        "train_input_path": str(var / "f"),
    }
    config = validate(PipelineConfig, data, str(CONFIG))
    model = build_model(config)
    model(sample_inputs(config))
    target = var / "export" / "1"
    target.parent.mkdir(parents=True)
    write_saved_model(config, model, {}, target)
    return target


def _rows(path: Path, rows: int, seed: int = 7) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    cols = [
        rng.integers(0, 2, rows).astype(str),
        np.char.mod("%.3f", rng.exponential(3.0, rows)),
        np.char.mod("%.4f", rng.normal(size=rows)),
        np.char.add("u", rng.integers(0, 100_000, rows).astype(str)),
        rng.integers(0, 9999, rows).astype(str),
        np.char.add(np.char.add("t", rng.integers(0, 50, rows).astype(str)), ",t7"),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for start in range(0, rows, 100_000):
            part = [c[start : start + 100_000] for c in cols]
            f.write("\n".join("\t".join(r) for r in zip(*part, strict=True)) + "\n")


def _command(args: list[str], env: dict) -> dict:
    """Run ``python -m cli predict args``; its wall, CPU-seconds and peak RSS (MiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "predict", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out, err = proc.stdout.read(), proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"predict failed: {err[-2000:]}")
    rows = __import__("json").loads(out.strip().splitlines()[-1])["rows"]
    cpu = usage.ru_utime + usage.ru_stime
    return {"rows": rows, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "rows_per_s": round(rows / wall),
            "rows_per_cpu_s": round(rows / cpu), "peak_rss_mib": round(usage.ru_maxrss / 1024)}  # fmt: skip


def _floor(export: Path, path: Path, batch_size: int) -> dict:
    import numpy as np
    import pyarrow.csv as pacsv
    import tensorflow as tf

    fn = tf.saved_model.load(str(export)).signatures["serving_default"]
    names = ["label", "i1", "i2", "c1", "c2", "c3"]
    strings = pacsv.ConvertOptions(column_types={"c1": "string", "c3": "string"})
    tsv = pacsv.ParseOptions(delimiter="\t")
    table = pacsv.read_csv(
        path, read_options=pacsv.ReadOptions(column_names=names), parse_options=tsv, convert_options=strings
    )
    batches = []
    for start in range(0, table.num_rows, batch_size):
        part = table.slice(start, batch_size)
        batches.append({
            "i1": tf.constant(part["i1"].to_numpy(), tf.float64),
            "i2": tf.constant(part["i2"].to_numpy(), tf.float64),
            "c1": tf.constant(part["c1"].to_numpy(zero_copy_only=False).astype(object)),
            "c2": tf.constant(part["c2"].to_numpy().astype(np.int64)),
            "c3": tf.constant(part["c3"].to_numpy(zero_copy_only=False).astype(object)),
        })  # fmt: skip
    fn(**batches[0])  # traced once before timing
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        fn(**batch)["probability"].numpy()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rows = table.num_rows
    return {"rows": rows, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "rows_per_s": round(rows / wall),
            "rows_per_cpu_s": round(rows / cpu)}  # fmt: skip


def main() -> int:
    parser = harness.parser(__doc__, rounds=None)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch_size", type=int, default=4096)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="predict-bench-") as tmp:
        var = Path(tmp)
        env = {**os.environ, "RECPIPE_VAR_DIR": str(var), "TF_CPP_MIN_LOG_LEVEL": "2"}
        # in a process of its own: a command forked from this one after TensorFlow loaded
        # would report this process's size as its own peak (ru_maxrss survives exec)
        code = f"from bench.predict import _export; _export({str(var)!r})"
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, capture_output=True)
        export = var / "export" / "1"
        full, quarter = var / "in" / "full" / "part-0.tsv", var / "in" / "quarter" / "part-0.tsv"
        _rows(full, args.rows)
        _rows(quarter, args.rows // 4)
        common = [
            "--saved_model_dir",
            str(export),
            "--batch_size",
            str(args.batch_size),
            "--output_format",
            "parquet",
        ]
        results = {"rows": args.rows, "batch_size": args.batch_size}
        results["local"] = _command(
            ["--input_path", str(full.parent), "--output_path", str(var / "o1"), *common], env
        )
        results["local_quarter"] = _command(
            ["--input_path", str(quarter.parent), "--output_path", str(var / "o2"), *common], env
        )
        results["spark"] = _command(
            [
                "--input_path",
                str(full.parent),
                "--output_path",
                str(var / "o3"),
                "--master",
                "local[2]",
                *common,
            ],
            env,
        )
        results["floor"] = _floor(export, full, args.batch_size)
    for name in ("floor", "local", "local_quarter", "spark"):
        r = results[name]
        rates = f"{r['rows_per_s']:>9,}/s {r['rows_per_cpu_s']:>9,}/CPU-s"
        print(f"{name:14s} {r['rows']:>10,} rows {r['wall_s']:7.1f} s {r['cpu_s']:7.1f} CPU-s {rates} "
              f"{r.get('peak_rss_mib', '-'):>6} MiB")  # fmt: skip
    results["local_vs_floor_per_cpu_s"] = round(
        results["local"]["rows_per_cpu_s"] / results["floor"]["rows_per_cpu_s"], 2
    )
    print(write_results("predict", results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
