"""DIN (``MultiTowerDIN``, ``conf/movielens_din.yaml``): the attention ignores padding, config
errors name their field, and the model trains on the Spark job's histories and serves raw
ones: the SavedModel, given each row's history as the separated string, scores as the
trainer's model does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from recpipe.config.model import DNN
from recpipe.layout import finished_partitions, parse_ds_range
from tests.support import ROOT, with_edits
from trainer.layers.attention import DINAttention

WEEK = "1997-09-20:1997-09-26"  # a week: a fresh root prepares each day in several seconds


def test_attention_ignores_padding_and_pools_an_empty_history_to_zeros():
    tf.random.set_seed(0)
    layer = DINAttention(DNN(hidden_units=[8, 1]))
    query = tf.random.normal([3, 4])
    keys = tf.random.normal([3, 5, 4])
    mask = tf.constant([[True] * 5, [True, True, False, False, False], [False] * 5])
    out = layer(query, keys, mask)
    noise = tf.where(mask[:, :, None], keys, tf.random.normal([3, 5, 4]) * 100)
    np.testing.assert_allclose(layer(query, noise, mask).numpy(), out.numpy(), atol=1e-6)
    np.testing.assert_array_equal(out[2].numpy(), np.zeros(4))
    # a history of one element pools to that element
    one = tf.constant([[True, False, False, False, False]] * 3)
    np.testing.assert_allclose(layer(query, keys, one).numpy(), keys[:, 0].numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="must end with 1"):
        DINAttention(DNN(hidden_units=[8, 4]))


def test_the_first_layer_split_by_parts_scores_as_the_concatenated_form_with_the_same_variables():
    """The scoring MLP's first layer is computed as ``q @ (W_q + W_d) + [k, q * k] @ [W_k - W_d;
    W_p]``: the same scores as ``[q, k, q - k, q * k] @ W``, the same kernel, named as before."""
    tf.random.set_seed(2)
    layer = DINAttention(DNN(hidden_units=[8, 4, 1]), name="din_0")
    query, keys = tf.random.normal([5, 6]), tf.random.normal([5, 7, 6])
    mask = tf.sequence_mask([7, 3, 1, 0, 5], 7)
    out = layer(query, keys, mask)
    names = sorted(v.name for v in layer.weights)
    assert names == [
        "din_0/att_dnn/dense_0/bias:0", "din_0/att_dnn/dense_0/kernel:0", "din_0/att_dnn/dense_1/bias:0",
        "din_0/att_dnn/dense_1/kernel:0", "din_0/att_score/bias:0", "din_0/att_score/kernel:0",
    ]  # fmt: skip
    assert layer.mlp.dense[0].kernel.shape == (24, 8)
    q = tf.tile(query[:, None, :], [1, 7, 1])
    concat = tf.concat([q, keys, q - keys, q * keys], axis=-1)
    scores = tf.squeeze(layer.score(layer.mlp(concat)), -1)
    scores = tf.where(mask, scores, -1e9 * tf.ones_like(scores))
    weights = tf.nn.softmax(scores, axis=-1) * tf.cast(mask, tf.float32)
    np.testing.assert_allclose(out.numpy(), tf.einsum("bl,bld->bd", weights, keys).numpy(), atol=1e-5)


def test_aux_history_is_pooled_with_the_history_weights_and_takes_no_part_in_them():
    tf.random.set_seed(1)
    layer = DINAttention(DNN(hidden_units=[8, 1]))
    query, keys = tf.random.normal([4, 3]), tf.random.normal([4, 6, 3])
    mask = tf.sequence_mask([6, 2, 1, 0], 6)
    ratings = tf.random.normal([4, 6, 2])
    out = layer(query, keys, mask, values=ratings)
    assert out.shape == (4, 5)
    np.testing.assert_allclose(out[:, :3].numpy(), layer(query, keys, mask).numpy(), atol=1e-6)
    # the same weights: pooling [keys, ratings] is pooling the keys and the ratings apiece
    both = layer(query, keys, mask, values=tf.concat([ratings, keys], axis=-1))
    np.testing.assert_allclose(both[:, 3:5].numpy(), out[:, 3:].numpy(), atol=1e-6)
    np.testing.assert_allclose(both[:, 5:].numpy(), out[:, :3].numpy(), atol=1e-6)
    # the ratings move no weight: doubled, they pool to twice as much beside the same keys
    twice = layer(query, keys, mask, values=2 * ratings)
    np.testing.assert_allclose(twice[:, :3].numpy(), out[:, :3].numpy(), atol=1e-6)
    np.testing.assert_allclose(twice[:, 3:].numpy(), 2 * out[:, 3:].numpy(), atol=1e-5)
    np.testing.assert_array_equal(out[3].numpy(), np.zeros(5))


@pytest.mark.parametrize(
    "edits, message",
    [
        (
            {"model_config.multi_tower.din_towers": [{"input": "seq"}]},
            r"din_towers\[0\].input: no seq_att_groups",
        ),
        (
            {"model_config.multi_tower.towers": [{"input": "users"}]},
            r"towers\[0\].input: no feature group 'users'",
        ),
        (
            {
                "model_config.seq_att_groups": [
                    {
                        "group_name": "din",
                        "seq_att_map": [{"key": "item_id", "hist_seq": ["hist_item_id", "hist_genres"]}],
                    }
                ]
            },
            r"seq_att_groups\[din\]: the keys' embedding_dim add up to 16, the histories' to 32",
        ),
        (
            {
                "model_config.seq_att_groups": [
                    {"group_name": "din", "seq_att_map": [{"key": "item_id", "hist_seq": "genres"}]}
                ]
            },
            r"seq_att_map\[0\].hist_seq\[0\]: 'genres' is a TagFeature, not a SequenceFeature",
        ),
        (
            {
                "model_config.seq_att_groups": [
                    {
                        "group_name": "din",
                        "seq_att_map": [
                            {"key": "item_id", "hist_seq": "hist_item_id", "aux_hist_seq": ["age"]}
                        ],
                    }
                ]
            },
            r"seq_att_map\[0\].aux_hist_seq\[0\]: 'age' is a RawFeature, not a SequenceFeature",
        ),
    ],
)
def test_a_bad_multi_tower_din_names_its_field(edits, message):
    from recpipe.config import load_pipeline_config
    from trainer.models.builders import ModelConfigError, build_model

    config = with_edits(load_pipeline_config(ROOT / "conf/movielens_din.yaml"), edits)
    with pytest.raises(ModelConfigError, match=message):
        build_model(config)


def test_a_multi_tower_din_without_din_towers_is_easyrecs_multi_tower():
    """``din_towers: []`` and no ``seq_att_groups``: the towers over the feature groups alone
    (its tables of one width still come back per feature, as the towers pick them by name)."""
    from recpipe.config import load_pipeline_config
    from trainer.input import sample_inputs
    from trainer.models.builders import build_model

    config = with_edits(
        load_pipeline_config(ROOT / "conf/movielens_din.yaml"),
        {"model_config.multi_tower.din_towers": [], "model_config.seq_att_groups": []},
    )
    model = build_model(config)
    logits = model(sample_inputs(config))
    assert logits.shape[0] >= 1 and np.all(np.isfinite(logits.numpy()))
    assert not any("din_" in v.name for v in model.trainable_variables)


# a DeepFM whose item group attends over the user's earlier films (EasyRec's feature group
# ``sequence_features``): the histories of conf/movielens_din.yaml
GROUP_SEQUENCES = {
    "model_config.model_class": "DeepFM",
    "model_config.deepfm": {"dnn": {"hidden_units": [32, 16]}},
    "model_config.multi_tower": None,
    "model_config.seq_att_groups": [],
    "model_config.feature_groups": [
        {"group_name": "user", "feature_names": ["user_id", "gender", "occupation", "zip_code", "age"]},
        {
            "group_name": "item",
            "feature_names": ["item_id", "genre_set", "release_year"],
            "sequence_features": [
                {
                    "group_name": "seq",
                    "seq_att_map": [
                        {"key": ["item_id", "genre_set"], "hist_seq": ["hist_item_id", "hist_genres"]}
                    ],
                    "seq_dnn": {"hidden_units": [16, 1]},
                }
            ],
        },
    ],
}


def _group_model(edits: dict):
    from recpipe.config import load_pipeline_config
    from trainer.input import sample_inputs
    from trainer.models.builders import build_model

    config = with_edits(load_pipeline_config(ROOT / "conf/movielens_din.yaml"), GROUP_SEQUENCES | edits)
    model = build_model(config)
    inputs = sample_inputs(config)
    return model, inputs, model(inputs)


def test_a_groups_sequence_features_join_its_inputs_as_easyrecs_sequence_layer():
    """The attention's output (the pooled histories, 32 wide, then the keys' 32) reaches the
    tower after the raw features; without ``need_key_feature`` the keys are left out; the
    tables are the features' own."""
    model, inputs, logits = _group_model({})
    assert np.all(np.isfinite(logits.numpy()))
    embeddings, dense, sequences = model.looked_up(inputs, False, False)
    assert dense.shape[1] == 2 + 32 + 32  # age, release_year; pooled histories; keys
    keys = tf.concat([embeddings["item_id"], embeddings["genre_set"]], axis=1)
    np.testing.assert_allclose(dense[:, -32:].numpy(), keys.numpy())
    assert {v.name.split("/")[2] for v in model.attention.trainable_variables} == {"seq_dnn_seq"}
    group = GROUP_SEQUENCES["model_config.feature_groups"][1]["sequence_features"][0]
    without = dict(group, need_key_feature=False)
    edits = {"model_config.feature_groups": [GROUP_SEQUENCES["model_config.feature_groups"][0],
                                             dict(GROUP_SEQUENCES["model_config.feature_groups"][1],
                                                  sequence_features=[without])]}  # fmt: skip
    model, inputs, _ = _group_model(edits)
    assert model.looked_up(inputs, False, False)[1].shape[1] == 2 + 32


