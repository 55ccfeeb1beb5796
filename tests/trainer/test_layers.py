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


@pytest.mark.parametrize("model_class, width", [("DeepFM", 1 + 16 + 32), ("WideAndDeep", 4 + 32)])
def test_final_dnn_takes_the_wide_fm_and_deep_outputs_side_by_side(model_class, width):
    """EasyRec's ``final_dnn``: DeepFM's over ``[wide sum, FM per dimension, deep]``,
    WideAndDeep's over ``[wide rows summed (wide_output_dim), deep]``; the FM vector sums
    to the FM term."""
    from recpipe.config import load_pipeline_config
    from tests.support import ROOT, with_edits
    from trainer.input import sample_inputs
    from trainer.models.builders import build_model

    block = model_class.lower().replace("wideanddeep", "wide_and_deep")
    edits = {
        "model_config.model_class": model_class,
        f"model_config.{block}": {"dnn": {"hidden_units": [32]}, "final_dnn": {"hidden_units": [8]}}
        | ({"wide_output_dim": 4} if model_class == "WideAndDeep" else {}),
        "model_config.feature_groups": [
            {"group_name": "deep", "feature_names": ["user_id", "item_id", "gender", "age"]},
            {"group_name": "wide", "feature_names": ["user_id", "item_id"], "wide_deep": "WIDE"},
        ],
    }
    config = with_edits(load_pipeline_config(ROOT / "conf/movielens_deepfm.yaml"), edits)
    model = build_model(config)
    logits = model(sample_inputs(config))
    assert logits.shape.rank == 1 and np.all(np.isfinite(logits.numpy()))
    assert model.final.dense[0].kernel.shape == (width, 8)
    assert model.head.kernel.shape == (8, 1)
    v = tf.random.normal([3, 5, 16])
    np.testing.assert_allclose(
        tf.reduce_sum(FM()(v, vector=True), axis=1).numpy(), FM()(v)[:, 0].numpy(), rtol=1e-5
    )


@pytest.mark.parametrize("embedding_wise", [False, True])
def test_variational_dropout_keeps_one_minus_p_and_penalises_retention(embedding_wise):
    """EasyRec's ``variational_dropout``: in inference each feature is scaled by ``1 - p``
    (``p = 0.5`` at first), in training by a relaxed Bernoulli sample near 0 or 1; the loss
    ``lambda / B * sum(1 - p)`` is added, and both it and the model's loss move ``logit_p``."""
    from recpipe.config import load_pipeline_config
    from tests.support import ROOT, with_edits
    from trainer.input import sample_inputs
    from trainer.layers.feature_dropout import VariationalDropout
    from trainer.models.builders import build_model

    layer = VariationalDropout([2, 1], 0.1, embedding_wise)
    x = tf.ones([1000, 3])
    np.testing.assert_allclose(layer(x).numpy(), 0.5)
    sampled = layer(x, training=True).numpy()
    # at temperature 0.1 about 85 % of the draws land within 0.05 of 0 or 1
    assert np.mean((sampled < 0.05) | (sampled > 0.95)) > 0.8
    assert 0.45 < sampled.mean() < 0.55
    if not embedding_wise:  # a feature's two columns share one draw
        np.testing.assert_allclose(sampled[:, 0], sampled[:, 1])
    size = 3 if embedding_wise else 2
    np.testing.assert_allclose(layer.losses[-1].numpy(), 0.1 / 1000 * size * 0.5, rtol=1e-6)

    vd = {"regularization_lambda": 0.01, "embedding_wise_variational_dropout": embedding_wise}
    config = with_edits(
        load_pipeline_config(ROOT / "conf/movielens_deepfm.yaml"), {"model_config.variational_dropout": vd}
    )
    model = build_model(config)
    inputs = sample_inputs(config)
    with tf.GradientTape() as tape:
        logits = model(inputs, training=True)
        loss = tf.reduce_mean(logits) + tf.add_n(model.losses)
    rates = model.feature_dropout.logit_p
    assert rates.shape == ((6 * 16 + 2) if embedding_wise else 8,)
    grad = tape.gradient(loss, rates)
    assert grad is not None and np.any(grad.numpy() != 0)
    assert np.all(np.isfinite(model(inputs).numpy()))


def test_a_vocab_list_feature_takes_its_values_rows_and_row_0_for_the_rest():
    """EasyRec's ``vocab_list``: value k of the list is row k + 1, an unknown or empty value
    row 0, alike for ids and tag lists; the table has one row more than the list."""
    from trainer.hashing import feature_ids

    f = FeatureSpec(input_names=["hour"], vocab_list=["0", "1", "23"])
    got = feature_ids(tf.constant(["23", "0", "7", "", "1"]), f)
    np.testing.assert_array_equal(got.numpy(), [3, 1, 0, 0, 2])
    tags = FeatureSpec(input_names=["hours"], feature_type="TagFeature", vocab_list=["0", "1", "23"])
    ragged = feature_ids(tf.ragged.constant([["1", "x"], [], ["23"]]), tags)
    assert ragged.to_list() == [[2, 0], [], [3]]
    assert f.table_rows == 4
    with pytest.raises(ValueError, match="one of hash_bucket_size, num_buckets or vocab_list"):
        FeatureSpec(input_names=["hour"], vocab_list=["0"], hash_bucket_size=10)


