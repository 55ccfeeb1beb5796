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

Each variant runs in its own process, the variants alternate, ``--rounds`` times. Printed:
the medians over the rounds of examples/s of the training loop, examples per CPU-second of the
loop and of the whole process, held-out AUC and peak RSS of the process tree, and the median of
each round's ratio to (a) of the same round.
Goals: (c) >= 1.2x (a) by wall second and 1.5x by CPU-second of the loop at an AUC no more
than 0.002 below (a)'s; (b) >= 1.6x (a) by CPU-second of the loop; peak RSS within 1.5x of (a)'s. The figures
go to ``bench/results/vs_torchrec.json``.

TorchRec is installed for this benchmark only, in its own virtual environment
``var/bench/torchrec-venv`` (``torch==2.13.0`` CPU, ``fbgemm-gpu-cpu==1.8.0``, ``torchrec==1.8.0``
without its dependencies, which name the CUDA ``fbgemm-gpu``, and the few it imports).

    python bench/vs_torchrec.py [--rows 1000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def vocabularies(features: Path) -> tuple[dict[str, int], int]:
    """Distinct ids of each field over the training rows (not held out), and those rows."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(features, columns=[*FIELDS, "_holdout"])
    table = table.filter(pc.invert(table["_holdout"]))
    return {f: len(pc.unique(table[f].drop_null())) for f in FIELDS}, table.num_rows


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


def variant(name: str, python: Path, work: Path, vocab: dict[str, int], rows: int):
    """One run of a variant in its own process, measured whole (``bench.process_tree``): the
    loop's examples per wall second and per CPU-second, the process's per CPU-second, held-out
    AUC, peak RSS and, for recpipe, the step's phases."""
    from bench.process_tree import checked

    def once() -> dict:
        log = work / "logs" / f"{name}.log"
        if name == "a_torchrec":
            argv = [str(python), __file__, "--torchrec_child", "--workdir", str(work)]
        else:
            model_dir = work / "models" / name
            shutil.rmtree(model_dir, ignore_errors=True)
            argv = [
                sys.executable, "-m", "cli", "train", "--pipeline_config_path", str(CONFIG),
                "--edit_config_json", json.dumps(recpipe_edits(work, vocab, name)),
                "--model_dir", str(model_dir), f"--train_ds={DS}", f"--eval_ds={DS}",
            ]  # fmt: skip
        measured = checked(argv, log, name)
        r = measured.result
        auc = r["auc"] if name == "a_torchrec" else r["eval"]["auc"]
        loop_cpu_s = r.get("loop_cpu_s") or r["cpu_seconds"]
        return {
            "examples_per_sec": r["examples_per_sec"],
            "per_loop_cpu_s": rows / loop_cpu_s,
            "per_process_cpu_s": rows / measured.cpu_s,
            "auc": auc,
            "peak_rss_mb": measured.peak_rss_mb,
            "wall_s": measured.wall_s,
            "cpu_s": measured.cpu_s,
            "phases": r.get("phases"),
        }

    return once


def input_child(work: Path, edits: str) -> dict:
    """The input pipeline alone over the training rows: ``FeatureReader.flat_dataset`` (Parquet
    -> the batches the step takes), no model. Examples per second and per CPU-second."""
    from bench.train_throughput import input_only
    from recpipe.config import load_pipeline_config

    rates = input_only(load_pipeline_config(CONFIG, json.loads(edits)))
    return {"examples_per_sec": rates[0], "examples_per_cpu_s": rates[1]}


def run_input(work: Path, vocab: dict[str, int], log: Path) -> dict:
    from bench.process_tree import checked

    edits = json.dumps(recpipe_edits(work, vocab, "c_online"))
    argv = [sys.executable, __file__, "--input_child", edits, "--workdir", str(work)]
    return checked(argv, log, "the input pipeline").result


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


RATIOS = {"examples_per_sec": "wall_vs_a", "per_loop_cpu_s": "loop_cpu_vs_a",
          "per_process_cpu_s": "process_cpu_vs_a", "peak_rss_mb": "rss_vs_a"}  # fmt: skip
GOALS = {"c_wall": 1.2, "c_loop_cpu": 1.5, "auc_within": 0.002, "b_loop_cpu": 1.6, "rss": 1.5}


def figures(runs: dict[str, list[dict]], rows: int) -> dict[str, dict]:
    """Each variant's medians over the rounds, the medians of its rounds' ratios to (a), its
    AUC gap to (a) (the median of the rounds' differences) and the step's phases (last round)."""
    summary = harness.summarize(runs, reference="a_torchrec", ratios=RATIOS)
    out = {}
    for name, medians in summary["variants"].items():
        vs = summary["vs_a_torchrec"].get(name, dict.fromkeys(RATIOS, 1.0))
        out[name] = {
            "label": VARIANTS[name],
            **medians,
            **{key: vs[figure] for figure, key in RATIOS.items()},
            "auc_minus_a": harness.difference(runs, name, "a_torchrec", "auc"),
            "loop_cores": medians["examples_per_sec"] / medians["per_loop_cpu_s"],
            "step_cpu_ms": 1e3 * BATCH / medians["per_loop_cpu_s"],
            "phases": runs[name][-1]["phases"],
        }
    return out


def goals_met(table: dict[str, dict]) -> dict[str, bool]:
    """Each goal of the docstring against ``figures``' table."""
    met = {"rss": all(v["rss_vs_a"] <= GOALS["rss"] for v in table.values())}
    for v in ("c", "e"):
        row = table.get({"c": "c_online", "e": "e_online_bf16"}[v])
        if row:
            met[f"{v}_wall"] = row["wall_vs_a"] >= GOALS["c_wall"]
            met[f"{v}_loop_cpu"] = row["loop_cpu_vs_a"] >= GOALS["c_loop_cpu"]
            met[f"{v}_auc"] = row["auc_minus_a"] >= -GOALS["auc_within"]  # within 0.002 below, or above
    if "b_hashed" in table:
        met["b_loop_cpu"] = table["b_hashed"]["loop_cpu_vs_a"] >= GOALS["b_loop_cpu"]
    return met


def main() -> int:
    parser = harness.parser(__doc__, rounds=2, workdir="vs_torchrec")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=sorted(VARIANTS))
    parser.add_argument("--torchrec_child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input_child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = args.workdir
    if args.input_child:
        print(json.dumps(input_child(work, args.input_child)))
        return 0
    if args.torchrec_child:
        print(json.dumps(torchrec_child(work)))
        return 0
    from bench.criteo_data import prepare

    python = install()
    prepare(args.rows, 1, work, 100_000, holdout_percent=10)
    vocab, rows = vocabularies(work / "features" / f"ds={DS}")
    print(f"{args.rows:,} rows, 10 % held out; {sum(vocab.values()):,} ids in the training rows", flush=True)
    names = ["a_torchrec", *(v for v in args.variants if v != "a_torchrec")]
    runs = harness.alternate({v: variant(v, python, work, vocab, rows) for v in names}, args.rounds)
    table = figures(runs, rows)
    columns = {"examples_per_sec": "ex/s", "wall_vs_a": "x (a)", "per_loop_cpu_s": "ex/CPU-s loop",
               "loop_cpu_vs_a": "x (a)", "per_process_cpu_s": "ex/CPU-s proc", "auc": "AUC",
               "auc_minus_a": "- (a)", "peak_rss_mb": "RSS MiB", "rss_vs_a": "x (a)"}  # fmt: skip
    print(harness.table(table, columns))
    print(f"medians of {args.rounds} alternating rounds; x (a): the median of the rounds' ratios to (a)")
    for name, row in table.items():
        if p := row["phases"]:
            print(
                f"{name}: first step {p['first_step_s']:.2f} s ({p['first_step_cpu_s']:.2f} CPU-s), "
                f"then {p['step_ms']:.2f} ms a step ({p['step_cpu_ms']:.2f} CPU-ms), {p['step_ops']:,} ops"
            )
    pipe = run_input(work, vocab, work / "logs" / "input.log")
    pipe["cpu_ms_per_batch"] = 1e3 * BATCH / pipe["examples_per_cpu_s"]
    print(f"input pipeline alone (Parquet -> batches): {pipe['examples_per_sec']:,.0f} ex/s, "
          f"{pipe['examples_per_cpu_s']:,.0f} ex/CPU-s")  # fmt: skip
    goals = {**GOALS, "met": goals_met(table)}
    print("goals:", goals)
    doc = {"rows": args.rows, "train_rows": rows, "ids": sum(vocab.values()), "rounds": args.rounds}
    harness.finish("vs_torchrec", {**doc, "variants": table, "input_pipeline": pipe, "goals": goals})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
