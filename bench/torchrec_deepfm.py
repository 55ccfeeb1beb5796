"""(a) of ``bench/vs_torchrec.py``: DeepFM on TorchRec 1.8 with FBGEMM's fused CPU embedding
tables, trained one epoch over the prepared rows and scored on the held-out ones.

It runs in its own virtual environment (``install``: torch CPU, fbgemm-gpu-cpu and torchrec,
numpy, pyarrow and scipy), as ``python bench/torchrec_deepfm.py WORKDIR``, and prints one JSON
line: the loop's examples per second, its CPU-seconds, the held-out AUC and the rows trained.
Nothing of recpipe runs here but ``recpipe.stats.auc`` (numpy and scipy).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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


def train_and_score(work: Path) -> dict:
    """(a)'s run over ``work``'s features: ``{examples_per_sec, loop_cpu_s, auc, rows}``."""
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


if __name__ == "__main__":
    print(json.dumps(train_and_score(Path(sys.argv[1]))))
