"""Submit a job's Kubeflow manifests with the cncf.kubernetes provider and wait for it."""

# Imports inside functions: Airflow's Kubernetes hook is imported when a job is submitted: the
# core loads without Airflow.

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from recpipe.launch.base import JobFailedError, JobSpec, JobTimeoutError

log = logging.getLogger(__name__)
KINDS = {"TFJob": "tfjobs", "MPIJob": "mpijobs"}


class KubernetesLauncher:
    """Creates the job's manifests (``JobSpec.manifests``: a TFJob or MPIJob first, then an
    optional evaluator ``batch/v1`` Job) through ``KubernetesHook``, polls the training job's
    conditions until ``Succeeded`` or ``Failed``, saves the chief's pod log, and deletes
    everything it created on every outcome (success, failure, timeout, ``kill``). The objects
    after the training job (the evaluator's Job, the NetworkPolicy) are owned by it
    (``ownerReferences``), and the training job is deleted by its operator a while after it
    ends (``runPolicy.ttlSecondsAfterFinished``), so that even a launcher killed outright
    leaves nothing behind for long.

    Args:
        log_dir: where ``<job>-0.log`` (the chief's or launcher's pod log) and
            ``<job>-status.log`` (the job's status at each change) go.
        conn_id: the Airflow connection of the cluster (``kubernetes_default``).
        poll_s: seconds between status reads.
        timeout_s: delete the job's objects and raise ``JobTimeoutError`` after this many
            seconds (None: wait for ever).
    """

    def __init__(
        self,
        log_dir: str | Path,
        conn_id: str = "kubernetes_default",
        poll_s: float = 30.0,
        timeout_s: float | None = None,
    ):
        self.log_dir, self.conn_id, self.poll_s = Path(log_dir), conn_id, poll_s
        self.timeout_s = timeout_s
        self.degraded: dict[str, str] = {}
        self._created: list[dict] = []
        self._hook = None

    @property
    def hook(self):
        if self._hook is None:
            from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

            self._hook = KubernetesHook(conn_id=self.conn_id)
        return self._hook

    def run(self, job: JobSpec) -> list[Path]:
        """Submit and wait.

        Raises:
            ValueError: the JobSpec carries no manifests.
            JobFailedError: the job's ``Failed`` condition, with its message and replica states.
        """
        if not job.manifests:
            raise ValueError(f"job {job.name}: the kubernetes launcher needs rendered manifests")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        status_log = self.log_dir / f"{job.name}-status.log"
        main = job.manifests[0]
        try:
            for manifest in job.manifests:
                if manifest is not main:
                    manifest = owned_by(manifest, main, self._uid(main))
                self._create(manifest)
                self._created.append(manifest)
                log.info("created %s %s", manifest["kind"], manifest["metadata"]["name"])
        except BaseException:
            self.kill()
            raise
        last, started = None, time.monotonic()
        while True:
            status = self._get(main).get("status", {})
            if status != last:
                with status_log.open("a") as out:
                    out.write(json.dumps(status) + "\n")
                last = status
            conditions = {c["type"]: c for c in status.get("conditions", []) if c.get("status") == "True"}
            if "Succeeded" in conditions:
                try:
                    return [self._chief_log(job, main), status_log]
                finally:
                    self.kill()  # the job, its evaluator and its NetworkPolicy
            if "Failed" in conditions:
                self.kill()
                raise JobFailedError(
                    f"{job.name}: {main['kind']} {main['metadata']['name']} failed: "
                    f"{conditions['Failed'].get('message', '')}; replicas "
                    f"{json.dumps(status.get('replicaStatuses', {}))} (status log {status_log})"
                )
            if self.timeout_s is not None and time.monotonic() - started > self.timeout_s:
                self.kill()
                raise JobTimeoutError(
                    f"{job.name}: {main['kind']} {main['metadata']['name']} ran past its timeout of "
                    f"{self.timeout_s:.0f} s and was deleted (status log {status_log})"
                )
            time.sleep(self.poll_s)

    def _uid(self, manifest: dict) -> str:
        return self._get(manifest)["metadata"]["uid"]

    def _networking(self):
        from kubernetes import client

        return client.NetworkingV1Api(self.hook.api_client)

    def _create(self, manifest: dict) -> None:
        namespace = manifest["metadata"]["namespace"]
        if manifest["kind"] == "NetworkPolicy":
            self._networking().create_namespaced_network_policy(namespace=namespace, body=manifest)
            return
        if manifest["kind"] == "Job":
            self.hook.batch_v1_client.create_namespaced_job(namespace=namespace, body=manifest)
            return
        group, version = manifest["apiVersion"].split("/")
        self.hook.create_custom_object(
            group=group, version=version, plural=KINDS[manifest["kind"]], body=manifest, namespace=namespace
        )

    def _get(self, manifest: dict) -> dict:
        group, version = manifest["apiVersion"].split("/")
        meta = manifest["metadata"]
        return self.hook.get_custom_object(
            group=group,
            version=version,
            plural=KINDS[manifest["kind"]],
            name=meta["name"],
            namespace=meta["namespace"],
        )

    def _chief_log(self, job: JobSpec, main: dict) -> Path:
        """The log of worker 0 (TFJob) or of the launcher (MPIJob): it holds the result line."""
        meta = main["metadata"]
        role = "launcher" if main["kind"] == "MPIJob" else "worker"
        selector = f"training.kubeflow.org/job-name={meta['name']},training.kubeflow.org/replica-type={role}"
        if role == "worker":
            selector += ",training.kubeflow.org/replica-index=0"
        core = self.hook.core_v1_client
        pods = core.list_namespaced_pod(namespace=meta["namespace"], label_selector=selector).items
        path = self.log_dir / f"{job.name}-0.log"
        text = ""
        if pods:
            # the raw bytes: the client's own decoding parses a log that is one JSON document
            # and prints it back as a Python dict (single quotes: no result line is found)
            raw = core.read_namespaced_pod_log(
                pods[0].metadata.name, meta["namespace"], _preload_content=False
            )
            text = raw.data.decode("utf-8", errors="replace")
        path.write_text(text)
        return path

    def kill(self) -> None:
        """Delete every manifest this launcher created; never raises."""
        for manifest in reversed(self._created):
            meta = manifest["metadata"]
            try:
                if manifest["kind"] == "NetworkPolicy":
                    self._networking().delete_namespaced_network_policy(meta["name"], meta["namespace"])
                elif manifest["kind"] == "Job":
                    self.hook.batch_v1_client.delete_namespaced_job(
                        meta["name"], meta["namespace"], propagation_policy="Background"
                    )
                else:
                    group, version = manifest["apiVersion"].split("/")
                    self.hook.delete_custom_object(
                        group=group,
                        version=version,
                        plural=KINDS[manifest["kind"]],
                        name=meta["name"],
                        namespace=meta["namespace"],
                    )
            except Exception as err:  # noqa: BLE001 - best effort: the job may be gone already
                log.warning("could not delete %s %s: %s", manifest["kind"], meta["name"], err)
        self._created = []


def owned_by(manifest: dict, owner: dict, uid: str) -> dict:
    """``manifest`` with an ``ownerReference`` to ``owner`` (the training job, whose ``uid`` the
    API server gave it): Kubernetes' garbage collector deletes it with its owner."""
    reference = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": uid,
        "blockOwnerDeletion": False,
    }
    return {**manifest, "metadata": {**manifest["metadata"], "ownerReferences": [reference]}}
