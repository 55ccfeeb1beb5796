"""Push base and delta exports (``recpipe.exports.files``) to Redis, the online embedding store.

Each row of an online table is one Redis hash, ``<prefix>:<model>:<table>:<id>``, with a field
per layer reading the table (its variable name -> the row as little-endian float32 bytes) and
``version`` (``<day>/<name>@<global_step>`` of the export that wrote it). A tombstone deletes
the hash. ``<prefix>:<model>:applied`` records the last export pushed (``day``, ``name``,
``sequence``, ``global_step``, ``ev_step`` as a hash). Exports are ordered by ``(day,
sequence)``, so that:

- a push is idempotent: pushing the export already applied writes the same values again;
- a push never moves the store backwards: an export older than the one applied (a cleared
  or late task of an earlier pass) is a no-op with a warning (``stale``), so rows admitted
  since are kept;
- a delta must follow the export applied (its manifest's ``follows``); one further ahead
  (a store that was flushed or restarted, a push lost earlier) is refused before writing
  anything (``StoreBehind``): the caller pushes the day's chain in order instead;
- a base replaces the model's rows whole: hashes of ids (and tables) the base lacks are
  deleted, found by one scan of the model's keys.

Each row is replaced in a ``MULTI``/``EXEC`` transaction (its ``DELETE`` and ``HSET`` with it),
so a reader sees the old row or the new one, never none; pushers of one model take turns
through a Redis lock (``<prefix>:<model>:push-lock``).

Dense weights stay with the SavedModel; the store holds embedding rows only (Monolith's and
PaddleRec's split between parameter server and model file).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from redis.exceptions import LockError

from recpipe.errors import PipelineError
from recpipe.exports.files import chain, follows, is_base, read_manifest, read_params

PREFIX = "recpipe"
BATCH = 1000  # commands per pipeline round trip
log = logging.getLogger(__name__)


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


class StoreBehind(StoreError):
    """The store holds an export older than the one before a delta (or nothing): push the
    exports between them first."""


LOCK_TIMEOUT_S = 600  # a pusher that died frees the lock after this long
LOCK_WAIT_S = 120


def order(manifest: dict) -> tuple[str, int]:
    """Where an export stands in a model's history: ``(day, sequence)``."""
    return str(manifest["day"]), int(manifest["sequence"])


def push(client, model: str, export: Path, prefix: str = PREFIX, force: bool = False) -> dict[str, int]:
    """Write a base or delta export's rows to Redis (``client``: a ``redis.Redis``) and record
    it as applied, holding the model's push lock. Returns ``{"rows": written, "deleted":
    removed, "stale": 0 or 1}``; ``stale`` 1: the store holds a later export, nothing was
    written. ``force`` pushes a base even then (``push_chain``, which knows the store is not
    ahead of the delta it brings the store to).

    Raises:
        StoreBehind: a delta that does not follow the export applied, which is older (names
            both): push the day's chain up to it instead.
        StoreError: the push lock stayed taken for ``LOCK_WAIT_S`` seconds.
        recpipe.exports.files.DeltaError: an unfinished export or a checksum mismatch.
    """

    lock = client.lock(f"{prefix}:{model}:push-lock", timeout=LOCK_TIMEOUT_S, blocking_timeout=LOCK_WAIT_S)
    try:
        if not lock.acquire():
            raise StoreError(f"{model}: another push held the store's lock for {LOCK_WAIT_S} s")
    except LockError as err:
        raise StoreError(f"{model}: cannot take the store's push lock ({err})") from None
    try:
        return _push(client, model, Path(export), prefix, force)
    finally:
        try:
            lock.release()
        except LockError:  # expired while pushing: another pusher may hold it now
            log.warning("%s: the push lock expired before the push ended", model)


