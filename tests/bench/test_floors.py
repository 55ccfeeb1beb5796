"""bench/floors.py: the push's floor writes every row of a base and its delta to Redis, as
bytes, and deletes the delta's tombstones."""

from __future__ import annotations

import numpy as np

from bench.floors import hset_rows
from recpipe.exports.files import Params, TableRows, write_export


def _export(day, name, sequence, previous, rows):
    params = Params({"item_id": rows}, {"dense/w": np.zeros(2, np.float32)}, {})
    return write_export(day, name, sequence, previous, params, sequence, sequence)


def test_hset_rows_writes_a_base_then_its_delta_with_tombstones(tmp_path, store):
    client, model = store
    view = "item_id/embedding_weights"
    base = _export(tmp_path, "base", 0, None, TableRows(np.arange(3), {view: np.eye(3, dtype="f4")}))
    delta = TableRows(np.array([1]), {view: np.full((1, 3), 7, "f4")}, tombstones=np.array([2]))
    _export(tmp_path, "delta-01", 1, base, delta)

    def key(table, row):
        return f"recpipe:{model}:{table}:{row}"

    written = hset_rows(client, [tmp_path / "base", tmp_path / "delta-01"], key, batch=2)
    assert written == 3 + 1 + 1  # three rows, one moved, one deleted
    assert np.frombuffer(client.hget(key("item_id", 0), view), "<f4").tolist() == [1, 0, 0]
    assert np.frombuffer(client.hget(key("item_id", 1), view), "<f4").tolist() == [7, 7, 7]
    assert not client.exists(key("item_id", 2))
