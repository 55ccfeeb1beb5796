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
