"""One training step's rows of the online tables, handed from the view that admits to the
others that look the same ids up.

A feature's deep and wide embeddings are two layers over one table (``EmbeddingVariable``):
the deep view admits the batch's ids and finds their rows; the wide view, called after it in
the same step, takes those rows instead of admitting or looking the ids up again. The model
makes one ``StepRows`` a call and passes it to both layers, so the hand-over is in the call's
arguments and nothing outlives the trace.
"""

from __future__ import annotations

import tensorflow as tf


class StepRows:
    """The rows and group keys of one model call, by table and ids tensor.

    ``put`` / ``get``: a table's ``(rows int64 [U], index int64 [N])`` of an ids tensor
    ``int64 [N]`` (``EmbeddingVariable.count``); ``member_keys``: a group's keys of one set of
    features (``EVView.member_keys``), made once a call so that both views pass the same ids
    tensor. Eager calls keep nothing (each op runs at once; tensors are not reused)."""

    def __init__(self):
        self._rows: dict = {}
        self._keys: dict = {}

    def put(self, ev, keys: tf.Tensor, slots: tuple | None) -> None:
        """Record the admitting view's ``slots`` of ``keys`` in table ``ev``."""
        if slots is not None and not tf.executing_eagerly():
            self._rows[id(ev), keys.ref()] = slots

    def get(self, ev, keys: tf.Tensor) -> tuple | None:
        """The slots ``put`` for ``keys`` in ``ev`` in this call, or None."""
        if tf.executing_eagerly():
            return None
        return self._rows.get((id(ev), keys.ref()))

    def member_keys(self, ev, signature: tuple, make) -> tuple:
        """``make()`` (a group's ``(keys, members)``), once a call per table and ``signature``
        (the features' ids tensors, ``Tensor.ref()``)."""
        if tf.executing_eagerly():
            return make()
        key = (id(ev), signature)
        if key not in self._keys:
            self._keys[key] = make()
        return self._keys[key]
