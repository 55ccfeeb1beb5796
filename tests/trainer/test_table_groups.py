"""Grouped online tables (issue 37): tables of one ``ev_params`` and dimension share one id -> row
map, admission sketch and row storage, each id keyed by ``id XOR tag``. A group must behave as its
tables would alone (a property over random sequences of steps), export per table, and restore
from and into tables alone (checkpoints written before grouping, or after a config change)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recpipe.config import load_pipeline_config
from tests.support import ROOT, with_edits
from trainer.checkpoints import list_online_tables, restore_embedding_variables, saved_online_tables
from trainer.input.specs import feature_spec
from trainer.online import StepRows, snapshot, table_tag
from trainer.state import build_state

ID_FEATURES = ("user_id", "item_id", "gender", "occupation", "zip_code")
# a fixed wide sketch: no counter shared by two of the few ids, grouped or alone
EV = {"filter_freq": 2, "init_capacity": 8, "max_capacity": 512, "filter_counter_width": 1 << 16}


def _config(grouped: bool):
    """MovieLens DeepFM with every id and tag feature online: one group, or (``grouped``
    False) each table alone, kept apart by an ``ev_params`` field a single day never reads."""
    edits = {"train_config.optimizer_config": [{"lazy_adam_optimizer": {}}, {"adam_optimizer": {}}]}
    for i, name in enumerate((*ID_FEATURES, "genres")):
        decay = 0.5 if grouped else 0.5 + i / 100
        edits[f"feature_config.features[input_names={name}].ev_params"] = {
            **EV,
            "filter_counter_decay": decay,
        }
    return with_edits(load_pipeline_config(ROOT / "conf/movielens_deepfm.yaml", {}), edits)


def _batch(ids: list[list[int]]) -> dict[str, tf.Tensor]:
    """One batch: row ``r`` holds ``ids[r][j]`` in id feature ``j`` and its first two ids as
    genres (a tag feature: ids of one step reach a table from two features' shapes)."""
    cols = np.array(ids, np.int64).reshape(len(ids), len(ID_FEATURES))
    batch = {name: tf.constant(cols[:, j]) for j, name in enumerate(ID_FEATURES)}
    batch["genres"] = tf.RaggedTensor.from_row_lengths(cols[:, :2].reshape(-1), [2] * len(ids))
    batch["age"] = tf.zeros([len(ids)], tf.float32)
    batch["release_year"] = tf.zeros([len(ids)], tf.float32)
    return batch


# the features dict's spec (both configs' features differ in ev_params only)
SPEC = feature_spec(load_pipeline_config(ROOT / "conf/movielens_deepfm.yaml", {}))


def _train_step(state):
    model, optimizers, split = state.model, state.optimizers, state.var_split

    @tf.function(input_signature=[SPEC])  # batches of 1-6 rows: traced once, not once a size
    def step(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(batch, training=True) ** 2)
        variables = [v for part in split for v in part]
        grads = tape.gradient(loss, variables)
        at = 0
        for opt, part in zip(optimizers, split, strict=True):
            opt.apply_gradients(zip(grads[at : at + len(part)], part, strict=True))
            at += len(part)
        model.ev_clock.step.assign_add(1)

    return step


def _members(state) -> dict[str, tuple[set[int], dict]]:
    """Table -> (its admitted ids, its summary less the capacity)."""
    out = {}
    for ev in state.evs:
        ids = ev.member_ids()
        for table, summary in ev.member_summaries().items():
            summary.pop("capacity")
            out[table] = (set(ids[table].tolist()), summary)
    return out


@pytest.fixture(scope="module")
def configs():
    return _config(True), _config(False)


def test_tables_of_one_ev_params_form_one_group_and_export_per_table(configs):
    grouped, alone = (build_state(c) for c in configs)
    assert [ev.members for ev in grouped.evs] == [[*ID_FEATURES, "genres"]]
    assert len(alone.evs) == 6 and all(not ev.grouped for ev in alone.evs)
    (ev,) = grouped.evs
    # two layers (deep and wide) look the group up, each with one weight over its rows
    assert [v.weights.shape[1] for v in ev.views] == [16, 1]
    _train_step(grouped)(_batch([[3, 3, 3, 3, 3]] * 2))
    rows, _ = snapshot(grouped.model)
    assert set(rows) == {*ID_FEATURES, "genres"}
    # id 3 is admitted in every table at its second sighting, and exported as 3, under the
    # table's own weight names
    for table in ID_FEATURES:
        assert rows[table].ids.tolist() == [3], table
        assert sorted(rows[table].views) == sorted(
            [
                f"deepfm/input_layer/{table}/embedding_weights",
                f"deepfm/wide/wide_embedding/{table}/embedding_weights",
            ]
        )
    keys = ev.ids()
    assert sorted(keys[keys >= 0].tolist()) == sorted(3 ^ table_tag(t) for t in (*ID_FEATURES, "genres"))


@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(
            st.lists(st.integers(0, 12), min_size=len(ID_FEATURES), max_size=len(ID_FEATURES)),
            min_size=1,
            max_size=6,
        ),
        min_size=2,
        max_size=5,
    )
)
def test_a_group_admits_counts_and_looks_up_as_its_tables_alone(configs, steps):
    """Over any sequence of steps (ids shared by several tables), each table of the group holds
    the same ids, counts and statistics as the table alone, and every row the model looks up
    for an id is that id's (the map never returns another table's row)."""
    grouped, alone = (build_state(c) for c in configs)
    step_g, step_a = _train_step(grouped), _train_step(alone)
    for ids in steps:
        batch = _batch(ids)
        step_g(batch)
        step_a(batch)
        assert _members(grouped) == _members(alone)
    (ev,) = grouped.evs
    keys = ev.ids()
    used = np.flatnonzero(keys >= 0)
    np.testing.assert_array_equal(ev.map.lookup(tf.constant(keys[used])).numpy(), used)
    tags = ev.row_tags.numpy()[used]
    assert set(tags.tolist()) <= set(ev.tags)


