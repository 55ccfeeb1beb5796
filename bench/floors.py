"""The floors the benches hold recpipe's steps against: what the same work costs with nothing
of the product around it.

``bare_steps`` is the training floor of ``bench/train_throughput.py`` and
``bench/production_day.py``: the config's model, loss and first optimizer in one bare
``tf.function`` step, ids hashed inside the step as a hand-written loop would hash them (the
trainer's ``trainer.hashing``), no checkpoints, summaries, hooks or input pipeline of its own.
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
