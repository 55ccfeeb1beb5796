"""The Kubernetes launcher leaves no object behind, on every outcome: a job that succeeds, fails,
runs past its timeout, is killed by its task, or whose second create is refused. It runs as in
a task, through Airflow's ``KubernetesHook`` and the official client, against
``dev.kube_api``'s stand-in API server (no cluster runs here). The stand-in collects no owned
objects, so each deletion asserted is the launcher's own."""

from __future__ import annotations

import json
import threading
import time

import pytest

from dev.kube_api import KubeApi
from recpipe.config import load_cluster_config
from recpipe.config.cluster import ClusterConfig
from recpipe.config.train import TrainDistribute as D
from recpipe.launch import JobSpec
from recpipe.launch.base import JobFailedError, JobTimeoutError
from recpipe.launch.kubeflow import render
from recpipe.launch.kubernetes import KubernetesLauncher
from tests.support import ROOT

ARGS = ["--pipeline_config_path", "conf/movielens_deepfm.yaml", "--model_dir", "/var/lib/recpipe/m"]
CREATED = ["mpijobs", "jobs", "networkpolicies"]


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """The stand-in server and the Airflow connection ``kubernetes_test`` naming it."""
    with KubeApi() as api:
        config = api.kubeconfig(tmp_path / "kubeconfig")
        conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(config)}}
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_TEST", json.dumps(conn))
        yield api


def _job(tmp_path) -> JobSpec:
    base = load_cluster_config(ROOT / "conf/cluster/k8s_horovod.yaml")
    k8s = ClusterConfig.model_validate({**base.model_dump(), "shared_volume": {"claim_name": "recpipe-data"}})
    manifests = render("train-1997-09-20", D.HorovodStrategy, k8s, ARGS, eval_args=ARGS)
    return JobSpec(name="train", argv=[["python"]], cwd=tmp_path, manifests=list(manifests))


def _launcher(tmp_path, timeout_s: float | None = None) -> KubernetesLauncher:
    return KubernetesLauncher(tmp_path / "logs", conn_id="kubernetes_test", poll_s=0.05, timeout_s=timeout_s)


def _when_created(api: KubeApi, then) -> threading.Thread:
    """Run ``then(api, job_name, namespace)`` once the launcher has created all three objects."""

    def watch():
        deadline = time.monotonic() + 60
        while len(api.left()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        (plural, namespace, name) = next(k for k in api.left() if k[0] == "mpijobs")
        then(api, name, namespace)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _deleted(api: KubeApi) -> list[str]:
    return [plural for method, plural, _ in api.calls if method == "DELETE"]


def test_a_job_that_succeeds_leaves_nothing_and_its_log_is_kept(cluster, tmp_path):
    def succeed(api, name, namespace):
        labels = {
            "training.kubeflow.org/job-name": name,
            "training.kubeflow.org/replica-type": "launcher",
        }
        api.add_pod(namespace, f"{name}-launcher", labels, '{"result": 1}\n')
        api.set_status("mpijobs", namespace, name, {"conditions": [{"type": "Succeeded", "status": "True"}]})

    _when_created(cluster, succeed)
    chief_log, status_log = _launcher(tmp_path).run(_job(tmp_path))
    assert chief_log.read_text() == '{"result": 1}\n' and "Succeeded" in status_log.read_text()
    assert cluster.left() == [] and sorted(_deleted(cluster)) == sorted(CREATED)


def test_a_job_that_fails_leaves_nothing(cluster, tmp_path):
    def fail(api, name, namespace):
        status = {"conditions": [{"type": "Failed", "status": "True", "message": "worker 1 OOMKilled"}]}
        api.set_status("mpijobs", namespace, name, status)

    _when_created(cluster, fail)
    with pytest.raises(JobFailedError, match="worker 1 OOMKilled"):
        _launcher(tmp_path).run(_job(tmp_path))
    assert cluster.left() == [] and sorted(_deleted(cluster)) == sorted(CREATED)


def test_a_job_past_its_timeout_leaves_nothing(cluster, tmp_path):
    with pytest.raises(JobTimeoutError, match="was deleted"):
        _launcher(tmp_path, timeout_s=0.5).run(_job(tmp_path))
    assert cluster.left() == [] and sorted(_deleted(cluster)) == sorted(CREATED)


def test_a_job_killed_by_its_task_leaves_nothing(cluster, tmp_path):
    """``kill`` from another thread (the task's ``on_kill``) while the launcher polls: every
    object goes, and the polling ends with an error rather than waiting for ever."""
    launcher = _launcher(tmp_path)
    _when_created(cluster, lambda api, name, namespace: launcher.kill())
    with pytest.raises(Exception, match="(?i)not found|404"):
        launcher.run(_job(tmp_path))
    assert cluster.left() == [] and sorted(_deleted(cluster)) == sorted(CREATED)


def test_a_refused_create_removes_what_was_created_before_it(cluster, tmp_path):
    cluster.refuse("networkpolicies")
    with pytest.raises(Exception, match="Forbidden|403"):
        _launcher(tmp_path).run(_job(tmp_path))
    assert cluster.left() == [] and sorted(_deleted(cluster)) == ["jobs", "mpijobs"]
