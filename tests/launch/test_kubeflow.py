"""Kubeflow manifests rendered from the cluster configs, checked against the training-operator
CRDs' required fields (TFJob kubeflow.org/v1, MPIJob kubeflow.org/v2beta1) and the sizes of
``conf/cluster/*.yaml``. They cannot be submitted here (no cluster)."""

from __future__ import annotations

import re

import pytest

from recpipe.config import load_cluster_config
from recpipe.config.cluster import ClusterConfig
from recpipe.config.train import TrainDistribute as D
from recpipe.launch.kubeflow import JOB_LABEL, SYNC_MODE_ANNOTATION, render
from tests.support import ROOT

ARGS = ["--pipeline_config_path", "conf/movielens_deepfm.yaml", "--model_dir", "/var/lib/recpipe/m"]
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# required fields of the CRDs' OpenAPI schemas, and the replica types each accepts
CRDS = {
    ("kubeflow.org/v1", "TFJob"): ("tfReplicaSpecs", {"Chief", "Master", "PS", "Worker", "Evaluator"}),
    ("kubeflow.org/v2beta1", "MPIJob"): ("mpiReplicaSpecs", {"Launcher", "Worker"}),
}


def _check_pod(template: dict, cluster: ClusterConfig) -> dict:
    (container,) = template["spec"]["containers"]
    assert container["name"] and container["image"] == cluster.image and container["command"]
    if cluster.shared_volume:
        (mount,) = container["volumeMounts"]
        assert mount["mountPath"] == cluster.shared_volume.mount_path
        assert template["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "recpipe-data"
    return container


def _check_crd(manifest: dict, cluster: ClusterConfig) -> dict:
    field, types = CRDS[(manifest["apiVersion"], manifest["kind"])]
    assert (
        DNS_1123.match(manifest["metadata"]["name"])
        and manifest["metadata"]["namespace"] == cluster.namespace
    )
    specs = manifest["spec"][field]
    assert specs and set(specs) <= types
    for spec in specs.values():
        assert isinstance(spec["replicas"], int) and spec["replicas"] >= 1
        assert spec["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        _check_pod(spec["template"], cluster)
    return specs


@pytest.fixture
def k8s() -> ClusterConfig:
    cluster = load_cluster_config(ROOT / "conf/cluster/k8s_horovod.yaml")
    return ClusterConfig.model_validate(
        {**cluster.model_dump(), "shared_volume": {"claim_name": "recpipe-data"}}
    )


def _check_policy(policy: dict, name: str, cluster) -> None:
    """The job's NetworkPolicy: its pods reachable from its own pods only."""
    from kubernetes.client import ApiClient, V1NetworkPolicy

    # as the API server would take it: the client's own model of the object
    model = ApiClient()._ApiClient__deserialize(policy, V1NetworkPolicy)
    assert model.kind == "NetworkPolicy" and model.metadata.namespace == cluster.namespace
    pods = {JOB_LABEL: name}
    assert model.spec.pod_selector.match_labels == pods and model.spec.policy_types == ["Ingress"]
    (rule,) = model.spec.ingress
    assert [peer.pod_selector.match_labels for peer in rule._from] == [pods] and rule.ports is None


def test_horovod_renders_an_mpijob_sized_by_the_cluster_config_and_an_evaluator_job(k8s):
    job, evaluator, policy = render("Recpipe Train 2024-01-01", D.HorovodStrategy, k8s, ARGS, eval_args=ARGS)
    _check_policy(policy, "recpipe-train-2024-01-01", k8s)
    assert evaluator["spec"]["template"]["metadata"]["labels"][JOB_LABEL] == "recpipe-train-2024-01-01"
    specs = _check_crd(job, k8s)
    assert job["metadata"]["name"] == "recpipe-train-2024-01-01"
    assert specs["Launcher"]["replicas"] == 1 and specs["Worker"]["replicas"] == k8s.worker.count == 4
    assert job["spec"]["slotsPerWorker"] == 1
    command = specs["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert command[:7] == ["horovodrun", "-np", "4", "--hostfile", "/etc/mpi/hostfile", "--gloo", "python"]
    assert command[-len(ARGS) :] == ARGS
    worker = specs["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {"cpu": "8.0", "memory": "32Gi", "nvidia.com/gpu": "1"}
    # each worker pod makes its own sshd host keys as it starts: the image holds none
    assert worker["command"] == ["sh", "-c", "ssh-keygen -A && exec /usr/sbin/sshd -De"]
    assert (
        evaluator["kind"] == "Job" and evaluator["metadata"]["name"] == "recpipe-train-2024-01-01-evaluator"
    )
    pod = evaluator["spec"]["template"]
    assert _check_pod(pod, k8s)["command"][-1] == "--follow" and pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "4.0", "memory": "16Gi"}


def test_multi_worker_and_ps_render_tfjobs(k8s):
    k8s = ClusterConfig.model_validate({**k8s.model_dump(), "ps": {"count": 2, "cpu": 4}})
    mwms, policy = render("train", D.MultiWorkerMirroredStrategy, k8s, ARGS, eval_args=ARGS, workers=3)
    _check_policy(policy, "train", k8s)
    specs = _check_crd(mwms, k8s)
    assert set(specs) == {"Worker", "Evaluator"} and specs["Worker"]["replicas"] == 3
    assert (
        specs["Worker"]["template"]["spec"]["containers"][0]["name"] == "tensorflow"
    )  # the operator's default
    ps, _ = render("train", D.PSStrategy, k8s, ARGS)
    specs = _check_crd(ps, k8s)
    assert set(specs) == {"Chief", "Worker", "PS"} and specs["PS"]["replicas"] == 2
    command = {role: spec["template"]["spec"]["containers"][0]["command"] for role, spec in specs.items()}
    assert command["Chief"][:3] == ["python", "-m", "trainer.train_eval"]
    assert command["Worker"] == command["PS"] == ["python", "-m", "trainer.distribute.server"]
    assert specs["Worker"]["restartPolicy"] == "OnFailure" and specs["Chief"]["replicas"] == 1
    assert specs["PS"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "4.0"
    # the parameter-server update mode is written on the job; asynchronous unless told
    assert ps["metadata"]["annotations"] == {SYNC_MODE_ANNOTATION: "async"}
    geo, _ = render("train", D.NoStrategy, k8s, ARGS, sync_mode="geo")
    assert geo["metadata"]["annotations"] == {SYNC_MODE_ANNOTATION: "geo"}
    assert set(_check_crd(geo, k8s)) == {"Chief", "Worker", "PS"}
    assert "annotations" not in mwms["metadata"]


def test_what_cannot_be_rendered_is_refused(k8s):
    with pytest.raises(ValueError, match="needs image"):
        render("t", D.HorovodStrategy, ClusterConfig(launcher="kubernetes"), ARGS)
    with pytest.raises(ValueError, match="SokStrategy needs GPUs"):
        render("t", D.SokStrategy, k8s, ARGS)
    with pytest.raises(ValueError, match="NoStrategy runs in one process"):
        render("t", D.NoStrategy, k8s, ARGS)  # k8s_horovod.yaml has 4 workers
    with pytest.raises(ValueError, match="PSStrategy needs ps.count"):
        render("t", D.PSStrategy, k8s, ARGS)


def test_the_kubernetes_launcher_is_picked_by_the_cluster_config_and_needs_manifests(k8s, tmp_path):
    from recpipe.launch import JobSpec, launcher_for
    from recpipe.launch.kubernetes import KubernetesLauncher

    launcher = launcher_for(k8s, tmp_path)
    assert isinstance(launcher, KubernetesLauncher) and launcher.conn_id == "kubernetes_default"
    with pytest.raises(ValueError, match="needs rendered manifests"):
        launcher.run(JobSpec(name="train", argv=[["python"]], cwd=tmp_path))
    launcher.kill()  # nothing created: a no-op, never raises


def test_owned_objects_name_the_training_job(k8s):
    from recpipe.launch.kubernetes import owned_by

    job, evaluator, policy = render("train", D.HorovodStrategy, k8s, ARGS, eval_args=ARGS)
    for manifest in (evaluator, policy):
        (ref,) = owned_by(manifest, job, "uid-1")["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"]) == ("MPIJob", job["metadata"]["name"], "uid-1")
        assert ref["apiVersion"] == "kubeflow.org/v2beta1" and ref["blockOwnerDeletion"] is False
    ps, _ = render(
        "train", D.PSStrategy, ClusterConfig.model_validate({**k8s.model_dump(), "ps": {"count": 1}}), ARGS
    )
    restart = {role: spec["restartPolicy"] for role, spec in ps["spec"]["tfReplicaSpecs"].items()}
    assert restart == {"Chief": "Never", "Worker": "OnFailure", "PS": "OnFailure"}
