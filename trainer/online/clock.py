"""The online tables' time: training steps over the model's life and the newest day trained on."""

from __future__ import annotations

import datetime

import tensorflow as tf
import tf_keras as keras

from trainer.online.ahead import Ahead

_EPOCH = datetime.date(1970, 1, 1).toordinal()


def day_number(ds: str) -> int:
    """``YYYY-MM-DD`` (or a pass, ``YYYY-MM-DD/HH``) -> days since 1970-01-01 (what
    ``ev_days`` holds)."""
    return datetime.date.fromisoformat(ds.partition("/")[0]).toordinal() - _EPOCH


class EVClock(keras.layers.Layer):
    """The online tables' time: ``step`` (int64, training steps over the model's life: unlike
    ``global_step`` it continues across fine-tunes, so ``steps_to_live`` spans days) and
    ``day`` (int64, days since 1970-01-01 of the newest day trained on), and the lookups' mode
    when a step admits one batch ahead (``ahead``, ``trainer.online.ahead``): the versions that
    batch's rows get. The tables themselves are in ``trainer.online.registry``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # the lookups' mode while a step admitting one batch ahead is traced
        self.ahead = Ahead()

    def stamp(self) -> tf.Tensor:
        """The version (``int64`` scalar) a training step gives the rows it looks up: the
        number of that step, counted from 1 (``step`` + 1; ``step`` moves to it when the step
        ends). So after K steps ``step`` == K == the newest version, and an export that records
        ``step`` as its ``ev_step`` holds every version up to it: the rows looked up after it
        are exactly those with a version above it (``trainer.delta``). A batch admitted
        ahead of the one training (``trainer.online.ahead``) gets the version of its own step."""
        return tf.convert_to_tensor(self.step) + 1 + self.ahead.offset

    def build(self, input_shape=None):
        def counter(name):
            # named in full: the clock is built outside the model's name scope
            return self.add_weight(
                name=f"{self.name}/{name}", shape=(), dtype=tf.int64, initializer="zeros", trainable=False
            )

        self.step, self.day = counter("step"), counter("day")
        super().build(input_shape)

    def call(self, inputs):
        return inputs
