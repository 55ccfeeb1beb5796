"""Learning-rate schedules and EasyRec's multi-optimizer variable split."""

from __future__ import annotations

import pytest
import tensorflow as tf

from recpipe.config.model import ModelClass
from recpipe.config.train import LearningRate
from trainer.optimizers import LearningRateSchedule, OptimizerConfigError, split_variables


def test_exponential_decay_staircase_floor_and_warmup():
    lr = LearningRate(
        exponential_decay_learning_rate={
            "initial_learning_rate": 0.1,
            "decay_steps": 10,
            "decay_factor": 0.5,
            "min_learning_rate": 0.02,
        }
    )
    schedule = LearningRateSchedule(lr)
    assert [round(float(schedule(s)), 6) for s in (0, 9, 10, 25, 1000)] == [0.1, 0.1, 0.05, 0.025, 0.02]
    smooth = LearningRateSchedule(
        LearningRate(
            exponential_decay_learning_rate={
                "initial_learning_rate": 0.1,
                "decay_steps": 10,
                "decay_factor": 0.5,
                "staircase": False,
            }
        )
    )
    assert float(smooth(5)) == pytest.approx(0.1 * 0.5**0.5)
    warm = LearningRateSchedule(LearningRate(constant_learning_rate={"learning_rate": 0.1}), 10, 0.0)
    assert [round(float(warm(s)), 6) for s in (0, 5, 10, 50)] == [0.0, 0.05, 0.1, 0.1]


def _vars(n):
    return [tf.Variable(float(i)) for i in range(n)]


def test_split_follows_easyrec():
    wide, emb, dense = _vars(1), _vars(2), _vars(3)
    groups = {"wide": wide, "embedding": emb, "dense": dense}
    assert split_variables(groups, 1, ModelClass.DeepFM) == [wide + emb + dense]
    assert split_variables(groups, 2, ModelClass.DeepFM) == [wide + emb, dense]
    assert split_variables(groups, 2, ModelClass.WideAndDeep) == [wide, emb + dense]
    assert split_variables(groups, 3, ModelClass.WideAndDeep) == [wide, dense, emb]
    with pytest.raises(OptimizerConfigError, match="only for WideAndDeep"):
        split_variables(groups, 3, ModelClass.DeepFM)
    with pytest.raises(OptimizerConfigError, match=r"optimizer_config\[0\] would update no variable"):
        split_variables({"wide": [], "embedding": emb, "dense": dense}, 2, ModelClass.WideAndDeep)


def test_freeze_gradient_takes_the_variables_it_matches_out_of_the_update():
    from trainer.optimizers import freeze

    table = tf.Variable(tf.zeros([4, 2]), name="deep_fm/c1_embedding/embeddings")
    kernel = tf.Variable(tf.zeros([2, 1]), name="deep_fm/dnn/dense_0/kernel")
    split = [[table], [kernel]]
    assert freeze(split, None) is split
    with pytest.raises(OptimizerConfigError, match=r"leaves optimizer_config\[0\] nothing"):
        freeze(split, "c1_embedding")
    assert freeze([[table, kernel]], "c1_embedding") == [[kernel]]
    with pytest.raises(OptimizerConfigError, match="matches none of the model's variables: deep_fm/c1"):
        freeze(split, "input_layer_1.*embedding_weights")
    with pytest.raises(OptimizerConfigError, match="not a regular expression"):
        freeze(split, "(")


def test_the_embedding_multiplier_scales_only_the_tables_gradients():
    from trainer.optimizers import scale_gradients

    table, kernel = tf.Variable(tf.zeros([4, 2])), tf.Variable(tf.zeros([2]))
    sparse = tf.IndexedSlices(tf.ones([2, 2]), tf.constant([1, 3]), tf.constant([4, 2]))
    out = scale_gradients([sparse, tf.ones([2])], [table, kernel], {table.ref()}, 100.0)
    assert isinstance(out[0], tf.IndexedSlices) and out[0].values.numpy().tolist() == [[100.0] * 2] * 2
    assert out[1].numpy().tolist() == [1.0, 1.0]
    assert scale_gradients([sparse], [table], {table.ref()}, None)[0] is sparse
