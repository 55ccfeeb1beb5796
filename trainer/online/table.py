"""One online table (``ev_params``) on stock TensorFlow: the id -> row map and each row's state.

A table starts at ``init_capacity`` rows (``float32 [C, dim]``, named
``<table>/embedding_weights`` as the hashed tables are) and doubles, up to ``max_capacity``,
when an admission finds no free row: its variables have an unknown first dimension, so the
train step grows them in place (with the optimizer's slots) and is never traced again; the
admission sketch widens by its own fill (``trainer.online.admission``). A
``tf.lookup.experimental.MutableHashTable`` maps an id's full 64-bit fingerprint
(``trainer.hashing`` without a modulo: no collisions beyond Fingerprint64's own) to its row.
Per row, ``ev_keys`` (the id, -1 for a free row), ``ev_freqs`` (sightings), ``ev_versions``
(the ``EVClock.stamp`` of the step it was last looked up in training) and ``ev_days`` (the last
day it was seen) are variables, shared by the layers that look the table up (the deep and wide
embeddings of a feature, each with its own weights). They are checkpointed with the weights,
and the map is rebuilt from ``ev_keys`` after every restore (``refresh``), so checkpoints need
no hash-table format and re-shard to any world size.

In training a lookup first updates the table (``admit``: ``trainer.online.admit``, on the stock
ops below or in one kernel), then reads it:

- an id with a row has its count, version and day updated;
- with ``steps_to_live`` rows whose version is older than that are evicted
  (``trainer.online.eviction``: an O(rows) scan, so it runs every ``steps_to_live // 8``
  steps; a row lives at most an eighth longer, exactly as long up to 15 steps to live);
- an id without a row is counted (``trainer.online.admission``) and admitted once its count
  reaches ``filter_freq``;
- an admitted id takes a free row (from a stack: O(new ids)); with none free the table grows
  (``_grow_state``, then ``_grow_weights``), and only at ``max_capacity`` are the least
  recently looked-up rows not used in this step evicted first; if none is left it stays
  unadmitted (``refused``). The row starts from ``trainer.online.initializer`` and its
  optimizer slots from their initial values (tf-keras' ``DynamicEmbedding`` forgets these);
- an id without a row looks up zeros and gets no gradient (DeepRec's
  ``default_value_no_permission``): its lookup is left out of the gather.

At the day boundary (``new_day``) the sketch decays and, with ``delete_after_unseen_days``,
rows not seen for that many days are evicted. Serving and evaluation only read.

Tables of one ``ev_params`` and embedding dimension form one group (``EmbeddingVariable``
over several tables, named ``ev_group_dim<dim>``), as hashed tables of one width share a
fused variable: a step's ids of every table in the group are admitted, counted, evicted and
looked up by one set of ops, and the optimizer updates one variable per view, instead of one
set per table (26 Criteo tables: ~26x fewer ops a step). Table ``t``'s ids are keyed by
``id XOR tag(t)`` (``table_tag``: a 63-bit hash of the table's name, so ids of two tables
never share a key beyond the 2^-63 chance of any two fingerprints) and each row keeps its
table's tag in ``ev_tables``: exports, deltas and summaries are still per table, and a
checkpoint restores into any grouping (rows are matched by tag, not by position). A group of
one table is the table alone: no tag, no ``ev_tables``, named after the table, exactly as
before grouping.

References: DeepRec ``Feature-Filter.md`` / ``Feature-Eviction.md`` (EmbeddingVariable);
PaddleRec ``doc/online_trainer.md`` (``delete_after_unseen_days``); TorchRec's grouped
(fused) embedding-bag collections for the grouping.
"""

from __future__ import annotations

import zlib

import numpy as np
import tensorflow as tf
import tf_keras as keras

from recpipe.config.data import EVParams
from trainer import kernels
from trainer.embedding_tables import gather_unique, rows_of
from trainer.online import eviction
from trainer.online.admission import SKETCH_DEPTH, SKETCH_NAME, CountMinSketch
from trainer.online.admit import StepAdmission, set_rows
from trainer.online.clock import EVClock
from trainer.online.initializer import initial_rows
from trainer.online.row_io import FREE, STATS, RowIO
from trainer.online.step_rows import StepRows