@pytest.mark.parametrize("transform_dnn, width", [(False, 32), (True, 32)])
def test_a_narrower_key_is_padded_or_projected_with_allow_key_transform(transform_dnn, width):
    item = dict(GROUP_SEQUENCES["model_config.feature_groups"][1])
    att = dict(item["sequence_features"][0], allow_key_transform=True, transform_dnn=transform_dnn)
    att["seq_att_map"] = [{"key": "item_id", "hist_seq": ["hist_item_id", "hist_genres"]}]
    groups = [GROUP_SEQUENCES["model_config.feature_groups"][0], dict(item, sequence_features=[att])]
    model, inputs, logits = _group_model({"model_config.feature_groups": groups})
    assert np.all(np.isfinite(logits.numpy()))
    embeddings, dense, _ = model.looked_up(inputs, False, False)
    assert dense.shape[1] == 2 + 32 + width
    projected = any("key_transform" in v.name for v in model.trainable_variables)
    assert projected == transform_dnn
    if not transform_dnn:  # the query is the key's 16 then zeros
        np.testing.assert_allclose(dense[:, -32:-16].numpy(), embeddings["item_id"].numpy())
        np.testing.assert_array_equal(dense[:, -16:].numpy(), 0)


@pytest.mark.parametrize(
    "edits, message",
    [
        ({"model_config.model_class": "DLRM", "model_config.dlrm": {}}, "not with model_class DLRM"),
        (
            {
                "model_config.feature_groups": [
                    {"group_name": "all", "feature_names": ["item_id", "hist_item_id"]}
                ]
            },
            r"feature_groups\[0\].feature_names: SequenceFeature \['hist_item_id'\] is attended over",
        ),
    ],
)
def test_a_bad_group_attention_names_its_field(edits, message):
    from trainer.models.builders import ModelConfigError

    with pytest.raises(ModelConfigError, match=message):
        _group_model(edits)


