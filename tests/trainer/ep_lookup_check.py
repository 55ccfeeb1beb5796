"""Run under ``horovodrun -np W``: sharded lookups and gradients vs one unsharded table.

Each rank writes ``<out>/rank<r>.json`` with the largest differences it found.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from trainer.distribute.embedding_parallel import horovod_alltoall, shard_rows, sharded_lookup


def main(out: Path) -> None:
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    rows, dim = 23, 4
    full = np.random.default_rng(0).normal(size=(rows, dim)).astype(np.float32)
    shard = tf.Variable(full[rank::world])
    assert shard.shape[0] == shard_rows(rows, rank, world)
    rng = np.random.default_rng(100 + rank)
    alltoall = horovod_alltoall()

    @tf.function(reduce_retracing=True)
    def step(ids, weights):
        with tf.GradientTape() as tape:
            emb = sharded_lookup(shard, ids, world, alltoall)
            loss = tf.reduce_sum(emb * weights)
        return emb, tape.gradient(loss, shard)

    report = {"rank": rank, "world": world}
    # a batch with duplicate ids, then one where the last rank has no ids at all (a padded step)
    for case, shape in (("batch", (7, 3)), ("empty_on_last_rank", (0,) if rank == world - 1 else (5,))):
        ids = rng.integers(0, rows, size=shape).astype(np.int64)
        weights = rng.normal(size=(*shape, dim)).astype(np.float32)
        emb, grad = step(tf.constant(ids), tf.constant(weights))
        local = np.zeros_like(full)
        np.add.at(local, ids.reshape(-1), weights.reshape(-1, dim))
        expected_grad = hvd.allreduce(tf.constant(local), op=hvd.Sum).numpy()[rank::world]
        report[case] = {
            "sparse_gradient": isinstance(grad, tf.IndexedSlices),
            "lookup_error": float(np.abs(emb.numpy() - full[ids]).max(initial=0.0)),
            "gradient_error": float(np.abs(tf.convert_to_tensor(grad).numpy() - expected_grad).max()),
            "gradient_norm": float(np.abs(expected_grad).sum()),
        }
    (out / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
