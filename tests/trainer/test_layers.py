"""Layers against their formulas, computed independently in numpy."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from recpipe.config.data import FeatureSpec
from trainer.hashing import hash_ids
from trainer.layers.cross import Cross
from trainer.layers.dot_interaction import DotInteraction
from trainer.layers.embedding import EmbeddingConfigError, FeatureEmbedding
from trainer.layers.fm import FM


def test_fm_equals_sum_of_pairwise_dot_products():
    v = np.random.default_rng(0).normal(size=(4, 5, 3)).astype(np.float32)
    expected = [sum(v[b, i] @ v[b, j] for i in range(5) for j in range(i + 1, 5)) for b in range(4)]
    np.testing.assert_allclose(FM()(tf.constant(v)).numpy()[:, 0], expected, rtol=1e-5)


def test_cross_layer_formula():
    rng = np.random.default_rng(1)
    x0, x = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(3, 4)).astype(np.float32)
    layer = Cross()
    out = layer((tf.constant(x0), tf.constant(x))).numpy()
    w, b = layer.dense.kernel.numpy(), layer.dense.bias.numpy()
    np.testing.assert_allclose(out, x0 * (x @ w + b) + x, rtol=1e-5)


@pytest.mark.parametrize("self_interaction, pairs", [(False, 6), (True, 10)])
def test_dot_interaction_upper_triangle(self_interaction, pairs):
    z = np.random.default_rng(2).normal(size=(2, 4, 3)).astype(np.float32)
    out = DotInteraction(self_interaction)(tf.constant(z)).numpy()
    k = 0 if self_interaction else 1
    expected = [[z[b, i] @ z[b, j] for i in range(4) for j in range(i + k, 4)] for b in range(2)]
    assert out.shape == (2, pairs)
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_embedding_lookup_combiners_and_shared_tables():
    features = [
        FeatureSpec(input_names=["u"], hash_bucket_size=50, embedding_dim=4, embedding_name="shared"),
        FeatureSpec(input_names=["v"], hash_bucket_size=50, embedding_dim=4, embedding_name="shared"),
        FeatureSpec(
            input_names=["t"],
            feature_type="TagFeature",
            hash_bucket_size=30,
            embedding_dim=4,
            combiner="mean",
        ),
    ]
    layer = FeatureEmbedding(features)
    tags = tf.ragged.constant([["a", "b"], [], ["a"]], dtype=tf.string, row_splits_dtype=tf.int64)
    u, v = tf.constant(["x", "y", "x"]), tf.constant(["x", "z", "q"])
    out = layer({"u": hash_ids(u, 50), "v": hash_ids(v, 50), "t": hash_ids(tags, 30)})
    assert set(layer.tables) == {"shared", "t"}
    shared, tag_table = layer.tables["shared"].numpy(), layer.tables["t"].numpy()
    ids = hash_ids(tf.constant(["x", "y"]), 50).numpy()
    np.testing.assert_allclose(out["u"].numpy()[0], shared[ids[0]])
    np.testing.assert_allclose(out["v"].numpy()[0], shared[ids[0]])  # same value, same shared row
    a, b = hash_ids(tf.constant(["a", "b"]), 30).numpy()
    np.testing.assert_allclose(out["t"].numpy()[0], (tag_table[a] + tag_table[b]) / 2, rtol=1e-6)
    np.testing.assert_allclose(out["t"].numpy()[1], 0.0)
    np.testing.assert_allclose(out["t"].numpy()[2], tag_table[a], rtol=1e-6)
    with pytest.raises(TypeError, match="feature 'u' arrived as string; the model takes int64 ids"):
        layer({"u": u, "v": hash_ids(v, 50), "t": hash_ids(tags, 30)})  # ids are hashed before the model


def test_stacked_embeddings_are_the_features_rows_in_order_and_train_the_same():
    features = [
        FeatureSpec(input_names=["u"], hash_bucket_size=50, embedding_dim=4),
        FeatureSpec(input_names=["t"], feature_type="TagFeature", hash_bucket_size=30, embedding_dim=4),
        FeatureSpec(input_names=["v"], hash_bucket_size=40, embedding_dim=4),
        FeatureSpec(input_names=["w"], hash_bucket_size=20, embedding_dim=4),
    ]
    layer = FeatureEmbedding(features)
    tags = tf.ragged.constant([["a", "b"], [], ["a"]], dtype=tf.string, row_splits_dtype=tf.int64)
    raw = {"u": tf.constant(["x", "y", "x"]), "t": tags, "v": tf.constant(["p", "q", "r"])}
    raw["w"] = tf.constant(["k", "l", "m"])
    inputs = {n: hash_ids(value, layer.shapes[n][0]) for n, value in raw.items()}
    weights = tf.random.stateless_normal([3, 4, 4], seed=[1, 2])
    outs, grads = [], []
    for stacked in (False, True):
        with tf.GradientTape() as tape:
            out = layer(inputs, stacked=stacked)
            if not stacked:
                out = tf.stack([out[n] for n in "utvw"], axis=1)
            loss = tf.reduce_sum(out * weights)
        outs.append(out.numpy())
        grads.append(tf.convert_to_tensor(tape.gradient(loss, layer.fused[4])).numpy())
    assert outs[1].shape == (3, 4, 4)
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-6)
    looked_up = {
        layer.tables[n].offset + int(i)
        for n, values in [
            ("u", inputs["u"]),
            ("t", inputs["t"].flat_values),
            ("v", inputs["v"]),
            ("w", inputs["w"]),
        ]
        for i in values.numpy()
    }
    assert set(np.flatnonzero(grads[1].any(axis=1))) == looked_up  # only the batch's rows
    mixed = FeatureEmbedding(
        features[:1] + [FeatureSpec(input_names=["z"], hash_bucket_size=9, embedding_dim=2)]
    )
    assert layer.width == 4 and mixed.width is None
    with pytest.raises(EmbeddingConfigError, match="stacked embeddings need one embedding_dim"):
        mixed({"u": tf.constant([1], tf.int64), "z": tf.constant([2], tf.int64)}, stacked=True)


def test_embedding_config_errors():
    with pytest.raises(EmbeddingConfigError, match="'u' needs hash_bucket_size"):
        FeatureEmbedding([FeatureSpec(input_names=["u"])])
    shared = [
        FeatureSpec(input_names=["u"], hash_bucket_size=50, embedding_name="s"),
        FeatureSpec(input_names=["v"], hash_bucket_size=60, embedding_name="s"),
    ]
    with pytest.raises(EmbeddingConfigError, match="sharing embedding_name 's'"):
        FeatureEmbedding(shared)


def test_fused_tables_save_and_restore_one_entry_per_table(tmp_path):
    features = [
        FeatureSpec(input_names=["u"], hash_bucket_size=5, embedding_dim=4),
        FeatureSpec(input_names=["v"], hash_bucket_size=7, embedding_dim=4),
        FeatureSpec(input_names=["w"], hash_bucket_size=3, embedding_dim=2),
    ]
    layer = FeatureEmbedding(features)
    layer.build()
    assert {w: v.shape.as_list() for w, v in layer.fused.items()} == {2: [3, 2], 4: [12, 4]}
    # a checkpoint of plain per-table variables (the layout before fusing) restores by name
    old = {n: tf.Variable(np.full(layer.tables[n].shape, i + 1.0, np.float32)) for i, n in enumerate("uvw")}
    path = tf.train.Checkpoint(tables=old).save(str(tmp_path / "old"))
    tf.train.Checkpoint(tables=dict(layer.tables)).restore(path).assert_consumed()
    np.testing.assert_array_equal(
        layer.fused[4].numpy(), np.repeat([[1.0], [2.0]], [5, 7], axis=0) * np.ones(4)
    )
    np.testing.assert_array_equal(layer.tables["w"].numpy(), np.full((3, 2), 3.0))
    # and the fused layer saves the same keys
    path = tf.train.Checkpoint(tables=dict(layer.tables)).save(str(tmp_path / "new"))
    assert sorted(k for k, _ in tf.train.list_variables(path) if k.startswith("tables/")) == [
        f"tables/{n}/.ATTRIBUTES/VARIABLE_VALUE" for n in "uvw"
    ]


def test_an_mlp_under_mixed_bfloat16_computes_in_bfloat16_with_float32_weights_and_output():
    from recpipe.config.model import DNN
    from trainer.layers.mlp import MLP

    x = tf.random.stateless_normal([64, 40], seed=[1, 2])
    full = MLP(DNN(hidden_units=[32, 8]))
    mixed = MLP(DNN(hidden_units=[32, 8], dtype_policy="mixed_bfloat16"))
    full(x), mixed(x)
    for a, b in zip(full.weights, mixed.weights, strict=True):
        b.assign(a)
    with tf.GradientTape() as tape:
        out = mixed(x)
        loss = tf.reduce_sum(out)
    grads = tape.gradient(loss, mixed.trainable_weights)
    assert out.dtype == tf.float32 and all(w.dtype == tf.float32 for w in mixed.weights)
    assert all(g.dtype == tf.float32 for g in grads)
    assert mixed.dense[0].compute_dtype == "bfloat16"
    reference = full(x).numpy()
    # bfloat16 keeps 8 bits of mantissa: close to the float32 product, not equal to it
    assert not np.array_equal(out.numpy(), reference)
    np.testing.assert_allclose(out.numpy(), reference, rtol=0.05, atol=0.05 * np.abs(reference).max())
