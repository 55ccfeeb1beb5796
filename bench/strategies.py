"""Benchmark: examples/s of each distributed strategy with 2 workers against ``NoStrategy``.

DeepFM on synthetic Criteo rows (the Spark job's Parquet), lazy Adam for the embeddings and Adam
for the dense weights, the same global batch (``--batch``) and steps for every strategy: one
process of batch B, or 2 replicas / workers of batch B/2. Each job runs ``trainer.train_eval``
through the local launcher, as the DAG does. Printed per strategy: the job's examples/s in the
training loop in steady state (the chief's logged examples/s after its first window, x workers:
every worker feeds the same batch size), the ratio to ``NoStrategy``, the examples per
CPU-second of all the job's processes (user + system, start-up included) and its ratio, and
the job's wall time including start-up.

All processes share this machine's cores, so the ratios here measure the strategies' overhead
(collectives, padding, start-up), not the speed-up that more machines would give.

Usage: ``python bench/strategies.py [--rows 400000] [--steps 300] [--batch 2048] [--only NAME ...]``
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

# name: (train_distribute, worker processes, ps, batches per step, sync_replicas)
STRATEGIES = {
    "NoStrategy": ("NoStrategy", 1, 0, 1, False),
    "MirroredStrategy": ("MirroredStrategy", 1, 0, 2, False),
    "MultiWorkerMirroredStrategy": ("MultiWorkerMirroredStrategy", 2, 0, 2, False),
    "HorovodStrategy": ("HorovodStrategy", 2, 0, 2, False),
    "EmbeddingParallelStrategy": ("EmbeddingParallelStrategy", 2, 0, 2, False),
    # the chief dispatches every step: asynchronous, one batch on one worker
    "PSStrategy": ("PSStrategy", 2, 2, 1, False),
    # one batch per worker, summed on the chief, then one update
    "NoStrategy+sync_replicas": ("NoStrategy", 2, 1, 2, True),
}


def run(work: Path, buckets: int, name: str, steps: int, batch: int) -> dict:
    """One job; its chief's result line, the job's examples/s and its wall time."""
    import shutil

    from bench.criteo_data import CONFIG, bench_edits, days
    from recpipe.config import ClusterConfig
    from recpipe.config.train import TrainDistribute
    from recpipe.launch import LocalLauncher, job_result, training_job

    strategy, workers, ps, replicas, sync = STRATEGIES[name]
    edits = {
        **bench_edits(work, buckets),
        "train_ds": days(1)[0],
        "data_config.batch_size": batch // replicas,
        "train_config.num_steps": steps,
        "train_config.train_distribute": strategy,
        "train_config.sync_replicas": sync,
        "train_config.num_gpus_per_worker": replicas if strategy == "MirroredStrategy" else 1,
        "train_config.log_step_count_steps": 50,
        "train_config.optimizer_config": [{"lazy_adam_optimizer": {}}, {"adam_optimizer": {}}],
    }
    model_dir = work / "models" / name
    shutil.rmtree(model_dir, ignore_errors=True)
    args = ["--pipeline_config_path", str(CONFIG), "--model_dir", str(model_dir)]
    args += ["--skip_eval", "--edit_config_json", json.dumps(edits)]
    job = training_job(
        "train", TrainDistribute(strategy), ClusterConfig(), args, cwd=ROOT, workers=workers, ps=ps
    )
    start, cpu_before = time.perf_counter(), _children_cpu()
    logs = LocalLauncher(model_dir / "logs").run(job)
    wall = time.perf_counter() - start
    cpu = _children_cpu() - cpu_before
    result = job_result(logs[0])
    # steady state: the chief's logged windows after the first (which holds tracing)
    lines = (model_dir / "train_metrics.jsonl").read_text().splitlines()[1:]
    rates = [json.loads(line)["examples_per_sec"] for line in lines]
    # the chief logs its own examples/s; a parameter-server chief feeds the whole job
    rate = sum(rates) / len(rates) * (1 if ps else workers)
    examples = steps * batch  # every strategy's step is one global batch
    return {
        "examples_per_sec": rate,
        "wall_s": wall,
        "cpu_s": cpu,
        "per_cpu_s": examples / cpu,
        "loss": result["loss"],
    }


def _children_cpu() -> float:
    """CPU-seconds (user + system) of every finished child process and its waited-for
    descendants so far: the job's processes, start-up included, every thread."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--buckets", type=int, default=12_800)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=2048, help="global batch")
    parser.add_argument("--workdir", default=str(ROOT / "var/bench/strategies"))
    parser.add_argument(
        "--only", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES), help="NoStrategy always runs"
    )
    args = parser.parse_args()
    from bench.criteo_data import prepare

    work = Path(args.workdir)
    prepare(args.rows, 1, work, args.buckets)
    print(
        f"data: {args.rows:,} rows, {26 * args.buckets * 16 / 1e6:.1f}M embedding parameters; "
        f"global batch {args.batch}, {args.steps} steps; {os.cpu_count()} cores shared by all processes"
    )
    base = base_cpu = None
    for name, (_, workers, ps, _, _) in STRATEGIES.items():
        if name != "NoStrategy" and name not in args.only:
            continue
        r = run(work, args.buckets, name, args.steps, args.batch)
        base = base or r["examples_per_sec"]
        base_cpu = base_cpu or r["per_cpu_s"]
        processes = f"x{workers}{f'+{ps}ps' if ps else ''}"
        print(
            f"{name:26s} {processes:6s} {r['examples_per_sec']:9,.0f} examples/s "
            f"(ratio {r['examples_per_sec'] / base:4.2f})  {r['per_cpu_s']:7,.0f} examples/CPU-s "
            f"(ratio {r['per_cpu_s'] / base_cpu:4.2f}, {r['cpu_s']:.0f} CPU-s)  wall {r['wall_s']:5.1f} s  "
            f"final loss {r['loss']:.4f}",
            flush=True,
        )
    print(
        "examples/s: the training loop in steady state; examples/CPU-s: the job's steps x global "
        "batch over the CPU-seconds of all its processes (start-up included), which other tenants "
        "of a shared machine do not inflate as they do wall time"
    )


if __name__ == "__main__":
    main()
