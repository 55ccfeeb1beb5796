"""Benchmark: what the dense part of the TorchRec bench's step costs alone, in float32 and in
bfloat16 (``dnn.dtype_policy: mixed_bfloat16``).

DeepFM 26 x 16's MLP (``trainer.layers.mlp.MLP``, 256-128-64, then the logit's Dense 1) on a
batch of 1024 rows of 26 x 16 + 13 inputs: the forward pass and the gradients of the weights
and of the input (the embeddings' share), one ``tf.function`` call a batch, nothing else. The
two policies alternate ``--rounds`` times in one process; printed: wall and CPU milliseconds a
batch (every thread of the process). The figures go to ``bench/results/step_parts.json``;
``bench/vs_torchrec.py``'s CPU-ms a batch of the whole loop stand beside them in
docs/benchmarks.md.

    python bench/step_parts.py [--batches 300] [--rounds 3]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench import harness  # noqa: E402

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
    parser = harness.parser(__doc__, rounds=3)
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()
    import tensorflow as tf

    x = tf.random.stateless_normal([BATCH, INPUTS], seed=[1, 2])

    def batches(step):
        def run() -> None:
            for _ in range(args.batches):
                loss, _ = step(x)
            float(loss)

        return run

    # traced by the warm-up call
    runs = harness.alternate({p: batches(mlp_step(p)) for p in POLICIES}, args.rounds, warm_up=True)
    per_batch = {
        p: {"wall_ms": 1e3 * m["wall_s"] / args.batches, "cpu_ms": 1e3 * m["cpu_s"] / args.batches}
        for p, m in harness.summarize(runs)["variants"].items()
    }
    ratio = per_batch["float32"]["cpu_ms"] / per_batch["mixed_bfloat16"]["cpu_ms"]
    print(harness.table(per_batch, {"wall_ms": "ms a batch", "cpu_ms": "CPU-ms"}))
    print(f"float32 / bfloat16 CPU: {ratio:.2f}")
    doc = {"batch": BATCH, "inputs": INPUTS, "batches": args.batches, "rounds": args.rounds}
    harness.finish("step_parts", doc | {"mlp": per_batch, "float32_vs_bfloat16_cpu": ratio})


if __name__ == "__main__":
    main()