def _push(client, model: str, export: Path, prefix: str, force: bool) -> dict[str, int]:
    manifest = read_manifest(export)
    done = applied(client, model, prefix)
    if done:
        held = {**done, "sequence": int(done["sequence"]), "ev_step": int(done["ev_step"])}
        if order(held) > order(manifest) and not (force and is_base(manifest)):
            log.warning(
                "%s: the store holds %s/%s, a later export: not pushed (a push never moves the "
                "store backwards)",
                export,
                held["day"],
                held["name"],
            )
            return {"rows": 0, "deleted": 0, "stale": 1}
        same = all(held[k] == manifest[k] for k in ("day", "name", "ev_step"))
        if not is_base(manifest) and not same and not follows(manifest, held):
            raise StoreBehind(
                f"{export} follows {manifest['day']}/{manifest['follows']}, but the store holds "
                f"{done['day']}/{done['name']} at ev_step {done['ev_step']}: push the exports in order"
            )
    elif not is_base(manifest):
        raise StoreBehind(f"{export} is a delta and the store holds nothing of {model}: push its base first")
    params = read_params(export)
    version = f"{manifest['day']}/{manifest['name']}@{manifest['global_step']}"
    written = deleted = 0
    pipe = client.pipeline(transaction=True)  # MULTI/EXEC: a row is never seen deleted
    pending = 0

    def flush(now: bool = False) -> None:
        nonlocal pending
        if pending >= BATCH or (now and pending):
            pipe.execute()
            pending = 0

    keep = set()
    for table, rows in params.tables.items():
        for i, key in enumerate(rows.ids.tolist()):
            fields = {"version": version}
            for name, values in rows.views.items():
                fields[name] = np.ascontiguousarray(values[i], "<f4").tobytes()
            name = row_key(model, table, key, prefix)
            pipe.delete(name)  # a row is exactly the export's fields, whatever was there
            pipe.hset(name, mapping=fields)
            if is_base(manifest):
                keep.add(name.encode())
            pending += 1
            written += 1
            flush()
        for key in rows.tombstones.tolist():
            pipe.delete(row_key(model, table, key, prefix))
            pending += 1
            deleted += 1
            flush()
        flush(now=True)
    if is_base(manifest):  # one pass over the model's rows, every table at once
        for name in client.scan_iter(match=row_key(model, "*", "*", prefix), count=BATCH):
            if name not in keep:
                pipe.delete(name)
                pending += 1
                deleted += 1
                flush()
    flush(now=True)
    record = {k: str(manifest[k]) for k in ("day", "name", "sequence", "global_step", "ev_step")}
    client.hset(f"{prefix}:{model}:applied", mapping=record)
    return {"rows": written, "deleted": deleted, "stale": 0}


def push_chain(client, model: str, export: Path, prefix: str = PREFIX) -> tuple[dict[str, int], list[Path]]:
    """Push ``export``; when the store is behind it (``StoreBehind``: a restarted or flushed
    store, a push lost earlier, a pass re-exported), push its day's chain up to it instead,
    the base forced. Returns the summed totals and the exports written. Never moves the store
    backwards: an export older than the store's is a no-op (``push``'s ``stale``).

    Raises:
        StoreError, recpipe.exports.files.DeltaError: as ``push``.
    """
    export = Path(export)
    try:
        return push(client, model, export, prefix), [export]
    except StoreBehind as err:
        log.warning("%s; pushing the day's exports up to it", err)
    exports = chain(export.parent)
    exports = exports[: [p.name for p in exports].index(export.name) + 1]
    totals = {"rows": 0, "deleted": 0, "stale": 0}
    for i, item in enumerate(exports):
        for key, value in push(client, model, item, prefix, force=i == 0).items():
            totals[key] += value
    return totals, exports


def read_rows(client, model: str, table: str, prefix: str = PREFIX) -> dict[int, dict[str, np.ndarray]]:
    """Every row the store holds for ``table``: id -> {view name: ``float32 [dim]``}."""
    out = {}
    for name in client.scan_iter(match=row_key(model, table, "*", prefix), count=BATCH):
        key = int(name.decode().rsplit(":", 1)[1])
        fields = client.hgetall(name)
        out[key] = {k.decode(): np.frombuffer(v, "<f4") for k, v in fields.items() if k != b"version"}
    return out
