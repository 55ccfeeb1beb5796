"""A worker or ps of a parameter-server job: ``python -m trainer.distribute.server``.

Starts a ``tf.distribute.Server`` for this process's ``TF_CONFIG`` task and serves until
stopped; the chief's coordinator runs the steps on it (workers) or keeps variables on it (ps).
"""

from __future__ import annotations

import sys

import tensorflow as tf

from trainer import kernels
from trainer.distribute.base import share_cores


def main() -> int:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type not in ("worker", "ps"):
        print(f"error: TF_CONFIG task type {resolver.task_type!r}: this serves worker or ps", file=sys.stderr)
        return 2
    if resolver.task_type == "worker":
        share_cores()
    try:  # the chief's steps may place trainer.kernels' ops on this task
        kernels.ops()
    except kernels.KernelsMissingError as err:
        print(f"warning: {err}", file=sys.stderr, flush=True)
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol="grpc",
        start=True,
    )
    print(f"serving {resolver.task_type} {resolver.task_id} at {server.target}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
