"""Kubeflow training-operator manifests for a training job on a Kubernetes cluster.

- ``TFJob`` (``kubeflow.org/v1``) for ``NoStrategy``, ``MirroredStrategy``,
  ``MultiWorkerMirroredStrategy`` and ``PSStrategy``: ``Worker`` replicas, or for
  parameter-server jobs a ``Chief`` (the trainer), ``Worker`` and ``PS`` replicas running
  ``trainer.distribute.server``; the operator writes each pod's TF_CONFIG. With
  ``eval_method: separate`` an ``Evaluator`` replica runs ``trainer.eval --follow``.
- ``MPIJob`` (``kubeflow.org/v2beta1``) for ``HorovodStrategy`` and
  ``EmbeddingParallelStrategy``: a ``Launcher`` pod runs ``horovodrun --gloo`` over the
  workers listed in ``/etc/mpi/hostfile`` (the MPI operator's SSH set-up); ``Worker`` pods run
  ``sshd``. The separate evaluator is a ``batch/v1`` Job beside it.

Sizes, image, namespace and the shared volume (model_dir and features) come from the cluster
config (``conf/cluster/*.yaml``), never from the model config.

Every job's manifests end with a ``NetworkPolicy`` (``networking.k8s.io/v1``): its pods (the
operators' ``training.kubeflow.org/job-name`` label, which recpipe also puts on the evaluator
Job's pods) accept connections from each other only, so the TensorFlow servers (which listen
on every interface, unauthenticated) and Horovod's ranks are closed to the rest of the cluster.
"""

from __future__ import annotations

import re

from recpipe.config.cluster import ClusterConfig, RoleResources
from recpipe.config.errors import ConfigError
from recpipe.config.train import SyncMode, TrainDistribute

TFJOB = ("kubeflow.org", "v1", "tfjobs", "TFJob")
JOB_LABEL = "training.kubeflow.org/job-name"  # the training and MPI operators' pod label
MPIJOB = ("kubeflow.org", "v2beta1", "mpijobs", "MPIJob")


# an MPIJob worker: its own host keys, made as the pod starts (the image holds none: pods sharing
# one image's keys could impersonate each other), then sshd in the foreground
SSHD = ("sh", "-c", "ssh-keygen -A && exec /usr/sbin/sshd -De")

