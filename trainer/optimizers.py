"""``optimizer_config`` -> tf-keras optimizers with EasyRec's learning-rate schedules, and the
multi-optimizer split of the variables (EasyRec ``get_grouped_vars`` / ``MultiOptimizer``):

- one entry: every variable;
- two: the first for embedding tables, the second for dense weights (WideAndDeep: the first
  for the wide part only, the second for everything else);
- three (WideAndDeep only): wide part, dense weights, deep embeddings.
"""

from __future__ import annotations

import re

import tensorflow as tf
import tf_keras as keras

from recpipe.config.errors import ConfigError
from recpipe.config.model import ModelClass
from recpipe.config.train import LearningRate, OptimizerConfig
from trainer.sparse_optimizers import SGD, Adagrad, Adam, AdamW, LazyAdam, SparseFtrl


class OptimizerConfigError(ConfigError):
    """The optimizer_config does not fit the model (names the field)."""


class LearningRateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """EasyRec's constant / exponential-decay rates with a linear warmup.

    For step < warmup_steps: warmup_lr + (base(warmup_steps) - warmup_lr) * step / warmup_steps.
    Exponential decay: max(initial * decay_factor ** (step / decay_steps), min_learning_rate),
    the exponent floored when ``staircase``.
    """

    def __init__(self, config: LearningRate, warmup_steps: int = 0, warmup_learning_rate: float = 0.0):
        self.config = config
        self.warmup_steps = warmup_steps
        self.warmup_learning_rate = warmup_learning_rate

    def _base(self, step):
        which, c = self.config.which(), self.config.value()
        if which == "constant_learning_rate":
            return tf.constant(c.learning_rate, tf.float32)
        exponent = step / c.decay_steps
        if c.staircase:
            exponent = tf.floor(exponent)
        return tf.maximum(c.initial_learning_rate * tf.pow(c.decay_factor, exponent), c.min_learning_rate)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        lr = self._base(step)
        if self.warmup_steps:
            start = tf.constant(self.warmup_learning_rate, tf.float32)
            target = self._base(tf.constant(float(self.warmup_steps)))
            warm = start + (target - start) * step / self.warmup_steps
            lr = tf.where(step < self.warmup_steps, warm, lr)
        return lr

    def get_config(self):
        return {"config": self.config.model_dump(), "warmup_steps": self.warmup_steps}


def build_optimizer(
    config: OptimizerConfig, name: str, fused_kernels: bool = True
) -> keras.optimizers.Optimizer:
    """One tf-keras optimizer for one ``optimizer_config`` entry.

    ``lazy_adam_optimizer``, ``adagrad_optimizer`` and ``ftrl_optimizer`` update only the
    embedding rows in the batch (``trainer.sparse_optimizers``; in ``trainer.kernels``' C++
    kernels with ``fused_kernels``); ``adam_optimizer`` and ``adamw_optimizer`` update every
    row of a table on each step.
    """
    opt = _optimizer(config, name)
    opt.fused_kernels = fused_kernels
    return opt


def _optimizer(config: OptimizerConfig, name: str) -> keras.optimizers.Optimizer:
    which, c = config.which(), config.value()
    lr = LearningRateSchedule(c.learning_rate, c.warmup_steps, c.warmup_learning_rate)
    if which == "sgd_optimizer":
        return SGD(lr, name=name)
    if which == "momentum_optimizer":
        return SGD(lr, momentum=c.momentum_optimizer_value, name=name)
    if which == "momentumw_optimizer":
        return SGD(lr, momentum=c.momentum_optimizer_value, weight_decay=c.weight_decay, name=name)
    if which == "adagrad_optimizer":
        return Adagrad(lr, initial_accumulator_value=c.initial_accumulator_value, name=name)
    if which == "adam_optimizer":
        return Adam(lr, beta_1=c.beta1, beta_2=c.beta2, epsilon=c.epsilon, name=name)
    if which == "lazy_adam_optimizer":
        return LazyAdam(lr, beta_1=c.beta1, beta_2=c.beta2, epsilon=c.epsilon, name=name)
    if which == "adamw_optimizer":
        return AdamW(
            lr, weight_decay=c.weight_decay, beta_1=c.beta1, beta_2=c.beta2, epsilon=c.epsilon, name=name
        )
    return SparseFtrl(
        lr,
        learning_rate_power=c.learning_rate_power,
        initial_accumulator_value=c.initial_accumulator_value,
        l1_regularization_strength=c.l1_reg,
        l2_regularization_strength=c.l2_reg,
        name=name,
    )


def split_variables(
    groups: dict[str, list[tf.Variable]], n: int, model_class: ModelClass
) -> list[list[tf.Variable]]:
    """The variables each of ``n`` optimizers updates (see the module docstring).

    Raises:
        OptimizerConfigError: three entries for a model other than WideAndDeep, or an entry
            that would update nothing.
    """
    wide, emb, dense = groups["wide"], groups["embedding"], groups["dense"]
    if n == 1:
        split = [wide + emb + dense]
    elif n == 2:
        split = [wide, emb + dense] if model_class == ModelClass.WideAndDeep else [wide + emb, dense]
    elif model_class == ModelClass.WideAndDeep:
        split = [wide, dense, emb]
    else:
        raise OptimizerConfigError(
            "train_config.optimizer_config: three entries are only for WideAndDeep "
            "(wide, dense, deep embeddings)"
        )
    for i, part in enumerate(split):
        if not part:
            raise OptimizerConfigError(f"train_config.optimizer_config[{i}] would update no variable")
    return split


def freeze(split: list[list[tf.Variable]], pattern: str | None) -> list[list[tf.Variable]]:
    """``split`` without the variables whose name ``pattern`` matches (``re.search``;
    EasyRec's ``train_config.freeze_gradient``): they keep their values.

    Raises:
        OptimizerConfigError: ``pattern`` is not a regular expression, matches no variable
            (the message lists their names), or leaves an optimizer nothing to update.
    """
    if pattern is None:
        return split
    try:
        regex = re.compile(pattern)
    except re.error as err:
        raise OptimizerConfigError(
            f"train_config.freeze_gradient: {pattern!r} is not a regular expression: {err}"
        ) from None
    names = [v.name for part in split for v in part]
    if not any(regex.search(n) for n in names):
        raise OptimizerConfigError(
            f"train_config.freeze_gradient: {pattern!r} matches none of the model's variables: "
            + ", ".join(names)
        )
    kept = [[v for v in part if not regex.search(v.name)] for part in split]
    for i, part in enumerate(kept):
        if not part:
            raise OptimizerConfigError(
                f"train_config.freeze_gradient: {pattern!r} leaves optimizer_config[{i}] nothing to update"
            )
    return kept


def scale_gradients(grads: list, variables: list[tf.Variable], tables: set, multiplier: float | None) -> list:
    """Each table's gradient (``tables``: the tables' ``ref()``) times ``multiplier``
    (EasyRec's ``embedding_learning_rate_multiplier``; None: unchanged). A sparse gradient
    stays a ``tf.IndexedSlices``."""
    if multiplier is None or multiplier == 1:
        return grads
    out = []
    for grad, var in zip(grads, variables, strict=True):
        if var.ref() in tables and grad is not None:
            if isinstance(grad, tf.IndexedSlices):
                grad = tf.IndexedSlices(grad.values * multiplier, grad.indices, grad.dense_shape)
            else:
                grad = grad * multiplier
        out.append(grad)
    return out
