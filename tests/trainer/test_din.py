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
                    {"group_name": "din", "seq_att_map": [{"key": "genre_set", "hist_seq": "hist_item_id"}]}
                ]
            },
            r"seq_att_map\[0\]: 'hist_item_id' must share 'genre_set''s table",
        ),
        (
            {
                "model_config.seq_att_groups": [
                    {"group_name": "din", "seq_att_map": [{"key": "item_id", "hist_seq": "genres"}]}
                ]
            },
            r"seq_att_map\[0\].hist_seq: 'genres' is a TagFeature, not a SequenceFeature",
        ),
    ],
)
def test_a_bad_multi_tower_din_names_its_field(edits, message):
    from recpipe.config import load_pipeline_config
    from trainer.models.builders import ModelConfigError, build_model

    config = with_edits(load_pipeline_config(ROOT / "conf/movielens_din.yaml"), edits)
    with pytest.raises(ModelConfigError, match=message):
        build_model(config)


@pytest.fixture(scope="module")
def ml_din(spark, movielens_raw, tmp_path_factory):
    """conf/movielens_din.yaml over the first week, prepared by the Spark job."""
    from features.prepare import prepare_day
    from tests.trainer.conftest import _config

    config = _config(movielens_raw, tmp_path_factory.mktemp("din"), "conf/movielens_din.yaml")
    for ds in parse_ds_range(WEEK):
        if (movielens_raw / "events" / f"ds={ds}").exists():
            prepare_day(spark, config, ds)
    return config


def test_din_trains_and_the_saved_model_scores_raw_histories_as_the_trainer(ml_din, tmp_path):
    from tests.trainer.test_serving import _raw_requests
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

    # the raw request: the day's rows in the features' order (the history joins reorder them),
    # each history as the logs would hold it, the separated string
    raw = _raw_requests(config, last)
    part = next((Path(config.train_input_path) / f"ds={last}").glob("*.parquet"))
    written = pq.read_table(part, columns=["user_id", "item_id", "hist_item_id", "hist_genres"]).to_pydict()
    at = {key: i for i, key in enumerate(zip(raw["user_id"], raw["item_id"], strict=True))}
    order = [at[key] for key in zip(written["user_id"], written["item_id"], strict=True)]
    request = {name: values[order] for name, values in raw.items()}
    request["hist_item_id"] = np.array(["|".join(h) for h in written["hist_item_id"]], dtype=object)
    request["hist_genres"] = np.array(["|".join(h) for h in written["hist_genres"]], dtype=object)
    served = tf.saved_model.load(str(final)).signatures["serving_default"]
    got = served(**{k: tf.constant(v) for k, v in request.items()})
    np.testing.assert_allclose(got["probability"].numpy(), expected, rtol=0, atol=1e-5)
