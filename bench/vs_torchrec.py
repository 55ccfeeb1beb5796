"""Benchmark: ``recpipe train`` against TorchRec (FBGEMM's fused CPU embedding tables).

The same rows, the same model, one epoch: synthetic Criteo rows prepared by the project's
Spark job (``bench/criteo_data.py``: 26 id fields with vocabularies of 10 to 200,000, 13
counts), one day, 10 % held out; DeepFM 26 x 16 with a wide part, FM and an MLP 256-128-64,
batch 1024.

(a) TorchRec 1.8: ``EmbeddingBagCollection`` sharded by ``DistributedModelParallel`` on one
    CPU process, table-wise with FBGEMM's fused table-batched kernel, row-wise Adagrad applied
    inside the backward pass, Adam for the dense layers (the wide part's tables are 4 wide and
    summed: the kernel takes widths divisible by 4); ids as indices of each field's vocabulary
    (collision-free), tensors built in memory before the clock starts;
(b) ``recpipe train``, hashed tables of ``hash_bucket_size`` = each field's vocabulary
    (collisions), lazy Adam for the tables and Adam for the rest;
(c) ``recpipe train``, online tables (``filter_freq: 0``: collision-free), lazy Adam + Adam;
(d) (c) with Adagrad for the tables, the closest to (a)'s optimizer;
(e) (c) with the MLP's products in bfloat16 (``dnn.dtype_policy: mixed_bfloat16``; (a) and (c)
    compute in float32): what this CPU's bfloat16 instructions give;
(f) (c) admitting each batch one step ahead (``train_config.admit_ahead``);
(g) (c) on TensorFlow's stock ops alone (``train_config.fused_kernels: false``): what
    recpipe's kernels (``trainer/kernels``) give.

Each variant runs in its own process, the variants alternate, ``--repeat`` times. Printed:
examples/s of the training loop, examples per CPU-second of the loop and of the whole
process, held-out AUC, peak RSS of the process tree, and each ratio to (a) of the same round.
Goals: (c) >= 1.2x (a) by wall second and 1.5x by CPU-second of the loop at an AUC no more
than 0.002 below (a)'s; (b) >= 1.6x (a) by CPU-second of the loop; peak RSS within 1.5x of (a)'s. The figures
go to ``bench/results/vs_torchrec.json``.

TorchRec is installed for this benchmark only, in its own virtual environment
``var/bench/torchrec-venv`` (``torch==2.13.0`` CPU, ``fbgemm-gpu-cpu==1.8.0``, ``torchrec==1.8.0``
without its dependencies, which name the CUDA ``fbgemm-gpu``, and the few it imports).

    python bench/vs_torchrec.py [--rows 1000000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# stdlib only at import: the TorchRec child imports this module too
from bench import harness  # noqa: E402
from bench.criteo_data import ADAM, CONFIG, LAZY  # noqa: E402

VENV = ROOT / "var/bench/torchrec-venv"
BATCH = 1024  # every variant's batch
TORCH = ["torch==2.13.0", "fbgemm-gpu-cpu==1.8.0", "numpy", "pyarrow", "scipy"]
# torchrec's metadata asks for the CUDA fbgemm-gpu: it goes in without dependencies, with
# the ones it imports on the CPU
NO_DEPS = [
    "torchrec==1.8.0",
    "tensordict==0.15.3",
    "pyvers==0.2.3",
    "pyre-extensions==0.0.32",
    "typing-inspect==0.9.0",
    "mypy-extensions==1.1.0",
    "cloudpickle==3.1.3",  # tensordict imports it
]
DS = "2024-01-01"
FIELDS = [f"C{i}" for i in range(1, 27)]
DENSE = [f"I{i}" for i in range(1, 14)]
ADAGRAD = {"adagrad_optimizer": {"learning_rate": {"constant_learning_rate": {"learning_rate": 0.05}}}}
VARIANTS = {
    "a_torchrec": "(a) TorchRec, fused tables, row-wise Adagrad",
    "b_hashed": "(b) recpipe, hashed = vocabulary",
    "c_online": "(c) recpipe, online tables",
    "d_online_adagrad": "(d) recpipe, online tables, Adagrad",
    "e_online_bf16": "(e) recpipe, online tables, bfloat16 MLP",
    "f_online_ahead": "(f) recpipe, online tables, admitted ahead",
    "g_online_stock": "(g) recpipe, online tables, stock ops",
}


def install() -> Path:
    """The bench's own environment with TorchRec; returns its Python."""
    python = VENV / "bin/python"
    if (VENV / "ok").exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, *TORCH], check=True)
    subprocess.run([*pip, "--no-deps", *NO_DEPS], check=True)
    subprocess.run([str(python), "-c", "import torchrec.distributed"], check=True)
    (VENV / "ok").write_text("\n".join(TORCH + NO_DEPS))
    return python