def job_name(text: str) -> str:
    """A DNS-1123 name (lowercase alphanumerics and '-', at most 52 characters, leaving room for
    the operator's pod suffixes)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:52].strip("-")
    return name or "recpipe"


def _resources(role: RoleResources) -> dict:
    requests = {"cpu": str(role.cpu), "memory": role.memory}
    limits = dict(requests)
    if role.gpu:
        limits["nvidia.com/gpu"] = str(role.gpu)
    return {"requests": requests, "limits": limits}


def _pod(cluster: ClusterConfig, container: str, command: list[str], role: RoleResources) -> dict:
    spec: dict = {
        "containers": [
            {
                "name": container,
                "image": cluster.image,
                "command": command,
                "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                "resources": _resources(role),
            }
        ]
    }
    if cluster.shared_volume is not None:
        spec["volumes"] = [
            {"name": "shared", "persistentVolumeClaim": {"claimName": cluster.shared_volume.claim_name}}
        ]
        spec["containers"][0]["volumeMounts"] = [
            {"name": "shared", "mountPath": cluster.shared_volume.mount_path}
        ]
    return {"metadata": {"labels": {"app.kubernetes.io/part-of": "recpipe"}}, "spec": spec}


def network_policy(name: str, namespace: str) -> dict:
    """A ``NetworkPolicy`` that lets the pods of job ``name`` be reached by each other only."""
    pods = {"matchLabels": {JOB_LABEL: name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": job_name(f"{name}-job-only"),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "recpipe"},
        },
        "spec": {
            "podSelector": pods,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": pods}]}],
        },
    }


def _replica(cluster, container, command, role: RoleResources, replicas: int, restart: str) -> dict:
    return {
        "replicas": replicas,
        "restartPolicy": restart,
        "template": _pod(cluster, container, command, role),
    }


SYNC_MODE_ANNOTATION = "recpipe.io/sync-mode"
# pods still running once the job ends are deleted; the job itself an hour after it ends (the
# launcher deletes it at once; this is for a launcher that died); a failure is not retried
RUN_POLICY = {"cleanPodPolicy": "Running", "backoffLimit": 0, "ttlSecondsAfterFinished": 3600}


def render(
    name: str,
    distribute: TrainDistribute,
    cluster: ClusterConfig,
    train_args: list[str],
    eval_args: list[str] | None = None,
    workers: int | None = None,
    sync_mode: SyncMode | None = None,
) -> list[dict]:
    """The manifests of one training job: the training job first, a separate evaluator's Job
    (if any), then the job's ``NetworkPolicy`` (``network_policy``).

    Args:
        name: the job's name (made DNS-1123).
        distribute: the strategy.
        cluster: resources, image, namespace, shared volume.
        train_args: arguments of ``python -m trainer.train_eval``.
        eval_args: arguments of ``python -m trainer.eval`` for a separate evaluator, or None.
        workers: worker count (default ``cluster.worker.count``).
        sync_mode: a parameter-server job's update mode (``train_config.sync_mode``), written
            on the TFJob as the ``recpipe.io/sync-mode`` annotation (the chief reads it from the
            config; the annotation shows it to whoever lists the jobs).

    Raises:
        ConfigError: no ``image`` in the cluster config; ``SokStrategy``; several workers for a
            single-process strategy; ``PSStrategy`` without ``ps``.
    """
    if not cluster.image:
        raise ConfigError("cluster config: kubernetes needs image (the recpipe image)")
    if distribute == TrainDistribute.SokStrategy:
        raise ConfigError("SokStrategy needs GPUs with NVIDIA SOK; it is not rendered")
    workers = workers or cluster.worker.count
    name = job_name(name)
    meta = {"name": name, "namespace": cluster.namespace, "labels": {"app.kubernetes.io/part-of": "recpipe"}}
    train = ["python", "-m", "trainer.train_eval", *train_args]
    evaluate = (
        ["python", "-m", "trainer.eval", *(eval_args or []), "--follow"] if eval_args is not None else None
    )
    if distribute.uses_horovod:
        manifests = [_mpi_job(meta, cluster, train, workers)]
        if evaluate is not None:
            manifests.append(_evaluator_job(meta, cluster, evaluate))
        return [*manifests, network_policy(name, cluster.namespace)]
    return [
        _tf_job(meta, distribute, cluster, train, evaluate, workers, sync_mode),
        network_policy(name, cluster.namespace),
    ]


def _mpi_job(meta: dict, cluster: ClusterConfig, train: list[str], workers: int) -> dict:
    """A Horovod job's MPIJob: a small launcher running ``horovodrun`` over ``workers`` pods
    that serve SSH."""
    slots = max(cluster.worker.gpu, 1)
    launcher = ["horovodrun", "-np", str(workers * slots), "--hostfile", "/etc/mpi/hostfile", "--gloo"]
    small = RoleResources(count=1, cpu=1, memory="2Gi")
    return {
        "apiVersion": f"{MPIJOB[0]}/{MPIJOB[1]}",
        "kind": MPIJOB[3],
        "metadata": meta,
        "spec": {
            "slotsPerWorker": slots,
            "runPolicy": dict(RUN_POLICY),
            "mpiReplicaSpecs": {
                "Launcher": _replica(cluster, "launcher", [*launcher, *train], small, 1, "Never"),
                "Worker": _replica(cluster, "worker", list(SSHD), cluster.worker, workers, "Never"),
            },
        },
    }


def _evaluator_job(meta: dict, cluster: ClusterConfig, evaluate: list[str]) -> dict:
    """A Horovod job's separate evaluator: a batch Job inside the job's network policy."""
    pod = _pod(cluster, "evaluator", evaluate, cluster.evaluator)
    pod["spec"]["restartPolicy"] = "Never"
    pod["metadata"]["labels"][JOB_LABEL] = meta["name"]  # inside the job's network policy
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {**meta, "name": job_name(f"{meta['name']}-evaluator")},
        "spec": {"backoffLimit": 0, "template": pod},
    }


def _tf_job(meta, distribute, cluster: ClusterConfig, train, evaluate, workers: int, sync_mode) -> dict:
    """The TFJob of every other strategy: one process's workers, or a chief with workers and
    ps (the parameter-server modes), and the evaluator as a replica.

    Raises:
        ConfigError: several workers for a single-process strategy; ``PSStrategy`` without ps.
    """
    with_ps = distribute.with_parameter_servers(cluster.ps.count)
    single = distribute in (TrainDistribute.NoStrategy, TrainDistribute.MirroredStrategy)
    if not with_ps and single and workers != 1:
        raise ConfigError(f"num_workers={workers}: {distribute.value} runs in one process")
    if distribute == TrainDistribute.PSStrategy and not cluster.ps.count:
        raise ConfigError("PSStrategy needs ps.count >= 1 in the cluster config")
    if with_ps:
        meta["annotations"] = {SYNC_MODE_ANNOTATION: SyncMode(sync_mode or SyncMode.async_).value}
        # the chief runs the trainer (TF's coordinator); workers and ps serve it. Workers and
        # ps are restarted on failure, as the training operator's parameter-server example has
        # them: the coordinator runs a lost worker's steps elsewhere and takes it back. The
        # job's outcome is the chief's (the operator's default success policy), so servers
        # that never exit by themselves, or that end before it, decide nothing
        server = ["python", "-m", "trainer.distribute.server"]
        specs = {
            "Chief": _replica(cluster, "tensorflow", train, cluster.worker, 1, "Never"),
            "Worker": _replica(cluster, "tensorflow", server, cluster.worker, workers, "OnFailure"),
            "PS": _replica(cluster, "tensorflow", server, cluster.ps, cluster.ps.count, "OnFailure"),
        }
    else:
        specs = {"Worker": _replica(cluster, "tensorflow", train, cluster.worker, workers, "Never")}
    if evaluate is not None:
        specs["Evaluator"] = _replica(cluster, "tensorflow", evaluate, cluster.evaluator, 1, "Never")
    return {
        "apiVersion": f"{TFJOB[0]}/{TFJOB[1]}",
        "kind": TFJOB[3],
        "metadata": meta,
        "spec": {"runPolicy": dict(RUN_POLICY), "tfReplicaSpecs": specs},
    }
