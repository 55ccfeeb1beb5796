"""``train_config.train_distribute`` -> the ``tf.distribute.Strategy`` the loop runs under.

The seam where distributed strategies plug in: the loop only calls ``strategy.scope()``,
``strategy.run`` and ``strategy.reduce``. Single-process training (``NoStrategy``) uses
TensorFlow's default strategy.
"""

from __future__ import annotations

import tensorflow as tf

from recpipe.config.train import TrainConfig, TrainDistribute


class StrategyError(ValueError):
    """The configured train_distribute cannot run here (the message says why)."""


def strategy_for(train_config: TrainConfig) -> tf.distribute.Strategy:
    """The strategy for a single training process.

    Raises:
        StrategyError: ``SokStrategy`` (needs a GPU and NVIDIA SOK), or a multi-process
            strategy, which needs its launcher rather than this one process.
    """
    kind = train_config.train_distribute
    if kind == TrainDistribute.NoStrategy and not train_config.sync_replicas:
        return tf.distribute.get_strategy()
    if kind == TrainDistribute.SokStrategy:
        raise StrategyError("train_config.train_distribute: SokStrategy needs a GPU and NVIDIA SOK")
    raise StrategyError(
        f"train_config.train_distribute: {kind.value}"
        f"{' with sync_replicas' if train_config.sync_replicas else ''} runs as a multi-process job "
        "through a launcher; this entry point trains in one process (train_distribute: NoStrategy)"
    )
