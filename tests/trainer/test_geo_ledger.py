"""The GEO chief's bookkeeping of its workers' batches over random interleavings (a Hypothesis
stateful test): batches queued, trained by one worker or another, pushes staged every
``geo_step`` and sent later (its own thread in a job; here a rule that runs it between any two
others), workers lost in a step, while staging, while a push ships, while it pulls after its
commit, while merging; the chief's ``sync``. The workers are stand-ins (a step, a stage, a
ship, a pull and a merge that succeed or raise TensorFlow's ``UnavailableError``, or another
error carrying gRPC's UNAVAILABLE, as a lost worker's ops do); the chief's code is
``GeoScheduler``'s own, driven through its public interface in this thread. After every step:
no batch is trained twice, each trained batch is applied once (as the ps counts) or lost with its worker or
still pending or in flight, a failed step's error is raised by the next call, and once no
worker is left nothing waits in the queue."""

from __future__ import annotations

import contextlib
import queue
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trainer.distribute.base import StrategyError
from trainer.distribute.geo import GeoScheduler

FATES = st.sampled_from([None, None, None, "step", "stage", "merge", "error"])
COPY_FATES = st.sampled_from([None, None, "copy"])
PUSH_FATES = st.sampled_from([None, None, "ship", "pull"])
LOST_KINDS = (tf.errors.UnavailableError, tf.errors.UnknownError, tf.errors.InternalError)


class Ps:
    """What the ps holds of the pushes: the number of batches applied."""

    def __init__(self):
        self.applied = 0


class StandInWorker:
    """A GEO worker as the chief drives it; ``fate`` says where it fails next."""

    def __init__(self, index: int, trained: Counter):
        self.index, self.alive, self.pending, self.stale, self.pairs = index, True, [], {}, []
        self.sending: list[int] = []
        self.inflight = None
        self.ready: queue.Queue = queue.Queue(maxsize=1)
        self.exited = False  # its thread ended
        self.fate: str | None = None
        self.trained = trained

    def scope(self):
        return contextlib.nullcontext()

    push_scope = feed_scope = scope

    def copy(self, element):
        self._maybe_lost("copy")
        return tuple(element)

    def _maybe_lost(self, where: str) -> None:
        if self.fate == where:
            # a lost worker's op fails as UNAVAILABLE, or with it wrapped in another error
            kind = LOST_KINDS[(self.index + len(self.pending)) % len(LOST_KINDS)]
            raise kind(None, None, f'worker {self.index} lost in {where}: {{"grpc_status":14}}')

    def step(self, number):
        self._maybe_lost("step")
        if self.fate == "error":
            self.fate = None
            raise ValueError(f"a bad batch {number}")
        self.trained[number] += 1
        return 0.5

    def stage(self):
        self._maybe_lost("stage")
        return []

    def ship(self, staged):
        self._maybe_lost("ship")
        return staged

    def pull(self):
        self._maybe_lost("pull")
        return [], tf.zeros([0], tf.int32)

    def merge(self, fetched):
        self._maybe_lost("merge")

    def copy_slots(self):
        self._maybe_lost("slots")

    def sent_rows(self, staged):
        return np.zeros(0, np.int64)


class HeldPushes:
    """A dispatcher that holds staged pushes until a rule sends them (a job's push thread
    runs any time), and sends one at once when the stage waits for it."""

    def __init__(self, machine):
        self.machine = machine

    def start(self, push) -> None:
        self.machine.unsent.append(push)

    def wait(self, push) -> None:
        if push in self.machine.unsent:
            self.machine.unsent.remove(push)
            self.machine.chief.send(push)


