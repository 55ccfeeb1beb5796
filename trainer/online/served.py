"""Rows a client read from the online store, served to the model in place of its own tables.

A stream model's embedding rows live in Redis (``recpipe.exports.store``) and its dense part in
the SavedModel. Two extra signatures let a client score with the store's rows
(``trainer.serving``): ``ids`` returns, for each table of the store (a group's member), the
ids a request looks up, as the data holds them; ``serving_rows`` takes the request, and for
each table the ids the client found in the store with each view's rows, and scores as
``serving_default`` would had the SavedModel's tables held those rows. An id the client has no
row for gets the zero row, as an id the tables lack does (``EVView.rows_of``).

During tracing, ``EmbeddingVariable.served`` holds a ``RecordIds`` or a ``ProvidedRows``, which
``EVView.lookup`` answers from instead of the table.
"""

from __future__ import annotations

import tensorflow as tf

from trainer.embedding_tables import variable_name


class RecordIds:
    """Collect the keys (``int64``) and their member index each lookup of one table asks for,
    answering with zero rows."""

    def __init__(self, ev):
        self.ev, self.keys, self.members = ev, [], []

    def lookup(self, view, keys: tf.Tensor, members: tf.Tensor | None) -> tf.Tensor:
        flat = tf.reshape(keys, [-1])
        self.keys.append(flat)
        self.members.append(tf.zeros_like(flat) if members is None else tf.reshape(members, [-1]))
        return tf.zeros(tf.concat([tf.shape(keys), [view.dim]], axis=0), view.weights.dtype)

    def ids(self) -> dict[str, tf.Tensor]:
        """Each member table -> its distinct ids as the data holds them (``int64 [K]``)."""
        keys, members = tf.concat(self.keys, 0), tf.concat(self.members, 0)
        out = {}
        for i, (member, tag) in enumerate(zip(self.ev.members, self.ev.tags, strict=True)):
            mine = tf.boolean_mask(keys, tf.equal(members, i))
            out[member] = tf.unique(tf.bitwise.bitwise_xor(mine, tf.constant(tag, tf.int64)))[0]
        return out


class ProvidedRows:
    """One table's rows as the client read them: for each member, ``ids`` (``int64 [K_m]``)
    and each view's rows (``float32 [K_m, dim]``, by the store's field name)."""

    def __init__(self, ev, ids: dict[str, tf.Tensor], rows: dict[str, tf.Tensor]):
        keys = [
            tf.bitwise.bitwise_xor(ids[m], tf.constant(t, tf.int64))
            for m, t in zip(ev.members, ev.tags, strict=True)
        ]
        self.keys = tf.concat(keys, 0)
        self.order = tf.argsort(self.keys)
        self.sorted = tf.gather(self.keys, self.order)
        self.rows = {}
        for view in ev.views:
            name = variable_name(view.weights)
            self.rows[id(view)] = tf.concat([rows[ev.member_name(name, m)] for m in ev.members], 0)

    def lookup(self, view, keys: tf.Tensor, members: tf.Tensor | None) -> tf.Tensor:
        flat = tf.reshape(keys, [-1])
        n = tf.size(self.sorted)
        place = tf.minimum(tf.searchsorted(self.sorted, flat), tf.maximum(n - 1, 0))
        # an empty set of rows: every key misses (the gather reads a padded row)
        padded = tf.concat([self.sorted, tf.constant([0], tf.int64)], 0)
        hit = tf.logical_and(n > 0, tf.equal(tf.gather(padded, place), flat))
        table = tf.concat([self.rows[id(view)], tf.zeros([1, view.dim], view.weights.dtype)], 0)
        index = tf.where(hit, tf.gather(tf.concat([self.order, [n]], 0), place), n)
        found = tf.gather(table, index)
        return tf.reshape(found, tf.concat([tf.shape(keys), [view.dim]], axis=0))


def row_inputs(tables) -> dict[str, dict]:
    """The ``serving_rows`` inputs of ``tables`` (``online.tables(model)``): member ->
    ``{"ids": input name, "views": {store field name: (input name, dim)}}``."""
    out = {}
    for ev in tables:
        for member in ev.members:
            views = {
                ev.member_name(variable_name(v.weights), member): (f"rows_{member}_{k}", v.dim)
                for k, v in enumerate(ev.views)
            }
            out[member] = {"ids": f"ids_{member}", "views": views}
    return out
