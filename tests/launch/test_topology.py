"""The processes the local launcher starts for each train_distribute."""

from __future__ import annotations

import json
import sys

import pytest

from recpipe.config import ClusterConfig
from recpipe.config.errors import ConfigError
from recpipe.config.train import TrainDistribute as D
from recpipe.launch import training_job
from recpipe.launch.topology import free_ports, training_processes

ARGS = ["trainer.train_eval", "--model_dir", "m"]


def test_single_process_strategies():
    for kind in (D.NoStrategy, D.MirroredStrategy):
        (p,) = training_processes(kind, 1, ARGS)
        assert p.argv == [sys.executable, "-m", *ARGS] and p.env == {} and p.role == "worker 0"
    with pytest.raises(ValueError, match="MirroredStrategy runs in one process"):
        training_processes(D.MirroredStrategy, 2, ARGS)
    with pytest.raises(ValueError, match="at least one worker"):
        training_processes(D.HorovodStrategy, 0, ARGS)


def test_multi_worker_mirrored_gets_one_tf_config_per_worker_on_distinct_local_ports():
    procs = training_processes(D.MultiWorkerMirroredStrategy, 3, ARGS)
    configs = [json.loads(p.env["TF_CONFIG"]) for p in procs]
    workers = configs[0]["cluster"]["worker"]
    assert len(set(workers)) == 3 and all(w.startswith("localhost:") for w in workers)
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs)
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    assert [p.role for p in procs] == ["worker 0", "worker 1", "worker 2"]


def test_horovod_is_one_horovodrun_with_gloo_on_loopback():
    (p,) = training_processes(D.HorovodStrategy, 4, ARGS)
    argv = " ".join(p.argv)
    assert "recpipe.launch.horovodrun -np 4 -H localhost:4 --gloo --network-interfaces lo" in argv
    assert argv.endswith(" -m " + " ".join(ARGS)) and p.env["RECPIPE_LOCAL_PROCESSES"] == "4"


def test_free_ports_are_distinct():
    ports = free_ports(5)
    assert len(set(ports)) == 5 and all(1024 < p < 65536 for p in ports)


def test_parameter_server_jobs_are_a_chief_and_servers_with_their_tf_config():
    for kind, ps in ((D.PSStrategy, 2), (D.NoStrategy, 1)):
        procs = training_processes(kind, 2, ARGS, ps=ps)
        assert [p.role for p in procs] == ["chief", "worker 0", "worker 1", *[f"ps {i}" for i in range(ps)]]
        assert procs[0].argv == [sys.executable, "-m", *ARGS] and not procs[0].server
        assert all(p.argv[-1] == "trainer.distribute.server" and p.server for p in procs[1:])
        assert [p.restart for p in procs] == [False, True, True, *[False] * ps]
        tasks = [json.loads(p.env["TF_CONFIG"])["task"] for p in procs]
        assert tasks[0] == {"type": "chief", "index": 0} and tasks[-1] == {"type": "ps", "index": ps - 1}
        cluster = json.loads(procs[0].env["TF_CONFIG"])["cluster"]
        assert (len(cluster["chief"]), len(cluster["worker"]), len(cluster["ps"])) == (1, 2, ps)
    assert len(training_processes(D.PSStrategy, 1, ARGS)) == 3  # PSStrategy takes at least one ps


def test_the_separate_evaluator_is_restarted_and_optional_the_trainers_are_not():
    from pathlib import Path

    from recpipe.config.cluster import ClusterConfig
    from recpipe.launch import training_job

    job = training_job("train", D.NoStrategy, ClusterConfig(), ["--x"], cwd=Path("."), eval_args=["--y"])
    assert job.roles == ["worker 0", "evaluator"]
    assert job.restart == {1} and job.optional == {1} and job.servers == set()
    assert job.argv[1][-2:] == ["--y", "--follow"]


def test_a_parameter_server_mode_without_ps_is_refused_before_any_process():
    for mode, spelt in (
        ("geo", "geo"),
        ("half_async", "half_async"),
        ("sync", r"sync \(sync_replicas: true\)"),
    ):
        with pytest.raises(
            ConfigError, match=rf"train_config.sync_mode: {spelt} runs on parameter servers.*--num_ps"
        ):
            training_job("t", D.NoStrategy, ClusterConfig(), ["--x"], cwd=".", sync_mode=mode)
    job = training_job("t", D.NoStrategy, ClusterConfig(), ["--x"], cwd=".", workers=2, ps=1, sync_mode="geo")
    assert job.roles == ["chief", "worker 0", "worker 1", "ps 0"]
    assert training_job("t", D.NoStrategy, ClusterConfig(), ["--x"], cwd=".", sync_mode="async").roles == [
        "worker 0"
    ]
