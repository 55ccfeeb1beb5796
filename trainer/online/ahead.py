"""Admission one batch ahead: batch N+1's ids are counted and admitted while batch N trains.

A step of a model with online tables is a chain: admission (unique, the id -> row map, the
free rows, the state scatters), then the lookup, then the MLP forward and backward. The
admission of the next batch needs nothing of the current one's gradients, so one traced
function runs both: batch N's forward, backward and update over the rows its admission gave
it in the previous call, and batch N+1's admission (``train_config.admit_ahead``). TensorFlow
orders the ops of one variable in program order, so the only ops of N+1's admission that wait
for N's update are its writes to the rows' weights and optimizer slots (new rows' initial
values, evicted rows cleared); the rest runs on the cores the MLP leaves idle. The idea is
TorchRec's ``TrainPipelineSparseDist`` (the next batch's sparse part overlapped with the
current batch's dense part).

What a step computes is unchanged: batch N+1 is admitted with the version it would have had
(``EVClock.stamp`` one step further), and batch N trains over the rows its admission gave it,
whatever N+1's admission does to the id -> row map: a row N+1 evicts (least recently used, or
by steps) and gives to a new id is cleared and initialised after N's update of it, as when N+1
is admitted in its own step (``EmbeddingVariable.admit`` writes the weights last). Checkpoints
hold no batch admitted ahead: the loop trains the pending batch alone (``AheadSteps.drain``)
before a save and at the end, so a job resumed from a checkpoint admits every batch once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import tensorflow as tf


class Ahead:
    """The mode of the online tables' training lookups while a step is traced, held by the
    model's ``EVClock`` (``clock.ahead``).

    Attributes:
        recording: lookups of this trace admit (with the training semantics, whatever the
            model's ``training``) and record the rows they found instead of reading them: an
            admission pass.
        offset: steps between the batch being recorded and the next one to train (0 or 1).
        recorded: ``(rows int64 [U], index int64 [N])`` of each admitting lookup, in order.
        given: the recorded pairs a replaying trace's admitting lookups take, in order.
    """

    def __init__(self):
        self.recording, self.offset = False, 0
        self.recorded: list[tuple[tf.Tensor, tf.Tensor]] = []
        self.given: list[tuple[tf.Tensor, tf.Tensor]] | None = None

    @contextlib.contextmanager
    def record(self, offset: int) -> Iterator[list]:
        """Trace an admission pass; yields the list the lookups record into."""
        self.recording, self.offset, self.recorded = True, offset, []
        try:
            yield self.recorded
        finally:
            self.recording, self.offset = False, 0

    @contextlib.contextmanager
    def replay(self, given: list[tuple[tf.Tensor, tf.Tensor]]) -> Iterator[None]:
        """Trace a training pass whose admitting lookups take ``given`` in order.

        Raises:
            RuntimeError: the pass took fewer or more than it was given (the model looked its
                tables up differently from the admission pass)."""
        self.given = list(given)
        try:
            yield
            if self.given:
                raise RuntimeError(f"{len(self.given)} online-table lookups admitted ahead were never read")
        finally:
            self.given = None

    def take(self) -> tuple[tf.Tensor, tf.Tensor]:
        """The next admitting lookup's recorded ``(rows, index)``."""
        if not self.given:
            raise RuntimeError("an online-table lookup in training that the admission pass did not record")
        return self.given.pop(0)

    @property
    def replaying(self) -> bool:
        return self.given is not None


def _flat(pairs: list[tuple[tf.Tensor, tf.Tensor]]) -> list[tf.Tensor]:
    return [t for pair in pairs for t in pair]


def _pairs(flat) -> list[tuple[tf.Tensor, tf.Tensor]]:
    flat = list(flat)
    return list(zip(flat[::2], flat[1::2], strict=True))


class AheadSteps:
    """The three traced functions of a loop that admits one batch ahead, and the batch pending.

    Args:
        ahead: the model's ``Ahead``.
        signature: one batch's flat input signature.
        train: ``flat -> loss`` of one batch (forward, backward, update), traced inside.
        admit: ``flat -> None``, the model called on one batch's features (the admission pass).
        counters: variables incremented once per trained batch.

    ``step(element)`` trains the pending batch and admits ``element``; ``drain()`` trains the
    pending batch alone; ``admit(element)`` makes ``element`` the pending batch. Each of
    ``step`` and ``drain`` returns ``(the batch trained, its loss)``.
    """

    def __init__(self, ahead: Ahead, signature: tuple, train: Callable, admit: Callable, counters: tuple):
        self.signature, self.pending = tuple(signature), None
        k = len(self.signature)

        def admit_fn(*flat):
            with ahead.record(0) as recorded:
                admit(flat)
            return _flat(recorded)

        # autograph off, as the plain step: Python control flow on Python values only
        self._admit = tf.function(admit_fn, input_signature=self.signature, autograph=False)
        n = len(self._admit.get_concrete_function().structured_outputs)
        slots = tuple(tf.TensorSpec([None], tf.int64) for _ in range(n))

        def trained(flat, given):
            with ahead.replay(_pairs(given)):
                return train(flat)

        def count():
            for counter in counters:
                counter.assign_add(1)

        def step_fn(*inputs):
            loss = trained(inputs[:k], inputs[k : k + n])
            with ahead.record(1) as recorded:  # before the counters: it reads the clock's step
                admit(inputs[k + n :])
            count()
            return loss, _flat(recorded)

        def last_fn(*inputs):
            loss = trained(inputs[:k], inputs[k:])
            count()
            return loss

        self._step = tf.function(
            step_fn, input_signature=self.signature + slots + self.signature, autograph=False
        )
        self._last = tf.function(last_fn, input_signature=self.signature + slots, autograph=False)

    @property
    def traced(self):
        """The function most steps run (for its graph's size)."""
        return self._step

    def admit(self, element: tuple) -> None:
        """Admit ``element`` (nothing pending)."""
        assert self.pending is None
        self.pending = (element, self._admit(*element))

    def step(self, element: tuple) -> tuple[tuple, tf.Tensor]:
        """Train the pending batch, admit ``element``."""
        trained, slots = self.pending
        loss, ahead = self._step(*trained, *slots, *element)
        self.pending = (element, ahead)
        return trained, loss

    def drain(self) -> tuple[tuple, tf.Tensor]:
        """Train the pending batch alone."""
        trained, slots = self.pending
        self.pending = None
        return trained, self._last(*trained, *slots)
