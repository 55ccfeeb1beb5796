"""Benchmark: examples/s of each distributed strategy with 2 workers against ``NoStrategy``.

DeepFM on synthetic Criteo rows (the Spark job's Parquet), lazy Adam for the embeddings and Adam
for the dense weights, the same global batch (``--batch``) and steps for every strategy: one
process of batch B, or 2 replicas / workers of batch B/2. Each job runs ``trainer.train_eval``
through the local launcher, as the DAG does. Printed per strategy: the job's examples/s in the
training loop in steady state (the chief's logged examples/s after its first window, x workers:
every worker feeds the same batch size), the ratio to ``NoStrategy``, and the job's wall time
including start-up.

All processes share this machine's cores, so the ratios here measure the strategies' overhead
(collectives, padding, start-up), not the speed-up that more machines would give.

Usage: ``python bench/strategies.py [--rows 400000] [--steps 300] [--batch 2048]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STRATEGIES = {
    "NoStrategy": 1,
    "MirroredStrategy": 1,
    "MultiWorkerMirroredStrategy": 2,
    "HorovodStrategy": 2,
    "EmbeddingParallelStrategy": 2,
    "PSStrategy": 2,  # 2 workers and 2 ps; the chief dispatches every step
}


def run(work: Path, buckets: int, strategy: str, steps: int, batch: int) -> dict:
    """One job; its chief's result line, the job's examples/s and its wall time."""
    import shutil

    from bench.criteo_data import CONFIG, bench_edits, days
    from operators.base import last_json_line
    from operators.launchers import LocalLauncher
    from operators.launchers.topology import job_spec, training_processes
    from recpipe.config.train import TrainDistribute

    workers = STRATEGIES[strategy]
    # a parameter-server step is one batch on one worker, asynchronously
    replicas = 1 if strategy in ("NoStrategy", "PSStrategy") else 2
    edits = {
        **bench_edits(work, buckets),
        "train_ds": days(1)[0],
        "data_config.batch_size": batch // replicas,
        "train_config.num_steps": steps,
        "train_config.train_distribute": strategy,
        "train_config.num_gpus_per_worker": replicas if strategy == "MirroredStrategy" else 1,
        "train_config.log_step_count_steps": 50,
        "train_config.optimizer_config": [{"lazy_adam_optimizer": {}}, {"adam_optimizer": {}}],
    }
    model_dir = work / "models" / strategy
    shutil.rmtree(model_dir, ignore_errors=True)
    args = ["trainer.train_eval", "--pipeline_config_path", str(CONFIG), "--model_dir", str(model_dir)]
    args += ["--skip_eval", "--edit_config_json", json.dumps(edits)]
    ps = 2 if strategy == "PSStrategy" else 0
    processes = training_processes(TrainDistribute(strategy), workers, args, ps=ps)
    job = job_spec("train", processes, ROOT, {"TF_CPP_MIN_LOG_LEVEL": "2"})
    start = time.perf_counter()
    logs = LocalLauncher(model_dir / "logs").run(job)
    wall = time.perf_counter() - start
    result = last_json_line(logs[0])
    # steady state: the chief's logged windows after the first (which holds tracing)
    lines = (model_dir / "train_metrics.jsonl").read_text().splitlines()[1:]
    rates = [json.loads(line)["examples_per_sec"] for line in lines]
    # the chief logs its own examples/s; a parameter-server chief feeds the whole job
    rate = sum(rates) / len(rates) * (1 if ps else workers)
    return {"examples_per_sec": rate, "wall_s": wall, "loss": result["loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--buckets", type=int, default=12_800)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=2048, help="global batch")
    parser.add_argument("--workdir", default=str(ROOT / "var/bench/strategies"))
    args = parser.parse_args()
    from bench.criteo_data import prepare

    work = Path(args.workdir)
    prepare(args.rows, 1, work, args.buckets)
    print(
        f"data: {args.rows:,} rows, {26 * args.buckets * 16 / 1e6:.1f}M embedding parameters; "
        f"global batch {args.batch}, {args.steps} steps; {os.cpu_count()} cores shared by all processes"
    )
    base = None
    for strategy in STRATEGIES:
        r = run(work, args.buckets, strategy, args.steps, args.batch)
        base = base or r["examples_per_sec"]
        print(
            f"{strategy:28s} x{STRATEGIES[strategy]} process(es) {r['examples_per_sec']:9,.0f} examples/s "
            f"(ratio {r['examples_per_sec'] / base:4.2f})  wall {r['wall_s']:5.1f} s  "
            f"final loss {r['loss']:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
