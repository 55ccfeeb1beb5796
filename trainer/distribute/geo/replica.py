"""The GEO protocol's worker side: a worker's model copy and the functions that step it and
move its changes to and from the parameter servers (stage, ship, commit, pull, merge), and
what the chief ships to it (``narrow``) or learns from its errors (``worker_lost``)."""

from __future__ import annotations

import contextlib
import queue

import numpy as np
import tensorflow as tf

# TensorFlow's ClusterCoordinator gives each worker's thread an executor of its own, so that a
# failed worker's error stays in it instead of failing the chief's next op (its input); there
# is no public API for it
from tensorflow.python.eager import context as eager_context
from tensorflow.python.eager import executor as eager_executor

from trainer.distribute.base import StepParts, StrategyError
from trainer.distribute.parameter_server import LOST_RESULT

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


class GeoReplica:
    """One worker's model copy, its last-pulled values and its step, push and pull functions
    (the GEO protocol's worker side; ``trainer.distribute.geo.scheduler`` drives them).

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
        self.inflight = None  # its StagedPush in flight
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
        # a push, a pull: one part per model variable, in order: ``(delta,)`` or ``(value,)``
        # of a dense one, ``(ids, rows)`` of a table
        self.stage = self._stage_fn()
        self.ship = self._ship_fn()
        self.pull = self._pull_fn()
        self.merge = self._merge_fn()
        self.pull_all = self._pull_all_fn()
        self.copy_slots = self._copy_slots_fn()

    def sent_rows(self, staged: list) -> np.ndarray:
        """``int64 [tables]``: the rows each table sends in ``staged`` (``stage``'s output)."""
        return np.array([staged[i][0].shape[0] for i in sorted(self.stale)], np.int64)

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
                    out.append((now - then,))
                    s.assign(now)
                    continue
                # the rows that changed here since the last push: the ones a step looked up, and
                # under an optimizer that moves rows without a gradient (Adam's momentum) more
                ids = tf.where(tf.reduce_any(tf.not_equal(now, then), axis=1))[:, 0]
                rows = tf.gather(now, ids)
                out.append((ids, rows - tf.gather(then, ids)))
                s.scatter_update(tf.IndexedSlices(rows, ids))
            return out

        return stage

    def _ship_fn(self):
        devices = [g.device for g, _ in self.pairs]

        @tf.function(autograph=False, reduce_retracing=True)
        def ship(staged):
            """``stage``'s tensors copied to their variables' ps: a worker lost here loses its
            push whole."""
            out = []
            for part, device in zip(staged, devices, strict=True):
                with tf.device(device):
                    out.append(tuple(tf.identity(t) for t in part))
            return out

        return ship

    def commit_fn(self, applied: tf.Variable):
        """The function that applies a staged push (``stage``'s tensors, already on the ps,
        and the number of batches in it) on the ps, whole: every op on a ps, none on the
        worker, so the worker's death cannot cut it in two."""
        pairs, stale, me = self.pairs, self.stale, self.index

        @tf.function(autograph=False, reduce_retracing=True)
        def commit(staged, batches):
            for i, ((g, _), part) in enumerate(zip(pairs, staged, strict=True)):
                if i not in stale:
                    g.assign_add(part[0])
                    continue
                ids, delta = part
                added = g.scatter_add(tf.IndexedSlices(delta, ids))
                # marked only once the rows hold the update: a worker that pulls a marked row
                # reads it with the update in
                with tf.control_dependencies([added]):
                    for w, flags in enumerate(stale[i]):
                        if w != me:
                            flags.scatter_update(tf.IndexedSlices(tf.ones_like(ids, tf.bool), ids))
            applied.assign_add(batches)

        return commit

    def _pull_fn(self):
        pairs, stale, me, device = self.pairs, self.stale, self.index, self.device

        @tf.function(autograph=False)
        def pull():
            """After a commit, in the push's thread: the dense values, and the ids and rows
            other workers changed, copied to this worker (the network's part of a pull; the
            copy is untouched). Returns (per variable ``(value,)`` or ``(ids, rows)``,
            ``int32 [tables]`` the rows received)."""
            pulled, received = [], []
            for i, (g, _) in enumerate(pairs):
                if i not in stale:
                    value = g.read_value()
                    with tf.device(device):
                        pulled.append((tf.identity(value),))
                    continue
                mine = stale[i][me]
                with tf.device(mine.device):
                    changed = tf.where(mine.read_value())[:, 0]
                cleared = mine.scatter_update(tf.IndexedSlices(tf.zeros_like(changed, tf.bool), changed))
                # read after the marks are cleared: a mark set later is pulled next time
                with tf.control_dependencies([cleared]):
                    rows = tf.gather(g, changed)
                with tf.device(device):
                    pulled.append((tf.identity(changed), tf.identity(rows)))
                received.append(tf.size(changed))
            return pulled, (tf.stack(received) if received else tf.zeros([0], tf.int32))

        return pull

    def _merge_fn(self):
        pairs, snapshot, stale = self.pairs, self.snapshot, self.stale

        @tf.function(autograph=False, reduce_retracing=True)
        def merge(pulled):
            """Between two steps: the copy moves by ``pulled - last pulled`` (what the worker
            trained since its last stage is kept) and the snapshot takes ``pulled``."""
            for i, ((_, c), part) in enumerate(zip(pairs, pulled, strict=True)):
                s = snapshot[i]
                if i not in stale:
                    c.assign_add(part[0] - s.read_value())
                    s.assign(part[0])
                    continue
                ids, rows = part
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