def vocabularies(features: Path) -> dict[str, int]:
    """Distinct ids of each field over the training rows (not held out)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(features, columns=[*FIELDS, "_holdout"])
    table = table.filter(pc.invert(table["_holdout"]))
    return {f: len(pc.unique(table[f].drop_null())) for f in FIELDS}


def recpipe_edits(work: Path, vocab: dict[str, int], variant: str) -> dict:
    from bench.criteo_data import bench_edits

    edits = bench_edits(work, 100_000)
    edits.update(
        {
            "data_config.holdout_percent": 10,
            "data_config.num_epochs": 1,
            "train_config.optimizer_config": [ADAGRAD if variant == "d_online_adagrad" else LAZY, ADAM],
        }
    )
    for f, n in vocab.items():
        edits[f"feature_config.features[input_names={f}].hash_bucket_size"] = n
    if variant != "b_hashed":
        edits["model_config.ev_params"] = {"filter_freq": 0, "max_capacity": 1 << 18}
    if variant == "e_online_bf16":
        edits["model_config.deepfm.dnn.dtype_policy"] = "mixed_bfloat16"
    if variant == "f_online_ahead":
        edits["train_config.admit_ahead"] = True
    if variant == "g_online_stock":
        edits["train_config.fused_kernels"] = False
    return edits


def run_recpipe(work: Path, vocab: dict[str, int], variant: str, log: Path):
    from bench.process_tree import run

    model_dir = work / "models" / variant
    subprocess.run(["rm", "-rf", str(model_dir)], check=True)
    argv = [
        sys.executable, "-m", "cli", "train", "--pipeline_config_path", str(CONFIG),
        "--edit_config_json", json.dumps(recpipe_edits(work, vocab, variant)),
        "--model_dir", str(model_dir), f"--train_ds={DS}", f"--eval_ds={DS}",
    ]  # fmt: skip
    measured = run(argv, log)
    if measured.returncode:
        raise SystemExit(f"{variant} failed, see {log}:\n{log.read_text()[-3000:]}")
    r = measured.result
    loop = {
        "examples_per_sec": r["examples_per_sec"],
        "loop_cpu_s": r["cpu_seconds"],
        "auc": r["eval"]["auc"],
        "phases": r.get("phases", {}),
    }
    return measured, loop


def input_child(work: Path, edits: str) -> dict:
    """The input pipeline alone over the training rows: ``FeatureReader.flat_dataset`` (Parquet
    -> the batches the step takes), no model. Examples per second and per CPU-second."""
    from bench.train_throughput import input_only
    from recpipe.config import load_pipeline_config

    rates = input_only(load_pipeline_config(CONFIG, json.loads(edits)))
    return {"examples_per_sec": rates[0], "examples_per_cpu_s": rates[1]}


def run_input(work: Path, vocab: dict[str, int], log: Path) -> dict:
    from bench.process_tree import run

    edits = json.dumps(recpipe_edits(work, vocab, "c_online"))
    measured = run([sys.executable, __file__, "--input_child", edits, "--workdir", str(work)], log)
    if measured.returncode:
        raise SystemExit(f"the input pipeline failed, see {log}:\n{log.read_text()[-3000:]}")
    return measured.result


def run_torchrec(python: Path, work: Path, log: Path):
    from bench.process_tree import run

    measured = run([str(python), __file__, "--torchrec_child", "--workdir", str(work)], log)
    if measured.returncode:
        raise SystemExit(f"TorchRec failed, see {log}:\n{log.read_text()[-3000:]}")
    return measured, measured.result


# --- (a), in the TorchRec environment (numpy, pyarrow and torch only) -------------------


def torchrec_child(work: Path) -> dict:
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import torch
    import torch.distributed as dist
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.distributed.types import ShardingType
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from recpipe.stats import auc  # numpy and scipy, both in the bench environment

    columns = ["label", "_holdout", *DENSE, *FIELDS]
    table = pq.read_table(work / "features" / f"ds={DS}", columns=columns)
    held = table["_holdout"]
    train, test = table.filter(pc.invert(held)), table.filter(held)
    # each field's ids -> 1..n by its training vocabulary, 0 for missing and unseen ids
    ids_train, ids_test, sizes = [], [], []
    for f in FIELDS:
        vocab = pc.unique(train[f].drop_null())
        sizes.append(len(vocab) + 1)
        for part, out in ((train, ids_train), (test, ids_test)):
            index = pc.index_in(part[f], value_set=vocab).fill_null(-1).to_numpy()
            out.append(index.astype(np.int64) + 1)

    def dense(part):
        cols = [np.log1p(np.maximum(part[c].fill_null(0).to_numpy().astype(np.float32), 0)) for c in DENSE]
        return torch.from_numpy(np.stack(cols, 1))

    batch = BATCH
    torch.manual_seed(0)

    def batches(part, ids):
        x, y, n = dense(part), torch.from_numpy(part["label"].to_numpy().astype(np.float32)), part.num_rows
        out = []
        for s in range(0, n, batch):
            e = min(n, s + batch)
            values = torch.from_numpy(np.concatenate([i[s:e] for i in ids]))
            kjt = KeyedJaggedTensor.from_lengths_sync(
                keys=FIELDS, values=values, lengths=torch.ones(len(FIELDS) * (e - s), dtype=torch.int32)
            )
            out.append((x[s:e], kjt, y[s:e]))
        return out

    class DeepFM(nn.Module):
        def __init__(self):
            super().__init__()

            def tables(prefix, dim):
                return [
                    EmbeddingBagConfig(
                        name=f"{prefix}{f}", embedding_dim=dim, num_embeddings=n, feature_names=[f]
                    )
                    for f, n in zip(FIELDS, sizes, strict=True)
                ]

            self.deep = EmbeddingBagCollection(tables=tables("deep_", 16), device=torch.device("meta"))
            # FBGEMM's kernels take widths divisible by 4: the wide part's weight of an id is the
            # sum of a 4-wide row (the same function, 4 numbers where one would do)
            self.wide = EmbeddingBagCollection(tables=tables("wide_", 4), device=torch.device("meta"))
            self.mlp = nn.Sequential(
                nn.Linear(len(DENSE) + 16 * len(FIELDS), 256), nn.ReLU(),
                nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1),
            )  # fmt: skip

        def forward(self, x, kjt):
            emb = self.deep(kjt).values().view(-1, len(FIELDS), 16)
            wide = self.wide(kjt).values().sum(1)
            fm = 0.5 * (emb.sum(1).pow(2) - emb.pow(2).sum(1)).sum(1)
            return wide + fm + self.mlp(torch.cat([x, emb.flatten(1)], 1)).squeeze(1)

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
    model = DeepFM()
    apply_optimizer_in_backward(
        RowWiseAdagrad, [*model.deep.parameters(), *model.wide.parameters()], {"lr": 0.05, "eps": 1e-8}
    )
    # one process: the planner would keep the tables data-parallel with a plain kernel; ask
    # for what TorchRec is chosen for, FBGEMM's fused table-batched kernel (table-wise)
    fused = ParameterConstraints(
        sharding_types=[ShardingType.TABLE_WISE.value], compute_kernels=[EmbeddingComputeKernel.FUSED.value]
    )
    names = [f"{p}{f}" for p in ("deep_", "wide_") for f in FIELDS]
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, compute_device="cpu"), constraints={n: fused for n in names}
    )
    plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
    model = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan)
    print(model.plan, file=sys.stderr)  # the log shows the compute kernel (fused) of each table
    dense_params = dict(in_backward_optimizer_filter(model.named_parameters()))
    optimizer = torch.optim.Adam(dense_params.values(), lr=0.001)
    train_batches, test_batches = batches(train, ids_train), batches(test, ids_test)
    loss_fn = nn.BCEWithLogitsLoss()
    model.train()
    wall, cpu = time.perf_counter(), time.process_time()
    for x, kjt, y in train_batches:
        optimizer.zero_grad()
        loss = loss_fn(model(x, kjt), y)
        loss.backward()
        optimizer.step()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    model.eval()
    with torch.no_grad():
        scores = torch.cat([torch.sigmoid(model(x, kjt)) for x, kjt, _ in test_batches]).numpy()
    labels = test["label"].to_numpy()
    return {
        "examples_per_sec": train.num_rows / wall,
        "loop_cpu_s": cpu,
        "auc": auc(labels, scores),
        "rows": train.num_rows,
    }


def main() -> int:
    parser = harness.parser(__doc__, rounds=None)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=sorted(VARIANTS))
    parser.add_argument("--workdir", default=str(ROOT / "var/bench/vs_torchrec"))
    parser.add_argument("--torchrec_child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input_child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = Path(args.workdir)
    if args.input_child:
        print(json.dumps(input_child(work, args.input_child)))
        return 0
    if args.torchrec_child:
        print(json.dumps(torchrec_child(work)))
        return 0
    from bench.criteo_data import prepare
    from bench.results import write_results

    python = install()
    prepare(args.rows, 1, work, 100_000, holdout_percent=10)
    vocab = vocabularies(work / "features" / f"ds={DS}")
    train_rows = None
    print(f"{args.rows:,} rows, 10 % held out; {sum(vocab.values()):,} ids in the training rows", flush=True)
    rounds: list[dict] = []
    for attempt in range(args.repeat):
        figures = {}
        for variant in args.variants:
            log = work / "logs" / f"{variant}-{attempt}.log"
            if variant == "a_torchrec":
                measured, loop = run_torchrec(python, work, log)
                train_rows = loop["rows"]
            else:
                measured, loop = run_recpipe(work, vocab, variant, log)
            figures[variant] = (measured, loop)
            print(
                f"round {attempt + 1} {VARIANTS[variant]:46s} {loop['examples_per_sec']:8,.0f} ex/s, "
                f"loop {loop['loop_cpu_s']:6.1f} CPU-s, process {measured.cpu_s:6.1f} CPU-s, "
                f"AUC {loop['auc']:.4f}, peak RSS {measured.peak_rss_mb:,.0f} MiB",
                flush=True,
            )
        rounds.append(figures)
    rows = train_rows or int(args.rows * 0.9)
    print(
        f"\n{'':48s} {'ex/s':>8s} {'x (a)':>6s} {'ex/CPU-s loop':>13s} {'x (a)':>6s} {'ex/CPU-s proc':>13s}"
        f" {'x (a)':>6s} {'AUC':>7s} {'- (a)':>7s} {'RSS MiB':>8s} {'x (a)':>6s}"
    )
    table = {}
    for variant in args.variants:

        def mean(fn, v=variant):
            return sum(fn(r[v]) for r in rounds) / len(rounds)

        def ratio(fn, v=variant):
            if "a_torchrec" not in args.variants:
                return float("nan")
            return sum(fn(r[v]) / fn(r["a_torchrec"]) for r in rounds) / len(rounds)

        wall = lambda f: f[1]["examples_per_sec"]  # noqa: E731
        loop_cpu = lambda f: rows / f[1]["loop_cpu_s"]  # noqa: E731
        proc_cpu = lambda f: rows / f[0].cpu_s  # noqa: E731
        auc = lambda f: f[1]["auc"]  # noqa: E731
        rss = lambda f: f[0].peak_rss_mb  # noqa: E731
        gap = mean(auc) - (mean(auc, "a_torchrec") if "a_torchrec" in args.variants else float("nan"))
        print(
            f"{VARIANTS[variant]:48s} {mean(wall):8,.0f} {ratio(wall):6.2f} {mean(loop_cpu):13,.0f} "
            f"{ratio(loop_cpu):6.2f} {mean(proc_cpu):13,.0f} {ratio(proc_cpu):6.2f} {mean(auc):7.4f} "
            f"{gap:+7.4f} {mean(rss):8,.0f} {ratio(rss):6.2f}"
        )
        table[variant] = {
            "label": VARIANTS[variant],
            "examples_per_sec": mean(wall),
            "wall_vs_a": ratio(wall),
            "per_loop_cpu_s": mean(loop_cpu),
            "loop_cpu_vs_a": ratio(loop_cpu),
            "per_process_cpu_s": mean(proc_cpu),
            "process_cpu_vs_a": ratio(proc_cpu),
            "auc": mean(auc),
            "auc_minus_a": gap,
            "loop_cores": mean(wall) / mean(loop_cpu),  # CPU-s per wall second of the loop
            "step_cpu_ms": 1e3 * BATCH / mean(loop_cpu),  # a batch's CPU-ms, the loop's mean
            "peak_rss_mb": mean(rss),
            "rss_vs_a": ratio(rss),
            "phases": rounds[-1][variant][1].get("phases") if variant != "a_torchrec" else None,
        }
    print("ratios are each round's variant over (a) of the same round, averaged over the rounds")
    print("\nrecpipe's step by phase (last round): first step (tracing + first run), later steps, graph ops")
    for variant in args.variants:
        p = rounds[-1][variant][1].get("phases") if variant != "a_torchrec" else None
        if p:
            print(
                f"{VARIANTS[variant]:48s} first {p['first_step_s']:6.2f} s "
                f"({p['first_step_cpu_s']:.2f} CPU-s), "
                f"then {p['step_ms']:6.2f} ms a step ({p['step_cpu_ms']:.2f} CPU-ms), {p['step_ops']:,} ops"
            )
    pipe = run_input(work, vocab, work / "logs" / "input.log")
    print(
        f"input pipeline alone (Parquet -> batches, no model): {pipe['examples_per_sec']:,.0f} ex/s, "
        f"{pipe['examples_per_cpu_s']:,.0f} ex/CPU-s"
    )
    goals = {"c_wall": 1.2, "c_loop_cpu": 1.5, "auc_within": 0.002, "b_loop_cpu": 1.6, "rss": 1.5}
    print(
        f"goals: (c) >= {goals['c_wall']}x (a) by wall and {goals['c_loop_cpu']}x by loop CPU-s at an AUC "
        f"within {goals['auc_within']}; (b) >= {goals['b_loop_cpu']}x (a) by loop CPU-s; peak RSS <= "
        f"{goals['rss']}x (a)"
    )
    if {"a_torchrec", "b_hashed", "c_online"} <= set(table):
        b, c = table["b_hashed"], table["c_online"]
        goals["met"] = {
            "c_wall": c["wall_vs_a"] >= goals["c_wall"],
            "c_loop_cpu": c["loop_cpu_vs_a"] >= goals["c_loop_cpu"],
            "c_auc": c["auc_minus_a"] >= -goals["auc_within"],  # within 0.002 below, or above
            "b_loop_cpu": b["loop_cpu_vs_a"] >= goals["b_loop_cpu"],
            "rss": all(v["rss_vs_a"] <= goals["rss"] for v in table.values()),
        }
        if "e_online_bf16" in table:  # (c)'s goals, met with bfloat16 products?
            e = table["e_online_bf16"]
            goals["met"] |= {
                "e_wall": e["wall_vs_a"] >= goals["c_wall"],
                "e_loop_cpu": e["loop_cpu_vs_a"] >= goals["c_loop_cpu"],
                "e_auc": e["auc_minus_a"] >= -goals["auc_within"],
            }
        print("met:", goals["met"])
        doc = {"rows": args.rows, "train_rows": rows, "ids": sum(vocab.values()), "rounds": len(rounds)}
        pipe["cpu_ms_per_batch"] = 1e3 * BATCH / pipe["examples_per_cpu_s"]
        doc.update(variants=table, input_pipeline=pipe, goals=goals)
        print(f"-> {write_results('vs_torchrec', doc).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
