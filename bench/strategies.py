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

The parameter-server modes (``train_config.sync_mode``: async, half_async, geo with
``geo_step`` 1, 10, 100) also print their traffic: the bytes that crossed the loopback interface
during the job per example (everything: the chief's batches to the workers, the workers' reads
and writes on the ps, start-up), and, where the distribution counts them, the bytes its updates
sent to the ps per example (half_async: the merged gradients; geo: the pushed deltas and ids).
With ``--eval`` every job is evaluated on a second synthetic day (AUC).

With ``--rounds`` above 1 the jobs alternate, round after round; the figures are medians and
the ratios the median of each round's ratio.

Usage: ``python bench/strategies.py [--rows 400000] [--steps 300] [--batch 2048] [--eval]
[--only NAME ...] [--rounds 1]``
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# the jobs on the host's network: a private namespace's loopback (the launcher's default) is
# not counted in this namespace's /proc/net/dev, which the traffic figures read
os.environ.setdefault("RECPIPE_JOB_NETWORK", "host")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

# name: (train_distribute, worker processes, ps, batches per step, train_config edits)
STRATEGIES = {
    "NoStrategy": ("NoStrategy", 1, 0, 1, {}),
    "MirroredStrategy": ("MirroredStrategy", 1, 0, 2, {}),
    "MultiWorkerMirroredStrategy": ("MultiWorkerMirroredStrategy", 2, 0, 2, {}),
    "HorovodStrategy": ("HorovodStrategy", 2, 0, 2, {}),
    "EmbeddingParallelStrategy": ("EmbeddingParallelStrategy", 2, 0, 2, {}),
    # the chief dispatches every step: asynchronous, one batch on one worker
    "PSStrategy": ("PSStrategy", 2, 2, 1, {}),
    # one batch per worker, summed on the chief, then one update
    "NoStrategy+sync_replicas": ("NoStrategy", 2, 1, 2, {"sync_replicas": True}),
    # gradients of 2 steps merged by id on the chief, applied once, nobody waiting
    "PSStrategy+half_async": ("PSStrategy", 2, 2, 1, {"sync_mode": "half_async"}),
    # local copies on the workers, deltas pushed every geo_step batches
    "PSStrategy+geo_step=1": ("PSStrategy", 2, 2, 1, {"sync_mode": "geo", "geo_step": 1}),
    "PSStrategy+geo_step=10": ("PSStrategy", 2, 2, 1, {"sync_mode": "geo", "geo_step": 10}),
    "PSStrategy+geo_step=100": ("PSStrategy", 2, 2, 1, {"sync_mode": "geo", "geo_step": 100}),
}