def test_checkpoints_restore_between_groups_and_tables_alone(configs, tmp_path):
    """A checkpoint of tables alone restores into a group and back, row by row: weights and
    Adam slots by id, the counts; ``list_online_tables`` reads both per table."""
    grouped, alone = (build_state(c) for c in configs)
    step = _train_step(alone)
    rng = np.random.default_rng(3)
    for _ in range(4):
        step(_batch(rng.integers(0, 20, size=(8, len(ID_FEATURES))).tolist()))
    path = alone.checkpoint.save(str(tmp_path / "alone" / "ckpt"))
    before = saved_online_tables(path)
    assert sum(len(t.ids) for t in before.values()) > 20

    restored = restore_embedding_variables(grouped.evs, path)
    assert restored == {"deepfm/input_layer/ev_group_dim16": sum(len(t.ids) for t in before.values())}
    path2 = grouped.checkpoint.save(str(tmp_path / "grouped" / "ckpt"))
    after = saved_online_tables(path2)
    assert after.keys() == before.keys()
    for table, saved in before.items():
        again = after[table]
        order, order2 = np.argsort(saved.ids), np.argsort(again.ids)
        np.testing.assert_array_equal(saved.ids[order], again.ids[order2])
        np.testing.assert_array_equal(saved.freqs[order], again.freqs[order2])
        assert again.arrays.keys() == saved.arrays.keys() and len(saved.arrays) == 6  # 2 views, m, v
        for name, values in saved.arrays.items():
            np.testing.assert_array_equal(values[order], again.arrays[name][order2], err_msg=name)
    assert [(t.rsplit("/", 1)[1], n) for t, n, _ in list_online_tables(path2)] == [
        (t.rsplit("/", 1)[1], n) for t, n, _ in list_online_tables(path)
    ]

    back = build_state(configs[1])  # and from the group into tables alone
    restore_embedding_variables(back.evs, path2)
    assert _members(back) == {
        t: (ids, {**s, **{k: 0 for k in s if k != "rows_used"}}) for t, (ids, s) in _members(alone).items()
    }


def _op_counts(fn) -> dict[str, int]:
    """Op type -> how many a traced function holds, its nested functions included."""
    graph = fn.get_concrete_function().graph.as_graph_def()
    counts: dict[str, int] = {}
    for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]:
        counts[node.op] = counts.get(node.op, 0) + 1
    return counts


@pytest.mark.parametrize("fused", [True, False])
def test_the_wide_embedding_takes_the_deep_embeddings_rows_each_step(configs, fused):
    """The deep and wide views of a group are two layers; the model hands the deep one's rows to
    the wide one in the call (``StepRows``): one admission and one map lookup a step, in every
    trace of the model, and the wide view's rows are those of the ids admitted in that step."""
    state = build_state(with_edits(configs[0], {"train_config.fused_kernels": fused}))
    model = state.model
    batch = _batch([[3, 4, 5, 6, 7]] * 2)
    wanted = {"RecpipeAdmit": 1, "LookupTableFindV2": 0} if fused else {"LookupTableFindV2": 1}
    for _ in range(2):  # a second trace gets its own hand-over, nothing from the first
        counts = _op_counts(tf.function(lambda: model(batch, training=True)))
        assert {op: counts.get(op, 0) for op in wanted} == wanted
    # the wide layer alone, with no deep rows handed over, looks the ids up itself
    counts = _op_counts(tf.function(lambda: model.wide(batch, training=True)))
    assert counts.get("LookupTableFindV2", 0) == 1 and counts.get("RecpipeAdmit", 0) == 0
    # ids seen twice are admitted in the step: the wide view reads their new rows, not zeros
    (ev,) = state.evs

    @tf.function
    def wide_rows():
        step_rows = StepRows()
        model.looked_up(batch, True, True, step_rows)
        return model.wide.embedding(batch, stacked=True, training=True, step_rows=step_rows)

    rows = wide_rows().numpy()[0, :5, 0]  # example 0's rows of the five id features
    keys = tf.constant(
        [i ^ table_tag(t) for i, t in zip((3, 4, 5, 6, 7), ID_FEATURES, strict=True)], tf.int64
    )
    found = ev.map.lookup(keys).numpy()
    assert (found >= 0).all()
    np.testing.assert_array_equal(rows, tf.gather(ev.views[1].weights, found).numpy()[:, 0])
    assert np.abs(rows).min() > 0
