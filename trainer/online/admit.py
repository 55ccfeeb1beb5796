"""A step's admission of its ids into an online table, on the stock TensorFlow ops (the
reference) or in recpipe's kernel (``trainer.kernels.admit``, ``train_config.fused_kernels``):
the ids' rows found and updated, eviction by steps, the count-min filter
(``trainer.online.admission``), growth or eviction of the least recently used rows when too few
are free, free rows given, the step's statistics (the module docstring of
``trainer.online.table`` says what each does).

``StepAdmission`` is the admission half of ``trainer.online.table.EmbeddingVariable``: it reads
and writes the table's state variables and map, and leaves the rows' weights, slots and growth
(``_write_rows``, ``_grow_state``), eviction (``_evict_state``) and row I/O to the table.

References: DeepRec ``Feature-Filter.md`` / ``Feature-Eviction.md``; HKV's LRU eviction.
"""

from __future__ import annotations

import tensorflow as tf

from trainer import kernels
from trainer.online import eviction
from trainer.online.admission import SKETCH_DEPTH, fitted_width, ready


def set_rows(var: tf.Variable, index: tf.Tensor, values) -> None:
    """``var[index] = values`` (a scalar ``values`` fills every indexed row): one op."""
    tf.raw_ops.ResourceScatterUpdate(resource=var.handle, indices=index, updates=values)


