"""Benchmark: the parameter-server modes across hosts, over links of a given rate.

Each mode's job (PaddleRec's ``sync``, ``async``, ``half_async`` and ``geo``) is rendered as the
TFJob the train task would submit and started as Kubeflow's training operator would, one
replica a host (``dev/training_operator.py`` on network namespaces, ``dev/hosts.py``: run
as root): a chief, 2 workers and 2 ps, every host's link capped at each ``--rates`` value
(``tc tbf`` on both ends). DeepFM on synthetic Criteo rows (``bench/criteo_data.py``), lazy Adam
on the embeddings. Printed and written to ``bench/results/ps_links.json`` per mode and rate:
examples/s of the training loop in steady state (the chief's logged windows after the first),
examples per CPU-second of all the job's processes (start-up included: other tenants of this
shared machine inflate wall time, not CPU time), the bytes every host sent per example (the
hosts' links' counters), the job's wall time and final loss. Compare modes and rates inside one
run: a wall-clock ratio alone swings 2x between runs here. With ``--rounds`` above 1 the jobs
alternate; figures are medians, ``slow_vs_fast`` the median of the rounds' ratios.

All hosts share this machine's cores: the rates bind where the network, not the CPU, is the
bottleneck, which is what a slow link between real machines does.

Usage (root): ``python bench/ps_links.py [--rates 1gbit 100mbit] [--steps 120] [--batch 1024] [--rounds 1]``
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

# mode: (train_config edits, batches per step: sync sums one batch per worker)
MODES = {
    "sync": ({"sync_mode": "sync"}, 2),
    "async": ({"sync_mode": "async"}, 1),
    "half_async": ({"sync_mode": "half_async"}, 1),
    "geo": ({"sync_mode": "geo", "geo_step": 100}, 1),
}
HOSTS = ["chief", "w0", "w1", "ps0", "ps1"]
PLACEMENT = {
    ("Chief", 0): "chief",
    ("Worker", 0): "w0",
    ("Worker", 1): "w1",
    ("PS", 0): "ps0",
    ("PS", 1): "ps1",
}


def _sent(hosts, name: str) -> int:
    """Bytes host ``name`` sent: what the bridge's end of its link received."""
    return int(Path(f"/sys/class/net/{hosts.link(name)}/statistics/rx_bytes").read_text())


def run(work: Path, buckets: int, mode: str, rate: str, steps: int, batch: int) -> dict:
    """One mode's job across the hosts at ``rate``: its figures."""
    import shutil

    from bench.criteo_data import CONFIG, job_edits, steady_rate
    from dev.hosts import Hosts
    from dev.training_operator import start_tfjob
    from recpipe.config import ClusterConfig
    from recpipe.config.train import SyncMode, TrainDistribute
    from recpipe.launch import job_result
    from recpipe.launch.kubeflow import render

    train_edits, per_step = MODES[mode]
    train_edits = {**train_edits, "log_step_count_steps": 20, "save_checkpoints_steps": steps}
    edits = job_edits(work, buckets, "PSStrategy", batch // per_step, steps, train_edits)
    model_dir = work / "models" / f"{mode}-{rate}"
    shutil.rmtree(model_dir, ignore_errors=True)
    args = ["--pipeline_config_path", str(CONFIG), "--model_dir", str(model_dir), "--skip_eval"]
    args += ["--edit_config_json", json.dumps(edits)]
    cluster = ClusterConfig(
        launcher="kubernetes", image="recpipe:bench", worker={"count": 2}, ps={"count": 2}
    )
    job, _ = render(f"ps-{mode}", TrainDistribute.PSStrategy, cluster, args, sync_mode=SyncMode(mode))
    with Hosts(HOSTS) as hosts:
        for host in HOSTS:
            hosts.limit(host, rate)
        sent_before = sum(_sent(hosts, h) for h in HOSTS)
        clock = harness.Clock()  # the replicas are this process's waited-for children
        start, cpu_before = time.perf_counter(), clock.cpu()
        run_ = start_tfjob(hosts, job, PLACEMENT, model_dir / "logs")
        try:
            code = run_.wait(timeout_s=3600)
        finally:
            run_.stop()
        wall = time.perf_counter() - start
        sent = sum(_sent(hosts, h) for h in HOSTS) - sent_before
    cpu = clock.cpu() - cpu_before
    chief = run_.replica("Chief").log
    if code != 0:
        raise RuntimeError(f"{mode} at {rate}: the job failed:\n{chief.read_text()[-3000:]}")
    result = job_result(chief)
    examples = result["global_step"] * batch
    return {
        "examples_per_sec": steady_rate(model_dir),
        "per_cpu_s": examples / cpu,
        "cpu_s": cpu,
        "sent_bytes_per_example": sent / examples,
        "wall_s": wall,
        "loss": result["loss"],
    }


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("bench/ps_links.py makes network namespaces: run it as root")
    parser = harness.parser(__doc__, rounds=1, workdir="ps_links")
    parser.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"], help="tc rates, fastest first")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--buckets", type=int, default=12_800)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch", type=int, default=1024, help="examples a step")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    args = parser.parse_args()
    from bench.criteo_data import prepare

    work = args.workdir
    prepare(args.rows, 1, work, args.buckets)
    print(f"data: {args.rows:,} rows, batch {args.batch}, {args.steps} steps; {os.cpu_count()} cores shared")
    names = {f"{mode} {rate}": (mode, rate) for mode in args.modes for rate in args.rates}

    def job(mode, rate):
        return lambda: run(work, args.buckets, mode, rate, args.steps, args.batch)

    runs = harness.alternate({n: job(*mr) for n, mr in names.items()}, args.rounds)
    medians = harness.summarize(runs)["variants"]
    columns = {"examples_per_sec": "examples/s", "per_cpu_s": "ex/CPU-s",
               "sent_bytes_per_example": "B sent/ex", "wall_s": "wall s", "loss": "loss"}  # fmt: skip
    print(harness.table(medians, columns))
    figures: dict = {"rates": args.rates, "steps": args.steps, "batch": args.batch, "rounds": args.rounds}
    modes = figures["modes"] = {m: {} for m in args.modes}
    for name, (mode, rate) in names.items():
        m = medians[name]
        modes[mode][rate] = {k: round(v) for k, v in m.items() if k != "loss"} | {"loss": round(m["loss"], 4)}
    for mode in args.modes:
        fast, slow = (f"{mode} {r}" for r in (args.rates[0], args.rates[-1]))
        modes[mode]["slow_vs_fast"] = round(harness.ratio(runs, slow, fast, "examples_per_sec"), 2)
        print(f"{mode:10s} {args.rates[-1]} / {args.rates[0]}: {modes[mode]['slow_vs_fast']:.2f}x")
    harness.finish("ps_links", figures)


if __name__ == "__main__":
    main()
