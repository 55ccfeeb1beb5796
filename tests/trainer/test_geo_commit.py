"""The GEO commit's order on the ps: a row is marked stale for the other workers only once the
update is in it, so that a worker pulling a marked row (its pull clears the mark, then reads
the row) reads it with the update. Two threads cannot force the race in a test that always
ends; the order is the traced function's own: the mark's write depends on the table's
``scatter_add`` in the graph, which these tests read, besides what a commit leaves behind."""

from __future__ import annotations

import types

import numpy as np
import tensorflow as tf

from trainer.distribute.geo import GeoReplica

ROWS, DIM, WORKERS, ME = 6, 3, 3, 1


def _commit():
    """``GeoReplica.commit_fn`` of worker ``ME`` over a dense variable (index 0) and a table
    (index 1) with a stale mark per worker; returns (commit, table, dense, marks, applied)."""
    dense = tf.Variable(tf.zeros([2]))
    table = tf.Variable(tf.zeros([ROWS, DIM]))
    marks = [tf.Variable(tf.zeros([ROWS], tf.bool), trainable=False) for _ in range(WORKERS)]
    copies = [tf.Variable(tf.zeros([2])), tf.Variable(tf.zeros([ROWS, DIM]))]
    pairs = list(zip([dense, table], copies, strict=True))
    worker = types.SimpleNamespace(pairs=pairs, stale={1: marks}, index=ME)
    applied = tf.Variable(0, dtype=tf.int64, trainable=False)
    return GeoReplica.commit_fn(worker, applied), table, dense, marks, applied


def _staged():
    ids = tf.constant([0, 4], tf.int64)
    return [(tf.constant([1.0, 2.0]),), (ids, tf.ones([2, DIM]))], tf.constant(2, tf.int64)


def _waits_for(op: tf.Operation) -> set[str]:
    """The names of every op ``op`` waits for in its graph: its inputs' producers and its
    control inputs, transitively."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for dep in [t.op for t in current.inputs] + list(current.control_inputs):
            if dep.name not in seen:
                seen.add(dep.name)
                todo.append(dep)
    return seen


def test_the_marks_are_written_after_the_rows_hold_the_update():
    """In the traced commit, each write to another worker's mark waits for the table's
    ``ResourceScatterAdd``; the committing worker's own mark is never written."""
    commit, table, _, marks, _ = _commit()
    graph = commit.get_concrete_function(*_staged()).graph
    adds = [op for op in graph.get_operations() if op.type == "ResourceScatterAdd"]
    writes = [op for op in graph.get_operations() if op.type == "ResourceScatterUpdate"]
    assert len(adds) == 1 and len(writes) == WORKERS - 1, [op.type for op in graph.get_operations()]
    for write in writes:
        assert adds[0].name in _waits_for(write), f"{write.name} may run before the rows hold the update"


def test_a_commit_adds_the_rows_and_marks_them_for_the_other_workers_only():
    commit, table, dense, marks, applied = _commit()
    commit(*_staged())
    expected = np.zeros([ROWS, DIM], np.float32)
    expected[[0, 4]] = 1.0
    np.testing.assert_array_equal(table.numpy(), expected)
    np.testing.assert_array_equal(dense.numpy(), [1.0, 2.0])
    for w, mark in enumerate(marks):
        want = [False] * ROWS if w == ME else [True, False, False, False, True, False]
        assert mark.numpy().tolist() == want, w
    assert int(applied.numpy()) == 2
