"""TensorFlow jobs across hosts (network namespaces, ``dev/hosts.py``), started from the TFJob
recpipe renders for Kubernetes, as Kubeflow's training operator starts its pods
(``dev/training_operator.py``): one replica a host, each reaching the others by their
Services' names over the hosts' own interfaces."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from dev.hosts import Hosts
from dev.training_operator import start_tfjob
from recpipe.config import ClusterConfig
from recpipe.config.train import SyncMode, TrainDistribute
from recpipe.launch import job_result
from recpipe.launch.kubeflow import render
from tests.support import EARLY, with_edits
from tests.trainer.test_distribute import PS_EDITS

pytestmark = pytest.mark.slow

K8S = {"launcher": "kubernetes", "image": "recpipe:test", "namespace": "ranking"}
# a job to cut a host off from: checkpoints every 10 steps, 200 steps when nothing is cut
CUT_EDITS = {
    "data_config.batch_size": 128,
    "data_config.num_epochs": 20,
    "train_config.num_steps": 200,
    "train_config.save_checkpoints_steps": 10,
    "train_config.log_step_count_steps": 10,
}


def _args(config_path, model_dir, edits: dict) -> list[str]:
    return [
        "--pipeline_config_path", str(config_path), "--model_dir", str(model_dir), "--skip_eval",
        "--edit_config_json", json.dumps(edits),
    ]  # fmt: skip


def _connects(hosts: Hosts, host: str, address: str, port: int = 2222) -> bool:
    probe = f"import socket; socket.create_connection(({address!r}, {port}), 3).close()"
    return hosts.run(host, [sys.executable, "-c", probe], timeout=30).returncode == 0


def _cut_once_checkpointed(
    hosts: Hosts, run, lead, model_dir, host: str, timeout_s: float
) -> tuple[int, float]:
    """Partition ``host`` (for good) once the job's checkpoint 10 exists and wait for the job
    (``run``: a TFJob or MPIJob run; ``lead``: the replica whose exit is the job's); its exit
    code and the seconds from the cut to it. The job's processes are stopped either way."""
    try:
        deadline = time.monotonic() + 300
        while not (model_dir / "model.ckpt-10.index").exists():
            assert lead.proc.poll() is None, lead.log.read_text(errors="replace")[-5000:]
            assert time.monotonic() < deadline, "no checkpoint 10"
            time.sleep(0.1)
        hosts.partition(host)
        cut = time.monotonic()
        code = run.wait(timeout_s=timeout_s)
        return code, time.monotonic() - cut
    finally:
        run.stop()


def test_an_asynchronous_ps_tfjob_trains_with_each_replica_on_its_own_host(ml_early, config_path, tmp_path):
    """Four hosts for the job, a fifth outside it: the job's NetworkPolicy (enforced as a
    network plugin would, ``enforce_network_policy``) admits the job's own traffic, and the
    ps's port, open to the chief's host, refuses the outsider."""
    from trainer.scoring import evaluate

    cluster = ClusterConfig(**K8S, worker={"count": 2}, ps={"count": 1})
    model_dir = tmp_path / "model"
    job, policy = render(
        "ps-across-hosts",
        TrainDistribute.PSStrategy,
        cluster,
        _args(config_path, model_dir, PS_EDITS),
        sync_mode=SyncMode.async_,
    )
    placement = {("Chief", 0): "chief", ("Worker", 0): "w0", ("Worker", 1): "w1", ("PS", 0): "ps0"}
    with Hosts(["chief", "w0", "w1", "ps0", "outsider"]) as hosts:
        run = start_tfjob(hosts, job, placement, tmp_path / "logs", policy=policy)
        try:
            ps = run.replica("PS")
            deadline = time.monotonic() + 120
            while "serving ps 0" not in ps.log.read_text(errors="replace"):
                assert time.monotonic() < deadline and ps.proc.poll() is None, ps.log.read_text()[-3000:]
                time.sleep(0.2)
            assert _connects(hosts, "chief", hosts.address("ps0"))
            assert not _connects(hosts, "outsider", hosts.address("ps0"))
            code = run.wait(timeout_s=600)
        finally:
            run.stop()
    chief = run.replica("Chief").log
    assert code == 0, chief.read_text()[-5000:]
    result = job_result(chief)
    assert result["global_step"] == 30 and np.isfinite(result["loss"])
    assert "/job:ps/replica:0/task:0" in chief.read_text()
    # the checkpoint restores on one host and scores as any other
    metrics = evaluate(with_edits(ml_early, PS_EDITS), model_dir, [EARLY[1]])
    assert 0.5 < metrics["auc"] < 1.0


def test_a_worker_host_cut_off_mid_job_is_waited_for_and_the_job_ends(ml_early, config_path, tmp_path):
    """A worker's host partitioned once checkpoint 10 exists, healed 15 s later: the job
    stalls while the host is away (measured: ~15 s between two logged steps; TensorFlow's
    coordinator waits for the worker's scheduled steps), takes the host back and ends with
    every step (one the cut interrupted possibly twice)."""
    cluster = ClusterConfig(**K8S, worker={"count": 2}, ps={"count": 1})
    model_dir = tmp_path / "model"
    edits = {**PS_EDITS, "train_config.num_steps": 60, "data_config.num_epochs": 20}
    job, _ = render("ps-cut", TrainDistribute.PSStrategy, cluster, _args(config_path, model_dir, edits))
    placement = {("Chief", 0): "chief", ("Worker", 0): "w0", ("Worker", 1): "w1", ("PS", 0): "ps0"}
    with Hosts(["chief", "w0", "w1", "ps0"]) as hosts:
        run = start_tfjob(hosts, job, placement, tmp_path / "logs")
        try:
            deadline = time.monotonic() + 300
            while not (model_dir / "model.ckpt-10.index").exists():
                assert run.replica("Chief").proc.poll() is None, run.replica("Chief").log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no checkpoint 10"
                time.sleep(0.2)
            hosts.partition("w1")
            time.sleep(15)
            hosts.heal("w1")
            code = run.wait(timeout_s=300)  # 60 steps: about a minute after the heal
        finally:
            run.stop()
    chief = run.replica("Chief").log
    assert code == 0, chief.read_text()[-5000:]
    # no step lost; a step the cut-off worker ran may have reached the ps before its answer
    # was lost, and runs again (TensorFlow's coordinator runs a step at least once; as
    # test_distribute's worker that dies)
    assert 60 <= job_result(chief)["global_step"] <= 62


@pytest.mark.parametrize(("host", "task"), [("ps0", "ps-0"), ("w0", "worker-0")])
def test_a_ps_or_worker_host_cut_off_for_good_fails_the_job_naming_it(config_path, tmp_path, host, task):
    """The ps's (or the only worker's) host partitioned once checkpoint 10 exists, for good:
    TensorFlow's calls to it would wait for many minutes; the chief's watch
    (``train_config.server_timeout_secs``, 10 s here) ends the job with one line naming the
    task and its Service."""
    cluster = ClusterConfig(**K8S, worker={"count": 1}, ps={"count": 1})
    model_dir = tmp_path / "model"
    edits = {**PS_EDITS, "train_config.num_steps": 2000, "data_config.num_epochs": 50}
    edits["train_config.server_timeout_secs"] = 10
    job, _ = render("ps-lost", TrainDistribute.PSStrategy, cluster, _args(config_path, model_dir, edits))
    placement = {("Chief", 0): "chief", ("Worker", 0): "w0", ("PS", 0): "ps0"}
    with Hosts(["chief", "w0", "ps0"]) as hosts:
        run = start_tfjob(hosts, job, placement, tmp_path / "logs")
        chief = run.replica("Chief")
        code, failed_after = _cut_once_checkpointed(hosts, run, chief, model_dir, host, 120)
    log = chief.log.read_text(errors="replace")
    assert code != 0 and 10 <= failed_after < 60, log[-5000:]
    lost = f"{task.replace('-', ' ')} (ps-lost-{task}.ranking.svc:2222) unreachable for 10 s"
    assert f"recpipe train: PipelineError: {lost}" in log


def test_a_multi_worker_mirrored_tfjob_across_two_hosts_ends_where_one_host_does(config_path, tmp_path):
    """The same two-worker synchronous job (rows in file order) on two hosts, started from its
    TFJob, and on one host by ``recpipe train``: the same checkpoint, weights and slots."""
    from tests.trainer.test_distribute import SPLITS, _assert_same_state, _train

    edits = {
        "train_config.optimizer_config": SPLITS["adam"],
        "data_config.batch_size": 128,
        "data_config.shuffle": False,
        "train_config.num_steps": 20,
        "train_config.save_checkpoints_steps": 10,
        "train_config.log_step_count_steps": 10,
    }
    one, _ = _train(config_path, tmp_path / "one", "MultiWorkerMirroredStrategy", 2, **edits)
    cluster = ClusterConfig(**K8S, worker={"count": 2})
    model_dir = tmp_path / "two"
    strategy = {**edits, "train_config.train_distribute": "MultiWorkerMirroredStrategy"}
    job, _ = render(
        "mwms", TrainDistribute.MultiWorkerMirroredStrategy, cluster, _args(config_path, model_dir, strategy)
    )
    with Hosts(["a", "b"]) as hosts:
        run = start_tfjob(hosts, job, {("Worker", 0): "a", ("Worker", 1): "b"}, tmp_path / "logs")
        try:
            code = run.wait(timeout_s=600)
        finally:
            run.stop()
    lead = run.replica("Worker").log
    assert code == 0, lead.read_text()[-5000:]
    two = job_result(lead)
    assert two["global_step"] == one["global_step"] == 20
    assert abs(two["loss"] - one["loss"]) < 1e-5
    _assert_same_state(tmp_path / "one", model_dir)


def _reachable(hosts: Hosts, host: str, targets: list[tuple[str, int]]) -> list[list]:
    """Which of ``targets`` (address, port) accept a connection from ``host`` (tried at once,
    3 s each)."""
    probe = (
        "import json, socket, sys; from concurrent.futures import ThreadPoolExecutor\n"
        "def ok(t):\n"
        "    try: socket.create_connection(tuple(t), 3).close(); return True\n"
        "    except OSError: return False\n"
        "ts = json.loads(sys.argv[1])\n"
        "with ThreadPoolExecutor(len(ts)) as pool: up = list(pool.map(ok, ts))\n"
        "print(json.dumps([t for t, r in zip(ts, up) if r]))"
    )
    done = hosts.run(host, [sys.executable, "-c", probe, json.dumps(targets)], timeout=60, check=True)
    return json.loads(done.stdout)


def _listening(hosts: Hosts, host: str) -> set[int]:
    out = hosts.run(host, ["ss", "-ltnH"]).stdout.split("\n")
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in out if line.strip()}


@pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="no sshd: make setup installs openssh-server")
@pytest.mark.parametrize("distribute", ["HorovodStrategy", "EmbeddingParallelStrategy"])
def test_an_mpijob_across_hosts_ends_where_one_host_does_and_no_port_is_open_beyond_it(
    config_path, tmp_path, distribute
):
    """Two ranks on two worker hosts, started from the MPIJob recpipe renders as mpi-operator v2
    starts it (``horovodrun --gloo`` on the launcher's host over SSH to the workers' sshd), and
    on one host by ``recpipe train``: the same checkpoint, weights and slots. While it runs,
    every port listening on the job's hosts (sshd, Horovod's services, Gloo's) refuses a host
    outside the job."""
    from dev.training_operator import start_mpijob
    from tests.trainer.test_distribute import SPLITS, _assert_same_state, _train

    edits = {
        "train_config.optimizer_config": SPLITS["lazy_adam+adam"],
        "data_config.batch_size": 128,
        "data_config.shuffle": False,
        "train_config.num_steps": 20,
        "train_config.save_checkpoints_steps": 10,
        "train_config.log_step_count_steps": 10,
    }
    one, _ = _train(config_path, tmp_path / "one", distribute, 2, **edits)
    model_dir = tmp_path / "two"
    strategy = {**edits, "train_config.train_distribute": distribute}
    job, policy = render(
        "mpi", TrainDistribute(distribute), ClusterConfig(**K8S, worker={"count": 2}),
        _args(config_path, model_dir, strategy),
    )  # fmt: skip
    placement = {("Launcher", 0): "launcher", ("Worker", 0): "w0", ("Worker", 1): "w1"}
    with Hosts(["launcher", "w0", "w1", "outsider"]) as hosts:
        run = start_mpijob(hosts, job, placement, tmp_path / "logs", policy=policy)
        try:
            assert _connects(hosts, "launcher", hosts.address("w1"), 22)
            # every port seen listening on the job's hosts while it runs, tried from outside
            # (tried in the background: a try from outside waits 3 s for an answer)
            probed, tries, job_hosts = set(), [], ("launcher", "w0", "w1")
            with ThreadPoolExecutor(8) as pool, ThreadPoolExecutor(len(job_hosts)) as looker:
                deadline = time.monotonic() + 600
                while run.launcher.proc.poll() is None and time.monotonic() < deadline:
                    # the hosts at once: a rank's Gloo ports and Horovod's task services live
                    # for a second or two
                    ports = looker.map(lambda h: (h, _listening(hosts, h)), job_hosts)
                    seen = {(hosts.address(h), p) for h, listening in ports for p in listening}
                    if seen - probed:
                        tries.append(pool.submit(_reachable, hosts, "outsider", sorted(seen - probed)))
                        probed |= seen
                    time.sleep(0.05)
                reachable = [t for done in tries for t in done.result()]
            code = run.wait(timeout_s=1)
        finally:
            run.stop()
    assert reachable == []
    # sshd on each worker and at least one of the job's own ports: the launcher's rendezvous
    # server lives as long as the job; a rank's Gloo listener only while its pairs connect
    # (milliseconds: a quiet machine's polls miss it, a busy one's catch it)
    workers = {hosts.address("w0"), hosts.address("w1")}
    assert {(a, 22) for a in workers} <= probed and any(p != 22 for _, p in probed), probed
    log = run.launcher.log.read_text()
    assert code == 0, log[-5000:]
    two = job_result(run.launcher.log)
    assert two["global_step"] == one["global_step"] == 20
    assert abs(two["loss"] - one["loss"]) < 1e-5
    _assert_same_state(tmp_path / "one", model_dir)


@pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="no sshd: make setup installs openssh-server")
def test_a_worker_host_cut_off_fails_an_mpijob_in_bounded_time_and_a_retry_resumes(config_path, tmp_path):
    """Worker 1's host partitioned once checkpoint 10 exists: rank 0's next collective times
    out (Gloo's 30 s), the job fails with the trainer's one-line reason instead of hanging;
    the host back, the retry (the train task's next try: ``--continue_train``) resumes from
    the checkpoint and ends with every step."""
    from dev.training_operator import start_mpijob
    from tests.trainer.test_distribute import SPLITS

    edits = {
        **CUT_EDITS,
        "train_config.optimizer_config": SPLITS["lazy_adam+adam"],
        "train_config.train_distribute": "HorovodStrategy",
    }
    model_dir = tmp_path / "model"
    cluster = ClusterConfig(**K8S, worker={"count": 2})
    args = _args(config_path, model_dir, edits)
    job, _ = render("mpi-cut", TrainDistribute.HorovodStrategy, cluster, args)
    placement = {("Launcher", 0): "launcher", ("Worker", 0): "w0", ("Worker", 1): "w1"}
    with Hosts(["launcher", "w0", "w1"]) as hosts:
        run = start_mpijob(hosts, job, placement, tmp_path / "logs")
        code, failed_after = _cut_once_checkpointed(hosts, run, run.launcher, model_dir, "w1", 300)
        log = run.launcher.log.read_text(errors="replace")
        assert code != 0 and failed_after < 120, log[-5000:]
        reason = "recpipe train: PipelineError: rank 0 of 2"
        assert reason in log and "a Horovod collective failed" in log, log[-5000:]
        hosts.heal("w1")
        retry, _ = render("mpi-cut-2", TrainDistribute.HorovodStrategy, cluster, [*args, "--continue_train"])
        run = start_mpijob(hosts, retry, placement, tmp_path / "retry")
        try:
            code = run.wait(timeout_s=600)
        finally:
            run.stop()
    log = run.launcher.log.read_text(errors="replace")
    assert code == 0, log[-5000:]
    assert "resumed from" in log and job_result(run.launcher.log)["global_step"] == 200


