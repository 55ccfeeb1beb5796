"""Benchmark: what the dense part of the TorchRec bench's step costs alone, in float32 and in
bfloat16 (``dnn.dtype_policy: mixed_bfloat16``).

DeepFM 26 x 16's MLP (``trainer.layers.mlp.MLP``, 256-128-64, then the logit's Dense 1) on a
batch of 1024 rows of 26 x 16 + 13 inputs: the forward pass and the gradients of the weights
and of the input (the embeddings' share), one ``tf.function`` call a batch, nothing else. The
two policies alternate ``--repeat`` times in one process; printed: wall and CPU milliseconds a
batch (every thread of the process). The figures go to ``bench/results/step_parts.json``;
``bench/vs_torchrec.py``'s CPU-ms a batch of the whole loop stand beside them in
docs/benchmarks.md.

    python bench/step_parts.py [--batches 300] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench.results import write_results  # noqa: E402

BATCH, INPUTS = 1024, 26 * 16 + 13
POLICIES = ("float32", "mixed_bfloat16")


def mlp_step(policy: str):
    """The MLP's forward and backward pass as one traced call: ``x float32 [B, INPUTS] -> loss``."""
    import tensorflow as tf
    import tf_keras as keras

    from recpipe.config.model import DNN
    from trainer.layers.mlp import MLP

    mlp = MLP(DNN(hidden_units=[256, 128, 64], dtype_policy=policy))
    logit = keras.layers.Dense(1)
    y = tf.cast(tf.random.stateless_uniform([BATCH], seed=[0, 1]) < 0.25, tf.float32)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            z = tf.squeeze(logit(mlp(x)), 1)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=z))
        grads = tape.gradient(loss, [x, *mlp.trainable_weights, *logit.trainable_weights])
        return loss, grads[0]

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import tensorflow as tf

    x = tf.random.stateless_normal([BATCH, INPUTS], seed=[1, 2])
    steps = {p: mlp_step(p) for p in POLICIES}
    for step in steps.values():
        step(x)  # traced
    runs: dict[str, list[tuple[float, float]]] = {p: [] for p in POLICIES}
    for _ in range(args.repeat):
        for policy, step in steps.items():
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(args.batches):
                loss, _ = step(x)
            float(loss)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            runs[policy].append((1e3 * wall / args.batches, 1e3 * cpu / args.batches))
            print(
                f"{policy:15s} {runs[policy][-1][0]:6.2f} ms, {runs[policy][-1][1]:6.2f} CPU-ms a batch",
                flush=True,
            )
    mlp = {
        p: {
            "wall_ms": statistics.median(w for w, _ in runs[p]),
            "cpu_ms": statistics.median(c for _, c in runs[p]),
        }
        for p in POLICIES
    }
    ratio = mlp["float32"]["cpu_ms"] / mlp["mixed_bfloat16"]["cpu_ms"]
    print(f"medians: {mlp}; float32 / bfloat16 CPU: {ratio:.2f}")
    doc = {"batch": BATCH, "inputs": INPUTS, "batches": args.batches, "repeat": args.repeat}
    doc |= {"mlp": mlp, "float32_vs_bfloat16_cpu": ratio}
    print(f"-> {write_results('step_parts', doc).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
