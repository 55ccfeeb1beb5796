"""What ``train_config.op_determinism`` costs, and whether runs repeat exactly.

Synthetic Criteo rows (``bench/criteo_data.py``: DeepFM, 26 id fields x 16 dims, 13 dense,
batch 1024) prepared by the Spark job, then one ``recpipe train`` process per variant and
repeat, the variants alternating so that load from other tenants of this shared machine falls
on both:

  (a) ``op_determinism: false``, (b) ``op_determinism: true`` (the default);

both with the same ``random_seed``. Printed per process: examples/s by wall time and per
CPU-second of the training loop, the final loss and the next day's AUC; then each variant's
fastest rates, (b)/(a), and whether every repeat of a variant gave bit-identical loss and AUC;
written to ``bench/results/determinism.json``.

    python bench/determinism.py [--rows 200000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.criteo_data import CONFIG, bench_edits, days, prepare  # noqa: E402
from bench.results import write_results  # noqa: E402

VARIANTS = {"(a) op_determinism off": False, "(b) op_determinism on": True}
KEYS = {"(a) op_determinism off": "off", "(b) op_determinism on": "on"}  # in the results file


def run(work: Path, buckets: int, model_dir: Path, deterministic: bool) -> dict:
    """One ``recpipe train`` process on day 1, evaluated on day 2; its result line."""
    first, second = days(2)
    edits = {**bench_edits(work, buckets), "train_config.op_determinism": deterministic}
    shutil.rmtree(model_dir, ignore_errors=True)
    argv = [sys.executable, "-m", "cli", "train", "--pipeline_config_path", str(CONFIG)]
    argv += ["--model_dir", str(model_dir), f"--train_ds={first}", f"--eval_ds={second}"]
    argv += ["--edit_config_json", json.dumps(edits)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"recpipe train failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows a day (two days are drawn)")
    parser.add_argument("--buckets", type=int, default=12_800, help="hash_bucket_size of each id field")
    parser.add_argument("--repeats", type=int, default=3, help="processes per variant")
    parser.add_argument("--out", default="var/bench/determinism")
    args = parser.parse_args()
    work = ROOT / args.out
    prepare(args.rows * 2, 2, work / "data", args.buckets)
    print(f"{args.rows} rows, DeepFM, batch 1024, {args.repeats} processes per variant")
    print(f"{'variant':24s} {'ex/s wall':>10s} {'ex/CPU-s':>9s} {'loss':>12s} {'next AUC':>10s}")
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, deterministic in VARIANTS.items():
            r = run(work / "data", args.buckets, work / "model", deterministic)
            rows = r["global_step"] * 1024
            r["cpu_rate"] = rows / max(r["cpu_seconds"], 1e-9)
            results[name].append(r)
            print(
                f"{name:24s} {r['examples_per_sec']:10.0f} {r['cpu_rate']:9.0f} "
                f"{r['loss']:12.8f} {r['eval']['auc']:10.6f}",
                flush=True,
            )
    best = {
        n: (max(r["examples_per_sec"] for r in rs), max(r["cpu_rate"] for r in rs))
        for n, rs in results.items()
    }
    (a, b) = best.values()
    figures: dict = {"rows": args.rows, "repeats": args.repeats, "variants": {}}
    for name, (wall, cpu) in best.items():
        same = len({(r["loss"], r["eval"]["auc"]) for r in results[name]}) == 1
        print(f"{name}: fastest {wall:.0f} ex/s wall, {cpu:.0f} ex/CPU-s; repeats identical: {same}")
        figures["variants"][KEYS[name]] = {
            "examples_per_sec": round(wall),
            "per_cpu_s": round(cpu),
            "repeats_identical": same,
            "auc": round(results[name][0]["eval"]["auc"], 4),
        }
    figures["on_vs_off"] = {"wall": round(b[0] / a[0], 2), "per_cpu_s": round(b[1] / a[1], 2)}
    print(f"(b)/(a): {b[0] / a[0]:.2f}x wall, {b[1] / a[1]:.2f}x per CPU-second")
    print(f"wrote {write_results('determinism', figures)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
