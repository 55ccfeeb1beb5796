"""Multi-task models (``MMoE``, ``ESMM``, ``DBMTL``; ``conf/movielens_mmoe.yaml``): two tasks
from one MovieLens rating (``like``: rating >= 4, ``rated_high``: rating = 5) train together;
evaluation writes each task's metrics as ``<task>/<metric>``; the SavedModel and the MLflow
Model return every task's probability, as the trainer's model computes them; config errors
name their field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from recpipe.layout import finished_partitions, parse_ds_range
from tests.support import ROOT, with_edits

WEEK = "1997-09-20:1997-09-26"
LAST = "1997-09-26"
ESMM = {
    "model_config.model_class": "ESMM",
    "model_config.mmoe": None,
    "model_config.esmm": {
        "ctr_tower": {"tower_name": "ctr", "label_name": "label", "dnn": {"hidden_units": [32]}},
        "cvr_tower": {
            "tower_name": "cvr",
            "label_name": "rating",
            "label_threshold": 5,
            "dnn": {"hidden_units": [32]},
        },
    },
}
DBMTL = {
    "model_config.model_class": "DBMTL",
    "model_config.mmoe": None,
    "model_config.dbmtl": {
        "bottom_dnn": {"hidden_units": [64]},
        "task_towers": [
            {"tower_name": "like", "label_name": "label", "dnn": {"hidden_units": [32]}},
            {
                "tower_name": "rated_high",
                "label_name": "rating",
                "label_threshold": 5,
                "dnn": {"hidden_units": [32]},
                "relation_tower_names": ["like"],
                "relation_dnn": {"hidden_units": [16]},
            },
        ],
    },
}


def test_ctcvr_logit_is_the_logit_of_the_product_of_probabilities():
    from trainer.models.multitask import ctcvr_logit

    a = tf.constant([-30.0, -5.0, -1.0, 0.0, 0.5, 3.0, 12.0, 40.0])
    b = tf.constant([2.0, -20.0, 0.3, 0.0, -0.7, 8.0, 15.0, 40.0])
    got = ctcvr_logit(a, b)
    assert np.all(np.isfinite(got.numpy()))
    want = tf.sigmoid(tf.cast(a, tf.float64)) * tf.sigmoid(tf.cast(b, tf.float64))
    np.testing.assert_allclose(tf.sigmoid(got).numpy(), want.numpy(), rtol=1e-5, atol=1e-7)
    with tf.GradientTape() as tape:
        tape.watch(a)
        loss = tf.reduce_sum(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.ones_like(a), logits=ctcvr_logit(a, b))
        )
    assert np.all(np.isfinite(tape.gradient(loss, a).numpy()))


@pytest.mark.parametrize(
    "edits, message",
    [
        (
            {
                "model_config.mmoe.task_towers": [
                    {"tower_name": "like"},
                    {"tower_name": "x", "label_name": "clk"},
                ]
            },
            r"tower 'x': label_name 'clk' is not among data_config.label_fields",
        ),
        (
            {"model_config.mmoe.task_towers": [{"tower_name": "like"}, {"tower_name": "like"}]},
            r"tower_name \['like'\] given twice",
        ),
        ({"model_config.mmoe": None}, r"model_config.mmoe: model_class MMoE needs it"),
    ],
)
def test_a_bad_multi_task_config_names_its_field(edits, message):
    from recpipe.config import load_pipeline_config

    with pytest.raises(ValueError, match=message):
        with_edits(load_pipeline_config(ROOT / "conf/movielens_mmoe.yaml"), edits)


def test_a_sequence_feature_is_refused_by_a_multi_task_model():
    from recpipe.config import load_pipeline_config
    from trainer.models.builders import ModelConfigError, build_model

    din = load_pipeline_config(ROOT / "conf/movielens_din.yaml")
    names = [f.name for f in din.feature_config.features]
    config = with_edits(
        din,
        {
            "model_config.model_class": "MMoE",
            "model_config.multi_tower": None,
            "model_config.seq_att_groups": [],
            "model_config.feature_groups": [{"group_name": "all", "feature_names": names}],
            "model_config.mmoe": {
                "task_towers": [{"tower_name": "a"}, {"tower_name": "b", "label_name": "label"}]
            },
        },
    )
    with pytest.raises(
        ModelConfigError, match=r"SequenceFeature \['hist_item_id', 'hist_genres', 'hist_rating'\]"
    ):
        build_model(config)


def test_esmm_groups_feed_both_towers_an_mlp_per_feature_group():
    """EasyRec's ``esmm.groups``: the user and the item group each through its own MLP, their
    outputs side by side as the towers' input."""
    from recpipe.config import load_pipeline_config
    from trainer.input import sample_inputs
    from trainer.models.builders import ModelConfigError, build_model

    groups = [
        {"group_name": "user", "feature_names": ["user_id", "gender", "occupation", "zip_code", "age"]},
        {"group_name": "item", "feature_names": ["item_id", "genres", "release_year"]},
    ]
    esmm = dict(ESMM["model_config.esmm"], groups=[
        {"input": "user", "dnn": {"hidden_units": [24]}},
        {"input": "item", "dnn": {"hidden_units": [8]}},
    ])  # fmt: skip
    edits = {**ESMM, "model_config.feature_groups": groups, "model_config.esmm": esmm}
    config = with_edits(load_pipeline_config(ROOT / "conf/movielens_mmoe.yaml"), edits)
    model = build_model(config)
    logits = model(sample_inputs(config))
    assert logits.shape[1] == 2 and np.all(np.isfinite(logits.numpy()))
    # user: 4 ids of 16 and age; item: 2 of 16 and release_year; the towers read 24 + 8
    assert [m.dense[0].kernel.shape[0] for m in model.group_mlps] == [4 * 16 + 1, 2 * 16 + 1]
    assert model.towers[0].dense[0].kernel.shape[0] == 32
    esmm["groups"][1]["input"] = "items"
    with pytest.raises(ModelConfigError, match=r"esmm.groups\[1\].input: no feature group 'items'"):
        build_model(with_edits(load_pipeline_config(ROOT / "conf/movielens_mmoe.yaml"), edits))