@pytest.fixture(scope="module")
def ml_din(spark, movielens_raw, tmp_path_factory):
    """conf/movielens_din.yaml over the first week, prepared by the Spark job in one run over
    the range (tests/features/test_backfill.py: the same rows as day by day)."""
    from tests.trainer.conftest import _config, _days, _prepare

    config = _config(movielens_raw, tmp_path_factory.mktemp("din"), "conf/movielens_din.yaml")
    _prepare(spark, config, _days(movielens_raw / "events", *WEEK.split(":")))
    return config


def test_din_trains_and_the_saved_model_scores_raw_histories_as_the_trainer(ml_din, tmp_path):
    from trainer.input import FeatureReader
    from trainer.loop import Trainer, TrainJob
    from trainer.scoring import load_model
    from trainer.serving import export_saved_model

    config = with_edits(ml_din, {"train_config.num_steps": 60})
    days = [d for d in parse_ds_range(WEEK) if (Path(config.train_input_path) / f"ds={d}").exists()]
    trained = Trainer(TrainJob(config=config, model_dir=tmp_path / "m", train_days=days)).train()
    assert trained.global_step == 60 and np.isfinite(trained.loss)
    model, _ = load_model(config, tmp_path / "m")
    # the history shares item_id's table: no table of its own
    assert not any("hist_" in v.name for v in model.trainable_variables)
    final = export_saved_model(config, model, tmp_path / "m", tmp_path / "exports")

    last = WEEK.split(":")[1]
    reader = FeatureReader(
        config, finished_partitions(config.train_input_path, [last]), shuffle=False, batch_size=10**6
    )
    features, _ = reader.structure(next(reader.batches()))
    expected = tf.sigmoid(model(features)).numpy()
    assert tf.reduce_max(features["hist_item_id"].row_lengths()).numpy() > 1

    got = _serve(final, _requests(config, last))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


HISTORIES = ["hist_item_id", "hist_genres", "hist_rating"]


