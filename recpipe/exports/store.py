"""Push base and delta exports (``recpipe.exports.files``) to Redis, the online embedding store.

Keys of a model (``<prefix>:<model>:...``):

- ``applied``: a hash, the export the store serves (``day``, ``name``, ``sequence``,
  ``global_step``, ``ev_step``) and ``generation``, the key space its rows live in;
- ``g<generation>:<table>:<id>``: one row, a hash with a field per layer reading the table
  (its variable name -> the row as little-endian float32 bytes) and ``version``
  (``<day>/<name>@<global_step>`` of the export that wrote it);
- ``push-lock``: the pushers' lock (redis-py's ``Lock``), whose token also fences every write;
- ``next-generation``: the counter new generations are drawn from;
- ``written-generations``: a set of the generations drawn and not yet deleted (a push interrupted
  before its switch leaves one; the next switch deletes it).

Exports are ordered by ``(day, sequence)``:

- a push is idempotent: pushing the export already applied writes the same values again;
- a push never moves the store backwards: an export older than the one applied (a cleared
  or late task of an earlier pass) is a no-op with a warning (``stale``);
- a delta that follows the export applied is written in place, in the current generation;
  one further ahead (a store that was flushed or restarted, a push lost earlier) is refused
  before anything is written (``StoreBehind``);
- a base, and ``push_chain``'s rebuild (a day's base and its deltas up to an export), are
  written into a new generation that no reader sees; one atomic script then checks the order
  and switches ``applied`` to it, and the old generation is deleted. Readers that resolve the
  generation and read rows in one script (``lookup``) never see a served row missing.

Fencing (the invariant: the store never holds a row older than the export ``applied``
names, whatever the pushers' timing): every batch of row writes and the final switch run as
Lua scripts that first check that the push lock still holds this pusher's token, and extend
it. A pusher whose lock expired (a slow push, a paused process) or was lost to a Redis
restart has every later write refused (``StoreFenced``), so it can never write over a newer
pusher's rows. Every row is one ``HSET`` of all its fields, with no ``DEL``: every row of a
chain (a base and the deltas that follow it: one model's tables) carries the same fields, so an
``HSET`` over a row written before replaces each of them and nothing stale can stay; one
command, so a reader of a delta written in place sees the old row or the new one, never none or
a mix. A new generation's rows (a base, a rebuild's chain) are written where no reader looks
before the switch. The rows go in batches
of ``BATCH`` to one script call: the server unpacks them, cheaper for the pushing process
than redis-py building as many pipelined commands (``bench/push.py`` compares the push with
a bare pipelined ``HSET``). A batch is sent before the reply to the one before it is read, so
the server runs one while the pushing process builds the next (a sending thread did not
overlap them: the builder held the interpreter's lock while the sender waited for it); batches
reach the server in order on one connection, and the first refused one stops the push.

Dense weights stay with the SavedModel; the store holds embedding rows only (Monolith's and
PaddleRec's split between parameter server and model file).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from redis.exceptions import LockError, ResponseError

from recpipe.errors import PipelineError
from recpipe.exports import parity
from recpipe.exports.files import chain, follows, is_base, read_manifest, read_params

PREFIX = "recpipe"
BATCH = 1000  # rows per script call
log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 600  # a pusher that died frees the lock after this long
LOCK_WAIT_S = 120
RECORD = ("day", "name", "sequence", "global_step", "ev_step")

# KEYS[1]: the push lock. ARGV[1]: this pusher's token, ARGV[2]: the lock's ttl in ms, then
# ops: "S" key n field value ... (set every field of a row) or "D" key (delete a row).
_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED') end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local i = 3
while i <= #ARGV do
  local op, key = ARGV[i], ARGV[i + 1]
  if op == 'D' then
    redis.call('DEL', key)
    i = i + 2
  else
    local n = tonumber(ARGV[i + 2])
    redis.call('HSET', key, unpack(ARGV, i + 3, i + 2 + 2 * n))
    i = i + 3 + 2 * n
  end
end
return 1
"""
# KEYS[1]: the push lock, KEYS[2]: applied. ARGV[1]: token, ARGV[2]: the generation the pusher
# read from applied ('' when none), ARGV[3]: the export's day, ARGV[4]: its sequence, then
# ARGV[5]: '1' when the switch may go back to an earlier export (a rollback), then the new
# record's field / value pairs. Refuses when fenced, when applied changed since it was read,
# or (unless ARGV[5]) when it names a later export than this one.
_COMMIT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED') end
local held = redis.call('HMGET', KEYS[2], 'generation', 'day', 'sequence')
if (held[1] or '') ~= ARGV[2] then return redis.error_reply('MOVED') end
if ARGV[5] ~= '1' and held[2] and
   (held[2] > ARGV[3] or (held[2] == ARGV[3] and tonumber(held[3]) > tonumber(ARGV[4]))) then
  return redis.error_reply('MOVED')
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], unpack(ARGV, 6))
return 1
"""
# KEYS[1]: the push lock, KEYS[2]: written-generations. ARGV[1]: token, ARGV[2]: the lock's ttl
# in ms, ARGV[3]: a generation to forget once its rows are gone ('' for none), then row keys to
# unlink (the server frees their memory in a background thread).
_DROP = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED') end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local n = 0
for i = 4, #ARGV do n = n + redis.call('UNLINK', ARGV[i]) end
if ARGV[3] ~= '' then redis.call('SREM', KEYS[2], ARGV[3]) end
return n
"""
# KEYS[1]: applied. ARGV[1]: the key prefix up to the generation, ARGV[2]: the table, then ids.
_LOOKUP = """
local gen = redis.call('HGET', KEYS[1], 'generation')
local out = {}
for i = 3, #ARGV do
  if gen then out[#out + 1] = redis.call('HGETALL', ARGV[1] .. gen .. ':' .. ARGV[2] .. ':' .. ARGV[i])
  else out[#out + 1] = {} end
end
return out
"""


