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
    ``day`` (int64, days since 1970-01-01 of the newest day trained on). It also holds the
    model's tables by name (``table``), so that the layers looking one up share it, and the
    lookups' mode when a step admits one batch ahead (``ahead``, ``trainer.online.ahead``).

    Args:
        fused_kernels: the tables' training lookups in recpipe's kernel
            (``trainer.kernels.gather_rows``), not the stock ops."""

    def __init__(self, fused_kernels: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.fused_kernels = fused_kernels
        self._tables = _Tables()
        # the lookups' mode while a step admitting one batch ahead is traced
        self.ahead = Ahead()

    def groups(self, specs: dict) -> dict[str, tuple[str, list[str]]]:
        """The group of each online table of ``specs`` (table -> ``(ev_params, embedding_dim)``):
        ``(group name, member tables)``. Tables of one ``ev_params`` and dimension share a group
        (``ev_group_dim<dim>``); a table alone is its own group, named after it. A table keeps
        the group the first layer gave it, so the model's layers agree."""
        given = self._tables.groups
        buckets: dict = {}
        for table, (params, dim) in specs.items():
            if table not in given:
                buckets.setdefault((params.model_dump_json(), dim), []).append(table)
        taken = {name for name, _ in given.values()}
        for (_, dim), members in buckets.items():
            if len(members) == 1:
                given.update({t: (t, [t]) for t in members})
                continue
            name, k = f"ev_group_dim{dim}", 1
            while name in taken or name in specs:
                name, k = f"ev_group_dim{dim}_{k}", k + 1
            taken.add(name)
            given.update({t: (name, members) for t in members})
        return {t: given[t] for t in specs}

    def table(self, name: str, create):
        """The table ``name`` (an ``EmbeddingVariable``), made by ``create()`` the first time."""
        if name not in self._tables.by_name:
            self._tables.by_name[name] = create()
        return self._tables.by_name[name]

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


class _Tables:
    # a plain holder: Keras would track a dict attribute of the clock
    def __init__(self):
        self.by_name: dict = {}
        self.groups: dict = {}  # table -> (group name, members)
