"""``recpipe predict`` against its floor, and its memory as the input grows.

A DeepFM export (EasyRec's ``tests/config/easyrec/deepfm_criteo.config`` imported, its
variables as built: scoring costs the same trained or not) scores ``--rows`` Criteo-like TSV
rows (a label, two dense and three categorical columns), batches of ``--batch_size``:

  floor        the SavedModel's signature called on tensors built beforehand: no reading,
               parsing, casting or writing (in this process);
  local        ``recpipe predict`` in one process, TSV in, Parquet out;
  local_quarter  the same on the first quarter of the rows: the peak memory should not move;
  spark        ``recpipe predict --master local[2]``: Spark reads, two Python workers score.

Each command variant runs as its own process, measured whole (``bench.process_tree``: wall
time, the CPU-seconds and the peak resident memory of its process tree, Spark's JVM and Python
workers included). The variants alternate ``--rounds`` times; figures are medians. Figures go
to ``bench/results/predict.json``.

    python bench/predict.py [--rows 1000000] [--batch_size 4096] [--rounds 1]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.process_tree import checked  # noqa: E402

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


def _command(args: list[str], env: dict, log: Path) -> dict:
    """``python -m cli predict args``, measured whole (``bench.process_tree``: the JVM and
    Spark's Python workers included)."""
    m = checked([sys.executable, "-m", "cli", "predict", *args], log, "predict", env=env, cwd=ROOT)
    rows = m.result["rows"]
    return {"rows": rows, "wall_s": m.wall_s, "cpu_s": m.cpu_s, "rows_per_s": rows / m.wall_s,
            "rows_per_cpu_s": rows / m.cpu_s, "peak_rss_mib": m.peak_rss_mb}  # fmt: skip


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

    def score():
        for batch in batches:
            fn(**batch)["probability"].numpy()

    took = harness.Clock().measure(score)
    rows = table.num_rows
    return {"rows": rows, **took, "rows_per_s": rows / took["wall_s"], "rows_per_cpu_s": rows / took["cpu_s"]}


def main() -> int:
    parser = harness.parser(__doc__, rounds=1)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch_size", type=int, default=4096)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="predict-bench-") as tmp:
        var = Path(tmp)
        env = {**os.environ, "RECPIPE_VAR_DIR": str(var), "TF_CPP_MIN_LOG_LEVEL": "2"}
        # in a process of its own: a command forked from this one after TensorFlow loaded
        # would report this process's size as its own peak (ru_maxrss survives exec)
        code = f"from bench.predict import _export; _export({str(var)!r})"
        checked([sys.executable, "-c", code], var / "export.log", "the export", cwd=ROOT, env=env)
        export = var / "export" / "1"
        full, quarter = var / "in" / "full" / "part-0.tsv", var / "in" / "quarter" / "part-0.tsv"
        _rows(full, args.rows)
        _rows(quarter, args.rows // 4)
        common = ["--saved_model_dir", str(export), "--batch_size", str(args.batch_size)]
        common += ["--output_format", "parquet"]

        def predict(name: str, rows: Path, *extra: str):
            out = ["--input_path", str(rows.parent), "--output_path", str(var / name)]
            return lambda: _command([*out, *extra, *common], env, var / f"{name}.log")

        variants = {
            "floor": lambda: _floor(export, full, args.batch_size),
            "local": predict("local", full),
            "local_quarter": predict("local_quarter", quarter),
            "spark": predict("spark", full, "--master", "local[2]"),
        }
        runs = harness.alternate(variants, args.rounds)
    results = {"rows": args.rows, "batch_size": args.batch_size, "rounds": args.rounds}
    for name, medians in harness.summarize(runs)["variants"].items():
        results[name] = {k: round(v) if k in ("rows", "peak_rss_mib") else v for k, v in medians.items()}
    columns = {"rows": "rows", "wall_s": "wall s", "cpu_s": "CPU s", "rows_per_s": "rows/s",
               "rows_per_cpu_s": "rows/CPU-s", "peak_rss_mib": "peak MiB"}  # fmt: skip
    print(harness.table({n: results[n] for n in variants}, columns))
    results["local_vs_floor_per_cpu_s"] = harness.ratio(runs, "local", "floor", "rows_per_cpu_s")
    harness.finish("predict", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
