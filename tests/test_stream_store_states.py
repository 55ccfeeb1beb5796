"""The stream's exports and online store over random interleavings (a Hypothesis stateful
test): passes run, fail, are cleared and re-run; Redis restarts; a pusher whose lock expired
comes back. After every step, Redis serves exactly what serving would load from the same
exports (the day's base with its deltas applied, up to the export ``applied`` names), never
moves backwards, and the day's chain equals the model of the last pass it exported.

The passes are stand-ins for the trainer (a table of ids -> value per pass model; training
touches, admits and evicts ids); the export rules (``recpipe.exports.files.previous_export``)
and the store (``recpipe.exports.store``) are the production code, on a real redis-server
that the test starts and restarts.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from recpipe import atomic
from recpipe.exports.files import (
    BASE,
    DELTA_PREFIX,
    MANIFEST,
    DeltaError,
    Params,
    TableRows,
    alive_ids,
    apply,
    chain,
    new_manifest,
    previous_export,
    read_manifest,
    read_params,
    write_params,
)
from recpipe.layout import SUCCESS
from tests.support import RedisServer

DAY = "2024-05-01"
VIEW = "t/embedding_weights"
IDS = st.lists(st.integers(0, 19), max_size=5, unique=True)


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer()
    yield server
    server.stop()


def _params(table: dict[int, float]) -> Params:
    ids = np.array(sorted(table), np.int64)
    values = np.array([[table[i]] * 2 for i in ids.tolist()], np.float32).reshape(len(ids), 2)
    return Params({"t": TableRows(ids, {VIEW: values})}, {}, {})


def _as_dict(params: Params) -> dict[int, float]:
    rows = params.tables["t"]
    return {int(k): float(v[0]) for k, v in zip(rows.ids, rows.views[VIEW], strict=True)}


def _served(exports: list[Path]) -> dict[int, float]:
    params = read_params(exports[0])
    for export in exports[1:]:
        params = apply(params, read_params(export))
    return _as_dict(params)


class StreamStore(RuleBasedStateMachine):
    server: RedisServer  # set by the test

    @initialize()
    def start(self):
        import redis

        self.dir = Path(tempfile.mkdtemp(prefix="stream-states-"))
        self.day_dir = self.dir / DAY
        self.client = redis.Redis(host="127.0.0.1", port=self.server.port)
        self.model = f"m-{uuid.uuid4().hex[:8]}"
        self.hour = 0  # the next pass
        self.models: dict[int, tuple[dict[int, float], int]] = {}  # finished pass -> table, clock
        self.failed: set[int] = set()
        self.newest_pushed = None  # (day, sequence) since the store last started empty

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- a pass: train from the newest finished pass before it, export, push -------------
    def _train(self, hour: int, touch: list[int], evict: list[int]) -> None:
        before = [h for h in self.models if h < hour]
        table, clock = self.models[max(before)] if before else ({}, 0)
        table = dict(table)
        for i in touch:
            table[i] = float(np.float32(hour + i / 100 + clock / 1000))  # as a float32 row holds it
        for i in evict:
            table.pop(i, None)
        self.models[hour] = (table, clock + 1)

    def _export(self, hour: int) -> Path:
        table, clock = self.models[hour]
        name = BASE if not (self.day_dir / BASE / SUCCESS).exists() else f"{DELTA_PREFIX}{hour:02d}"
        exports = previous_export(self.day_dir, name, f"{hour:02d}")  # raises behind the chain
        params = _params(table)
        previous = read_manifest(exports[-1]) if exports else None
        if exports:
            served = _served(exports)
            changed = [i for i in table if served.get(i) != table[i]]
            params = _params({i: table[i] for i in changed})
            alive = alive_ids(exports)["t"]
            params.tables["t"].tombstones = np.sort(alive[~np.isin(alive, list(table))])
        with atomic.directory(self.day_dir / name) as tmp:
            files = write_params(params, tmp / "params")
            sequence = previous["sequence"] + 1 if previous else 0
            doc = new_manifest(DAY, name, sequence, previous, clock, clock, params, files)
            doc["pass"] = f"{hour:02d}"
            (tmp / MANIFEST).write_text(json.dumps(doc))
            (tmp / SUCCESS).touch()
        return self.day_dir / name

    def _push(self, export: Path) -> None:
        from recpipe.exports.store import EmbeddingStore, order

        before = EmbeddingStore(self.client, self.model).applied()
        EmbeddingStore(self.client, self.model).push_chain(export)
        now = EmbeddingStore(self.client, self.model).applied()
        pushed = order(read_manifest(export))
        if before:  # never backwards
            assert (now["day"], int(now["sequence"])) >= (before["day"], int(before["sequence"]))
        self.newest_pushed = max(self.newest_pushed or pushed, pushed)

    def _run(self, hour: int, touch, evict) -> None:
        self._train(hour, touch, evict)
        self._push(self._export(hour))

    @precondition(lambda self: self.hour < 24)
    @rule(touch=IDS, evict=IDS)
    def run_next_pass(self, touch, evict):
        self._run(self.hour, touch, evict)
        self.hour += 1

    @precondition(lambda self: self.hour < 24)
    @rule()
    def fail_next_pass(self):
        self.failed.add(self.hour)
        self.hour += 1

    @precondition(lambda self: self.failed)
    @rule(data=st.data(), touch=IDS, evict=IDS)
    def clear_and_rerun_a_failed_pass(self, data, touch, evict):
        hour = data.draw(st.sampled_from(sorted(self.failed)))
        if any(h > hour for h in self.models):  # a later pass exported
            # refused before anything is written: the chain and the store stay as they were
            before = sorted(p.name for p in self.day_dir.iterdir())
            self._train(hour, touch, evict)
            with pytest.raises(DeltaError, match="mark the failed task successful"):
                self._export(hour)
            del self.models[hour]
            assert sorted(p.name for p in self.day_dir.iterdir()) == before
            return
        self.failed.discard(hour)
        self._run(hour, touch, evict)

    @precondition(lambda self: (self.day_dir / BASE / SUCCESS).exists())
    @rule()
    def clear_and_rerun_the_newest_push(self):
        self._push(chain(self.day_dir)[-1])

    @precondition(lambda self: (self.day_dir / BASE / SUCCESS).exists())
    @rule(data=st.data())
    def clear_and_rerun_an_earlier_push(self, data):
        exports = chain(self.day_dir)
        self._push(data.draw(st.sampled_from(exports)))

    @rule()
    def restart_redis(self):
        self.server.restart()
        self.newest_pushed = None

    @precondition(lambda self: (self.day_dir / BASE / SUCCESS).exists())
    @rule(data=st.data())
    def a_pusher_whose_lock_expired_comes_back(self, data):
        import recpipe.exports.store as store

        exports = chain(self.day_dir)
        late = data.draw(st.sampled_from(exports))
        pusher = store._Pusher(store.EmbeddingStore(self.client, self.model)).__enter__()
        self.client.delete(pusher.lock.name)  # its lock expired while it was paused
        self._push(exports[-1])  # meanwhile the next push ran
        try:
            pusher.push(late)  # it wakes up: stale (a no-op) or refused, never written
        except store.StoreFenced:
            pass
        except store.StoreBehind:
            pass
        pusher.__exit__(None, None, None)

    @precondition(lambda self: (self.day_dir / BASE / SUCCESS).exists())
    @rule(expires=st.sampled_from(["after_taking_it", "after_writing", "after_switching"]))
    def a_rebuilds_lock_expires_and_the_next_pusher_runs_meanwhile(self, expires):
        """A rebuild (the day's chain into a new generation) whose lock expires at one of its
        steps; the next pusher takes the lock and writes its own generation before the first
        wakes up. The first's later writes, switch and clean-up are refused; nothing of the
        second's generation is deleted."""
        import recpipe.exports.store as store

        exports = chain(self.day_dir)
        first = store._Pusher(store.EmbeddingStore(self.client, self.model)).__enter__()
        held = store.EmbeddingStore(self.client, self.model).applied()
        steps = []
        if expires != "after_taking_it":
            generation = first.new_generation()
            for export in exports:
                first.write_export(export, read_manifest(export), generation)
            steps.append("written")
            if expires == "after_switching":
                first.switch(held, read_manifest(exports[-1]), generation, backwards=True)
                self.newest_pushed = max(
                    self.newest_pushed or (DAY, -1), store.order(read_manifest(exports[-1]))
                )
        self.client.delete(first.lock.name)  # expired while it was paused
        second = store._Pusher(store.EmbeddingStore(self.client, self.model)).__enter__()
        theirs = second.new_generation()
        for export in exports:
            second.write_export(export, read_manifest(export), theirs)
        # the first wakes up: whatever it does next is refused
        with pytest.raises(store.StoreFenced):
            if expires == "after_switching":
                first.drop_other_generations(generation, held)
            elif steps:
                first.switch(held, read_manifest(exports[-1]), generation, backwards=True)
            else:
                first.rebuild(exports, backwards=True)
        first.__exit__(None, None, None)
        before = store.EmbeddingStore(self.client, self.model).applied()
        second.switch(before, read_manifest(exports[-1]), theirs, backwards=True)
        second.drop_other_generations(theirs, before)
        second.__exit__(None, None, None)
        self.newest_pushed = store.order(read_manifest(exports[-1]))

    # -- what holds after every step ---------------------------------------------------------
    @invariant()
    def redis_serves_what_the_exports_serve(self):
        if not hasattr(self, "client"):
            return
        from recpipe.exports.store import EmbeddingStore

        held = EmbeddingStore(self.client, self.model).applied()
        if not held:
            assert self.newest_pushed is None and not EmbeddingStore(self.client, self.model).read_rows("t")
            return
        assert (held["day"], int(held["sequence"])) == self.newest_pushed
        exports = chain(self.day_dir)
        upto = [p.name for p in exports].index(held["name"])
        want = _served(exports[: upto + 1])
        stored = EmbeddingStore(self.client, self.model).read_rows("t")
        rows = {k: float(v[VIEW][0]) for k, v in stored.items()}
        assert rows == want

    @invariant()
    def rows_lie_in_the_applied_generation_alone(self):
        # every push that ran ended (switched or fenced before its first row): no other
        # generation's row is left to take memory
        if not hasattr(self, "client"):
            return
        from recpipe.exports.store import EmbeddingStore

        generation = EmbeddingStore(self.client, self.model).applied().get("generation")
        rows = {k.decode().split(":")[2] for k in self.client.scan_iter(match=f"recpipe:{self.model}:g*")}
        assert rows <= {f"g{generation}"}, rows

    @invariant()
    def the_chain_serves_the_last_exported_pass(self):
        if not hasattr(self, "day_dir") or not (self.day_dir / BASE / SUCCESS).exists():
            return
        exports = chain(self.day_dir)
        last = read_manifest(exports[-1])
        hour = max(h for h in self.models if h not in self.failed)
        assert _served(exports) == self.models[hour][0], last["name"]


def test_the_store_and_the_chain_over_random_interleavings(redis_server):
    StreamStore.server = redis_server
    machine = StreamStore.TestCase
    machine.settings = settings(max_examples=30, stateful_step_count=20, deadline=None)
    machine().runTest()