@pytest.fixture(scope="module")
def ml_mmoe(spark, movielens_raw, tmp_path_factory):
    """conf/movielens_mmoe.yaml over the first week (its features keep the rating as a label)."""
    from tests.trainer.conftest import _config, _prepare

    config = _config(movielens_raw, tmp_path_factory.mktemp("mmoe"), "conf/movielens_mmoe.yaml")
    _prepare(
        spark, config, [d for d in parse_ds_range(WEEK) if (movielens_raw / "events" / f"ds={d}").exists()]
    )
    return config


def _days(config):
    return [d for d in parse_ds_range(WEEK) if (Path(config.train_input_path) / f"ds={d}").exists()]


def _rows(config):
    from trainer.input import FeatureReader

    reader = FeatureReader(
        config, finished_partitions(config.train_input_path, [LAST]), shuffle=False, batch_size=10**6
    )
    return reader.structure(next(reader.batches()))


@pytest.mark.parametrize("variant", ["MMoE", "ESMM", "DBMTL"])
def test_multi_task_trains_evaluates_per_task_and_serves_every_task(ml_mmoe, tmp_path, variant):
    from tests.trainer.test_serving import _raw_requests
    from trainer.loop import Trainer, TrainJob
    from trainer.mlflow_model import signature
    from trainer.scoring import evaluate, load_model
    from trainer.serving import export_saved_model

    edits = {"MMoE": {}, "ESMM": ESMM, "DBMTL": DBMTL}[variant]
    config = with_edits(ml_mmoe, {**edits, "train_config.num_steps": 40})
    names = config.model.task_names
    assert names == (["ctr", "ctcvr"] if variant == "ESMM" else ["like", "rated_high"])
    trained = Trainer(TrainJob(config=config, model_dir=tmp_path / "m", train_days=_days(config))).train()
    assert trained.global_step == 40 and np.isfinite(trained.loss)

    result = evaluate(config, tmp_path / "m", [LAST], predictions_path=tmp_path / "p.parquet")
    assert json.loads((tmp_path / "m" / "eval_result.json").read_text()) == json.loads(json.dumps(result))
    for name in names:
        for metric in ("auc", "gauc", "logloss"):
            assert np.isfinite(result[f"{name}/{metric}"]), (name, metric)
    assert result["auc"] == result[f"{names[0]}/auc"]  # the gate's metric: the first task's
    assert result[f"{names[0]}/auc"] != result[f"{names[1]}/auc"]

    import pyarrow.parquet as pq

    predictions = pq.read_table(tmp_path / "p.parquet").to_pydict()
    like = np.asarray(predictions[f"label_{names[0]}"])
    high = np.asarray(predictions[f"label_{names[1]}"])
    assert set(np.unique(high)) <= {0.0, 1.0} and 0 < high.mean() < like.mean() < 1
    assert np.all(high <= like)  # a 5 is a like: the second target implies the first

    model, _ = load_model(config, tmp_path / "m")
    features, labels = _rows(config)
    assert labels.shape[1] == 2  # every label field, the rating among them
    logits = model(features)
    assert logits.shape == (labels.shape[0], 2)
    final = export_saved_model(config, model, tmp_path / "m", tmp_path / "exports")
    served = tf.saved_model.load(str(final)).signatures["serving_default"]
    got = served(**{k: tf.constant(v) for k, v in _raw_requests(config, LAST).items()})
    for i, name in enumerate(names):
        np.testing.assert_allclose(
            got[f"probability_{name}"].numpy(), tf.sigmoid(logits[:, i]).numpy(), atol=1e-5
        )
    np.testing.assert_allclose(got["probability"].numpy(), got[f"probability_{names[0]}"].numpy())
    if variant == "ESMM":  # p_ctcvr = p_ctr x p_cvr, and p_cvr is served too
        product = got["probability_ctr"].numpy() * got["probability_cvr"].numpy()
        np.testing.assert_allclose(got["probability_ctcvr"].numpy(), product, rtol=1e-4, atol=1e-6)
    outputs = signature(config).outputs.input_names()
    assert sorted(outputs) == sorted(got)  # the MLflow signature names every output


