"""Online tables that grow (issue 40): a table starts at ``init_capacity`` rows and doubles up
to ``max_capacity`` inside the traced train step; growth keeps every row, its optimizer slots
and its counts, the admission sketch stays an upper bound until it is half full and then
widens, and a checkpoint restores into a smaller or larger capacity. Invariants are property
tests over random streams of ids."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recpipe.config.data import sketch_width
from tests.trainer.test_online_tables import _by_key, _step, _table
from trainer.online.initializer import initial_rows


def _map_is_consistent(ev) -> None:
    keys = ev.keys.numpy()
    used = np.flatnonzero(keys >= 0)
    slots = ev.map.lookup(tf.constant(keys[used], tf.int64)).numpy()
    np.testing.assert_array_equal(slots, used)
    assert int(ev.free_top.numpy()) == len(keys) - len(used)
    # the free stack holds exactly the free rows
    free = ev.free.numpy()[: int(ev.free_top.numpy())]
    assert sorted(free.tolist()) == np.flatnonzero(keys < 0).tolist()


def test_a_traced_step_grows_the_table_and_keeps_every_row_its_slots_and_counts():
    state, table = _table(init_capacity=4, max_capacity=64)
    ev, optimizer = table.ev, state.optimizers[0]

    @tf.function
    def step(keys):
        with tf.GradientTape() as tape:
            rows = table.lookup(keys, training=True)
            loss = tf.reduce_sum(rows * rows)
        optimizer.apply_gradients([(tape.gradient(loss, table.weights), table.weights)])
        state.model.ev_clock.step.assign_add(1)

    rng = np.random.default_rng(1)
    seen: dict[int, int] = {}
    capacities = []
    for i in range(8):
        keys = list(range(i * 5, i * 5 + 5)) + rng.integers(0, i * 5 + 1, size=3).tolist()
        before = _by_key(table)
        step(tf.constant(keys, tf.int64))
        after = _by_key(table)
        for key in keys:
            seen[key] = seen.get(key, 0) + 1
        assert after.keys() == seen.keys()
        for key, values in before.items():
            if key not in keys:  # untouched rows moved with the growth, unchanged
                for a, b in zip(values, after[key], strict=True):
                    np.testing.assert_array_equal(a, b)
        assert {k: after[k][3] for k in seen} == seen  # sightings
        capacities.append(ev.capacity_now())
        assert capacities[-1] <= max(4, 2 * len(seen))  # memory follows the rows used
        _map_is_consistent(ev)
    assert capacities[0] == 8 and capacities[-1] == 64 and sorted(capacities) == capacities
    assert step.experimental_get_tracing_count() == 1  # grown in place: never traced again
    m, _ = [s for s, _ in ev.optimizer_slots][:2]
    assert m.shape[0] is None and m.numpy().shape[0] == ev.capacity_now()
    assert ev.summary()["capacity"] == 64 and ev.summary()["rows_used"] == len(seen)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    init=st.sampled_from([1, 2, 4, 8]),
    filter_freq=st.sampled_from([0, 2, 3]),
    batches=st.lists(st.lists(st.integers(0, 39), min_size=1, max_size=12), min_size=1, max_size=10),
)
def test_growth_keeps_rows_counts_and_an_upper_bound_sketch_over_random_streams(init, filter_freq, batches):
    state, table = _table(init_capacity=init, max_capacity=64, filter_freq=filter_freq)
    ev = table.ev
    sightings: dict[int, int] = {}
    for batch in batches:
        _step(state, table, batch)
        for key in batch:
            sightings[key] = sightings.get(key, 0) + 1
        held = _by_key(table)
        # admitted: exactly the ids seen filter_freq times (64 rows hold the 40 ids)
        assert held.keys() == {k for k, n in sightings.items() if n >= max(filter_freq, 1)}
        for key, (weights, m, v, freq, _) in held.items():
            np.testing.assert_allclose(weights, initial_rows(tf.constant([key], tf.int64), 16, ev.salt)[0])
            assert not m.any() and not v.any() and 0 < freq <= sightings[key]
        capacity = ev.capacity_now()
        assert capacity <= max(ev.start_rows, 2 * len(held)) and capacity <= 64
        assert ev.sketch.numpy().shape == (4 * sketch_width(ev.start_rows),)  # 40 ids: far from full
        waiting = [k for k in sightings if k not in held]
        if waiting and filter_freq > 1:
            counts = ev.counter.estimate(tf.constant(waiting, tf.int64)).numpy()
            assert (counts >= np.array([sightings[k] for k in waiting])).all()
        _map_is_consistent(ev)


@pytest.mark.parametrize(
    ("ev_params", "capacity", "kept"),
    [
        ({"init_capacity": 2, "max_capacity": 64}, 32, 30),  # doubled from 2 to hold 30 rows
        ({"init_capacity": 128, "max_capacity": 256}, 128, 30),  # a larger start
        ({"init_capacity": 4, "max_capacity": 16}, 16, 16),  # smaller: the 16 most recent
    ],
)
def test_a_grown_table_restores_into_another_capacity(tmp_path, ev_params, capacity, kept):
    from trainer.checkpoints import restore_embedding_variables

    state, table = _table(init_capacity=4, max_capacity=64, filter_freq=0)
    for start in range(0, 30, 5):
        _step(state, table, list(range(start, start + 5)))
    assert table.ev.capacity_now() == 32
    saved = _by_key(table)
    path = state.checkpoint.write(str(tmp_path / "ckpt"))

    again, copy = _table(filter_freq=0, **ev_params)
    assert restore_embedding_variables(again.evs, path) == {"deepfm/input_layer/user_id": kept}
    assert copy.ev.capacity_now() == capacity and copy.ev.summary()["rows_used"] == kept
    restored = _by_key(copy)
    newest = sorted(saved, key=lambda k: -saved[k][4])[:kept]
    assert sorted(restored) == sorted(newest)
    for key in restored:
        for a, b in zip(saved[key], restored[key], strict=True):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        copy.ev.counter.estimate(tf.constant([99], tf.int64)).numpy(),
        table.ev.counter.estimate(tf.constant([99], tf.int64)).numpy(),
    )
    _map_is_consistent(copy.ev)
    # and it grows on from there
    _step(again, copy, list(range(100, 100 + capacity)))
    assert copy.ev.capacity_now() == min(2 * capacity, ev_params["max_capacity"])


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    sizes=st.lists(st.integers(200, 3000), min_size=4, max_size=8),
    filter_freq=st.sampled_from([2, 3]),
)
def test_the_sketch_widens_at_half_full_so_ids_seen_once_stay_out(seed, sizes, filter_freq):
    """Production days: most ids are seen once. A stream of fingerprints seen once each never
    reaches filter_freq: with the sketch at most half full after every step, an unseen id finds
    all 4 of its counters in use with probability under 0.5 ** 4, so few are admitted (a sketch
    that stayed 4,096 wide would fill and admit most of them)."""
    state, table = _table(init_capacity=64, max_capacity=1 << 16, filter_freq=filter_freq)
    ev = table.ev
    rng = np.random.default_rng(seed)
    seen = 0
    for size in sizes:
        keys = rng.integers(0, 2**62, size=size, dtype=np.int64)
        _step(state, table, keys.tolist())
        seen += size
        counts = ev.sketch.numpy()
        width = len(counts) // 4
        used = int(np.count_nonzero(counts))
        assert used <= int(ev.sketch_used.numpy())  # the tracked count is an upper bound
        assert 2 * used <= 4 * width or width == ev.sketch_most  # at most half full
        assert width & (width - 1) == 0 and sketch_width(64) <= width <= ev.sketch_most
    admitted = ev.summary()["rows_used"]
    assert admitted <= 0.08 * seen, (admitted, seen)
    # and ids seen filter_freq times after the last widening are admitted
    again = rng.integers(0, 2**62, size=50, dtype=np.int64).tolist()
    for _ in range(filter_freq):
        _step(state, table, again)
    held = set(ev.keys.numpy().tolist())
    assert set(again) <= held


def test_a_restored_sketch_keeps_its_width_and_its_fill_is_recounted(tmp_path):
    from trainer.checkpoints import restore_embedding_variables

    state, table = _table(init_capacity=64, max_capacity=1 << 16, filter_freq=2)
    rng = np.random.default_rng(3)
    for _ in range(4):
        _step(state, table, rng.integers(0, 2**62, size=3000, dtype=np.int64).tolist())
    width = len(table.ev.sketch.numpy()) // 4
    assert width > sketch_width(64)
    path = state.checkpoint.write(str(tmp_path / "ckpt"))
    again, copy = _table(init_capacity=64, max_capacity=1 << 16, filter_freq=2)
    restore_embedding_variables(again.evs, path)
    np.testing.assert_array_equal(copy.ev.sketch.numpy(), table.ev.sketch.numpy())
    assert int(copy.ev.sketch_used.numpy()) == np.count_nonzero(table.ev.sketch.numpy())
