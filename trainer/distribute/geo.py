"""GEO-asynchronous parameter-server training (PaddleRec's ``sync_mode: geo``).

PaddleRec's distributed-modes doc (shared/reference/paddlerec_distributed_modes.md): every
worker runs the whole training step locally (forward, backward, optimizer) on a full copy of
the model, and every ``geo_step`` batches sends the difference between its parameters and the
values it last pulled to the parameter servers, which add it up; it then pulls the latest
values and trains on without waiting for anyone.

Here the chief (this process) keeps the global variables on the ps, as in asynchronous PS
training, and builds one copy of model and optimizers on each worker (``StepParts.
build_replica`` under the worker's device). A thread per worker feeds it batches from the
chief's input, each copied to the worker by a feeder thread while the step before it runs;
its step touches only that worker's variables. A push, run on the worker:

- dense variables: ``global += local - last_pulled``, then ``local = last_pulled = global``;
- tables (rank-2 variables of the embedding and wide groups): only the rows that changed on
  this worker since its last pull travel (ids and rows), added with ``scatter_add``; the ps
  marks them as changed for every other worker, and the worker pulls the rows marked for it
  (PaddleRec's GEO communicator sends sparse deltas and receives the ids others updated). A
  row-wise optimizer on the tables (``lazy_adam``, ``adagrad``, ``ftrl``) changes only the
  rows a step looked up; Adam's momentum moves every row it has seen, and all of those travel.

A push is staged, shipped, committed, fetched, then merged, and only staging and merging (both
on the worker, no network) hold up the worker's steps (PaddleRec's GEO communicator sends from a
thread of its own while training goes on):

- stage, in the worker's turn between two steps: the change since the last push (worker-local
  ops; its last-pushed values advance to the copy's), so a push holds exactly the batches
  trained before it;
- then a thread of the chief's sends it: copies the change to the ps (nothing global changes:
  a worker lost here loses its push whole), one function with every op on the ps applies it,
  marks the changed rows for the other workers (after the rows hold the update) and counts its
  batches on the ps, then fetches to the worker each row another worker changed and the dense
  values;
- merge, in the worker's turn again: the fetched values move its copy by ``fetched - last
  pulled``, so what the worker trained meanwhile is kept. One push a worker is in flight at a
  time: the next stage waits for the last merge.

So each batch is applied exactly once or not at all, and the chief's ledger (``figures``:
trained, applied, lost) says which.

Each worker's optimizer slots are its own; a checkpoint holds the ps values of the model and
the first live worker's optimizer slots (so tomorrow's fine-tune resumes them). Tables stay
whole on one ps each (no partitioner: a row's id is its index on its ps). A worker that
fails is dropped: a batch whose step failed with it is trained by another; batches it trained
but had not pushed are lost (at most ``geo_step``), never trained again; with no worker left
the job fails at once with a clear error, never waiting on a queue no one takes from. An
error in any step fails the job at the next step, even when that step's loss was never read.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time

import numpy as np
import tensorflow as tf

# TensorFlow's ClusterCoordinator gives each worker's thread an executor of its own, so that a
# failed worker's error stays in it instead of failing the chief's next op (its input); there
# is no public API for it
from tensorflow.python.eager import context as eager_context
from tensorflow.python.eager import executor as eager_executor

from trainer.distribute.base import Distribution, StepParts, StrategyError
from trainer.distribute.parameter_server import LOST_RESULT, cluster_from_tf_config

log = logging.getLogger(__name__)

# the batches queued ahead of the workers, per worker (the chief's input runs this far ahead)
QUEUE_PER_WORKER = 2
# seconds between two tries to queue a batch while the queue is full
PUT_POLL_S = 0.05
# what a worker's lost connection raises
WORKER_LOST = (*LOST_RESULT, tf.errors.AbortedError)
# how else a dead worker's op fails, by TensorFlow's own list (cluster_coordinator's
# _is_worker_failure): a gRPC UNAVAILABLE wrapped in another error, a handle or a function
# the restarted or gone worker no longer holds
LOST_TEXTS = (
    '"grpc_status":14',
    "Connection reset by peer",
    "Socket closed",
    "Unable to find the relevant tensor remote_handle",
    "unknown device",
    "neither a type of a primitive operation nor a name of a function registered",
)
ALL_FAILED = "geo: every worker failed; the job stops (a retry resumes from the latest checkpoint)"


def worker_lost(err: BaseException) -> bool:
    """Whether ``err``, raised by an op on a worker, means the worker is gone: one of
    ``WORKER_LOST``, or another ``tf.errors.OpError`` whose text is one of ``LOST_TEXTS``."""
    if isinstance(err, WORKER_LOST):
        return True
    return isinstance(err, tf.errors.OpError) and any(t in str(err) for t in LOST_TEXTS)


# the int32 range: ids (hash buckets) and row splits within it travel at half their bytes
INT32 = np.iinfo(np.int32)


def narrow(element) -> tuple:
    """A batch as the chief ships it to a worker: every ``int64`` tensor as ``int32`` (ids are
    hash bucket indices, row splits offsets: both fit), which the worker's step widens back.
    The chief feeds every worker's input over its own link, and ids are most of a batch's
    bytes: on a 100 Mbit/s link this bounds a GEO job's examples per second.

    Raises:
        StrategyError: an int64 value outside the int32 range (a hash bucket count of 2**31
            or more).
    """
    out = []
    for t in element:
        if getattr(t, "dtype", None) == tf.int64:
            values = t.numpy()
            if values.size and (values.min() < INT32.min or values.max() > INT32.max):
                raise StrategyError(
                    "train_config.sync_mode: geo ships ids as int32: a feature's table size "
                    f"must stay below 2**31 (a batch holds {values.max()})"
                )
            t = tf.cast(t, tf.int32)
        out.append(t)
    return tuple(out)


class _Step:
    """One batch handed to the workers (``number``: its place in the job's input): ``done``
    is set once some worker trained on it; ``shipped``: its tensors copied to the worker that
    holds it, ahead of its step (None until then, and again when it is re-queued)."""

    __slots__ = ("element", "number", "done", "loss", "error", "shipped")

    def __init__(self, element, number: int):
        self.element, self.number, self.done, self.loss, self.error = (
            element,
            number,
            threading.Event(),
            None,
            None,
        )
        self.shipped = None


class _Push:
    """One staged push of a worker: ``staged`` (``stage``'s tensors, on the worker), its
    ``batches``; ``done`` is set once it was committed and its pull fetched (``fetched``,
    merged into the copy by the worker's own thread between two steps), or it failed."""

    __slots__ = ("worker", "staged", "batches", "done", "fetched")

    def __init__(self, worker, staged: list, batches: list[int]):
        self.worker, self.staged, self.batches, self.done = worker, staged, batches, threading.Event()
        self.fetched = None


class _Worker:
    """One worker's model copy, its last-pulled values and its step, push and pull functions.

    Args:
        index: the worker's task index; ``device`` its device name.
        parts: the chief's ``StepParts`` (global variables on the ps).
        local: the ``StepParts`` of the copy built on this worker.
        stale: per table (index into the model's variables), one ``bool [rows]`` variable per
            worker on the table's ps: rows another worker changed since that worker's pull.

    Raises:
        StrategyError: the copy's variables differ in shape from the chief's.
    """

    def __init__(self, index: int, device: str, parts: StepParts, local: StepParts, stale: dict):
        self.index, self.device, self.local = index, device, local
        self.executor = eager_executor.new_executor(enable_async=False)
        # the push's thread has an executor of its own: a lost worker's error stays in it
        self.push_executor = eager_executor.new_executor(enable_async=False)
        # the feeder's too: it copies the next batch to the worker while the step runs
        self.feed_executor = eager_executor.new_executor(enable_async=False)
        self.ready: queue.Queue = queue.Queue(maxsize=1)  # a batch copied here, its step next
        self.pending: list[int] = []  # the batches trained here since the last stage
        self.sending: list[int] = []  # the batches of the push in flight, until its commit
        self.inflight: _Push | None = None
        self.alive = True
        g_vars, l_vars = parts.state.model.variables, local.state.model.variables
        if [v.shape for v in g_vars] != [v.shape for v in l_vars]:
            raise StrategyError("geo: a worker's model copy differs from the chief's model")
        self.pairs = list(zip(g_vars, l_vars, strict=True))
        g_opt = [v for opt in parts.state.optimizers for v in opt.variables]
        l_opt = [v for opt in local.state.optimizers for v in opt.variables]
        self.opt_pairs = list(zip(g_opt, l_opt, strict=True))
        self.stale = stale
        with tf.device(device):
            self.snapshot = [tf.Variable(c.read_value(), trainable=False) for _, c in self.pairs]
        self.step = self._step_fn(local.signature)
        # where each table's pushed ids sit in ``stage``'s output (a dense delta takes one place,
        # a table two: ids, rows)
        places = [2 if i in stale else 1 for i in range(len(self.pairs))]
        self.id_slots = [sum(places[:i]) for i in sorted(stale)]
        self.stage = self._stage_fn()
        self.ship = self._ship_fn(places)
        self.fetch = self._fetch_fn()
        self.merge = self._merge_fn()
        self.pull_all = self._pull_all_fn()
        self.copy_slots = self._copy_slots_fn()

    @contextlib.contextmanager
    def scope(self):
        """Ops run on this worker, their errors kept in its own executor."""
        with eager_context.executor_scope(self.executor), tf.device(self.device):
            yield

    @contextlib.contextmanager
    def feed_scope(self):
        """Ops of this worker's feeder (run by a thread of the chief's)."""
        with eager_context.executor_scope(self.feed_executor), tf.device(self.device):
            yield

    def copy(self, element) -> tuple:
        """``element``'s tensors copied to this worker (call under ``feed_scope``)."""
        return tuple(tf.identity(t) for t in element)

    @contextlib.contextmanager
    def push_scope(self):
        """Ops of this worker's push (run by the chief's push thread)."""
        with eager_context.executor_scope(self.push_executor), tf.device(self.device):
            yield

    def _step_fn(self, signature: tuple):
        """The worker's step, taking the batch as ``run_step`` ships it: int64 tensors as
        int32 (``narrow``), widened back here."""
        local = self.local
        wide = [spec.dtype == tf.int64 for spec in signature]
        shipped = tuple(
            tf.TensorSpec(spec.shape, tf.int32, spec.name) if w else spec
            for spec, w in zip(signature, wide, strict=True)
        )

        @tf.function(input_signature=shipped, autograph=False)
        def step(*flat):
            flat = tuple(tf.cast(t, tf.int64) if w else t for t, w in zip(flat, wide, strict=True))
            loss, grads = local.gradients(flat, 1.0)
            local.apply(grads)
            return loss

        return step

    def _stage_fn(self):
        # c: this worker's copy, s: c as last pushed or pulled
        pairs, snapshot, stale = self.pairs, self.snapshot, self.stale

        @tf.function(autograph=False)
        def stage():
            """This worker's change since its last push, kept on the worker: dense deltas, and
            for each table the ids that changed and their deltas; the snapshot takes the
            copy's values, so what the worker trains next is the next push's."""
            out = []
            for i, (_, c) in enumerate(pairs):
                s = snapshot[i]
                now, then = c.read_value(), s.read_value()
                if i not in stale:
                    out.append(now - then)
                    s.assign(now)
                    continue
                # the rows that changed here since the last push: the ones a step looked up, and
                # under an optimizer that moves rows without a gradient (Adam's momentum) more
                ids = tf.where(tf.reduce_any(tf.not_equal(now, then), axis=1))[:, 0]
                rows = tf.gather(now, ids)
                out += [ids, rows - tf.gather(then, ids)]
                s.scatter_update(tf.IndexedSlices(rows, ids))
            return out

        return stage

    def _ship_fn(self, places: list[int]):
        devices = [g.device for (g, _), n in zip(self.pairs, places, strict=True) for _ in range(n)]

        @tf.function(autograph=False, reduce_retracing=True)
        def ship(staged):
            """``stage``'s tensors copied to their variables' ps: a worker lost here loses its
            push whole."""
            out = []
            for t, device in zip(staged, devices, strict=True):
                with tf.device(device):
                    out.append(tf.identity(t))
            return out

        return ship

    def commit_fn(self, applied: tf.Variable):
        """The function that applies a staged push (``stage``'s tensors, already on the ps,
        and the number of batches in it) on the ps, whole: every op on a ps, none on the
        worker, so the worker's death cannot cut it in two."""
        pairs, stale, me = self.pairs, self.stale, self.index

        @tf.function(autograph=False, reduce_retracing=True)
        def commit(staged, batches):
            k = 0
            for i, (g, _) in enumerate(pairs):
                if i not in stale:
                    g.assign_add(staged[k])
                    k += 1
                    continue
                ids, delta = staged[k], staged[k + 1]
                k += 2
                added = g.scatter_add(tf.IndexedSlices(delta, ids))
                # marked only once the rows hold the update: a worker that pulls a marked row
                # reads it with the update in
                with tf.control_dependencies([added]):
                    for w, flags in enumerate(stale[i]):
                        if w != me:
                            flags.scatter_update(tf.IndexedSlices(tf.ones_like(ids, tf.bool), ids))
            applied.assign_add(batches)

        return commit

    def _fetch_fn(self):
        pairs, stale, me, device = self.pairs, self.stale, self.index, self.device

        @tf.function(autograph=False)
        def fetch():
            """After a commit, in the push's thread: the dense values, and the ids and rows
            other workers changed, copied to this worker (the network's part of a pull; the
            copy is untouched). Returns (per variable ``[value]`` or ``[ids, rows]``,
            ``int32 [tables]`` the rows received)."""
            fetched, received = [], []
            for i, (g, _) in enumerate(pairs):
                if i not in stale:
                    value = g.read_value()
                    with tf.device(device):
                        fetched.append(tf.identity(value))
                    continue
                mine = stale[i][me]
                with tf.device(mine.device):
                    changed = tf.where(mine.read_value())[:, 0]
                cleared = mine.scatter_update(tf.IndexedSlices(tf.zeros_like(changed, tf.bool), changed))
                # read after the marks are cleared: a mark set later is pulled next time
                with tf.control_dependencies([cleared]):
                    rows = tf.gather(g, changed)
                with tf.device(device):
                    fetched += [tf.identity(changed), tf.identity(rows)]
                received.append(tf.size(changed))
            return fetched, (tf.stack(received) if received else tf.zeros([0], tf.int32))

        return fetch

    def _merge_fn(self):
        pairs, snapshot, stale = self.pairs, self.snapshot, self.stale

        @tf.function(autograph=False, reduce_retracing=True)
        def merge(fetched):
            """Between two steps: the copy moves by ``fetched - last pulled`` (what the worker
            trained since its last stage is kept) and the snapshot takes ``fetched``."""
            k = 0
            for i, (_, c) in enumerate(pairs):
                s = snapshot[i]
                if i not in stale:
                    new = fetched[k]
                    k += 1
                    c.assign_add(new - s.read_value())
                    s.assign(new)
                    continue
                ids, rows = fetched[k], fetched[k + 1]
                k += 2
                c.scatter_add(tf.IndexedSlices(rows - tf.gather(s, ids), ids))
                s.scatter_update(tf.IndexedSlices(rows, ids))

        return merge

    def _pull_all_fn(self):
        pairs, snapshot, opt_pairs = self.pairs, self.snapshot, self.opt_pairs

        @tf.function(autograph=False)
        def pull_all():
            # the start: model and optimizer state as the chief restored them
            for (g, c), s in zip(pairs, snapshot, strict=True):
                value = g.read_value()
                c.assign(value)
                s.assign(value)
            for g, c in opt_pairs:
                c.assign(g.read_value())

        return pull_all

    def _copy_slots_fn(self):
        opt_pairs = self.opt_pairs

        @tf.function(autograph=False)
        def copy_slots():
            for g, c in opt_pairs:
                g.assign(c.read_value())

        return copy_slots


class GeoParameterServerDistribution(Distribution):
    """The chief of a GEO-asynchronous parameter-server job (``train_config.sync_mode: geo``).

    ``run_step`` queues a batch for the next free worker and returns at once; ``fetch`` waits
    for that batch's loss (float); ``sync`` waits for every queued batch and makes every worker
    push what it has not, so that the ps hold every step before a checkpoint.

    Args:
        geo_step: local batches between two pushes of a worker (PaddleRec's ``geo_step``).

    Attributes:
        traffic: ``pushes``, ``rows_sent``, ``rows_received``, ``bytes_to_ps``,
            ``bytes_from_ps`` (the pushes' tensors: deltas and ids out, pulled values and ids
            in) since the job started.

    Raises:
        StrategyError: see ``cluster_from_tf_config``; at ``run_step`` or ``sync`` once every
            worker has failed.
    """

    holds_online_tables = False
    exits_at_once_on_error = True

    def __init__(self, geo_step: int):
        self.cluster = cluster_from_tf_config()
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        # no partitioner: a table stays whole on one ps, so a row's id is its index there
        super().__init__(tf.distribute.ParameterServerStrategy(resolver))
        self.geo_step = geo_step
        self.workers: list[_Worker] = []
        self._start_ledger(len(self.cluster["worker"]))

    def _start_ledger(self, workers: int) -> None:
        """The chief's state of the workers' batches: the queue, the ledger, the counts."""
        self.traffic = dict.fromkeys(
            ("pushes", "rows_sent", "rows_received", "bytes_to_ps", "bytes_from_ps"), 0
        )
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_PER_WORKER * workers)
        self._counters: tuple = ()
        self._dispatched = 0  # steps queued since the counters were last advanced
        self._lock = threading.RLock()  # traffic, the ledger, "is any worker alive", the error
        self._commit_executor = eager_executor.new_executor(enable_async=False)
        self._commit_lock = threading.Lock()
        self._batches = 0  # the batches queued so far (each gets its number)
        # the ledger: which worker trained each batch, the batches whose push was committed,
        # those lost with a worker before their push
        self.trained: dict[int, int] = {}
        self.applied: set[int] = set()
        self.lost: set[int] = set()
        self._error: BaseException | None = None  # a step's error, raised at the next call

    # -- the step ------------------------------------------------------------------------------
    def build_train_step(self, parts: StepParts):
        """Build a model copy on every worker from the chief's (restored) values and start the
        workers' threads; returns the function ``run_step`` is given (unused: steps run on
        the workers' copies).

        Raises:
            StrategyError: ``parts`` cannot build copies (``build_replica`` is None).
        """
        if parts.build_replica is None:
            raise StrategyError("train_config.sync_mode: geo needs model copies the loop cannot build")
        model_vars = parts.state.model.variables
        grouped = parts.state.model.variable_groups()
        sparse = {v.ref() for v in grouped["embedding"] + grouped["wide"] if len(v.shape) == 2}
        tables = {i for i, v in enumerate(model_vars) if v.ref() in sparse}
        n = len(self.cluster["worker"])
        stale = {}
        for i in tables:
            with tf.device(model_vars[i].device):
                rows = model_vars[i].shape[0]
                stale[i] = [tf.Variable(tf.zeros([rows], tf.bool), trainable=False) for _ in range(n)]
        self._dense_bytes = sum(
            int(np.prod(v.shape)) * v.dtype.size for i, v in enumerate(model_vars) if i not in tables
        )
        self._row_bytes = {
            i: int(np.prod(model_vars[i].shape[1:])) * model_vars[i].dtype.size + 8 for i in tables
        }
        for k in range(n):
            device = f"/job:worker/replica:0/task:{k}"
            with tf.device(device):
                local = parts.build_replica()
            worker = _Worker(k, device, parts, local, stale)
            with worker.scope():
                worker.pull_all()
            self.workers.append(worker)
            log.info("geo: worker %d holds a copy of %d variables", k, len(worker.pairs))
        with tf.device(model_vars[0].device):
            self.applied_on_ps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._commits = {w.index: w.commit_fn(self.applied_on_ps) for w in self.workers}
        self._counters = parts.counters
        for worker in self.workers:
            name = f"geo-worker-{worker.index}"
            threading.Thread(target=self._serve, args=(worker,), name=name, daemon=True).start()
        return self._serve

    def _serve(self, worker: _Worker) -> None:
        name = f"geo-feed-{worker.index}"
        threading.Thread(target=self._feed, args=(worker,), name=name, daemon=True).start()
        while True:
            item = worker.ready.get()
            if item is None or not self._train(worker, item):
                self._drain_ready(worker)
                return

    def _feed(self, worker: _Worker) -> None:
        while self._copy(worker, self._queue.get()):
            pass

    def _copy(self, worker: _Worker, item: _Step) -> bool:
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
                self._lost(worker, err)
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
        with worker.feed_scope():  # released in its executor (see _train)
            item.shipped = None
        self._queue.task_done()
        self._requeue(item)
        return False

    def _drain_ready(self, worker: _Worker) -> None:
        """The worker's thread ends: a batch copied to it goes back to the queue."""
        with self._lock:
            try:
                item = worker.ready.get_nowait()
            except queue.Empty:
                return
        if item is not None:
            with worker.scope():  # released in its executor (see _train)
                item.shipped = None
            self._queue.task_done()
            self._requeue(item)

    def _train(self, worker: _Worker, item: _Step) -> bool:
        """Train ``item`` (taken from the queue) on ``worker``, staging a push every
        ``geo_step`` of its batches; False once the worker is lost (its thread then ends)."""
        self._merge_sent(worker)  # a push sent meanwhile: its pull, between two steps
        if not worker.alive:  # lost by its push's thread or its merge
            self._queue.task_done()
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
                self._lost(worker, err)
                self._queue.task_done()
                self._requeue(item)
                return False
            item.error = err
            self._fail(err)
            item.done.set()
            self._queue.task_done()
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
        self._queue.task_done()
        if not pushed:
            self._requeue(None)
        return pushed

    def _lost(self, worker: _Worker, err: BaseException) -> None:
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

    def _fail(self, err: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = err

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _requeue(self, item: _Step | None) -> None:
        while True:
            # checked and enqueued under the lock a dying worker drains under, never blocking
            # with it held (a worker that frees a place may need it)
            with self._lock:
                if not any(w.alive for w in self.workers):
                    self._drain(item)
                    return
                try:
                    if item is not None:
                        item.shipped = None  # on the lost worker: copied again by the next
                        self._queue.put_nowait(item)
                    return
                except queue.Full:
                    pass
            time.sleep(PUT_POLL_S)

    def _drain(self, item: _Step | None) -> None:
        """Nobody is left to train ``item`` and the queued batches: each fails, and join()
        returns. Called with the lock held."""
        self._fail(StrategyError(ALL_FAILED))
        held = [w.ready.get_nowait() for w in self.workers if not w.ready.empty()]
        for got in held:  # copied to a worker, not yet stepped: taken from the queue
            if got is not None:
                got.error = StrategyError(ALL_FAILED)
                got.done.set()
                self._queue.task_done()
        while True:
            if item is not None:
                item.error = StrategyError(ALL_FAILED)
                item.done.set()
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            self._queue.task_done()

    def _push(self, worker: _Worker) -> bool:
        """Stage the worker's change (after its last push's pull: the stage reads the copy
        the pull moves) and hand it to a push thread. Returns False when the worker was lost
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
            self._lost(worker, err)
            return False
        with self._lock:
            push = _Push(worker, staged, worker.pending)
            worker.sending, worker.pending = worker.pending, []
            worker.inflight = push
        self._dispatch(push)
        return True

    def _dispatch(self, push: _Push) -> None:
        """Send ``push`` from a thread of its own: the worker trains on meanwhile."""
        name = f"geo-push-{push.worker.index}"
        threading.Thread(target=self._send, args=(push,), name=name, daemon=True).start()

    def _wait_sent(self, worker: _Worker) -> None:
        if worker.inflight is not None:
            worker.inflight.done.wait()

    def _merge_sent(self, worker: _Worker) -> None:
        """In the worker's turn (no step of it runs): merge what its sent push fetched into
        its copy. Merged there, not by the push's thread: an optimizer's update of a dense
        variable is not atomic with another write (``use_locking`` off), so a merge beside
        a step could be lost."""
        push = worker.inflight
        if push is None or not push.done.is_set():
            return
        worker.inflight = None
        if push.fetched is None or not worker.alive:  # lost, or the job failed with it
            return
        try:
            with worker.scope():
                worker.merge(push.fetched)
        except tf.errors.OpError as err:
            if not worker_lost(err):
                raise
            self._lost(worker, err)

    def _send(self, push: _Push) -> None:
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
                self._lost(worker, err)
                self._requeue(None)  # the last worker gone: the queued batches fail now
                return
            with self._commit_lock, eager_context.executor_scope(self._commit_executor):
                self._commits[worker.index](shipped, tf.constant(len(push.batches), tf.int64))  # ps only
            with self._lock:
                self.applied.update(push.batches)
                worker.sending = []
            sent = np.array([push.staged[k].shape[0] for k in worker.id_slots], np.int64)  # no op
            try:
                with worker.push_scope():
                    fetched, received = worker.fetch()
                push.fetched, received = fetched, received.numpy()
            except tf.errors.OpError as err:
                if not worker_lost(err):
                    raise
                self._lost(worker, err)
                self._requeue(None)
                return
            rows = [self._row_bytes[i] for i in sorted(worker.stale)]
            with self._lock:
                t = self.traffic
                t["pushes"] += 1
                t["rows_sent"] += int(sent.sum())
                t["rows_received"] += int(received.sum())
                t["bytes_to_ps"] += self._dense_bytes + int(np.dot(sent, rows))
                t["bytes_from_ps"] += self._dense_bytes + int(np.dot(received, rows))
        except Exception as err:  # noqa: BLE001 - a ps lost or a bug: the job fails with it
            self._fail(err)
        finally:
            push.done.set()

    def run_step(self, train_step, element):
        self._raise_error()
        item = _Step(narrow(element), self._batches)
        self._batches += 1
        while True:
            with self._lock:
                if not any(w.alive for w in self.workers):
                    raise StrategyError(ALL_FAILED)
                try:
                    self._queue.put_nowait(item)
                    break
                except queue.Full:
                    pass
            time.sleep(PUT_POLL_S)
        self._dispatched += 1
        return item

    def fetch(self, value) -> float:
        value.done.wait()
        if value.error is not None:
            raise value.error
        return value.loss

    def distribute(self, make_dataset):
        def epoch():
            batches = iter(make_dataset())
            while True:
                try:
                    element = self._next(batches)
                except StopIteration:
                    break
                yield element
            self._advance_counters()  # before the loop resets batch_in_epoch

        return epoch()

    def _next(self, batches, tries: int = 3):
        """The input's next batch. A lost worker's error that its remote handles' release
        left in this thread's executor is raised by the iterator's first wait, before it
        reads: cleared, and the read tried again (``tries`` times)."""
        while True:
            try:
                return next(batches)
            except tf.errors.OpError as err:
                tries -= 1
                if not tries or not worker_lost(err) or "/job:worker" not in str(err):
                    raise
                log.warning("geo: a lost worker's error left in the input's thread, cleared: %s", err.message)
                eager_context.context().executor.clear_error()

    def _advance_counters(self) -> None:
        self._queue.join()
        if self._dispatched:
            for counter in self._counters:
                counter.assign_add(self._dispatched)
            self._dispatched = 0

    def sync(self) -> None:
        """Wait for every queued batch and push in flight, then push every worker's remaining
        change and wait for it.

        Raises:
            StrategyError: every worker has failed. The first error of a step (one whose
                loss was never read), as it was raised.
        """
        if not self.workers:
            return
        self._advance_counters()
        self._raise_error()
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
        self._raise_error()
        if not any(w.alive for w in self.workers):  # lost while staging or sending
            raise StrategyError(ALL_FAILED)

    def prepare_save(self, state, saved) -> None:
        """The first live worker's optimizer slots into the chief's optimizers, which the
        checkpoint holds (the model's values are the ps's after ``sync``). A worker that died
        since ``sync`` is dropped and the next one's slots are taken.

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
                self._lost(worker, err)
        raise StrategyError(ALL_FAILED)

    def figures(self) -> dict:
        """The traffic, and the ledger: ``batches_trained`` (each by one worker),
        ``batches_applied`` (their pushes committed; the ps's own count),
        ``batches_lost`` (trained by a worker that died before pushing them)."""
        with self._lock:
            ledger = {
                "batches_trained": len(self.trained),
                "batches_applied": len(self.applied),
                "batches_lost": len(self.lost),
            }
        on_ps = int(self.applied_on_ps.numpy()) if self.workers else 0
        return {**self.traffic, **ledger, "batches_applied_on_ps": on_ps}

    def job_loss(self, loss):
        return loss

    def local_examples(self, element) -> int:
        return int(element[0].shape[0])
