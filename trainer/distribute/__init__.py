"""``train_config.train_distribute`` -> how this process takes part in the training job.

A ``Distribution`` wraps a ``tf.distribute.Strategy`` with what the loop needs beyond
``scope``/``run``/``reduce``: this process's input shard, whether it is the chief, the sum of a
value over all replicas, and the gradient exchange (Horovod's all-reduce). The loop never
reads TF_CONFIG or Horovod state itself; every strategy runs the same loop.
"""

from trainer.distribute.base import Distribution, StrategyError
from trainer.distribute.factory import distribution_for

__all__ = ["Distribution", "StrategyError", "distribution_for"]
