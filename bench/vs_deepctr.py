"""Benchmark: DeepCTR's DeepFM + ``model.fit`` against ``trainer.train_eval``, side by side.

On the same synthetic Criteo Parquet (the Spark job's output; 1M training rows over five
days, the sixth day held out), the same DeepFM (26 id fields x 16 dims, 13 dense, FM, MLP
256-128-64, no regularization), batch 1024, one epoch, Adam at 0.001:

(a) DeepCTR 0.9.4 ``DeepFM`` + ``model.fit`` on in-memory arrays (ids hashed beforehand as
    the trainer hashes them, not timed);
(b) ``python -m trainer.train_eval`` with dense Adam;
(c) the same with ``lazy_adam_optimizer`` for the embedding tables and Adam for the rest.

Each runs in its own process, once a round, the variants alternating, ``--rounds`` rounds
(the machine is noisy); printed: training examples/s (one epoch, tracing included, reading
excluded for (a)), held-out AUC, and the median over rounds of each round's ratio to (a).
``--commit C`` adds (c) as commit C's code runs it, on the same data (what moved since C);
C's code reads today's ``conf/criteo_deepfm.yaml`` and features, which a commit whose config
schema or feature files differ refuses.
Goal: (c) >= 2.5x (a) at an AUC within 0.002.

DeepCTR is installed for this benchmark only, into ``var/bench/deepctr-0.9.4`` (it needs
``TF_USE_LEGACY_KERAS=1``, tf-keras being the project's Keras already).

Usage: ``python bench/vs_deepctr.py [--rows 1200000] [--buckets 12800] [--rounds 3] [--commit C]``
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

from bench import harness  # noqa: E402
from bench.criteo_data import ADAM, CONFIG, LAZY, bench_edits, days, prepare  # noqa: E402
from bench.process_tree import checked  # noqa: E402

DEEPCTR = "deepctr==0.9.4"
DEEPCTR_DIR = ROOT / "var/bench/deepctr-0.9.4"
N_DAYS = 6  # five training days, one held out
VARIANTS = {
    "a_deepctr": "(a) DeepCTR DeepFM + model.fit",
    "b_dense_adam": "(b) train_eval, dense Adam",
    "c_lazy_adam": "(c) train_eval, lazy Adam + Adam",
}


def _edits(work: Path, buckets: int, variant: str) -> dict:
    train, held_out = days(N_DAYS)[:-1], days(N_DAYS)[-1]
    edits = bench_edits(work, buckets)
    edits.update(
        {
            "train_ds": f"{train[0]}:{train[-1]}",
            "eval_ds": held_out,
            "data_config.num_epochs": 1,
            "data_config.holdout_percent": 0,
            "train_config.optimizer_config": [LAZY, ADAM] if variant == "c_lazy_adam" else [ADAM],
        }
    )
    return edits


def _install_deepctr() -> None:
    if not (DEEPCTR_DIR / "deepctr").is_dir():
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(DEEPCTR_DIR)]
        subprocess.run([*pip, DEEPCTR], check=True)


def _arrays(config, day_list: list[str]):
    """Every row of ``day_list`` as DeepCTR's input: name -> numpy array, and labels."""
    import numpy as np

    from recpipe.layout import finished_partitions
    from trainer.input import FeatureReader

    reader = FeatureReader(config, finished_partitions(config.train_input_path, day_list), shuffle=False)
    columns: dict[str, list] = {}
    labels = []
    for flat in reader.batches():
        features, y = reader.structure(flat)
        labels.append(np.asarray(y))
        for f in config.feature_config.features:
            # ids arrive hashed as the trainer hashes them
            columns.setdefault(f.name, []).append(np.asarray(features[f.name]))
    return {k: np.concatenate(v) for k, v in columns.items()}, np.concatenate(labels)


def run_deepctr(work: Path, buckets: int) -> dict:
    """(a), in this process: DeepCTR's DeepFM trained by ``model.fit`` for one epoch."""
    sys.path.insert(0, str(DEEPCTR_DIR))
    import tensorflow as tf
    from deepctr.feature_column import DenseFeat, SparseFeat
    from deepctr.models import DeepFM

    from recpipe.config import load_pipeline_config
    from recpipe.stats import auc

    config = load_pipeline_config(CONFIG, _edits(work, buckets, "a_deepctr"))
    train_x, train_y = _arrays(config, days(N_DAYS)[:-1])
    test_x, test_y = _arrays(config, days(N_DAYS)[-1:])
    columns = [
        SparseFeat(f.name, vocabulary_size=f.hash_bucket_size, embedding_dim=16)
        if f.hash_bucket_size
        else DenseFeat(f.name, 1)
        for f in config.feature_config.features
    ]
    no_l2 = {"l2_reg_linear": 0.0, "l2_reg_embedding": 0.0, "l2_reg_dnn": 0.0}
    model = DeepFM(columns, columns, dnn_hidden_units=(256, 128, 64), seed=0, **no_l2)
    model.compile(tf.keras.optimizers.Adam(0.001), "binary_crossentropy")
    start = time.perf_counter()
    model.fit(train_x, train_y, batch_size=1024, epochs=1, verbose=0, shuffle=True)
    seconds = time.perf_counter() - start
    scores = model.predict(test_x, batch_size=8192, verbose=0)[:, 0]
    return {"examples_per_sec": len(train_y) / seconds, "auc": auc(test_y, scores), "rows": len(train_y)}