def test_a_worker_host_cut_off_fails_a_mirrored_tfjob_naming_it_and_a_retry_resumes(config_path, tmp_path):
    """The MultiWorkerMirrored job's worker 1 host partitioned once checkpoint 10 exists:
    TensorFlow's coordination service misses its heartbeats and aborts the collectives, and
    the worker that fails first (either side of the cut: the job fails with it and its peer is
    deleted, the operator's rule) says so in one line naming the other and its Service; the
    host back, the retry resumes from the checkpoint and ends with every step."""
    edits = {**CUT_EDITS, "train_config.train_distribute": "MultiWorkerMirroredStrategy"}
    model_dir = tmp_path / "model"
    cluster = ClusterConfig(**K8S, worker={"count": 2})
    args = _args(config_path, model_dir, edits)
    job, _ = render("mwms-cut", TrainDistribute.MultiWorkerMirroredStrategy, cluster, args)
    placement = {("Worker", 0): "a", ("Worker", 1): "b"}
    with Hosts(["a", "b"]) as hosts:
        run = start_tfjob(hosts, job, placement, tmp_path / "logs")
        lead = run.replica("Worker")
        code, failed_after = _cut_once_checkpointed(hosts, run, lead, model_dir, "b", 300)
        assert code != 0 and failed_after < 120, lead.log.read_text(errors="replace")[-5000:]
        failed = [r for r in run.replicas if (r.proc.returncode or 0) > 0]  # not killed by stop()
        assert failed, [r.proc.returncode for r in run.replicas]
        for r in failed:
            other = 1 - r.index
            lost = f"worker {other} (mwms-cut-worker-{other}.ranking.svc:2222) stopped answering"
            log = r.log.read_text(errors="replace")
            assert f"recpipe train: PipelineError: worker {r.index} of 2: {lost}" in log, log[-3000:]
        hosts.heal("b")
        retry, _ = render(
            "mwms-cut", TrainDistribute.MultiWorkerMirroredStrategy, cluster, [*args, "--continue_train"]
        )
        run = start_tfjob(hosts, retry, placement, tmp_path / "retry")
        try:
            code = run.wait(timeout_s=600)
        finally:
            run.stop()
    log = run.replica("Worker").log.read_text(errors="replace")
    assert code == 0, log[-5000:]
    assert "resumed from" in log and job_result(run.replica("Worker").log)["global_step"] == 200