def table_tag(table: str) -> int:
    """The tag of ``table`` in a group, in ``[1, 2**63)``: its ids (``[0, 2**63)``,
    ``trainer.hashing``) are keyed by ``id XOR tag`` there, so keys stay non-negative (``FREE``
    and ``>= 0`` keep their meaning), and its rows carry the tag in ``ev_tables``."""
    high, low = zlib.crc32(table.encode()), zlib.crc32(f"{table}#recpipe".encode())
    return ((high << 32 | low) & (2**63 - 1)) or 1


class EmbeddingVariable(RowIO, StepAdmission):
    """One online table (see the module docstring): ids, their rows' state and the id -> row
    map, created on the first ``layer`` that builds it; each layer looking the table up gets
    its own weights over the same rows (``view``): the deep and the wide embedding of a feature
    share one map and admit once.

    Args:
        layer: the ``FeatureEmbedding`` building the table (its ``add_weight`` makes model
            variables, named ``<table>/ev_*``).
        table: the table's name (a group's: ``ev_group_dim<dim>``).
        params: the features' ``ev_params``.
        clock: the model's ``EVClock``.
        rows: rows this process holds (``max_capacity``, or its share under
            embedding-parallel sharding).
        key_union: ``(keys, counts, members) -> (keys, counts, members)`` over every
            process (Horovod, where each process holds the whole table and all must admit the
            same ids), or None.
        start_rows: rows allocated at first (default ``init_capacity``).
        members: the tables of a group (default ``[table]``: a table alone).
        fused_kernels: admission and training lookups in recpipe's kernels
            (``OnlineTables.fused_kernels``).

    Attributes:
        members: the group's tables; ``grouped``: more than one; ``tags``: each member's
            ``table_tag`` (``[0]`` for a table alone).
        row_tags: ``int64 [rows]`` each row's member tag (``ev_tables``), or None alone.
        views: each layer's ``EVView`` (weights ``float32 [rows, dim]``), the admitting one
            first.
        keys, freqs, versions, days: ``int64 [rows]`` per-row state.
        sketch: ``float32 [4 * counter_width]`` counts of ids without a row.
        stats: ``int64 [5 * members]``: admitted, evicted, refused, lookups, filtered
            (``STATS``) of each member in turn.
        sketch_used: ``int64 []`` counters of the sketch in use (an upper bound, recounted
            by ``refresh``), which decides its widening.
        map: the id -> row hash table (rebuilt from ``keys`` by ``refresh``).
        optimizer_slots: ``(slot variable, initial value)`` whose rows admission resets.
    """

    def __init__(
        self,
        layer,
        table: str,
        params: EVParams,
        clock: EVClock,
        rows: int,
        key_union=None,
        start_rows: int | None = None,
        members: list[str] | None = None,
        fused_kernels: bool = False,
    ):
        self.table, self.params, self.clock, self.max_rows = table, params, clock, rows
        self.fused_kernels = fused_kernels
        self.members = list(members or [table])
        self.grouped = len(self.members) > 1
        self.tags = [table_tag(t) for t in self.members] if self.grouped else [0]
        self.start_rows = min(rows, start_rows or params.start_capacity)
        self.key_union = key_union
        self.salt = zlib.crc32(table.encode())
        state = _weights_of(layer, table, self.start_rows)
        self.keys = state("ev_keys", (None,), tf.int64, FREE)
        # each row's table tag (table_tag), in a group of several tables only
        self.row_tags = state("ev_tables", (None,), tf.int64) if self.grouped else None
        self.freqs = state("ev_freqs", (None,), tf.int64)
        self.versions = state("ev_versions", (None,), tf.int64)
        self.days = state("ev_days", (None,), tf.int64)
        # the sketch widens with its fill unless filter_counter_width fixes it
        self.sketch_follows = not params.filter_counter_width
        width = params.counter_width(self.start_rows)
        self.sketch_start = width
        self.sketch_most = max(width, params.counter_width(rows))
        self.sketch = _weights_of(layer, table, SKETCH_DEPTH * width)(SKETCH_NAME, (None,), tf.float32, 0.0)
        self.counter = CountMinSketch(self.sketch)
        self.sketch_used = state("ev_filter_used", (), tf.int64)  # counters in use (an upper bound)
        self.stats = state("ev_stats", (len(STATS) * len(self.members),), tf.int64)  # per member
        # free rows as a stack (rows [0, top) of ev_free_rows), so that a step takes rows in
        # O(new ids); rebuilt from ev_keys by refresh(), whatever a checkpoint held
        self.free = state(
            "ev_free_rows", (None,), tf.int64, lambda shape, dtype: tf.range(shape[0] - 1, -1, -1, dtype)
        )
        self.free_top = state("ev_free_top", (), tf.int64, self.start_rows)
        self.map = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=FREE)
        self.views: list[EVView] = []
        # while a serving signature traces: rows a client read from the store (trainer.online.served)
        self.served = None
        self.optimizer_slots: list[tuple[tf.Variable, float]] = []

    def view(self, layer, dim: int) -> EVView:
        """Weights ``float32 [rows, dim]`` of ``layer`` over this table's rows (named
        ``<table>/embedding_weights``, as hashed tables are); the first view admits."""
        state = _weights_of(layer, self.table, self.capacity_now())
        weights = state("embedding_weights", (None, dim), tf.float32, 0.0, True)
        view = EVView(self, weights, dim, admits=not self.views)
        self.views.append(view)
        return view

    def capacity(self) -> tf.Tensor:
        """``int64 []``: the rows allocated now (``init_capacity`` .. ``max_capacity``)."""
        return rows_of(self.keys)

    def capacity_now(self) -> int:
        """The rows allocated now, as a Python int (eager)."""
        return int(self.capacity().numpy())

    @property
    def grown_variables(self) -> list[tuple[tf.Variable, object]]:
        """``(variable, fill)`` of every variable with one entry per row, optimizer slots
        included: what growth and ``resize`` extend, and the value of a new row."""
        return self._state_grown + self._weights_grown

    @property
    def _state_grown(self) -> list[tuple[tf.Variable, object]]:
        """``grown_variables`` of the rows' state (ids, counts, versions, days, free stack)."""
        rows = [(self.keys, FREE), (self.freqs, 0), (self.versions, 0), (self.days, 0), (self.free, 0)]
        return rows + ([(self.row_tags, 0)] if self.grouped else [])

    @property
    def _weights_grown(self) -> list[tuple[tf.Variable, object]]:
        """``grown_variables`` of the rows' weights and optimizer slots."""
        return [(v.weights, 0.0) for v in self.views] + list(self.optimizer_slots)

    @property
    def row_variables(self) -> list[tf.Variable]:
        """The variables with one entry per row (sharded with the rows)."""
        tags = [self.row_tags] if self.grouped else []
        return [
            *(v.weights for v in self.views),
            self.keys,
            self.freqs,
            self.versions,
            self.days,
            self.free,
            *tags,
        ]

    @property
    def derived_variables(self) -> list[tf.Variable]:
        """Variables ``refresh`` rebuilds from ``keys`` and the sketch (checkpointed, never read
        back)."""
        return [self.free, self.free_top, self.sketch_used]

    @property
    def summed_variables(self) -> list[tf.Variable]:
        """Per-process counts that add up to the job's (sketch and stats)."""
        return [self.sketch, self.stats]

    # -- training-time updates (the admission itself: trainer.online.admit) ----------------
    def _per_member(self, values: tf.Tensor, member: tf.Tensor | None) -> tf.Tensor:
        """``int64 [n]`` values of keys of ``member`` (``int64 [n]``, None alone) summed per
        member: ``int64 [members]``."""
        if member is None:
            return tf.reshape(tf.reduce_sum(values, 0), [1])
        return tf.math.unsorted_segment_sum(values, member, len(self.members))

    def _members_of_rows(self, slots: tf.Tensor) -> tf.Tensor | None:
        """Each of ``slots``' member index (``int64 [n]``, from its tag), None alone."""
        if not self.grouped:
            return None
        tags = tf.gather(self.row_tags, slots)
        match = tf.equal(tf.expand_dims(tags, 1), tf.constant(self.tags, tf.int64))
        return tf.argmax(tf.cast(match, tf.int32), axis=1, output_type=tf.int64)

    def _padded(self, variables: list[tuple[tf.Variable, object]], rows: tf.Tensor) -> list:
        """Extend each of ``variables`` (``(variable, fill)``) to ``rows`` rows at its fill,
        one variable at a time: the old and new buffers of all of them at once would be a
        transient of 3x the rows' memory (the job's peak RSS), one at a time it is one
        variable's. With ``fused_kernels`` in one op (``trainer.kernels.grow_rows``). Returns
        the last assignment (for control dependencies)."""
        if self.fused_kernels:
            return [kernels.grow_rows([v for v, _ in variables], [f for _, f in variables], rows)]
        done: list = []
        for var, fill in variables:
            with tf.control_dependencies(done):
                # pad, not concat with a filled block: one new buffer, not two
                extra = rows - rows_of(var)
                pads = tf.pad(tf.reshape(extra, [1, 1]), [[0, var.shape.rank - 1], [1, 0]])
                longer = tf.pad(var.read_value(), pads, constant_values=tf.constant(fill, var.dtype))
                done = [var.assign(longer, read_value=False)]
        return done

    def _grow_weights(self) -> tf.Operation:
        """Extend the weights and optimizer slots to the rows the state has (``capacity``),
        when ``_grow_state`` extended it."""
        cap = self.capacity()
        if self.fused_kernels:  # the kernel leaves variables that long as they are
            self._padded(self._weights_grown, cap)
            return tf.no_op()
        first = self._weights_grown[0][0]
        tf.cond(rows_of(first) < cap, lambda: self._padded(self._weights_grown, cap) and tf.no_op(), tf.no_op)
        return tf.no_op()

    def _grow_state(self, rows: tf.Tensor) -> tf.Operation:
        """Extend the rows' state (ids, counts, versions, days, free stack) to ``rows``
        (``int64 []``, more than now), the new rows on the free stack (the lowest on top); the
        weights and optimizer slots follow in ``_grow_weights``. No retrace: the shapes are
        dynamic."""
        cap = self.capacity()
        extra = rows - cap
        top = tf.convert_to_tensor(self.free_top)
        done = self._padded(self._state_grown, rows)
        with tf.control_dependencies(done):
            top = tf.identity(top)
        # the free stack now has `rows` entries: push the new rows above the top
        set_rows(self.free, tf.range(top, top + extra), tf.range(rows - 1, cap - 1, -1, dtype=tf.int64))
        self.free_top.assign_add(extra)
        return tf.no_op()

    def resize(self, rows: int) -> None:
        """Eager: reallocate every row variable and slot at ``rows`` rows, all free (keys
        ``FREE``, zeros, slots at their initial values); the caller fills them, then calls
        ``refresh``. The sketch keeps its counts."""
        for var, fill in self.grown_variables:
            var.assign(np.full((rows, *var.shape[1:]), fill, var.dtype.as_numpy_dtype))
        self.free_top.assign(0)

    def fitted(self, n: int) -> int:
        """Rows to allocate for ``n`` ids: ``init_capacity`` doubled until it holds them, at
        most ``max_capacity``."""
        rows = self.start_rows
        while rows < n and rows < self.max_rows:
            rows *= 2
        return min(rows, self.max_rows)

    def evict(self, slots: tf.Tensor) -> tf.Tensor:
        """Free ``slots`` (``int64 [n]``): drop their ids from the map, clear their rows, push
        them on the free stack. Returns the rows freed per member (``int64 [members]``)."""
        freed = self._evict_state(slots)
        for view in self.views:
            set_rows(view.weights, slots, tf.constant(0.0))
        return freed

    def _evict_state(self, slots: tf.Tensor) -> tf.Tensor:
        """``evict`` but the weights (``_write_rows`` clears them)."""
        freed = self._per_member(tf.ones_like(slots), self._members_of_rows(slots))
        self.map.remove(tf.gather(self.keys, slots))
        set_rows(self.keys, slots, tf.constant(FREE, tf.int64))
        zero = tf.constant(0, tf.int64)
        for var in (self.freqs, self.versions, self.days):
            set_rows(var, slots, zero)
        n = tf.size(slots, out_type=tf.int64)
        top = tf.convert_to_tensor(self.free_top)
        set_rows(self.free, tf.range(top, top + n), tf.reverse(slots, [0]))
        self.free_top.assign_add(n)
        return freed

    def _write_rows(self, cleared: tf.Tensor, slots: tf.Tensor, keys: tf.Tensor) -> None:
        """A step's writes to the weights and optimizer slots, after every op on the rows'
        state: extend them to the rows the state grew to, clear the rows evicted
        (``cleared``), give the admitted ``keys`` at ``slots`` fresh initial values and reset
        their optimizer slots."""
        self._grow_weights()
        for view in self.views:
            set_rows(view.weights, cleared, tf.constant(0.0))
        for view, rows in zip(self.views, self.initial_values(keys), strict=True):
            set_rows(view.weights, slots, rows)
        for slot, value in self.optimizer_slots:
            set_rows(slot, slots, tf.constant(value, slot.dtype))

    def initial_values(self, keys: tf.Tensor) -> list[tf.Tensor]:
        """Each view's initial rows of ``keys`` (``int64 [n]``): ``float32 [n, dim]`` per view,
        consecutive columns of one ``initial_rows`` draw (one hash for every view)."""
        rows = initial_rows(keys, sum(v.dim for v in self.views), self.salt)
        return tf.split(rows, [v.dim for v in self.views], axis=1) if len(self.views) > 1 else [rows]

    # -- eager maintenance -----------------------------------------------------------------
    def register_optimizer(self, optimizer) -> None:
        """Reset the views' slots of ``optimizer`` (tf-keras, built) for admitted rows:
        ``accumulator`` (Adagrad, FTRL) to ``initial_accumulator_value``, others (Adam ``m``
        and ``v``, FTRL ``linear``, momentum) to 0."""
        names = {v.weights.name.split(":")[0] for v in self.views}
        for slot in optimizer.variables:
            slot_name, _, var_name = slot.name.split(":")[0].partition("/")
            if var_name in names:
                value = (
                    getattr(optimizer, "initial_accumulator_value", 0.0)
                    if slot_name == "accumulator"
                    else 0.0
                )
                self.optimizer_slots.append((slot, float(value)))

    def refresh(self) -> None:
        """Rebuild the id -> row map and the free stack from ``keys`` (after a restore or a
        broadcast)."""
        old, _ = self.map.export()
        self.map.remove(old)
        used = tf.reshape(tf.where(self.keys >= 0), [-1])
        self.map.insert(tf.gather(self.keys, used), used)
        free = tf.reverse(tf.reshape(tf.where(self.keys < 0), [-1]), [0])  # the lowest row on top
        self.free.assign(
            tf.concat([free, tf.zeros([self.capacity() - tf.size(free, tf.int64)], tf.int64)], 0)
        )
        self.free_top.assign(tf.size(free, out_type=tf.int64))
        self.sketch_used.assign(self.counter.used())

    def new_day(self, day: int) -> int:
        """The day boundary: decay the sketch, evict rows unseen for
        ``delete_after_unseen_days``. Returns the rows evicted."""
        p = self.params
        self.counter.decay(p.filter_counter_decay)
        if not p.delete_after_unseen_days:
            return 0
        freed = self.evict(eviction.unseen_for_days(self.keys, self.days, day, p.delete_after_unseen_days))
        zero = tf.zeros_like(freed)
        self.stats.assign_add(tf.reshape(tf.stack([zero, freed, zero, zero, zero], axis=1), [-1]))
        return int(tf.reduce_sum(freed))


