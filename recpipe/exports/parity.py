"""The store matches the export: after a push, a sample of the rows it wrote, read back from the
store the way serving reads them, equals the export's rows byte for byte, and a sample of the
ids it evicted is absent.

A peer's store is trusted to hold what was pushed (TorchEasyRec cannot even delete an evicted
row); recpipe checks it, so that a lost write, a stale generation or a skipped tombstone fails
the pass that pushed it instead of serving wrong rows until the next full rebuild.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from recpipe.errors import PipelineError
from recpipe.exports.files import read_params

SAMPLE = 256  # ids per table and kind (rows, evicted) read back after each push


class StoreMismatchError(PipelineError):
    """The store serves something else than the export pushed: the message names the model, the
    table, the id and what differs."""


def expected_rows(exports: list[Path]) -> dict[str, tuple[dict[int, dict[str, np.ndarray]], set[int]]]:
    """What the store must serve after ``exports`` (in push order) were written, for the ids they
    name: per table, (id -> {view: ``float32 [dim]``} of the last export that wrote it, the ids
    whose last word was a tombstone)."""
    out: dict[str, tuple[dict[int, dict[str, np.ndarray]], set[int]]] = {}
    for export in exports:
        for table, rows in read_params(Path(export), verify=False).tables.items():
            written, evicted = out.setdefault(table, ({}, set()))
            for i, key in enumerate(rows.ids.tolist()):
                written[key] = {name: values[i] for name, values in rows.views.items()}
                evicted.discard(key)
            for key in rows.tombstones.tolist():
                written.pop(key, None)
                evicted.add(key)
    return out


def check(store, exports: list[Path], sample: int = SAMPLE, seed: int = 0) -> dict[str, int]:
    """Read back a sample of what pushing ``exports`` wrote and compare (module docstring).

    Args:
        store: a ``recpipe.exports.store.EmbeddingStore`` serving the last of ``exports``.
        exports: the base or delta directories the push wrote, in order.
        sample: ids per table and kind compared (all of them when fewer).
        seed: the sample's random seed.

    Returns:
        ``{"checked": rows compared, "absent": evicted ids found missing}``.

    Raises:
        StoreMismatchError: a sampled row differs or is missing, or an evicted id is served.
    """
    # the exports are read again, not handed over by the writer: what the store must hold comes
    # from the files, independent of what the writer made of them
    rng = np.random.default_rng(seed)
    checked = absent = 0
    for table, (written, evicted) in expected_rows(exports).items():
        ids = _sample(rng, sorted(written), sample)
        gone = _sample(rng, sorted(evicted), sample)
        served = store.lookup(table, [*ids, *gone])
        for key in ids:
            row = served.get(key)
            if row is None:
                raise StoreMismatchError(
                    f"{store.model}: table {table} id {key}: pushed, but the store lacks it"
                )
            for name, values in written[key].items():
                if name not in row or not np.array_equal(row[name], np.asarray(values, "<f4")):
                    raise StoreMismatchError(
                        f"{store.model}: table {table} id {key} view {name}: the store's row differs from "
                        f"the export's ({Path(exports[-1]).name})"
                    )
            checked += 1
        for key in gone:
            if key in served:
                raise StoreMismatchError(
                    f"{store.model}: table {table} id {key}: evicted, but the store serves it"
                )
            absent += 1
    return {"checked": checked, "absent": absent}


def _sample(rng: np.random.Generator, ids: list[int], size: int) -> list[int]:
    if len(ids) <= size:
        return ids
    return [ids[i] for i in sorted(rng.choice(len(ids), size=size, replace=False))]
