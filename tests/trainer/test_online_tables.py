"""Online-learning tables (``ev_params``): admission, eviction, capacity, slot reuse, checkpoints
and serving, on the MovieLens model's ``user_id`` table, step by step in one process."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from recpipe.config import load_pipeline_config
from tests.support import ROOT, with_edits
from trainer.online import start_day
from trainer.online.initializer import initial_rows
from trainer.state import build_state

LAZY_ADAM = [{"lazy_adam_optimizer": {}}, {"adam_optimizer": {}}]


def _config(**ev):
    config = load_pipeline_config(ROOT / "conf/movielens_deepfm.yaml", {})
    return with_edits(
        config,
        {
            "feature_config.features[input_names=user_id].ev_params": ev,
            "train_config.optimizer_config": LAZY_ADAM,
        },
    )


def _table(**ev):
    """A train state and its ``user_id`` table, looked up through the deep view."""
    state = build_state(_config(**ev))
    (table,) = state.evs  # the deep and the wide lookups share one table
    return state, table.views[0]


def _step(state, table, keys) -> np.ndarray:
    """One training lookup of ``keys`` at the clock's step, then the clock moves on."""
    out = table.lookup(tf.constant(keys, tf.int64), training=True)  # the deep view admits
    state.model.ev_clock.step.assign_add(1)
    return out.numpy()


def _slot_of(table, key: int) -> int:
    return int(table.ev.map.lookup(tf.constant([key], tf.int64))[0])


def _moments(table):
    mine = table.weights.name.split(":")[0]
    slots = [s for s, _ in table.ev.optimizer_slots if s.name.split(":")[0].endswith(mine)]
    assert sorted(s.name.split("/")[0] for s in slots) == ["m", "v"]
    return slots


def test_an_id_is_admitted_at_its_filter_freq_th_sighting_and_gets_no_gradient_before():
    state, table = _table(filter_freq=3)
    assert not _step(state, table, [7]).any()  # 1st sighting
    out = _step(state, table, [7, 8])  # 2nd
    assert not out.any() and _slot_of(table, 7) == -1
    out = _step(state, table, [7, 8, 8])  # 3rd of 7 (8: 3rd too, in one batch)
    assert _slot_of(table, 7) >= 0 and _slot_of(table, 8) >= 0
    np.testing.assert_allclose(out[0], initial_rows(tf.constant([7], tf.int64), 16, table.ev.salt)[0])
    assert np.abs(out[0]).max() > 0
    summary = table.ev.summary()
    assert summary["rows_used"] == 2 and summary["admitted"] == 2
    assert summary["lookups"] == 6 and summary["filtered"] == 3

    with tf.GradientTape() as tape:
        rows = table.lookup(tf.constant([7, 9, 9], tf.int64), training=True)
        loss = tf.reduce_sum(rows)
    grad = tape.gradient(loss, table.weights)
    assert isinstance(grad, tf.IndexedSlices)
    assert grad.indices.numpy().tolist() == [_slot_of(table, 7)]  # 9, not admitted: no row touched
    assert not rows.numpy()[1:].any()


def test_rows_are_evicted_after_steps_to_live_steps():
    state, table = _table(steps_to_live=2)
    _step(state, table, [1])  # step 0
    _step(state, table, [2])  # step 1
    _step(state, table, [2])  # step 2: 1 unused for 2 steps, kept
    assert _slot_of(table, 1) >= 0
    _step(state, table, [2])  # step 3: unused for 3 steps, evicted
    assert _slot_of(table, 1) == -1 and 1 not in table.ev.keys.numpy()
    assert table.ev.summary()["evicted"] == 1 and table.ev.summary()["rows_used"] == 1