class EVView:
    """One layer's weights over an ``EmbeddingVariable``'s rows.

    Attributes:
        ev: the table.
        weights: ``float32 [rows, dim]``, trainable.
        dim: row width.
        admits: this view's training lookups admit, count and evict (the first view's).
    """

    def __init__(self, ev: EmbeddingVariable, weights: tf.Variable, dim: int, admits: bool):
        self.ev, self.weights, self.dim, self.admits = ev, weights, dim, admits

    def rows_of(self, keys: tf.Tensor, slots: tuple | None = None) -> tf.Tensor:
        """``int64 [N]`` ids -> ``float32 [N, dim]``: their rows, zeros for ids without one
        (left out of the gather, so they get no gradient). ``slots``: ``(rows int64 [U], index
        int64 [N])`` of ``keys`` already known (``EmbeddingVariable.count``): the rows of the
        distinct keys (-1: none) and each key's place among them; each row is then gathered
        once (its gradient one entry a row: ``gather_unique``) and ``index`` spreads them over
        ``keys``; in one kernel with ``fused_kernels`` (``trainer.kernels.gather_rows``)."""
        if slots is None:
            return gather_found(self.weights, _found(self.ev.map.lookup(keys)))
        if self.ev.fused_kernels:
            return kernels.gather_rows(self.weights, *slots)
        return gather_found(self.weights, _found(*slots))

    def lookup(
        self,
        keys: tf.Tensor,
        counts: tf.Tensor | None = None,
        training: bool = False,
        members: tf.Tensor | None = None,
        step_rows: StepRows | None = None,
    ) -> tf.Tensor:
        """Rows of ``keys`` (``int64`` of shape ``S``) -> ``float32 [*S, dim]``; in training the
        admitting view first updates the table (``EmbeddingVariable.count``). ``counts``
        (``int64``, shape ``S``) are the sightings each key stands for (default 1 each);
        ``members`` (``int64 [N]``, flat keys only) each key's member in a group. ``step_rows``:
        the model call's ``StepRows``; the admitting view puts its rows there and a later view
        given the same ``keys`` tensor takes them (one admission and one lookup a step)."""
        if self.ev.served is not None and not training:
            return self.ev.served.lookup(self, keys, members)
        flat = keys.shape.rank == 1  # an id feature's batch: no reshapes to trace
        ids = keys if flat else tf.reshape(keys, [-1])
        counts = counts if counts is None or flat else tf.reshape(counts, [-1])
        slots = None
        ahead = self.ev.clock.ahead
        if ahead.recording and not tf.executing_eagerly():
            # an admission pass (trainer.online.ahead): admit, record, read nothing
            if self.admits:
                ahead.recorded.append(self.ev.count(ids, counts, members))
            return tf.zeros(tf.concat([tf.shape(keys), [self.dim]], axis=0), self.weights.dtype)
        if training and self.admits:
            slots = ahead.take() if ahead.replaying else self.ev.count(ids, counts, members)
            if step_rows is not None:
                step_rows.put(self.ev, keys, slots)
        elif training and step_rows is not None:
            slots = step_rows.get(self.ev, keys)
        if flat:
            return self.rows_of(keys, slots)
        rows = self.rows_of(ids, slots)
        return tf.reshape(rows, tf.concat([tf.shape(keys), [self.dim]], axis=0))

    def member_keys(
        self,
        columns: list[tuple[int, tf.Tensor]],
        tails: list[tuple[int, tf.Tensor]],
        step_rows: StepRows | None = None,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """A group's keys for one step, each id XOR its member's tag: ``columns`` (member index,
        an id feature's ``int64 [B]``), batch-major (``[B, len(columns)]`` flattened, so that
        their rows reshape to ``[B, F, dim]`` with no copy), then ``tails`` (member index, a tag
        feature's ``int64 [n_i]``) in turn. Returns ``(keys int64 [N], members int64 [N])``. The
        layers given one ``step_rows`` that pass the same ids get the same tensors, so that a
        later view takes the admitting view's rows instead of looking them up again."""
        if step_rows is None:
            return self._member_keys(columns, tails)
        sig = tuple((i, ids.ref()) for i, ids in columns), tuple((i, ids.ref()) for i, ids in tails)
        return step_rows.member_keys(self.ev, sig, lambda: self._member_keys(columns, tails))

    def _member_keys(self, columns: list, tails: list) -> tuple[tf.Tensor, tf.Tensor]:
        ev = self.ev
        keys, members = [], []
        if columns:
            block = tf.stack([ids for _, ids in columns], axis=1)
            tags = tf.constant([[ev.tags[i] for i, _ in columns]], tf.int64)
            keys.append(tf.reshape(tf.bitwise.bitwise_xor(block, tags), [-1]))
            index = tf.constant([[i for i, _ in columns]], tf.int64)
            members.append(tf.reshape(tf.tile(index, tf.stack([tf.shape(block)[0], 1])), [-1]))
        for i, ids in tails:
            keys.append(tf.bitwise.bitwise_xor(ids, tf.constant(ev.tags[i], tf.int64)))
            members.append(tf.fill(tf.shape(ids, out_type=tf.int64), tf.constant(i, tf.int64)))
        return (keys[0], members[0]) if len(keys) == 1 else (tf.concat(keys, 0), tf.concat(members, 0))


def gather_found(weights: tf.Variable, found: tuple) -> tf.Tensor:
    """The stock ops' lookup (``trainer.kernels.gather_rows`` is its fused twin): ``float32
    [N, dim]`` rows of ``weights`` (``float32 [rows, dim]``) at ``found`` (``_found``), zeros
    for keys without a row; with an ``index`` each row is gathered once (``gather_unique``)."""
    hit, miss, rows, index = found
    dim = weights.shape[1]
    got = gather_unique(weights, rows) if index is not None else tf.gather(weights, rows)
    # rows in their places, zeros in the others: a stitch copies the rows once, where a
    # scatter_nd into zeros writes the whole view
    zeros = tf.zeros(tf.stack([tf.size(miss), dim]), got.dtype)
    stitched = tf.dynamic_stitch([hit, miss], [got, zeros])
    if index is not None:
        stitched = tf.gather(stitched, index)
    return tf.reshape(stitched, [-1, dim])


def _found(slots: tf.Tensor, index: tf.Tensor | None = None) -> tuple:
    """``(hit int32 [n], miss int32 [U - n], rows int64 [n], index)``: the positions of
    ``slots`` (``int64 [U]``) that hold a row and of those that do not, the rows, and
    ``index`` as given (``int64 [N]``, each key's place among ``slots``; None: one slot a key)."""
    has = tf.cast(slots >= 0, tf.int32)
    miss, hit = tf.dynamic_partition(tf.range(tf.size(slots)), has, 2)
    return hit, miss, tf.dynamic_partition(slots, has, 2)[1], index


def _weights_of(layer, table: str, rows: int):
    """``state(name, shape, dtype, value, trainable)``: a weight of ``layer`` named
    ``<table>/<name>``, initialised to ``value`` (a constant or an initializer). A ``None``
    first dimension makes a variable of unknown length (it can grow), ``rows`` long at first."""

    def state(name, shape, dtype, value=0, trainable=False):
        init = value if callable(value) else keras.initializers.Constant(value)
        if shape and shape[0] is None:
            start = (rows, *shape[1:])
            initializer = lambda _, dtype=None: init(start, dtype=dtype)  # noqa: E731
        else:
            initializer = init
        return layer.add_weight(
            name=f"{table}/{name}", shape=shape, dtype=dtype, initializer=initializer, trainable=trainable
        )

    return state
