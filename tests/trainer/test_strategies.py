"""``train_distribute`` -> Distribution: what each process learns from its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from recpipe.config.train import TrainConfig
from tests.support import ROOT
from trainer.distribute import Distribution, StrategyError, distribution_for
from trainer.distribute.parameter_server import cluster_from_tf_config


def test_the_parameter_server_mode_follows_sync_mode_then_sync_replicas():
    assert TrainConfig().ps_mode == "async" and TrainConfig(sync_replicas=True).ps_mode == "sync"
    for mode in ("sync", "async", "half_async", "geo"):
        assert TrainConfig(train_distribute="PSStrategy", sync_mode=mode).ps_mode == mode
    assert TrainConfig(sync_mode="geo").geo_step == 100  # between PaddleRec's examples


def test_no_strategy_is_one_chief_process_on_the_default_strategy():
    dist = distribution_for(TrainConfig())
    assert type(dist) is Distribution and dist.strategy is tf.distribute.get_strategy()
    assert (dist.rank, dist.world_size, dist.is_chief, dist.synchronous) == (0, 1, True, False)


def test_strategies_that_cannot_run_fail_clearly(monkeypatch):
    with pytest.raises(StrategyError, match="SokStrategy needs a GPU and NVIDIA SOK"):
        distribution_for(TrainConfig(train_distribute="SokStrategy"))
    with pytest.raises(StrategyError, match="NoStrategy with sync_replicas is synchronous .* needs ps"):
        distribution_for(TrainConfig(sync_replicas=True))
    with pytest.raises(StrategyError, match="sync_mode: geo is a parameter-server mode and needs ps"):
        distribution_for(TrainConfig(sync_mode="geo"))
    # geo keeps no id -> row maps on the ps: online tables are refused before anything starts
    with pytest.raises(StrategyError, match="PSStrategy cannot train the online tables .* EmbeddingParallel"):
        distribution_for(TrainConfig(train_distribute="PSStrategy", sync_mode="geo"), ["user_id"])
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(StrategyError, match="parameter-server training needs TF_CONFIG"):
        distribution_for(TrainConfig(train_distribute="PSStrategy"))
    ps_cluster = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}
    # the chief's TF_CONFIG is accepted as it is (the cluster is not contacted here)
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": ps_cluster, "task": {"type": "chief", "index": 0}})
    )
    assert cluster_from_tf_config() == ps_cluster
    no_ps = {k: v for k, v in ps_cluster.items() if k != "ps"}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": no_ps, "task": {"type": "chief", "index": 0}}))
    with pytest.raises(StrategyError, match="lacks"):
        cluster_from_tf_config()
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


class _Value:
    """A scheduled step's result as the coordinator hands it back: its loss, or the error a
    fetch raises when the worker holding it died first."""

    def __init__(self, loss: float | None):
        self.loss = loss

    def fetch(self):
        if self.loss is None:
            raise tf.errors.CancelledError(None, None, "RecvFromRemoteAsync is cancelled")
        return self.loss


def test_a_parameter_server_loss_lost_with_its_worker_is_stood_in_for_by_a_later_steps():
    from trainer.distribute.parameter_server import ParameterServerDistribution

    dist = ParameterServerDistribution.__new__(ParameterServerDistribution)  # no cluster needed
    values = [_Value(0.5), _Value(None), _Value(None), _Value(0.25), _Value(0.125)]
    dist._recent = list(values)
    assert dist.fetch(values[0]) == 0.5
    assert dist.fetch(values[1]) == 0.25  # the first later step whose loss is still there
    dist._recent = values[:3]
    with pytest.raises(tf.errors.CancelledError):  # no later step's loss either
        dist.fetch(values[1])


_THREADS = """
import json, sys
import tensorflow as tf
from recpipe.config.train import TrainConfig
from trainer.distribute import distribution_for
distribution_for(TrainConfig(**json.loads(sys.argv[1])))
tf.constant(1.0) + 1.0  # the runtime starts with the pools as sized
threading = tf.config.threading
print(threading.get_inter_op_parallelism_threads(), threading.get_intra_op_parallelism_threads())
"""


@pytest.mark.parametrize(
    ("fields", "local_processes", "wanted"),
    [
        ({}, "1", (0, 0)),  # TensorFlow's choice
        ({"inter_op_parallelism_threads": 1, "intra_op_parallelism_threads": 1}, "1", (1, 1)),
        # a Horovod process of two on one machine: the config's pool keeps its size, the other
        # gets the process's share of the cores
        ({"train_distribute": "HorovodStrategy", "intra_op_parallelism_threads": 3}, "2", ("share", 3)),
    ],
)
def test_the_configs_thread_pools_size_a_training_process(fields, local_processes, wanted):
    """EasyRec's ``inter_op_parallelism_threads`` / ``intra_op_parallelism_threads``, set in a
    fresh process before TensorFlow's runtime starts (``distribution_for``)."""
    env = {**os.environ, "RECPIPE_LOCAL_PROCESSES": local_processes, "RECPIPE_FORKSERVER": "off"}
    env.pop("TF_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-c", _THREADS, json.dumps(fields)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    share = max(1, (os.cpu_count() or 1) // 2)
    assert tuple(int(n) for n in done.stdout.split()[-2:]) == tuple(
        share if w == "share" else w for w in wanted
    )


def test_thread_pools_of_negative_size_are_a_config_error():
    with pytest.raises(ValueError, match="intra_op_parallelism_threads"):
        TrainConfig(intra_op_parallelism_threads=-1)
