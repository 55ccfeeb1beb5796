"""``train_distribute`` -> Distribution: what each process learns from its environment."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

from recpipe.config.train import TrainConfig
from trainer.distribute import Distribution, StrategyError, distribution_for


def test_no_strategy_is_one_chief_process_on_the_default_strategy():
    dist = distribution_for(TrainConfig())
    assert type(dist) is Distribution and dist.strategy is tf.distribute.get_strategy()
    assert (dist.rank, dist.world_size, dist.is_chief, dist.synchronous) == (0, 1, True, False)


def test_strategies_that_cannot_run_fail_clearly(monkeypatch):
    with pytest.raises(StrategyError, match="SokStrategy needs a GPU and NVIDIA SOK"):
        distribution_for(TrainConfig(train_distribute="SokStrategy"))
    with pytest.raises(StrategyError, match="NoStrategy with sync_replicas is synchronous .* needs ps"):
        distribution_for(TrainConfig(sync_replicas=True))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(StrategyError, match="parameter-server training needs TF_CONFIG"):
        distribution_for(TrainConfig(train_distribute="PSStrategy"))
    ps_cluster = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": ps_cluster, "task": {"type": "chief", "index": 0}})
    )
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": ps_cluster, "task": {"type": "worker", "index": 0}})
    )
    with pytest.raises(StrategyError, match="workers and ps run python -m trainer.distribute.server"):
        distribution_for(TrainConfig(train_distribute="PSStrategy"))
    monkeypatch.delenv("TF_CONFIG")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(StrategyError, match="MultiWorkerMirroredStrategy needs TF_CONFIG"):
        distribution_for(TrainConfig(train_distribute="MultiWorkerMirroredStrategy"))
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:1"]}, "task": {"type": "ps", "index": 0}})
    )
    with pytest.raises(StrategyError, match="runs workers only"):
        distribution_for(TrainConfig(train_distribute="MultiWorkerMirroredStrategy"))


def test_horovod_without_horovodrun_is_a_world_of_one():
    dist = distribution_for(TrainConfig(train_distribute="HorovodStrategy"))
    assert (dist.rank, dist.world_size, dist.is_chief, dist.synchronous) == (0, 1, True, True)
    grads = dist.reduce_gradients([tf.ones([2]), tf.IndexedSlices(tf.ones([1, 2]), tf.constant([3]))])
    assert grads[0].numpy().tolist() == [1.0, 1.0] and grads[1].indices.numpy().tolist() == [3]
