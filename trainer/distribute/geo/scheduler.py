"""The GEO chief's scheduler: which worker trains each batch, when a worker's change is pushed,
what happens when a worker is lost, and the ledger that says of every batch whether it was
applied once or lost. It drives replicas (``trainer.distribute.geo.replica.GeoReplica``, or a
stand-in with the same methods) and knows nothing of TensorFlow's devices.

The public interface, as the distribution's threads and the stateful test call it:

- ``submit(element)``: queue a batch for the next free worker (the loop's ``run_step``);
- ``hand_over(worker, batch)``: a feeder copied ``batch`` (taken from ``queue``) to ``worker``;
- ``complete(worker, batch)``: ``worker`` trains ``batch``, staging a push every ``geo_step``;
- ``release(worker)``: the worker's thread ends; a batch copied to it goes back to the queue;
- ``lose(worker, err)``: ``worker`` is gone;
- ``send(push)``: a push thread's work: ship, commit, pull;
- ``sync()``: every queued batch trained and every worker's change pushed;
- ``save_slots()``: a live worker's optimizer slots copied for the checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from trainer.distribute.base import StrategyError
from trainer.distribute.geo.replica import worker_lost

log = logging.getLogger(__name__)

# the batches queued ahead of the workers, per worker (the chief's input runs this far ahead)
QUEUE_PER_WORKER = 2
# seconds between two tries to queue a batch while the queue is full
PUT_POLL_S = 0.05
ALL_FAILED = "geo: every worker failed; the job stops (a retry resumes from the latest checkpoint)"


class QueuedBatch:
    """One batch handed to the workers (``number``: its place in the job's input): ``done``
    is set once some worker trained on it; ``shipped``: its tensors copied to the worker that
    holds it, ahead of its step (None until then, and again when it is re-queued)."""

    __slots__ = ("element", "number", "done", "loss", "error", "shipped")

    def __init__(self, element, number: int):
        self.element, self.number, self.done = element, number, threading.Event()
        self.loss, self.error, self.shipped = None, None, None


class StagedPush:
    """One staged push of a worker: ``staged`` (``stage``'s tensors, on the worker), its
    ``batches``; ``done`` is set once it was committed and its pull arrived (``pulled``,
    merged into the copy by the worker's own thread between two steps), or it failed."""

    __slots__ = ("worker", "staged", "batches", "done", "pulled")

    def __init__(self, worker, staged: list, batches: list[int]):
        self.worker, self.staged, self.batches, self.done = worker, staged, batches, threading.Event()
        self.pulled = None


class ThreadDispatcher:
    """Sends each push with ``send`` from a thread of its own (the worker trains on meanwhile)."""

    def __init__(self, send: Callable[[StagedPush], None]):
        self.send = send

    def start(self, push: StagedPush) -> None:
        name = f"geo-push-{push.worker.index}"
        threading.Thread(target=self.send, args=(push,), name=name, daemon=True).start()

    def wait(self, push: StagedPush) -> None:
        push.done.wait()


class GeoScheduler:
    """The chief's queue, ledger and failover over ``workers`` (see the module docstring).

    Args:
        workers: how many workers the job has (the queue holds ``QUEUE_PER_WORKER`` each).
        geo_step: a worker's batches between two pushes.
        dispatcher: how a staged push is sent (default ``ThreadDispatcher``).

    Attributes:
        workers: the replicas (set by ``start``).
        queue: the batches waiting for a worker.
        trained: batch number -> the worker that trained it; ``applied``: the batches whose
            push was committed; ``lost``: those lost with a worker before their push.
        traffic: ``pushes``, ``rows_sent``, ``rows_received``, ``bytes_to_ps``,
            ``bytes_from_ps``.
    """

    def __init__(self, workers: int, geo_step: int, dispatcher=None):
        self.geo_step = geo_step
        self.workers: list = []
        self.traffic = dict.fromkeys(
            ("pushes", "rows_sent", "rows_received", "bytes_to_ps", "bytes_from_ps"), 0
        )
        self.queue: queue.Queue = queue.Queue(maxsize=QUEUE_PER_WORKER * workers)
        self._lock = threading.RLock()  # traffic, the ledger, "is any worker alive", the error
        self._batches = 0  # the batches queued so far (each gets its number)
        self.trained: dict[int, int] = {}
        self.applied: set[int] = set()
        self.lost: set[int] = set()
        self._error: BaseException | None = None  # a step's error, raised at the next call
        self.dispatcher = dispatcher or ThreadDispatcher(self.send)
        self._commit: Callable = lambda worker, shipped, batches: None
        self._dense_bytes, self._row_bytes = 0, {}

    def start(self, workers: list, commit: Callable, dense_bytes: int = 0, row_bytes: dict | None = None):
        """Take ``workers`` (replicas); ``commit(worker, shipped, batches)`` applies a shipped
        push on the ps; ``dense_bytes`` and ``row_bytes`` (per table index) size the traffic."""
        self.workers, self._commit = workers, commit
        self._dense_bytes, self._row_bytes = dense_bytes, row_bytes or {}

    # -- the loop's calls ----------------------------------------------------------------------
    def submit(self, element) -> QueuedBatch:
        """Queue ``element`` for the next free worker; returns its ``QueuedBatch``.

        Raises:
            StrategyError: every worker has failed. An earlier step's error, as it was raised.
        """
        self.raise_error()
        item = QueuedBatch(element, self._batches)
        self._batches += 1
        while True:
            with self._lock:
                if not self.any_alive():
                    raise StrategyError(ALL_FAILED)
                try:
                    self.queue.put_nowait(item)
                    return item
                except queue.Full:
                    pass
            time.sleep(PUT_POLL_S)

    def any_alive(self) -> bool:
        return any(w.alive for w in self.workers)

    def raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def clear_error(self) -> None:
        """Forget a step's error once raised (a caller that goes on, as a test does)."""
        self._error = None

    def sync(self) -> None:
        """Wait for every push in flight, then push every worker's remaining change and wait
        for it (the queue must be empty: ``queue.join()`` first).

        Raises:
            StrategyError: every worker has failed. The first error of a step (one whose
                loss was never read), as it was raised.
        """
        self.raise_error()
        for worker in self.workers:  # no step runs now: merged here
            self._wait_sent(worker)
            self._merge_sent(worker)
        live = [w for w in self.workers if w.alive]
        if not live:
            raise StrategyError(ALL_FAILED)
        for worker in live:
            if worker.pending:
                self._push(worker)
        for worker in live:
            self._wait_sent(worker)
            self._merge_sent(worker)
        self.raise_error()
        if not self.any_alive():  # lost while staging or sending
            raise StrategyError(ALL_FAILED)

    def save_slots(self) -> None:
        """The first live worker's optimizer slots copied into the chief's (``copy_slots``);
        a worker lost meanwhile is dropped and the next one's are taken.

        Raises:
            StrategyError: no worker is left.
        """
        for worker in self.workers:
            if not worker.alive:
                continue
            try:
                with worker.scope():
                    worker.copy_slots()
                return
            except tf.errors.OpError as err:
                if not worker_lost(err):
                    raise
                self.lose(worker, err)
        raise StrategyError(ALL_FAILED)

    def figures(self) -> dict:
        """The traffic and the ledger: ``batches_trained``, ``batches_applied``,
        ``batches_lost``."""
        with self._lock:
            return {
                **self.traffic,
                "batches_trained": len(self.trained),
                "batches_applied": len(self.applied),
                "batches_lost": len(self.lost),
            }

    # -- the workers' threads ------------------------------------------------------------------
    def serve(self, worker) -> None:
        """A worker's thread: its feeder started, then each batch copied to it trained."""
        name = f"geo-feed-{worker.index}"
        threading.Thread(target=self.feed, args=(worker,), name=name, daemon=True).start()
        while True:
            item = worker.ready.get()
            if item is None or not self.complete(worker, item):
                self.release(worker)
                return

    def feed(self, worker) -> None:
        """A worker's feeder thread: batches from the queue, copied to it one step ahead."""
        while self.hand_over(worker, self.queue.get()):
            pass

    def hand_over(self, worker, item: QueuedBatch) -> bool:
        """Copy ``item``'s batch (taken from the queue) to ``worker`` while its step before
        runs, and hand it to the worker's thread; False once the worker is lost (the batch
        is then re-queued for another worker, and the feeder ends)."""
        if worker.alive:
            try:
                with worker.feed_scope():
                    item.shipped = worker.copy(item.element)
            except tf.errors.OpError as err:
                if not worker_lost(err):
                    raise
                self.lose(worker, err)
        while True:
            # checked and handed over under the lock the worker is declared lost under: a
            # batch is never left with a worker whose thread has drained its hand
            with self._lock:
                if worker.alive:
                    try:
                        worker.ready.put_nowait(item)
                        return True
                    except queue.Full:
                        pass
                else:
                    with contextlib.suppress(queue.Full):
                        worker.ready.put_nowait(None)  # wakes the worker's thread to end
                    break
            time.sleep(PUT_POLL_S)
        with worker.feed_scope():  # released in its executor (see complete)
            item.shipped = None
        self.queue.task_done()
        self._requeue(item)
        return False

    def release(self, worker) -> None:
        """The worker's thread ends: a batch copied to it goes back to the queue."""
        with self._lock:
            try:
                item = worker.ready.get_nowait()
            except queue.Empty:
                return
        if item is not None:
            with worker.scope():  # released in its executor (see complete)
                item.shipped = None
            self.queue.task_done()
            self._requeue(item)

    def complete(self, worker, item: QueuedBatch) -> bool:
        """Train ``item`` (taken from the queue) on ``worker``, staging a push every
        ``geo_step`` of its batches; False once the worker is lost (its thread then ends)."""
        self._merge_sent(worker)  # a push sent meanwhile: its pull, between two steps
        if not worker.alive:  # lost by its push's thread or its merge
            self.queue.task_done()
            self._requeue(item)
            return False
        try:
            with worker.scope():
                try:
                    item.loss = float(worker.step(*(item.shipped or item.element)))
                finally:
                    # the copy's handles released in this worker's executor: a dead worker's
                    # release fails here, not in the loop's thread, which drops the batch last
                    item.shipped = None
        except Exception as err:  # noqa: BLE001 - raised by the loop's next call
            if worker_lost(err):
                # the step ran on the worker's copy alone: nothing of this batch reached the
                # ps, so another worker trains it
                self.lose(worker, err)
                self.queue.task_done()
                self._requeue(item)
                return False
            item.error = err
            self._fail(err)
            item.done.set()
            self.queue.task_done()
            return True
        with self._lock:
            self.trained[item.number] = worker.index
            if worker.alive:
                worker.pending.append(item.number)
            else:  # its push's thread lost it meanwhile: the batch went with the copy
                self.lost.add(item.number)
        pushed = worker.alive
        try:
            if pushed and len(worker.pending) >= self.geo_step:
                pushed = self._push(worker)
        except Exception as err:  # noqa: BLE001 - a bug: the job fails with it
            item.error = err
            self._fail(err)
        # trained and counted: its push is applied whole or lost with the worker, never
        # trained again
        item.done.set()
        self.queue.task_done()
        if not pushed:
            self._requeue(None)
        return pushed

    def lose(self, worker, err: BaseException) -> None:
        """``worker`` is gone (its step's or its push's thread found it): the batches it
        trained since its last stage are lost. Those of a push in flight are its push
        thread's to settle (applied if the push left the worker, else lost). Either thread may
        call it, once or twice."""
        with self._lock:
            if not worker.alive:
                return
            worker.alive = False
            gone = worker.pending
            self.lost.update(gone)
            worker.pending = []
        log.warning(
            "geo: worker %d failed (%s); its %d batches not yet staged are lost, the others train on",
            worker.index,
            type(err).__name__,
            len(gone),
        )

    def send(self, push: StagedPush) -> None:
        """Ship ``push`` to the ps, commit it there whole, pull the others' changes. A lost
        worker is dropped (its push applied whole or not at all); any other error fails the
        job at the loop's next call."""
        worker = push.worker
        try:
            try:
                with worker.push_scope():
                    shipped = worker.ship(push.staged)
            except tf.errors.OpError as err:
                if not worker_lost(err):
                    raise
                with self._lock:  # nothing of it reached the ps
                    self.lost.update(push.batches)
                    worker.sending = []
                self.lose(worker, err)
                self._requeue(None)  # the last worker gone: the queued batches fail now
                return
            self._commit(worker, shipped, len(push.batches))  # ps only
            with self._lock:
                self.applied.update(push.batches)
                worker.sending = []
            sent = worker.sent_rows(push.staged)  # shapes: no op
            try:
                with worker.push_scope():
                    pulled, received = worker.pull()
                push.pulled, received = pulled, received.numpy()
            except tf.errors.OpError as err:
                if not worker_lost(err):
                    raise
                self.lose(worker, err)
                self._requeue(None)
                return
            self._count(worker, sent, received)
        except Exception as err:  # noqa: BLE001 - a ps lost or a bug: the job fails with it
            self._fail(err)
        finally:
            push.done.set()

    # -- inside ----------------------------------------------------------------------------------
    def _count(self, worker, sent: np.ndarray, received: np.ndarray) -> None:
        rows = [self._row_bytes[i] for i in sorted(worker.stale)]
        with self._lock:
            t = self.traffic
            t["pushes"] += 1
            t["rows_sent"] += int(sent.sum())
            t["rows_received"] += int(received.sum())
            t["bytes_to_ps"] += self._dense_bytes + int(np.dot(sent, rows))
            t["bytes_from_ps"] += self._dense_bytes + int(np.dot(received, rows))

    def _fail(self, err: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = err

    def _requeue(self, item: QueuedBatch | None) -> None:
        while True:
            # checked and enqueued under the lock a dying worker drains under, never blocking
            # with it held (a worker that frees a place may need it)
            with self._lock:
                if not self.any_alive():
                    self._drain(item)
                    return
                try:
                    if item is not None:
                        item.shipped = None  # on the lost worker: copied again by the next
                        self.queue.put_nowait(item)
                    return
                except queue.Full:
                    pass
            time.sleep(PUT_POLL_S)

    def _drain(self, item: QueuedBatch | None) -> None:
        """Nobody is left to train ``item`` and the queued batches: each fails, and join()
        returns. Called with the lock held."""
        self._fail(StrategyError(ALL_FAILED))
        held = [w.ready.get_nowait() for w in self.workers if not w.ready.empty()]
        for got in held:  # copied to a worker, not yet stepped: taken from the queue
            if got is not None:
                got.error = StrategyError(ALL_FAILED)
                got.done.set()
                self.queue.task_done()
        while True:
            if item is not None:
                item.error = StrategyError(ALL_FAILED)
                item.done.set()
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return
            self.queue.task_done()

    def _push(self, worker) -> bool:
        """Stage the worker's change (after its last push's pull: the stage reads the copy
        the pull moves) and hand it to the dispatcher. Returns False when the worker was lost
        (its batches then lost, never applied)."""
        self._wait_sent(worker)
        self._merge_sent(worker)
        if not worker.alive:
            return False
        try:
            with worker.scope():
                staged = worker.stage()
        except tf.errors.OpError as err:
            if not worker_lost(err):
                raise
            self.lose(worker, err)
            return False
        with self._lock:
            push = StagedPush(worker, staged, worker.pending)
            worker.sending, worker.pending = worker.pending, []
            worker.inflight = push
        self.dispatcher.start(push)
        return True

    def _wait_sent(self, worker) -> None:
        if worker.inflight is not None:
            self.dispatcher.wait(worker.inflight)

    def _merge_sent(self, worker) -> None:
        """In the worker's turn (no step of it runs): merge what its sent push pulled into
        its copy. Merged there, not by the push's thread: an optimizer's update of a dense
        variable is not atomic with another write (``use_locking`` off), so a merge beside
        a step could be lost."""
        push = worker.inflight
        if push is None or not push.done.is_set():
            return
        worker.inflight = None
        if push.pulled is None or not worker.alive:  # lost, or the job failed with it
            return
        try:
            with worker.scope():
                worker.merge(push.pulled)
        except tf.errors.OpError as err:
            if not worker_lost(err):
                raise
            self.lose(worker, err)