def test_rows_unseen_for_delete_after_unseen_days_go_at_the_day_boundary_and_counts_decay():
    state, table = _table(delete_after_unseen_days=2, filter_freq=3)
    start_day(state.model, "2024-01-01")
    _step(state, table, [1, 1, 1, 5, 5])  # 1 admitted, 5 counted twice
    assert start_day(state.model, "2024-01-03") == 0  # unseen 2 days: kept
    assert _slot_of(table, 1) >= 0
    assert float(table.ev.counter.estimate(tf.constant([5], tf.int64))[0]) == 1.0  # halved
    assert start_day(state.model, "2024-01-04") == 1
    assert _slot_of(table, 1) == -1 and table.ev.summary()["evicted"] == 1


def test_a_reused_row_starts_from_the_initializer_with_zeroed_optimizer_slots():
    state, table = _table(max_capacity=2)
    _step(state, table, [1, 2])
    optimizer = state.optimizers[0]
    grad = tf.IndexedSlices(tf.ones([2, 16]), tf.constant([0, 1], tf.int64), tf.constant([2, 16]))
    optimizer.apply_gradients([(grad, table.weights)])
    m, v = _moments(table)
    assert np.abs(m.numpy()).min() > 0 and np.abs(v.numpy()).min() > 0
    _step(state, table, [2])  # 2 is now the more recently used
    _step(state, table, [3])  # full: 3 takes the least recently used row, 1's
    assert table.ev.keys.numpy().tolist() == [3, 2]
    np.testing.assert_allclose(
        table.weights.numpy()[0], initial_rows(tf.constant([3], tf.int64), 16, table.ev.salt)[0]
    )
    assert not m.numpy()[0].any() and not v.numpy()[0].any()
    assert m.numpy()[1].all() and v.numpy()[1].all()  # 2's moments untouched
    assert table.ev.summary()["evicted"] == 1


def test_max_capacity_is_never_exceeded_under_a_stream_of_ten_times_as_many_ids():
    state, table = _table(max_capacity=16)
    for batch in range(20):  # 160 distinct ids, 8 a step
        _step(state, table, list(range(batch * 8, batch * 8 + 8)))
        assert table.ev.summary()["rows_used"] <= 16
    assert table.ev.summary()["admitted"] == 160 and table.ev.summary()["evicted"] == 144
    _step(state, table, list(range(1000, 1020)))  # 20 new ids at once: 16 fit
    summary = table.ev.summary()
    assert summary["rows_used"] == 16 and summary["refused"] == 4
    assert sorted(k for k in table.ev.keys.numpy()) == sorted(set(table.ev.keys.numpy()) - {-1})


def _by_key(table) -> dict[int, tuple]:
    keys = table.ev.keys.numpy()
    m, v = _moments(table)
    rows = {}
    for slot, key in enumerate(keys):
        if key >= 0:
            rows[int(key)] = (
                table.weights.numpy()[slot],
                m.numpy()[slot],
                v.numpy()[slot],
                int(table.ev.freqs.numpy()[slot]),
                int(table.ev.versions.numpy()[slot]),
            )
    return rows