def run_train_eval(work: Path, buckets: int, variant: str, checkout: Path = ROOT) -> dict:
    """(b) / (c): ``python -m trainer.train_eval`` of ``checkout`` in a child process; its
    summary line."""
    model_dir = work / "models" / variant
    shutil.rmtree(model_dir, ignore_errors=True)
    optimizers = "c_lazy_adam" if variant.startswith("c_lazy_adam") else variant
    edits = json.dumps(_edits(work, buckets, optimizers))
    argv = [sys.executable, "-m", "trainer.train_eval", "--pipeline_config_path", str(CONFIG)]
    argv += ["--edit_config_json", edits, "--model_dir", str(model_dir)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    summary = checked(
        argv, work / "logs" / f"{variant}.train_eval.log", variant, cwd=checkout, env=env
    ).result
    return {"examples_per_sec": summary["examples_per_sec"], "auc": summary["eval"]["auc"]}


def _worktree(commit: str) -> Path:
    """A checkout of ``commit`` under var/bench/ (git worktree), with its kernels built when
    it has any."""
    path = ROOT / "var" / "bench" / f"checkout-{commit}"
    if not path.is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), commit], check=True, cwd=ROOT)
        if (path / "scripts" / "build_kernels.sh").exists():
            env = {**os.environ, "PYTHON": sys.executable}
            subprocess.run(["scripts/build_kernels.sh"], check=True, cwd=path, env=env)
    return path


def main() -> None:
    parser = harness.parser(__doc__, rounds=3, workdir="vs_deepctr")
    parser.add_argument("--rows", type=int, default=1_200_000, help="over six days; five are trained on")
    parser.add_argument("--buckets", type=int, default=12_800)
    parser.add_argument("--commit", help="also (c) as this earlier commit's code runs it (a git worktree)")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--checkout", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = args.workdir
    if args.variant:  # a child: one measurement, one JSON line
        if args.variant == "a_deepctr":
            result = run_deepctr(work, args.buckets)
        else:
            result = run_train_eval(work, args.buckets, args.variant, args.checkout)
        print(json.dumps(result))
        return
    prepare(args.rows, N_DAYS, work, args.buckets)
    _install_deepctr()
    print(
        f"data: {args.rows * 5 // 6:,} training rows, {args.rows // 6:,} held out; "
        f"{26 * args.buckets * 16 / 1e6:.1f}M embedding parameters; batch 1024; one epoch"
    )
    labels = dict(VARIANTS)
    checkouts = {v: ROOT for v in VARIANTS}
    if args.commit:
        variant = f"c_lazy_adam_at_{args.commit}"
        labels[variant] = f"(c) at commit {args.commit}"
        checkouts[variant] = _worktree(args.commit)
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1"}

    def child(variant: str):
        def once() -> dict:
            cmd = [sys.executable, __file__, "--variant", variant, "--workdir", str(work)]
            cmd += ["--buckets", str(args.buckets), "--checkout", str(checkouts[variant])]
            return checked(cmd, work / "logs" / f"{variant}.log", variant, env=env).result

        return once

    # cpu_s: the whole child process (start-up, reading, training, evaluation), every thread
    runs = harness.alternate({v: child(v) for v in labels}, args.rounds)
    train_rows = args.rows * 5 // 6
    for rows in runs.values():
        for r in rows:
            r["per_cpu_s"] = train_rows / r["cpu_s"]
    ratios = {"examples_per_sec": "vs_a", "per_cpu_s": "per_cpu_s_vs_a"}
    kept = ("examples_per_sec", "vs_a", "auc", "cpu_s", "per_cpu_s", "per_cpu_s_vs_a")
    means = {}
    for variant, medians in harness.versus(runs, "a_deepctr", ratios).items():
        means[variant] = {
            "label": labels[variant],
            **{k: medians[k] for k in kept},
            "auc_minus_a": harness.difference(runs, variant, "a_deepctr", "auc"),
            "runs": runs[variant],
        }
    columns = {"examples_per_sec": "examples/s", "vs_a": "x (a)", "auc": "AUC", "auc_minus_a": "- (a)"}
    columns |= {"cpu_s": "CPU-s", "per_cpu_s": "ex/CPU-s", "per_cpu_s_vs_a": "x (a)"}
    print(harness.table({m["label"]: m for m in means.values()}, columns))
    print("x (a): the median over rounds of each round's ratio to (a) of the same round")
    print("CPU-s: the whole child process, every thread; ex/CPU-s: training rows over them")
    print("goal: (c) >= 2.50x (a), AUC within 0.002 of (a)")
    c = means["c_lazy_adam"]
    goals = {"c_vs_a": 2.5, "auc_within": 0.002}
    goals["met"] = c["vs_a"] >= goals["c_vs_a"] and abs(c["auc_minus_a"]) <= goals["auc_within"]
    doc = {
        "train_rows": train_rows,
        "held_out_rows": args.rows // 6,
        "rounds": args.rounds,
        "variants": means,
    }
    harness.finish("vs_deepctr", {**doc, "goals": goals})


if __name__ == "__main__":
    main()
