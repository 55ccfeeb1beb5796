"""Push base and delta exports (``recpipe.params``) to Redis, the online embedding store.

Each row of an online table is one Redis hash, ``<prefix>:<model>:<table>:<id>``, with a field
per layer reading the table (its variable name -> the row as little-endian float32 bytes) and
``version`` (``<day>/<name>@<global_step>`` of the export that wrote it). A tombstone deletes
the hash. ``<prefix>:<model>:applied`` records the last export pushed (``day``, ``name``,
``sequence``, ``global_step``, ``ev_step`` as a hash), so that:

- a push is idempotent: pushing the export already applied writes the same values again;
- a delta must follow the export applied (its manifest's ``follows``) on the same day, or the
  push is refused before writing anything: an out-of-order delta would bring back old rows;
- a base replaces the model's rows whole: hashes of ids the base lacks are deleted.

Dense weights stay with the SavedModel; the store holds embedding rows only (Monolith's and
PaddleRec's split between parameter server and model file).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from recpipe.errors import PipelineError
from recpipe.params import BASE, follows, read_manifest, read_params

PREFIX = "recpipe"
BATCH = 1000  # commands per pipeline round trip


class StoreError(PipelineError):
    """An export cannot be pushed (out of order, another day) or the store is unreachable."""


def row_key(model: str, table: str, key: int, prefix: str = PREFIX) -> str:
    """The Redis key of one row: ``<prefix>:<model>:<table>:<id>``."""
    return f"{prefix}:{model}:{table}:{key}"


def applied(client, model: str, prefix: str = PREFIX) -> dict[str, str]:
    """The last export pushed for ``model`` (``day``, ``name``, ``sequence``, ``global_step``,
    ``ev_step``),
    empty when none."""
    return {k.decode(): v.decode() for k, v in client.hgetall(f"{prefix}:{model}:applied").items()}


def push(client, model: str, export: Path, prefix: str = PREFIX) -> dict[str, int]:
    """Write a base or delta export's rows to Redis (``client``: a ``redis.Redis``) and record
    it as applied. Returns ``{"rows": written, "deleted": removed}``.

    Raises:
        StoreError: a delta that does not follow the export applied (names both).
        recpipe.params.DeltaError: an unfinished export or a checksum mismatch.
    """
    export = Path(export)
    manifest = read_manifest(export)
    done = applied(client, model, prefix)
    held = {**done, "ev_step": int(done.get("ev_step", -1))}
    same = all(held.get(k) == manifest[k] for k in ("day", "name", "ev_step"))
    if manifest["kind"] == "delta" and not same:
        if not done or not follows(manifest, held):
            raise StoreError(
                f"{export} follows {manifest['day']}/{manifest['follows']}, but the store holds "
                f"{done.get('day', 'nothing')}/{done.get('name', '')}: push the exports in order"
            )
    params = read_params(export)
    version = f"{manifest['day']}/{manifest['name']}@{manifest['global_step']}"
    written = deleted = 0
    pipe = client.pipeline(transaction=False)
    pending = 0

    def flush(force: bool = False) -> None:
        nonlocal pending
        if pending >= BATCH or (force and pending):
            pipe.execute()
            pending = 0

    for table, rows in params.tables.items():
        keep = set()
        for i, key in enumerate(rows.ids.tolist()):
            fields = {"version": version}
            for name, values in rows.views.items():
                fields[name] = np.ascontiguousarray(values[i], "<f4").tobytes()
            name = row_key(model, table, key, prefix)
            pipe.delete(name)  # a row is exactly the export's fields, whatever was there
            pipe.hset(name, mapping=fields)
            keep.add(name)
            pending += 1
            written += 1
            flush()
        for key in rows.tombstones.tolist():
            pipe.delete(row_key(model, table, key, prefix))
            pending += 1
            deleted += 1
            flush()
        flush(force=True)
        if manifest["kind"] == BASE:
            for name in client.scan_iter(match=row_key(model, table, "*", prefix), count=BATCH):
                if name.decode() not in keep:
                    pipe.delete(name)
                    pending += 1
                    deleted += 1
                    flush()
    flush(force=True)
    record = {k: str(manifest[k]) for k in ("day", "name", "sequence", "global_step", "ev_step")}
    client.hset(f"{prefix}:{model}:applied", mapping=record)
    return {"rows": written, "deleted": deleted}


def read_rows(client, model: str, table: str, prefix: str = PREFIX) -> dict[int, dict[str, np.ndarray]]:
    """Every row the store holds for ``table``: id -> {view name: ``float32 [dim]``}."""
    out = {}
    for name in client.scan_iter(match=row_key(model, table, "*", prefix), count=BATCH):
        key = int(name.decode().rsplit(":", 1)[1])
        fields = client.hgetall(name)
        out[key] = {k.decode(): np.frombuffer(v, "<f4") for k, v in fields.items() if k != b"version"}
    return out