class GeoChief(RuleBasedStateMachine):
    @initialize(workers=st.integers(1, 3), geo_step=st.integers(1, 4))
    def start(self, workers, geo_step):
        self.ps = Ps()
        self.trained: Counter = Counter()  # successful steps per batch
        self.unsent: list = []  # pushes staged, their thread not run yet
        chief = GeoScheduler(workers, geo_step, dispatcher=HeldPushes(self))

        def commit(worker, shipped, batches):
            self.ps.applied += int(batches)

        chief.start([StandInWorker(i, self.trained) for i in range(workers)], commit)
        self.chief = chief
        self.items: list = []
        self.raised: list = []

    def _alive(self):
        return [w for w in self.chief.workers if w.alive]

    def _call(self, fn, *args):
        """A call of the loop's: a step's error is raised once, at the next call."""
        try:
            return fn(*args)
        except ValueError as err:
            self.raised.append(err)
            self.chief.clear_error()  # the job would end here; the test goes on looking
            return None

    def _room(self) -> bool:
        # a place left for every batch copied to a worker too: one re-queued must not wait
        # for a thread to take from the queue, as this test has none
        held = sum(w.ready.qsize() for w in self.chief.workers)
        return self.chief.queue.qsize() + held < self.chief.queue.maxsize

    @precondition(lambda self: self._alive() and self._room())
    @rule()
    def queue_a_batch(self):
        item = self._call(self.chief.submit, (len(self.items),))
        if item is not None:
            self.items.append(item)

    @precondition(lambda self: not self._alive())
    @rule()
    def queue_a_batch_with_no_worker_left(self):
        try:
            self.chief.submit((len(self.items),))
        except ValueError:  # a step's error, not raised yet, comes first
            self.chief.clear_error()
            return
        except StrategyError as err:
            assert "every worker failed" in str(err)
            return
        raise AssertionError("a batch was queued with no worker left to train it")

    @precondition(lambda self: self._alive() and not self.chief.queue.empty())
    @rule(data=st.data(), fate=FATES)
    def a_worker_takes_the_next_batch(self, data, fate):
        worker = data.draw(st.sampled_from(self._alive()))
        worker.fate = fate
        item = self.chief.queue.get_nowait()
        worker.exited = not self.chief.complete(worker, item)
        if worker.exited:  # as _serve does: a batch copied to it goes back to the queue
            self.chief.release(worker)
        worker.fate = None if worker.alive else worker.fate

    @precondition(
        lambda self: (
            not self.chief.queue.empty() and any(not w.alive and not w.exited for w in self.chief.workers)
        )
    )
    @rule(data=st.data())
    def a_thread_whose_worker_its_push_lost_takes_a_batch(self, data):
        # its thread waited for the queue while the push's thread found the worker gone
        worker = data.draw(st.sampled_from([w for w in self.chief.workers if not w.alive and not w.exited]))
        item = self.chief.queue.get_nowait()
        assert self.chief.complete(worker, item) is False
        self.chief.release(worker)
        worker.exited = True

    @precondition(lambda self: self._alive() and self.chief.queue.unfinished_tasks == 0)
    @rule(data=st.data(), fate=st.sampled_from([None, "stage", "ship", "pull", "merge", "slots"]))
    def sync_before_a_checkpoint(self, data, fate):
        # the sync, then the first live worker's optimizer slots copied for the checkpoint
        worker = data.draw(st.sampled_from(self._alive()))
        worker.fate = fate
        try:
            self._call(self.chief.sync)
            self.chief.save_slots()
        except StrategyError as err:
            assert "every worker failed" in str(err) and not self._alive()
        worker.fate = None if worker.alive else worker.fate

    @precondition(
        lambda self: (
            not self.chief.queue.empty()
            and any(not w.exited and not w.ready.full() for w in self.chief.workers)
        )
    )
    @rule(data=st.data(), fate=COPY_FATES)
    def a_feeder_copies_the_next_batch_to_its_worker(self, data, fate):
        worker = data.draw(
            st.sampled_from([w for w in self.chief.workers if not w.exited and not w.ready.full()])
        )
        worker.fate = fate if worker.alive else None
        if not self.chief.hand_over(worker, self.chief.queue.get_nowait()):
            assert not worker.alive
        worker.fate = None if worker.alive else worker.fate

    @precondition(lambda self: any(not w.exited and not w.ready.empty() for w in self.chief.workers))
    @rule(data=st.data(), fate=FATES)
    def a_worker_trains_the_batch_copied_to_it(self, data, fate):
        worker = data.draw(
            st.sampled_from([w for w in self.chief.workers if not w.exited and not w.ready.empty()])
        )
        worker.fate = fate if worker.alive else None
        item = worker.ready.get_nowait()
        if item is None or not self.chief.complete(worker, item):  # as _serve does
            self.chief.release(worker)
            worker.exited = True
        worker.fate = None if worker.alive else worker.fate

    @precondition(lambda self: self.unsent)
    @rule(data=st.data(), fate=PUSH_FATES)
    def a_staged_push_is_sent(self, data, fate):
        push = data.draw(st.sampled_from(self.unsent))
        self.unsent.remove(push)
        worker = push.worker
        worker.fate = fate if worker.alive else "ship"  # a dead worker's copy is gone
        self.chief.send(push)
        assert push.done.is_set()
        worker.fate = None if worker.alive else worker.fate

    @invariant()
    def each_batch_trained_once_and_applied_once_or_lost(self):
        if not hasattr(self, "chief"):
            return
        chief = self.chief
        assert max(self.trained.values(), default=0) <= 1  # never trained twice
        assert not chief.applied & chief.lost
        assert self.ps.applied == len(chief.applied)  # the ps counted each push's batches
        pending = {n for w in chief.workers if w.alive for n in w.pending}
        sending = {n for w in chief.workers for n in w.sending}
        assert not sending & (chief.applied | chief.lost | pending)
        assert set(self.trained) == chief.applied | chief.lost | pending | sending
        if not self.unsent:
            assert all(not w.sending for w in chief.workers)
        assert set(chief.trained) == set(self.trained)

    @invariant()
    def every_batch_is_queued_or_done(self):
        if not hasattr(self, "chief"):
            return
        queued = set(id(i) for i in list(self.chief.queue.queue))
        queued |= {id(i) for w in self.chief.workers for i in list(w.ready.queue) if i is not None}
        for item in self.items:
            if item.done.is_set():
                assert (item.loss is None) != (item.error is None) or item.error is not None
            else:
                assert id(item) in queued
        if not self._alive():
            assert self.chief.queue.empty() and all(i.done.is_set() for i in self.items)


