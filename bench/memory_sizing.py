"""A training job's peak memory against the rows of its embedding tables.

One synthetic Criteo day of ``--rows`` rows (``bench/criteo_data.py``), ``conf/criteo_deepfm.yaml``
(26 hashed tables x 16, DeepFM, lazy Adam), trained by ``recpipe train --skip_eval`` once per
``--buckets`` size, each in its own process measured whole by ``bench.process_tree`` (peak RSS
of the tree), beside the bytes of the checkpoint's variables and slots and the job's own
``memory_mb`` phases. Writes ``bench/results/memory_sizing.json``; docs/training.md's sizing
section renders it.

    python bench/memory_sizing.py [--rows 50000] [--buckets 10000 100000 300000]
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench import harness  # noqa: E402
from bench.criteo_data import CONFIG, LAZY, START, bench_edits, prepare  # noqa: E402
from bench.process_tree import checked, recpipe  # noqa: E402
from bench.production_day import variables_mb  # noqa: E402


def main() -> int:
    parser = harness.parser(__doc__, rounds=None, workdir="memory_sizing")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--buckets", type=int, nargs="+", default=[10_000, 100_000, 300_000])
    args = parser.parse_args()
    work = args.workdir
    prepare(args.rows, 1, work, args.buckets[0], holdout_percent=10)  # the DAG's split
    sizes = {}
    for buckets in args.buckets:
        model_dir = work / f"model-{buckets}"
        shutil.rmtree(model_dir, ignore_errors=True)
        edits = {**bench_edits(work, buckets), "train_config.optimizer_config": [LAZY]}
        edits["data_config.holdout_percent"] = 10
        argv = recpipe("train", "--model_dir", str(model_dir), f"--train_ds={START}", f"--eval_ds={START}",
                       "--skip_eval", config=CONFIG, edits=edits)  # fmt: skip
        m = checked(argv, work / "logs" / f"train-{buckets}.log", f"train with {buckets} rows a table")
        var = variables_mb(model_dir)
        sizes[str(buckets)] = {
            "variables_mb": var,
            "peak_rss_mb": m.peak_rss_mb,
            "memory_mb": m.result.get("memory_mb"),
            "wall_s": m.wall_s,
        }
        print(f"{buckets:>9,} rows a table: variables {var:8,.0f} MiB, peak {m.peak_rss_mb:8,.0f} MiB")
    harness.finish("memory_sizing", {"rows": args.rows, "tables": 26, "dim": 16, "sizes": sizes})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
