"""What ``train_config.op_determinism`` costs, and whether runs repeat exactly.

Synthetic Criteo rows (``bench/criteo_data.py``: DeepFM, 26 id fields x 16 dims, 13 dense,
batch 1024) prepared by the Spark job, then one ``recpipe train`` process per variant and
repeat, the variants alternating so that load from other tenants of this shared machine falls
on both:

  (a) ``op_determinism: false``, (b) ``op_determinism: true`` (the default);

both with the same ``random_seed``. Printed per process: examples/s by wall time and per
CPU-second of the training loop, the final loss and the next day's AUC; then each variant's
median rates, (b)/(a) (the median of the rounds' ratios), and whether every repeat of a
variant gave bit-identical loss and AUC; written to ``bench/results/determinism.json``.

    python bench/determinism.py [--rows 200000] [--rounds 3]
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.criteo_data import CONFIG, bench_edits, days, prepare  # noqa: E402
from bench.process_tree import checked, recpipe  # noqa: E402

VARIANTS = {"(a) op_determinism off": False, "(b) op_determinism on": True}
KEYS = {"(a) op_determinism off": "off", "(b) op_determinism on": "on"}  # in the results file


def run(work: Path, buckets: int, model_dir: Path, deterministic: bool) -> dict:
    """One ``recpipe train`` process on day 1, evaluated on day 2; its result line."""
    first, second = days(2)
    edits = {**bench_edits(work, buckets), "train_config.op_determinism": deterministic}
    shutil.rmtree(model_dir, ignore_errors=True)
    argv = recpipe("train", "--model_dir", str(model_dir), f"--train_ds={first}", f"--eval_ds={second}",
                   config=CONFIG, edits=edits)  # fmt: skip
    return checked(argv, model_dir.parent / "train.log", "recpipe train").result


def main() -> int:
    parser = harness.parser(__doc__, rounds=3, workdir="determinism")
    parser.add_argument("--rows", type=int, default=200_000, help="rows a day (two days are drawn)")
    parser.add_argument("--buckets", type=int, default=12_800, help="hash_bucket_size of each id field")
    args = parser.parse_args()
    work = args.workdir
    prepare(args.rows * 2, 2, work / "data", args.buckets)
    print(f"{args.rows} rows, DeepFM, batch 1024, {args.rounds} processes per variant")

    def variant(deterministic: bool):
        def once() -> dict:
            r = run(work / "data", args.buckets, work / "model", deterministic)
            return {
                "examples_per_sec": r["examples_per_sec"],
                "per_cpu_s": r["global_step"] * 1024 / max(r["cpu_seconds"], 1e-9),
                "loss": r["loss"],
                "auc": r["eval"]["auc"],
            }

        return once

    runs = harness.alternate({KEYS[n]: variant(d) for n, d in VARIANTS.items()}, args.rounds)
    summary = harness.summarize(runs, reference="off", ratios=("examples_per_sec", "per_cpu_s"))
    figures: dict = {"rows": args.rows, "rounds": args.rounds, "variants": {}}
    for name, medians in summary["variants"].items():
        same = len({(r["loss"], r["auc"]) for r in runs[name]}) == 1
        figures["variants"][name] = {
            "examples_per_sec": round(medians["examples_per_sec"]),
            "per_cpu_s": round(medians["per_cpu_s"]),
            "repeats_identical": same,
            "auc": round(runs[name][0]["auc"], 4),
        }
    print(
        harness.table(
            figures["variants"], {"examples_per_sec": "ex/s wall", "per_cpu_s": "ex/CPU-s", "auc": "next AUC"}
        )
    )
    on = summary["vs_off"]["on"]
    figures["on_vs_off"] = {"wall": round(on["examples_per_sec"], 2), "per_cpu_s": round(on["per_cpu_s"], 2)}
    print(
        f"(b)/(a), the median of the rounds' ratios: {on['examples_per_sec']:.2f}x wall, "
        f"{on['per_cpu_s']:.2f}x per CPU-second"
    )
    harness.finish("determinism", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