def loopback_bytes() -> int:
    """Bytes sent over the loopback interface since boot (``/proc/net/dev``)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, fields = line.partition(":")
        if name.strip() == "lo":
            return int(fields.split()[8])  # transmit bytes
    return 0


def run(work: Path, buckets: int, name: str, steps: int, batch: int, evaluate: bool = False) -> dict:
    """One job; its chief's result line, the job's examples/s and its wall time."""
    import shutil

    from bench.criteo_data import CONFIG, days, job_edits, steady_rate
    from recpipe.config import ClusterConfig
    from recpipe.config.train import TrainDistribute
    from recpipe.launch import LocalLauncher, job_result, training_job

    strategy, workers, ps, replicas, train_edits = STRATEGIES[name]
    train_edits = {
        **train_edits,
        "num_gpus_per_worker": replicas if strategy == "MirroredStrategy" else 1,
        "log_step_count_steps": 50,
    }
    edits = job_edits(work, buckets, strategy, batch // replicas, steps, train_edits)
    if evaluate:
        edits["eval_ds"] = days(2)[1]
    model_dir = work / "models" / name
    shutil.rmtree(model_dir, ignore_errors=True)
    args = ["--pipeline_config_path", str(CONFIG), "--model_dir", str(model_dir)]
    args += [*([] if evaluate else ["--skip_eval"]), "--edit_config_json", json.dumps(edits)]
    job = training_job(
        "train", TrainDistribute(strategy), ClusterConfig(), args, cwd=ROOT, workers=workers, ps=ps
    )
    clock = harness.Clock()  # the job's processes are this process's waited-for children
    start, cpu_before, lo_before = time.perf_counter(), clock.cpu(), loopback_bytes()
    logs = LocalLauncher(model_dir / "logs").run(job)
    wall, cpu = time.perf_counter() - start, clock.cpu() - cpu_before
    lo = loopback_bytes() - lo_before
    result = job_result(logs[0])
    # the chief logs its own examples/s; a parameter-server chief feeds the whole job
    rate = steady_rate(model_dir) * (1 if ps else workers)
    examples = result["global_step"] * batch  # every strategy's step is one global batch
    to_ps = result.get("distribution", {}).get("bytes_to_ps")
    return {
        "examples_per_sec": rate,
        "wall_s": wall,
        "cpu_s": cpu,
        "per_cpu_s": examples / cpu,
        "loss": result["loss"],
        "loopback_per_example": lo / examples,
        "to_ps_per_example": None if to_ps is None else to_ps / examples,
        "auc": (result.get("eval") or {}).get("auc"),
    }


def main() -> None:
    parser = harness.parser(__doc__, rounds=1, workdir="strategies")
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--buckets", type=int, default=12_800)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=2048, help="global batch")
    parser.add_argument("--eval", action="store_true", help="AUC of each job on a second day")
    parser.add_argument("--results", default="strategies", help="bench/results/<NAME>.json")
    parser.add_argument(
        "--only", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES), help="NoStrategy always runs"
    )
    args = parser.parse_args()
    from bench.criteo_data import prepare

    work = args.workdir
    # with --eval, a second day of as many rows to evaluate on
    prepare(args.rows * 2 if args.eval else args.rows, 2 if args.eval else 1, work, args.buckets)
    print(
        f"data: {args.rows:,} rows, {26 * args.buckets * 16 / 1e6:.1f}M embedding parameters; "
        f"global batch {args.batch}, {args.steps} steps; {os.cpu_count()} cores shared by all processes"
    )
    names = ["NoStrategy", *(n for n in STRATEGIES if n != "NoStrategy" and n in args.only)]

    def job(name):
        return lambda: run(work, args.buckets, name, args.steps, args.batch, args.eval)

    runs = harness.alternate({n: job(n) for n in names}, args.rounds)
    ratios = {"examples_per_sec": "vs_none", "per_cpu_s": "per_cpu_vs_none"}
    jobs = {}
    for name, figures in harness.versus(runs, "NoStrategy", ratios).items():
        _, workers, ps, _, _ = STRATEGIES[name]
        jobs[name] = {"name": name, "workers": workers, "ps": ps, "auc": None, "to_ps_per_example": None,
                      **figures}  # fmt: skip
    columns = {"examples_per_sec": "examples/s", "vs_none": "x none", "per_cpu_s": "ex/CPU-s",
               "per_cpu_vs_none": "x none", "wall_s": "wall s", "loss": "loss", "auc": "AUC",
               "loopback_per_example": "lo B/ex", "to_ps_per_example": "to ps B/ex"}  # fmt: skip
    print(harness.table({n: {k: v for k, v in j.items() if v is not None} for n, j in jobs.items()}, columns))
    print(
        "examples/s: the training loop in steady state; examples/CPU-s: the job's steps x global "
        "batch over the CPU-seconds of all its processes (start-up included), which other tenants "
        "of a shared machine do not inflate as they do wall time"
    )
    figures = {"rows": args.rows, "steps": args.steps, "global_batch": args.batch, "rounds": args.rounds}
    harness.finish(args.results, {**figures, "jobs": jobs})


if __name__ == "__main__":
    main()
