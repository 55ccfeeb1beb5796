"""The floors the benches hold recpipe's steps against: what the same work costs with nothing
of the product around it.

- ``bare_steps``: training (``bench/train_throughput.py``, ``bench/production_day.py``): the
  config's model, loss and first optimizer in one bare ``tf.function`` step, ids hashed inside
  the step as a hand-written loop would hash them (the trainer's ``trainer.hashing``), no
  checkpoints, summaries, hooks or input pipeline of its own;
- ``spark_csv_to_parquet``: feature preparation (``bench/feature_prep.py``,
  ``bench/production_day.py``): Spark reading the CSV with the typed schema and writing it;
- ``hset_rows``: the push to Redis (``bench/push.py``, ``bench/production_day.py``): a bare
  pipelined ``HSET`` a row, no lock, fencing or script;
- ``parquet_rows``: the export (``bench/production_day.py``): pyarrow writing a checkpoint's
  tables as Parquet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def bare_steps(config, first: tuple[dict, object]) -> tuple[Callable, Callable]:
    """``(train_step, eval_step)`` for ``config``'s model (built on ``first``, one batch of
    ``bench.criteo_data.parquet_batches``: raw features ``{name: [B]}``, labels float32
    ``[B]``); each takes ``(features, labels)`` and returns the batch's loss, a float32 scalar
    tensor. ``train_step`` applies the config's first optimizer to every trainable weight."""
    import tensorflow as tf

    from bench.criteo_data import hasher
    from trainer.losses import build_loss
    from trainer.models.builders import build_model
    from trainer.optimizers import build_optimizer

    hashed = hasher(config)
    model = build_model(config)
    model(hashed(first[0]))
    optimizer = build_optimizer(config.train_config.optimizer_config[0], "floor")
    loss_fn = build_loss(config.model)
    spec = (
        {k: tf.TensorSpec([None], v.dtype) for k, v in first[0].items()},
        tf.TensorSpec([None], tf.float32),
    )

    @tf.function(input_signature=spec)
    def train_step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(hashed(features), training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function(input_signature=spec)
    def eval_step(features, labels):
        return loss_fn(labels, model(hashed(features), training=False))

    return train_step, eval_step


def run_steps(step: Callable, batches: Iterable[tuple[dict, object]]) -> dict:
    """``step`` over every batch: ``{"examples": rows seen, "loss": the last batch's}``."""
    examples, loss = 0, None
    for features, labels in batches:
        loss = step(features, labels)
        examples += int(labels.shape[0])
    return {"examples": examples, "loss": float(loss) if loss is not None else float("nan")}


def spark_csv_to_parquet(spark, data_config, csv: str, out: str) -> None:
    """Read ``csv`` (a file or folder, ``data_config``'s separator, header and input fields'
    Spark types) and write it to ``out`` as Parquet, overwriting."""
    from pyspark.sql.types import StructField, StructType

    from features.schema import SPARK_TYPES

    fields = [StructField(f.input_name, SPARK_TYPES[f.input_type]) for f in data_config.input_fields]
    reader = spark.read.option("header", True).option("sep", data_config.separator)
    reader.schema(StructType(fields)).csv(csv).write.mode("overwrite").parquet(out)


def hset_rows(client, exports, row_key: Callable[[str, int], str], batch: int = 1000) -> int:
    """Every row of ``exports`` (export folders, base then deltas: ``recpipe.exports.files``)
    written to Redis by ``client`` as one ``HSET`` of its views' float32 bytes at
    ``row_key(table, id)``, each tombstone deleted, ``batch`` commands a pipelined round trip.
    Returns the rows written and deleted."""
    import numpy as np

    from recpipe.exports.files import read_params

    pipe, n = client.pipeline(transaction=False), 0
    for export in exports:
        for table, rows in read_params(export).tables.items():
            views = {k: np.ascontiguousarray(v, "<f4") for k, v in rows.views.items()}
            for i, key in enumerate(rows.ids.tolist()):
                pipe.hset(
                    row_key(table, key),
                    mapping={"version": "v", **{k: v[i].tobytes() for k, v in views.items()}},
                )
                n += 1
                if n % batch == 0:
                    pipe.execute()
            for key in rows.tombstones.tolist():
                pipe.delete(row_key(table, key))
                n += 1
    pipe.execute()
    return n


def redis_cpu_s(client) -> float:
    """The Redis server's CPU-seconds so far (``INFO cpu``: user + system): its share of a push,
    which the pushing process's tree does not hold."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def parquet_rows(checkpoint: str, out) -> int:
    """pyarrow writing a checkpoint's tables to ``out`` (a folder, replaced): every tensor of
    more than 1,000 rows that is not an optimizer slot, as Parquet with its row index and the
    rows as a fixed-size list column. Returns the bytes of the tensors written."""
    import shutil
    from pathlib import Path

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    reader, out = tf.train.load_checkpoint(checkpoint), Path(out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    written = 0
    for i, (name, shape) in enumerate(sorted(reader.get_variable_to_shape_map().items())):
        if "OPTIMIZER_SLOT" in name or len(shape) != 2 or shape[0] <= 1000:
            continue
        values = reader.get_tensor(name)
        column = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), pa.float32()), shape[1])
        table = pa.table({"id": np.arange(shape[0], dtype=np.int64), "row": column})
        pq.write_table(table, out / f"{i}.parquet", compression="none")
        written += values.nbytes
    return written