class StepAdmission:
    """A training step's admission into an ``EmbeddingVariable`` (graph or eager), whose
    attributes it reads (see the table's docstring)."""

    def count(self, keys: tf.Tensor, counts: tf.Tensor | None, members: tf.Tensor | None = None) -> None:
        """Admit, count and evict for one step's ``keys`` (``int64 [N]``), each standing for
        ``counts`` sightings (``int64 [N]``; default 1); in a group ``members`` (``int64 [N]``)
        is each key's member index. Returns ``(rows int64 [U], index int64 [N])``: the rows of
        the distinct keys after admission (-1 for ids without one) and each key's place among
        them (``tf.unique``'s), so that a lookup gathers each row once; or None where the ids
        admitted are the union over processes (``key_union``) and the caller looks them up.

        Raises:
            ValueError: a group's keys without ``members``."""
        if self.grouped and members is None:
            raise ValueError(f"online table group {self.table}: keys need their member tables")
        if counts is None:
            unique, index, occurrences = tf.unique_with_counts(keys, out_idx=tf.int64)
        else:
            unique, index = tf.unique(keys, out_idx=tf.int64)
            occurrences = tf.math.unsorted_segment_sum(counts, index, tf.size(unique, out_type=tf.int64))
        member = None
        if self.grouped:  # a key's member is the same wherever it occurs
            member = tf.math.unsorted_segment_max(members, index, tf.size(unique, out_type=tf.int64))
        if self.key_union is not None:
            unique, occurrences, member = self.key_union(unique, occurrences, member)
            self.admit(unique, occurrences, member)
            return None
        return self.admit(unique, occurrences, member), index

    def admit(self, keys: tf.Tensor, occurrences: tf.Tensor, member: tf.Tensor | None = None) -> tf.Tensor:
        """Update the table for one step's distinct ``keys`` (``int64 [U]``) seen
        ``occurrences`` (``int64 [U]``) times each, of ``member`` (``int64 [U]``, a group's
        member index; None alone): count, evict, admit (module docstring).
        Returns their rows now (``int64 [U]``, -1 for ids left without one): the rows they
        had (eviction spares the rows used in this step) and the ones admission gave them."""
        if self.fused_kernels:
            return self._admit_fused(keys, occurrences, member)
        p = self.params
        step, day = self.clock.stamp(), tf.convert_to_tensor(self.clock.day)
        slots = self.map.lookup(keys)
        # partition 0: ids without a row, 1: ids with one
        part = tf.cast(slots >= 0, tf.int32)
        miss, _ = tf.dynamic_partition(keys, part, 2)
        miss_occ, hit_occ = tf.dynamic_partition(occurrences, part, 2)
        _, hit_slots = tf.dynamic_partition(slots, part, 2)
        miss_member = None if member is None else tf.dynamic_partition(member, part, 2)[0]
        tf.raw_ops.ResourceScatterAdd(resource=self.freqs.handle, indices=hit_slots, updates=hit_occ)
        set_rows(self.versions, hit_slots, step)
        set_rows(self.days, hit_slots, day)
        evicted, cleared = self._evict_stale(step)
        ready_ids, count, index = ready(self.counter, miss, miss_occ, p.filter_freq)
        flags = tf.cast(ready_ids, tf.int64)
        order = tf.cumsum(flags)  # 1-based rank among the ready ids
        n_ready = tf.reduce_sum(flags, 0)
        victims = self._make_room(n_ready, step)
        targets = self._pop_rows(n_ready)
        m = tf.size(targets, out_type=tf.int64)
        admitted = ready_ids & (order <= m)
        admitted_at = tf.reshape(tf.where(admitted), [-1])
        if index is not None:  # ids left without a row keep their counts (max with 0: no-op)
            self.sketch_used.assign_add(self.counter.keep(index, tf.where(admitted, 0.0, count)))
            if self.sketch_follows:
                with tf.control_dependencies([targets]):  # not while the rows grow (peak RSS)
                    self._widen_sketch()
        new_keys = tf.gather(miss, admitted_at)
        new_member = None if miss_member is None else tf.gather(miss_member, admitted_at)
        evicted += self._per_member(tf.ones_like(victims), self._members_of_rows(victims))
        self._fill_state(
            targets, new_keys, tf.cast(tf.gather(count, admitted_at), tf.int64), step, day, new_member
        )
        filtered = tf.where(admitted, tf.zeros_like(miss_occ), miss_occ)
        refused = tf.cast(ready_ids & tf.logical_not(admitted), tf.int64)
        per_member = [
            self._per_member(tf.cast(admitted, tf.int64), miss_member),
            evicted,
            self._per_member(refused, miss_member),
            self._per_member(occurrences, member),
            self._per_member(filtered, miss_member),
        ]
        self.stats.assign_add(tf.reshape(tf.stack(per_member, axis=1), [-1]))
        # last, the ops on the rows' weights and slots: a batch admitted ahead of the one
        # training runs everything before them beside that batch's step (trainer.online.ahead)
        self._write_rows(tf.concat([cleared, victims], 0), targets, new_keys)
        # the admitted ids' places among `keys`: misses keep their order in dynamic_partition
        placed = tf.gather(tf.where(slots < 0), admitted_at)
        return tf.tensor_scatter_nd_update(slots, placed, targets)

    def _admit_fused(self, keys: tf.Tensor, occurrences: tf.Tensor, member: tf.Tensor | None) -> tf.Tensor:
        """``admit`` in recpipe's kernel (``trainer.kernels.admit``): every step of it on the
        rows' state in one op, no branch traced; the weights and slots written as here."""
        step, day = self.clock.stamp(), tf.convert_to_tensor(self.clock.day)
        rows, targets, new_keys, cleared = kernels.admit(self, keys, occurrences, member, step, day)
        self._write_rows(cleared, targets, new_keys)
        return rows

    def _evict_stale(self, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """With ``steps_to_live``, evict the rows not looked up for that many steps: an O(rows)
        scan every ``steps_to_live // 8`` steps (exact up to 15 steps to live). Returns the rows
        freed per member (``int64 [members]``) and the rows (``int64 [n]``), whose weights the
        caller clears last (``_write_rows``)."""
        p = self.params
        evicted = tf.zeros([len(self.members)], tf.int64)
        cleared = tf.zeros([0], tf.int64)
        if not p.steps_to_live:
            return evicted, cleared
        period = max(1, p.steps_to_live // 8)

        def stale():
            slots = eviction.stale_by_steps(self.keys, self.versions, step, p.steps_to_live)
            return self._evict_state(slots), slots

        return tf.cond(step % period == 0, stale, lambda: (evicted, cleared))

    def _widen_sketch(self) -> None:
        """Double the sketch's width until at most half its counters are in use (recounted
        exactly first: ``sketch_used`` over-counts), up to ``sketch_most`` counters a hash."""

        def widen():
            used = self.counter.used()
            self.sketch_used.assign(used)
            width = self.counter.width()
            target = fitted_width(used, width, self.sketch_most)
            tf.cond(target > width, lambda: self.counter.grow(target) or tf.no_op(), tf.no_op)
            return tf.no_op()

        full = 2 * tf.convert_to_tensor(self.sketch_used) > SKETCH_DEPTH * self.counter.width()
        tf.cond(full & (self.counter.width() < self.sketch_most), widen, tf.no_op)

    def _make_room(self, n: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
        """Make ``n`` rows free for new ids. When too few are free the table grows (``grow``);
        at ``max_capacity`` the least recently used rows not looked up at ``step`` are evicted
        first and returned (``victims``, their tags kept: ``admit`` counts them per member):
        as many as missing, and at least 1/64 of the table, so that the O(rows) search runs
        once per many admissions (``eviction.least_recently_used``). Fewer rows are free when
        the table holds no more."""
        short = n - tf.convert_to_tensor(self.free_top)
        cap = self.capacity()
        tf.cond(
            (short > 0) & (cap < self.max_rows),
            lambda: self._grow_state(tf.minimum(tf.maximum(2 * cap, cap + short), self.max_rows)),
            tf.no_op,
        )
        need = n - tf.convert_to_tensor(self.free_top)

        def lru():
            victims = eviction.least_recently_used(self.keys, self.versions, step, need)
            self._evict_state(victims)
            return victims

        return tf.cond(need > 0, lru, lambda: tf.zeros([0], tf.int64))

    def _pop_rows(self, n: tf.Tensor) -> tf.Tensor:
        """Up to ``n`` rows popped from the free stack (``int64 [m]``, the lowest first)."""
        top = tf.convert_to_tensor(self.free_top)
        m = tf.minimum(n, top)
        targets = tf.gather(self.free, tf.range(top - 1, top - m - 1, -1))
        self.free_top.assign_sub(m)
        return targets

    def _fill_state(self, slots, keys, freqs, step, day, member=None) -> None:
        """Give ``keys`` (of ``member``, a group's member indices) the rows ``slots`` (their
        weights come in ``_write_rows``)."""
        self.map.insert(keys, slots)
        if member is not None:
            set_rows(self.row_tags, slots, tf.gather(tf.constant(self.tags, tf.int64), member))
        set_rows(self.keys, slots, keys)
        set_rows(self.freqs, slots, freqs)
        set_rows(self.versions, slots, step)
        set_rows(self.days, slots, day)
