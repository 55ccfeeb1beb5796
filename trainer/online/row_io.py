"""An online table's rows in and out of its variables: a saved table's rows taken back, its rows
read out (all, or those looked up since a step: a delta), set from exported rows, and its
counts summed up; per member of a group, under the member's own names.

``RowIO`` is the row I/O half of ``trainer.online.table.EmbeddingVariable``; it reads the
table's state variables (``keys``, ``freqs``, ``versions``, ``days``, ``row_tags``,
``stats``), its views' weights, its optimizer slots and its sketch, and leaves the step's
admission, growth and eviction to the table.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from recpipe.exports.files import TableRows
from trainer.embedding_tables import variable_name

FREE = -1
# ev_stats entries: cumulative over the model's life
STATS = ("admitted", "evicted", "refused", "lookups", "filtered")


class RowIO:
    """Rows in and out of an ``EmbeddingVariable`` (eager), whose attributes it reads (see the
    table's docstring)."""

    def load(
        self,
        saved: dict[str, np.ndarray],
        weights: list[np.ndarray | None],
        slots: list[np.ndarray | None],
        owner=None,
    ) -> int:
        """Take this process's rows of a saved table: ids owned here (``id mod W == rank`` for
        an ``owner`` sharding of W ranks, all otherwise), the most recently used first when
        more are saved than fit. ``saved`` holds ``keys``, ``freqs``, ``versions``, ``days``
        (whole-table arrays) and ``sketch``, ``stats``; ``weights`` each view's saved rows and
        ``slots`` each ``optimizer_slots`` entry's (None: start from initial values); a group's
        ``saved`` also holds ``tables`` (each row's tag): rows of other tables are left out.
        The table is reallocated at the capacity that holds the rows (``fitted``), so a
        checkpoint restores into any ``init_capacity`` / ``max_capacity``. Returns the rows
        kept; call ``refresh`` after."""
        keys = saved["keys"]
        keep = keys >= 0
        if self.grouped:  # rows of tables no longer in the group are left out
            keep &= np.isin(saved["tables"], self.tags)
        if owner is not None and owner.world_size > 1:
            keep &= keys % owner.world_size == owner.rank
        index = np.flatnonzero(keep)
        if len(index) > self.max_rows:
            index = index[np.argsort(-saved["versions"][index], kind="stable")[: self.max_rows]]
        n = len(index)
        rows = self.fitted(n)

        def packed(values, fill, selected=False):
            return _packed(values if selected else values[index], rows, fill)

        self.keys.assign(packed(keys, FREE))
        for var, name in ((self.freqs, "freqs"), (self.versions, "versions"), (self.days, "days")):
            var.assign(packed(saved[name], 0))
        if self.grouped:
            self.row_tags.assign(packed(saved["tables"], 0))
        # only a view the checkpoint lacks starts from the initializer
        starts = self.initial_values(tf.constant(keys[index])) if any(w is None for w in weights) else None
        for i, (view, saved_rows) in enumerate(zip(self.views, weights, strict=True)):
            view.weights.assign(
                packed(saved_rows, 0.0) if saved_rows is not None else packed(starts[i].numpy(), 0.0, True)
            )
        for (slot, value), saved_rows in zip(self.optimizer_slots, slots, strict=True):
            fill = np.full((rows, *slot.shape[1:]), value, np.float32)
            slot.assign(packed(saved_rows, value) if saved_rows is not None else fill)
        self.free.assign(np.zeros(rows, np.int64))
        # a sketch that widens with its fill keeps the saved width (at least its start)
        self.counter.load(saved["sketch"], self.sketch_start if self.sketch_follows else None)
        first = owner is None or owner.rank == 0  # the job's counts, once
        stats = saved["stats"]
        fits = first and stats.shape == tuple(self.stats.shape)
        self.stats.assign(stats if fits else np.zeros(self.stats.shape, np.int64))
        return n

    def ids(self) -> np.ndarray:
        """``int64 [rows]``: each row's key (``id XOR tag`` in a group), ``FREE`` for a free row."""
        return self.keys.numpy()

    def member_name(self, name: str, member: str) -> str:
        """``member``'s name for a variable of this table or group (a view's weights, an
        optimizer slot of one: ``<scope>/<group>/embedding_weights`` ->
        ``<scope>/<member>/embedding_weights``, as a table alone names them)."""
        return name.replace(f"/{self.table}/", f"/{member}/")

    def _member_index(self) -> list[tuple[str, int, np.ndarray]]:
        """``(member, tag, its used rows)`` of each member (eager)."""
        keys = self.ids()
        used = keys != FREE
        if not self.grouped:
            return [(self.table, 0, np.flatnonzero(used))]
        tags = self.row_tags.numpy()
        return [
            (m, tag, np.flatnonzero(used & (tags == tag)))
            for m, tag in zip(self.members, self.tags, strict=True)
        ]

    def member_ids(self) -> dict[str, np.ndarray]:
        """Each member's admitted ids (``int64 [n]``, the ids as the data holds them)."""
        keys = self.ids()
        return {m: keys[index] ^ tag for m, tag, index in self._member_index()}

    def rows_since(self, step: int | None = None) -> dict[str, TableRows]:
        """Each member's admitted rows, or those looked up in training after ``step``
        (versions above it: see ``EVClock.stamp``), under the member's own names."""
        keys = self.ids()
        recent = self.versions.numpy() > step if step is not None else None
        weights = [(variable_name(v.weights), v.weights.numpy()) for v in self.views]
        out = {}
        for member, tag, index in self._member_index():
            if recent is not None:
                index = index[recent[index]]
            out[member] = TableRows(
                keys[index] ^ tag, {self.member_name(n, member): w[index] for n, w in weights}
            )
        return out

    def set_rows(self, rows: dict[str, TableRows]) -> None:
        """Hold exactly ``rows`` (each member's ids in the first rows, each view's weights by
        the member's names, ``member_name``); call ``refresh`` after.

        Raises:
            ValueError: a member ``rows`` lacks, more ids than rows, or a view ``rows`` lacks.
        """
        keys, tags, values = [], [], {id(v): [] for v in self.views}
        for member, tag in zip(self.members, self.tags, strict=True):
            if member not in rows:
                raise ValueError(f"no rows for online table {member!r}")
            part = rows[member]
            keys.append(np.asarray(part.ids, np.int64) ^ tag)
            tags.append(np.full(len(part.ids), tag, np.int64))
            for view in self.views:
                name = self.member_name(variable_name(view.weights), member)
                if name not in part.views:
                    raise ValueError(f"table {member}: no rows for {name}")
                values[id(view)].append(part.views[name])
        n = sum(len(k) for k in keys)
        if n > self.max_rows:
            raise ValueError(f"table {self.table}: {n} ids over max_capacity {self.max_rows}")
        size = self.fitted(n)
        self.resize(size)
        self.keys.assign(_packed(np.concatenate(keys), size, FREE))
        if self.grouped:
            self.row_tags.assign(_packed(np.concatenate(tags), size, 0))
        for view in self.views:
            rows_of_view = np.concatenate(values[id(view)]).reshape(-1, view.dim).astype(np.float32)
            view.weights.assign(_packed(rows_of_view, size, 0.0))

    def summary(self) -> dict[str, int]:
        """``rows_used``, ``capacity`` (rows allocated now) and the cumulative ``STATS`` of
        this process's table (a group's: over its members)."""
        capacity = self.capacity_now()
        stats = self.stats.numpy().reshape(-1, len(STATS)).sum(axis=0)
        return {
            "rows_used": capacity - int(self.free_top.numpy()),
            "capacity": capacity,
            **dict(zip(STATS, stats.tolist(), strict=True)),
        }

    def member_summaries(self) -> dict[str, dict[str, int]]:
        """``summary`` of each member (``capacity``: the group's)."""
        capacity = self.capacity_now()
        stats = self.stats.numpy().reshape(-1, len(STATS))
        return {
            member: {
                "rows_used": len(index),
                "capacity": capacity,
                **dict(zip(STATS, stats[i].tolist(), strict=True)),
            }
            for i, (member, _, index) in enumerate(self._member_index())
        }


def _packed(values: np.ndarray, rows: int, fill) -> np.ndarray:
    """``values`` (``[n, ...]``) in the first of ``rows`` rows, the rest ``fill``."""
    out = np.full((rows, *values.shape[1:]), fill, values.dtype)
    out[: len(values)] = values
    return out