def test_multi_task_online_tables_are_carried_by_deltas_and_pushed(ml_mmoe, tmp_path):
    """MMoE with online tables (``model_config.ev_params``): base + delta serves every task as a
    full export does, and the Redis push holds every table."""
    from tests.trainer.chain import (
        assert_base_plus_delta_serves_as_the_full_export,
        assert_the_push_carries_every_table,
        base_and_delta,
    )
    from tests.trainer.test_serving import _raw_requests

    days = _days(ml_mmoe)
    chain = base_and_delta(ml_mmoe, days[:-2], days[-2:-1], tmp_path)
    request = _raw_requests(chain["config"], days[-1])
    outputs = ["probability_like", "probability_rated_high"]
    assert_base_plus_delta_serves_as_the_full_export(chain, request, outputs, tmp_path / "sm")
    params = assert_the_push_carries_every_table(chain)
    assert {"user_id", "item_id", "genres"} <= set(params.tables)


@pytest.mark.slow
def test_mmoe_trains_alike_under_embedding_parallel_and_horovod(ml_mmoe, tmp_path):
    from tests.trainer.test_distribute import assert_ep_trains_as_horovod

    assert_ep_trains_as_horovod(ml_mmoe, tmp_path, WEEK, ["user_id", "item_id"])


@pytest.mark.slow
def test_mmoe_trains_under_mirrored_multi_worker_mirrored_and_parameter_servers(ml_mmoe, tmp_path):
    from tests.trainer.test_distribute import assert_trains_under_the_other_strategies

    assert_trains_under_the_other_strategies(ml_mmoe, tmp_path, WEEK)