def test_the_geo_chiefs_ledger_over_random_interleavings():
    machine = GeoChief.TestCase
    machine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
    machine().runTest()


def _one_worker_chief():
    """A chief of one stand-in worker, pushing every 4 batches."""
    chief = GeoScheduler(1, 4)
    worker = StandInWorker(0, Counter())
    chief.start([worker], lambda worker, shipped, batches: None)
    return chief, worker


def test_a_steps_error_is_raised_by_the_next_call_though_its_loss_was_never_read():
    chief, worker = _one_worker_chief()
    first = chief.submit((0,))
    worker.fate = "error"
    chief.complete(worker, chief.queue.get_nowait())
    assert first.done.is_set() and isinstance(first.error, ValueError)
    with pytest.raises(ValueError, match="a bad batch 0"):
        chief.submit((1,))  # the loop never fetched the first loss
    with pytest.raises(ValueError, match="a bad batch 0"):
        chief.sync()


def test_the_queue_is_drained_when_the_last_worker_is_lost():
    chief, worker = _one_worker_chief()
    items = [chief.submit((n,)) for n in range(2)]  # the queue holds 2 per worker: full
    with pytest.raises(queue.Full):
        chief.queue.put_nowait(None)
    worker.fate = "step"
    chief.complete(worker, chief.queue.get_nowait())
    assert chief.queue.empty() and all(i.done.is_set() and i.error is not None for i in items)
    with pytest.raises(StrategyError, match="every worker failed"):
        chief.submit((2,))


def test_a_worker_lost_after_the_sync_before_a_checkpoint_ends_the_job_with_the_reason():
    # nothing left to push, so the sync never touches the worker; its slots' copy is the
    # first op to find it gone
    chief, worker = _one_worker_chief()
    chief.sync()
    worker.fate = "slots"
    with pytest.raises(StrategyError, match="every worker failed"):
        chief.save_slots()
    assert not worker.alive
    with pytest.raises(StrategyError, match="every worker failed"):
        chief.submit((1,))


def test_a_lost_worker_is_told_from_a_failed_op_by_its_error():
    from trainer.distribute.geo import worker_lost

    reset = '{"grpc_message":"Connection reset by peer","grpc_status":14}'
    assert worker_lost(tf.errors.UnavailableError(None, None, "lost"))
    assert worker_lost(tf.errors.UnknownError(None, None, f"Graph execution error: {reset}"))
    gone = "Unable to find the relevant tensor remote_handle"
    assert worker_lost(tf.errors.InvalidArgumentError(None, None, gone))
    assert not worker_lost(tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [128] vs [64]"))
    assert not worker_lost(ValueError('"grpc_status":14'))