class StoreError(PipelineError):
    """An export cannot be pushed (out of order, another day) or the store is unreachable."""


class StoreBehind(StoreError):
    """The store holds an export older than the one before a delta (or nothing): push the
    exports between them first."""


class StoreFenced(StoreError):
    """This pusher lost the push lock (it expired, or Redis restarted) before it finished:
    nothing more of its push was written; another pusher may hold the store now."""


def _key(prefix: str, model: str, *parts) -> str:
    return ":".join((prefix, model, *map(str, parts)))


def order(manifest: dict) -> tuple[str, int]:
    """Where an export stands in a model's history: ``(day, sequence)``."""
    return str(manifest["day"]), int(manifest["sequence"])


class _Pusher:
    """One push session: holds the model's lock, and writes only while it still does."""

    def __init__(self, store: EmbeddingStore):
        self.store, self.client, self.model = store, store.client, store.model
        self.lock = self.client.lock(
            store.key("push-lock"), timeout=LOCK_TIMEOUT_S, blocking_timeout=LOCK_WAIT_S
        )
        self.write = self.client.register_script(_WRITE)
        self.commit_script = self.client.register_script(_COMMIT)
        self.drop_script = self.client.register_script(_DROP)

    def __enter__(self):
        try:
            if not self.lock.acquire():
                raise StoreError(f"{self.model}: another push held the store's lock for {LOCK_WAIT_S} s")
        except LockError as err:
            raise StoreError(f"{self.model}: cannot take the store's push lock ({err})") from None
        self.token = self.lock.local.token
        self.client.script_load(_WRITE)  # write_export's EVALSHA: a restart after this reads as fenced
        return self

    def __exit__(self, *exc):
        try:
            self.lock.release()
        except LockError:  # expired or taken: every write after that was refused
            log.warning("%s: the push lock expired before the push ended", self.model)

    def _run(self, script, keys, args):
        try:
            return script(keys=keys, args=[self.token, *args])
        except ResponseError as err:
            self._refused(err)

    def _refused(self, err: ResponseError):
        """Raise what a refused script means: ``StoreFenced`` for the fence, a changed
        ``applied`` or a restarted Redis (its scripts gone with the lock); else ``err``."""
        text = str(err)
        if "FENCED" in text or "NOSCRIPT" in text:
            raise StoreFenced(
                f"{self.model}: the push lock expired (after {LOCK_TIMEOUT_S} s without a write) "
                "or Redis restarted while this push ran; another pusher may hold the store, "
                "so nothing more was written. Retry the push"
            ) from None
        if "MOVED" in text:
            raise StoreFenced(f"{self.model}: the store's applied export changed during this push") from None
        raise err

    def write_export(self, export: Path, manifest: dict, generation: str) -> dict[str, int]:
        """Write one export's rows (each one ``HSET`` of all its fields) and tombstones into
        ``generation``, in fenced batches: each batch is sent before the reply to the one before
        it is read, so that the server runs a batch while this process builds the next (two in
        flight on one connection, in order; the first refused one stops the push, and the one
        sent after it is refused by the same fence)."""
        params = read_params(export)
        version = f"{manifest['day']}/{manifest['name']}@{manifest['global_step']}"
        lock_ms = int(LOCK_TIMEOUT_S * 1000)
        ops: list = []
        count = written = deleted = in_flight = 0
        pool = self.client.connection_pool
        conn = pool.get_connection()

        def receive() -> None:
            nonlocal in_flight
            in_flight -= 1
            try:
                conn.read_response()
            except ResponseError as err:
                self._refused(err)

        def flush(now: bool = False) -> None:
            nonlocal ops, count, in_flight
            if count >= BATCH or (now and count):
                conn.send_command("EVALSHA", self.write.sha, 1, self.lock.name, self.token, lock_ms, *ops)
                in_flight += 1
                ops, count = [], 0
                if in_flight > 1:
                    receive()  # the batch before: written, or its refusal raised here

        try:
            for table, rows in params.tables.items():
                names = list(rows.views)
                views = [np.ascontiguousarray(rows.views[n], "<f4") for n in names]
                head = self.store.row_key(table, "", generation)
                for i, key in enumerate(rows.ids.tolist()):
                    ops += ["S", f"{head}{key}", len(names) + 1, "version", version]
                    for name, values in zip(names, views, strict=True):
                        ops += [name, values[i].tobytes()]
                    count += 1
                    written += 1
                    flush()
                for key in rows.tombstones.tolist():
                    ops += ["D", f"{head}{key}"]
                    count += 1
                    deleted += 1
                    flush()
            flush(now=True)
            while in_flight:
                receive()
        finally:
            if in_flight:  # replies left unread: the connection cannot serve another command
                conn.disconnect()
            pool.release(conn)
        return {"rows": written, "deleted": deleted}

    def switch(self, held: dict, manifest: dict, generation: str, backwards: bool = False) -> None:
        """Make ``manifest``'s export the applied one, in ``generation``: refused unless the
        lock is still ours and ``applied`` is still ``held`` (and, unless ``backwards``, holds
        no later export)."""
        record = {k: str(manifest[k]) for k in RECORD} | {"generation": generation}
        pairs = [x for kv in record.items() for x in kv]
        keys = [self.lock.name, self.store.key("applied")]
        args = [held.get("generation", ""), *order(manifest), "1" if backwards else "0", *pairs]
        self._run(self.commit_script, keys, args)

    def new_generation(self) -> str:
        """A generation no push wrote before, recorded in ``written-generations`` before any of its
        rows is written (so that an interrupted push's rows are found and deleted later)."""
        generation = str(self.client.incr(self.store.key("next-generation")))
        self.client.sadd(self.store.key("written-generations"), generation)
        return generation

    def _unlink(self, names, forget: str = "") -> int:
        """Unlink ``names`` in fenced batches, then forget generation ``forget`` (its record in
        ``written-generations``); every batch is refused once the lock is not ours
        (``StoreFenced``), so a pusher that stalled past its lock deletes nothing of the
        generation the next pusher is writing."""
        keys = [self.lock.name, self.store.key("written-generations")]
        ttl = int(LOCK_TIMEOUT_S * 1000)
        gone, batch = 0, []
        for name in names:
            batch.append(name)
            if len(batch) >= BATCH:
                gone += self._run(self.drop_script, keys, [ttl, "", *batch])
                batch = []
        return gone + self._run(self.drop_script, keys, [ttl, forget, *batch])

    def drop_other_generations(self, keep: str, held: dict) -> int:
        """Delete every row key of the model outside generation ``keep``: those of the
        generations ``written-generations`` records (the old one, one an interrupted push left), each
        found by a server-side match; the number of keys deleted. A store whose applied
        generation (``held``, before the switch) is not recorded there (written by a recpipe
        before the set, or before generations) is swept whole once. Fenced as the writes are.

        Raises:
            StoreFenced: the lock expired or was taken since the switch: whatever is left is
                the next pusher's to delete (its own switch drops every other generation)."""
        recorded = self.store.key("written-generations")
        others = {g.decode() for g in self.client.smembers(recorded)} - {keep}
        gone = 0
        if held and held.get("generation") not in others | {keep}:
            control = {
                self.store.key(k).encode()
                for k in ("applied", "push-lock", "next-generation", "written-generations")
            }
            mine = self.store.key(f"g{keep}", "").encode()
            names = self.client.scan_iter(match=self.store.key("*"), count=10 * BATCH)
            gone += self._unlink(n for n in names if n not in control and not n.startswith(mine))
        for generation in sorted(others):
            match = self.store.key(f"g{generation}", "*")
            gone += self._unlink(self.client.scan_iter(match=match, count=10 * BATCH), forget=generation)
        return gone

    def push(self, export: Path) -> dict[str, int]:
        manifest = read_manifest(export)
        held = self.store.applied()
        if held:
            current = (held["day"], int(held["sequence"]))
            if current > order(manifest):
                log.warning(
                    "%s: the store holds %s/%s, a later export: not pushed (a push never moves the "
                    "store backwards)",
                    export,
                    held["day"],
                    held["name"],
                )
                return {"rows": 0, "deleted": 0, "stale": 1}
            same = all(held[k] == str(manifest[k]) for k in ("day", "name", "ev_step"))
            chained = {**held, "ev_step": int(held["ev_step"])}
            in_place = "generation" in held and (same or follows(manifest, chained))
            if not is_base(manifest) and not in_place:
                raise StoreBehind(
                    f"{export} follows {manifest['day']}/{manifest['follows']}, but the store holds "
                    f"{held['day']}/{held['name']} at ev_step {held['ev_step']}: push the exports in order"
                )
        elif not is_base(manifest):
            raise StoreBehind(
                f"{export} is a delta and the store holds nothing of {self.model}: push its base first"
            )
        if is_base(manifest):
            return self.rebuild([export])
        totals = self.write_export(export, manifest, held["generation"])
        self.switch(held, manifest, held["generation"])
        return {**totals, **parity.check(self.store, [export]), "stale": 0}

    def rebuild(self, exports: list[Path], backwards: bool = False) -> dict[str, int]:
        """Write a base and its deltas into a new generation, then switch to it at once; a
        no-op (``stale``) when the store holds a later export, unless ``backwards``."""
        held = self.store.applied()
        last = read_manifest(exports[-1])
        if not backwards and held and (held["day"], int(held["sequence"])) > order(last):
            return {"rows": 0, "deleted": 0, "stale": 1}
        generation = self.new_generation()
        totals = {"rows": 0, "deleted": 0}
        for export in exports:
            for k, v in self.write_export(export, read_manifest(export), generation).items():
                totals[k] += v
        self.switch(held, last, generation, backwards)
        try:
            totals["deleted"] += self.drop_other_generations(generation, held)
        except StoreFenced:  # switched: the export is served; the next pusher's switch cleans up
            log.warning(
                "%s: the push lock expired after the switch; old rows are left to the next push", self.model
            )
        return {**totals, **parity.check(self.store, exports), "stale": 0}