def test_a_sequence_of_numbers_is_bucketized_by_boundaries_or_even_buckets_of_its_range():
    """EasyRec's ``sub_feature_type: RawFeature``: each element a number, bucketized by
    ``boundaries`` (the count of boundaries <= it) or, with ``num_buckets`` and ``max_val >
    min_val``, by the even buckets of the range; a non-number is 0."""
    from trainer.hashing import feature_ids

    seq = {"input_names": ["prices"], "feature_type": "SequenceFeature", "sub_feature_type": "RawFeature"}
    cut = FeatureSpec(**seq, boundaries=[1.0, 5.0, 10.0])
    values = tf.ragged.constant([["0.5", "5", "12.5"], [], ["x", "7e0"]])
    assert feature_ids(values, cut).to_list() == [[0, 2, 3], [], [0, 2]]
    assert cut.table_rows == 4
    even = FeatureSpec(**seq, num_buckets=4, min_val=0.0, max_val=100.0)
    assert feature_ids(values, even).to_list() == [[1, 1, 1], [], [1, 1]]
    assert feature_ids(tf.constant(["30", "99", "-5"]), even).numpy().tolist() == [2, 4, 0]
    assert even.table_rows == 5 and even.identity_buckets is None
    with pytest.raises(ValueError, match="a sequence of numbers is bucketized"):
        FeatureSpec(**seq, num_buckets=4)


def test_dice_gates_each_unit_by_its_normalised_value_and_the_mlp_takes_easyrecs_names():
    from recpipe.config.model import DNN
    from trainer.layers.dice import Dice
    from trainer.layers.mlp import MLP

    x = tf.random.stateless_normal([256, 4], seed=[3, 4]) * 3.0 + 1.0
    dice = Dice()
    out = dice(x, training=True).numpy()
    # alpha starts at 0: p(s) * s, p the sigmoid of the batch-normalised value
    z = (x - tf.reduce_mean(x, 0)) / tf.sqrt(tf.math.reduce_variance(x, 0) + 1e-9)
    np.testing.assert_allclose(out, (tf.sigmoid(z) * x).numpy(), rtol=1e-4, atol=1e-4)
    dice.alpha.assign([0.5] * 4)
    served = dice(x, training=False).numpy()  # the moving statistics: not the batch's
    assert served.shape == (256, 4) and not np.allclose(served, out)
    assert DNN(activation="tf.nn.relu").activation == "relu" and DNN(activation="silu").activation == "swish"
    with pytest.raises(ValueError, match="'tf.nn.crelu': use one of"):
        DNN(activation="tf.nn.crelu")
    mlp = MLP(DNN(hidden_units=[8, 2], activation="dice"))
    mlp(x)  # built before the tape watches its weights
    with tf.GradientTape() as tape:
        y = mlp(x, training=True)
        loss = tf.reduce_sum(y)
    names = [w.name for w in mlp.trainable_weights]
    assert y.shape == (256, 2) and any("dice_1/alpha" in n for n in names)
    assert all(g is not None for g in tape.gradient(loss, mlp.trainable_weights))


def test_a_sequence_pooled_by_easyrecs_attention_combiner_weights_its_rows_by_a_softmax():
    seq = FeatureSpec(
        input_names=["s"],
        feature_type="SequenceFeature",
        hash_bucket_size=40,
        embedding_dim=4,
        sequence_length=2,
        sequence_combiner={"attention": {}},
    )
    layer = FeatureEmbedding([seq])
    values = tf.ragged.constant([["a", "b", "c"], [], ["a"]], dtype=tf.string, row_splits_dtype=tf.int64)
    out = layer({"s": hash_ids(values, 40)})["s"].numpy()
    table, w = layer.tables["s"].numpy(), layer.scorers["s"].numpy()[:, 0]
    b, c = table[hash_ids(tf.constant(["b", "c"]), 40).numpy()]  # the last sequence_length only
    scores = np.exp([b @ w, c @ w])
    # (float32 against NumPy's float64: an entry near 0 may differ by 1e-4 of itself)
    np.testing.assert_allclose(out[0], (scores[0] * b + scores[1] * c) / scores.sum(), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(out[1], 0.0)
    np.testing.assert_allclose(out[2], table[hash_ids(tf.constant(["a"]), 40).numpy()[0]], rtol=1e-6)
    with pytest.raises(ValueError, match="sequence_combiner: a SequenceFeature's, not a TagFeature's"):
        FeatureSpec(input_names=["t"], feature_type="TagFeature", sequence_combiner={"attention": {}})