def _requests(config, day: str) -> dict[str, np.ndarray]:
    """The raw requests of ``day``: its rows in the features' order (matched by user and item;
    no row is quarantined), each history as the logs would hold it, the separated string."""
    from tests.trainer.test_serving import _raw_requests

    raw = _raw_requests(config, day)
    part = next((Path(config.train_input_path) / f"ds={day}").glob("*.parquet"))
    written = pq.read_table(part, columns=["user_id", "item_id", *HISTORIES]).to_pydict()
    at = {key: i for i, key in enumerate(zip(raw["user_id"], raw["item_id"], strict=True))}
    order = [at[key] for key in zip(written["user_id"], written["item_id"], strict=True)]
    assert order == sorted(order)  # the Spark job keeps the logged order through the history join
    request = {name: values[order] for name, values in raw.items()}
    for name in HISTORIES:
        request[name] = np.array(["|".join(h) for h in written[name]], dtype=object)
    return request


def _serve(saved_model: Path, request: dict) -> np.ndarray:
    served = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    return served(**{k: tf.constant(v) for k, v in request.items()})["probability"].numpy()


def _days(config) -> list[str]:
    return [d for d in parse_ds_range(WEEK) if (Path(config.train_input_path) / f"ds={d}").exists()]


def test_histories_in_online_tables_are_looked_up_carried_by_deltas_and_pushed(ml_din, tmp_path):
    """``model_config.ev_params`` on every id feature, histories included: a history reads its
    item's online rows (no table of its own); a film met only in histories moves, so the delta
    carries it; base + delta serves as a full export and the Redis push holds every table."""
    from recpipe.exports.files import read_params
    from tests.trainer.chain import (
        assert_base_plus_delta_serves_as_the_full_export,
        assert_the_push_carries_every_table,
        base_and_delta,
    )
    from trainer import online
    from trainer.hashing import hash_ids

    days = _days(ml_din)
    chain = base_and_delta(ml_din, days[:-2], days[-2:-1], tmp_path)
    members = {m for ev in online.tables(chain["model"]) for m in ev.members}
    assert {"user_id", "item_id", "genre_set", "hist_rating"} <= members
    assert not members & {"hist_item_id", "hist_genres"}

    part = next((Path(ml_din.train_input_path) / f"ds={days[-2]}").glob("*.parquet"))
    written = pq.read_table(part, columns=["item_id", "hist_item_id"]).to_pydict()
    only_in_histories = {i for h in written["hist_item_id"] for i in h} - set(written["item_id"])
    keys = set(hash_ids(tf.constant(sorted(only_in_histories))).numpy().tolist())
    exports = chain["exports"]
    in_base = keys & set(read_params(exports / "base").tables["item_id"].ids.tolist())
    assert len(in_base) > 10
    assert in_base <= set(read_params(exports / "delta-01").tables["item_id"].ids.tolist())

    request = _requests(chain["config"], days[-1])
    assert_base_plus_delta_serves_as_the_full_export(chain, request, ["probability"], tmp_path / "sm")
    assert_the_push_carries_every_table(chain)


@pytest.mark.slow
def test_din_trains_alike_under_embedding_parallel_and_horovod(ml_din, tmp_path):
    """Every rank looks the histories up across ranks (all-to-all) in the item's sharded
    online table, uncounted, as Horovod's whole tables do."""
    from tests.trainer.test_distribute import assert_ep_trains_as_horovod

    assert_ep_trains_as_horovod(ml_din, tmp_path, WEEK, ["user_id", "item_id", "hist_item_id"])


@pytest.mark.slow
def test_din_trains_under_mirrored_multi_worker_mirrored_and_parameter_servers(ml_din, tmp_path):
    from tests.trainer.test_distribute import assert_trains_under_the_other_strategies

    assert_trains_under_the_other_strategies(ml_din, tmp_path, WEEK)


def test_an_esmm_group_mlp_reads_its_groups_attention_outputs():
    """ESMM's ``groups`` with a group's ``sequence_features``: the item group's MLP reads its
    ids, its raw feature and its attention's 64 columns; the user group's, none of them."""
    from tests.trainer.test_multitask import ESMM

    groups = GROUP_SEQUENCES["model_config.feature_groups"]
    esmm = dict(ESMM["model_config.esmm"], groups=[
        {"input": "user", "dnn": {"hidden_units": [8]}},
        {"input": "item", "dnn": {"hidden_units": [8]}},
    ])  # fmt: skip
    edits = {
        **ESMM,
        "model_config.deepfm": None,
        "model_config.esmm": esmm,
        "model_config.feature_groups": groups,
    }
    model, _, logits = _group_model(edits)
    assert logits.shape[1] == 2 and np.all(np.isfinite(logits.numpy()))
    widths = [m.dense[0].kernel.shape[0] for m in model.group_mlps]
    assert widths == [4 * 16 + 1, 2 * 16 + 1 + 32 + 32]