def _decode(fields) -> dict[str, np.ndarray]:
    pairs = dict(zip(fields[::2], fields[1::2], strict=True)) if isinstance(fields, list) else fields
    return {k.decode(): np.frombuffer(v, "<f4") for k, v in pairs.items() if k != b"version"}


class EmbeddingStore:
    """One model's rows in the online embedding store (Redis; the key layout and invariants
    above). ``client``: a ``redis.Redis``; ``model``: the retrain config's ``model_name``;
    ``prefix``: the keys' first part (``recpipe``)."""

    def __init__(self, client, model: str, prefix: str = PREFIX):
        self.client, self.model, self.prefix = client, model, prefix

    def key(self, *parts) -> str:
        """``<prefix>:<model>:<parts...>``."""
        return _key(self.prefix, self.model, *parts)

    def row_key(self, table: str, key: int | str, generation: str | int) -> str:
        """The Redis key of one row: ``<prefix>:<model>:g<generation>:<table>:<id>``."""
        return self.key(f"g{generation}", table, key)

    def applied(self) -> dict[str, str]:
        """The export the store serves (``day``, ``name``, ``sequence``, ``global_step``,
        ``ev_step``, ``generation``), empty when none."""
        return {k.decode(): v.decode() for k, v in self.client.hgetall(self.key("applied")).items()}

    def push(self, export: Path) -> dict[str, int]:
        """Write a base or delta export's rows and record it as applied, holding the model's
        push lock, then read a sample back (``recpipe.exports.parity``). Returns ``{"rows":
        written, "deleted": removed, "checked": rows read back equal, "absent": evicted ids read
        back absent, "stale": 0 or 1}``; ``stale`` 1: the store holds a later export, nothing
        was written (and nothing read back).

        Raises:
            StoreBehind: a delta that does not follow the export applied, which is older (names
                both): push the day's chain up to it instead (``push_chain``).
            StoreFenced: the lock was lost mid-push; what was not written stays unwritten.
            StoreError: the push lock stayed taken for ``LOCK_WAIT_S`` seconds.
            recpipe.exports.files.DeltaError: an unfinished export or a checksum mismatch.
            recpipe.exports.parity.StoreMismatchError: the store serves other rows than pushed.
        """
        with _Pusher(self) as pusher:
            return pusher.push(Path(export))

    def push_chain(self, export: Path) -> tuple[dict[str, int], list[Path]]:
        """Push ``export``; when the store is behind it (``StoreBehind``: a restarted or flushed
        store, a push lost earlier), rebuild the store from its day's chain up to it, in a new
        generation switched to at once, under the same lock: readers keep the old rows until
        the switch. Returns the summed totals and the exports written. Never moves the store
        backwards: an export older than the store's is a no-op (``stale``).

        Raises:
            StoreFenced, StoreError, recpipe.exports.files.DeltaError: as ``push``.
        """
        export = Path(export)
        with _Pusher(self) as pusher:
            try:
                return pusher.push(export), [export]
            except StoreBehind as err:
                log.warning("%s; rebuilding the store from the day's exports up to it", err)
            exports = chain(export.parent)
            exports = exports[: [p.name for p in exports].index(export.name) + 1]
            return pusher.rebuild(exports), exports

    def restore(self, exports: list[Path]) -> dict[str, int]:
        """Make the store hold ``exports`` (a base and its deltas, in order) and nothing else:
        written into a new generation and switched to at once under the push lock, even when
        the store holds later exports (a champion rolled back: ``recpipe.champion``).

        Raises:
            StoreFenced, StoreError, recpipe.exports.files.DeltaError: as ``push``.
        """
        if not exports or not is_base(read_manifest(Path(exports[0]))):
            raise StoreError(f"{self.model}: a restore starts at a base export, not {exports[:1]}")
        with _Pusher(self) as pusher:
            return pusher.rebuild([Path(e) for e in exports], backwards=True)

    def lookup(self, table: str, ids) -> dict[int, dict[str, np.ndarray]]:
        """Rows of ``table`` by id as the store serves them, read in one script with the
        generation ``applied`` names (so never a row missing during a rebuild): id -> {view
        name: ``float32 [dim]``}; an id the store lacks is left out."""
        script = self.client.register_script(_LOOKUP)
        ids = [int(i) for i in ids]
        found = script(keys=[self.key("applied")], args=[self.key("g"), table, *ids])
        return {i: _decode(fields) for i, fields in zip(ids, found, strict=True) if fields}

    def read_rows(self, table: str) -> dict[int, dict[str, np.ndarray]]:
        """Every row the store serves for ``table`` (the applied generation's): id -> {view
        name: ``float32 [dim]``}; empty when nothing is applied."""
        generation = self.applied().get("generation")
        if generation is None:
            return {}
        out = {}
        for name in self.client.scan_iter(match=self.row_key(table, "*", generation), count=BATCH):
            key = int(name.decode().rsplit(":", 1)[1])
            out[key] = _decode(self.client.hgetall(name))
        return out