def test_checkpoint_round_trip_and_re_sharding_keep_every_row_with_its_state(tmp_path):
    from trainer.checkpoints import list_online_tables, restore_embedding_variables
    from trainer.distribute.embedding_parallel import Sharding

    state, table = _table(filter_freq=2, max_capacity=64)
    rng = np.random.default_rng(0)
    optimizer = state.optimizers[0]
    for _ in range(6):
        _step(state, table, rng.integers(0, 40, size=12).tolist())
        slots = tf.constant(np.flatnonzero(table.ev.keys.numpy() >= 0), tf.int64)
        grad = tf.IndexedSlices(tf.random.normal([len(slots), 16]), slots, tf.constant([64, 16]))
        optimizer.apply_gradients([(grad, table.weights)])
    saved = _by_key(table)
    assert len(saved) > 10
    path = state.checkpoint.write(str(tmp_path / "ckpt"))
    assert ("deepfm/input_layer/user_id", len(saved), 64) in list_online_tables(path)

    again, copy = _table(filter_freq=2, max_capacity=64)
    restore_embedding_variables(again.evs, path)
    restored = _by_key(copy)
    assert restored.keys() == saved.keys()
    for key, values in saved.items():
        for a, b in zip(values, restored[key], strict=True):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(copy.ev.sketch.numpy(), table.ev.sketch.numpy())

    # two ranks each take the ids they own (id mod 2), with their rows and slots
    shards = []
    for rank in range(2):
        # building calls the model once: an exchange that keeps everything here stands in
        sharding = Sharding(rank, 2, alltoall=lambda tensor, splits: (tensor, splits))
        part = build_state(_config(filter_freq=2, max_capacity=64), sharding)
        (ev,) = [t.views[0] for t in part.evs]
        restore_embedding_variables(part.evs, path, sharding)
        assert ev.ev.max_rows == 32 and all(k % 2 == rank for k in _by_key(ev))
        shards.append(_by_key(ev))
    assert {**shards[0], **shards[1]}.keys() == saved.keys()
    for key, values in {**shards[0], **shards[1]}.items():
        np.testing.assert_array_equal(values[0], saved[key][0])


def test_serving_gives_training_rows_and_zero_rows_for_filtered_and_unknown_ids(tmp_path):
    from trainer.hashing import hash_ids
    from trainer.serving import export_saved_model

    state, table = _table(filter_freq=2)
    ids = hash_ids(tf.constant(["u1", "u1", "u2"]))  # u1 admitted, u2 seen once
    _step(state, table, ids.numpy().tolist())
    config = _config(filter_freq=2)
    from trainer.scoring import load_model

    model, _ = load_model(config, state.checkpoint.save(str(tmp_path / "ckpt")))
    export = export_saved_model(config, model, tmp_path / "m", tmp_path / "e")
    serve = tf.saved_model.load(str(export)).signatures["serving_default"]

    def request(users):
        n = len(users)
        raw = {
            "user_id": tf.constant(users),
            "item_id": tf.constant(["i1"] * n),
            "gender": tf.constant(["F"] * n),
            "occupation": tf.constant(["x"] * n),
            "zip_code": tf.constant(["1"] * n),
            "genres": tf.constant(["Drama"] * n),
            "age": tf.constant([30.0] * n, tf.float64),
            "release_year": tf.constant([1990.0] * n, tf.float64),
        }
        return raw, serve(**raw)["logit"].numpy()

    raw, served = request(["u1", " u2", "never-seen"])
    from trainer.serving import ServingModule

    local = ServingModule(config, state.model, {})
    # float32 logits near -4: the SavedModel's optimised graph may round differently
    np.testing.assert_allclose(
        served, state.model(local.transform(raw), training=False).numpy(), rtol=1e-5, atol=1e-6
    )
    assert served[1] == pytest.approx(served[2], abs=1e-7)  # filtered and unknown: the zero row
    assert abs(served[0] - served[2]) > 1e-6  # the admitted id's trained row differs
    features = local.transform(raw)
    rows = table.lookup(features["user_id"]).numpy()
    assert rows[0].any() and not rows[1:].any()


@pytest.mark.parametrize(
    "strategy", ["MirroredStrategy", "MultiWorkerMirroredStrategy", "PSStrategy", "NoStrategy+ps"]
)
def test_strategies_that_cannot_hold_online_tables_refuse_them_naming_embedding_parallel(
    strategy, monkeypatch
):
    import json

    from recpipe.config.train import TrainConfig
    from trainer.distribute import StrategyError, distribution_for

    kind = strategy.removesuffix("+ps")
    if "PS" in strategy or "+ps" in strategy:  # a ps in the cluster, as TF_CONFIG tells the chief
        cluster = {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}
        monkeypatch.setenv(
            "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
        )
    train_config = TrainConfig(train_distribute=kind)
    with pytest.raises(StrategyError, match="ev_params.*EmbeddingParallelStrategy"):
        distribution_for(train_config, ["user_id"])
