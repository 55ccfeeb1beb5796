"""A stand-in for Kubeflow's training operator in the multi-host tests: it starts the replicas of
a ``TFJob`` manifest that ``recpipe.launch.kubeflow.render`` wrote, one replica a host
(``tests.hosts.Hosts``), as the operator starts its pods.

What it takes from the operator's conventions (training-operator ``pkg/controller.v1/tensorflow``):
each replica ``<job>-<type>-<index>`` (type lowercased) has a Service of that name on port 2222;
each pod's ``TF_CONFIG`` names every replica by its Service (``<name>.<namespace>.svc:2222``),
its own task (type lowercased, index) and ``environment: cloud``; the pod runs the manifest's
container ``command`` with the manifest's ``env``; the job succeeds when the chief (or, without
one, worker 0) exits 0 and fails when a ``Never`` replica fails; an ``OnFailure`` replica is
started again. Services resolve through each host's own ``/etc/hosts``
(``/etc/netns/<namespace>/hosts``, which ``ip netns exec`` mounts over it), so a wrong name or
port in the manifest fails the job, as on a cluster. The container's ``python`` is this
interpreter and its working directory the project (the image's ``WORKDIR``); the filesystem is
shared, as the manifest's ReadWriteMany volume is. Never imported by production code.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from recpipe.launch.isolation import job_environment
from tests.hosts import Hosts

PORT = 2222  # the training operator's default port for TFJob replicas
ROOT = Path(__file__).resolve().parents[1]


def service(job: dict, kind: str, index: int) -> str:
    """Replica ``kind`` ``index``'s Service name (``<job>-<kind>-<index>``, lowercase)."""
    return f"{job['metadata']['name']}-{kind.lower()}-{index}"


def tf_config(job: dict, kind: str, index: int) -> dict:
    """The ``TF_CONFIG`` the operator gives replica ``kind`` ``index`` of ``job``."""
    namespace = job["metadata"]["namespace"]
    cluster = {
        k.lower(): [f"{service(job, k, i)}.{namespace}.svc:{PORT}" for i in range(spec["replicas"])]
        for k, spec in job["spec"]["tfReplicaSpecs"].items()
        if k != "Evaluator"  # the operator leaves the evaluator out of the cluster
    }
    return {"cluster": cluster, "task": {"type": kind.lower(), "index": index}, "environment": "cloud"}


@dataclass
class Replica:
    kind: str
    index: int
    host: str
    argv: list[str]
    env: dict[str, str]
    restart: str
    log: Path
    proc: subprocess.Popen | None = None


@dataclass
class TFJobRun:
    """A TFJob's replicas running on hosts; ``wait`` follows them as the operator does."""

    hosts: Hosts
    job: dict
    replicas: list[Replica] = field(default_factory=list)

    def _start(self, r: Replica) -> None:
        r.proc = self.hosts.popen(r.host, r.argv, log=r.log, cwd=ROOT, env=r.env)

    def replica(self, kind: str, index: int = 0) -> Replica:
        return next(r for r in self.replicas if r.kind == kind and r.index == index)

    def wait(self, timeout_s: float) -> int:
        """Until the chief (or worker 0) ends: its exit code; a ``Never`` replica that fails
        first fails the job (its code), an ``OnFailure`` one is started again.

        Raises:
            TimeoutError: the job ran past ``timeout_s`` (its replicas are left to ``Hosts``).
        """
        kinds = {r.kind for r in self.replicas}
        lead = self.replica("Chief" if "Chief" in kinds else "Worker")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = lead.proc.poll()
            if code is not None:
                return code
            for r in self.replicas:
                code = r.proc.poll()
                if code is None or code == 0 or r is lead:
                    continue
                if r.restart in ("OnFailure", "Always"):
                    self._start(r)
                else:
                    return code
            time.sleep(0.2)
        raise TimeoutError(f"TFJob {self.job['metadata']['name']} still running after {timeout_s} s")

    def stop(self) -> None:
        """Delete the pods (the operator's cleanPodPolicy ``Running``)."""
        for r in self.replicas:
            if r.proc is not None and r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()


def enforce_network_policy(hosts: Hosts, policy: dict, job: dict, inside: set[str]) -> list[str]:
    """Enforce a rendered ``NetworkPolicy`` as a cluster's network plugin would, for the job's
    hosts ``inside``: when it selects the job's pods (its ``training.kubeflow.org/job-name`` label)
    and admits only pods of that label, each job host gets a ``prohibit`` route to every other
    host and to the bridge (its answers to anyone outside the job are refused, so no connection
    from outside is ever set up). Returns the hosts outside the job.

    Raises:
        ValueError: the policy does not select the job's pods or admits more than them.
    """
    from recpipe.launch.kubeflow import JOB_LABEL

    name = job["metadata"]["name"]
    pods = {"matchLabels": {JOB_LABEL: name}}
    spec = policy["spec"]
    if spec["podSelector"] != pods or spec["ingress"] != [{"from": [{"podSelector": pods}]}]:
        raise ValueError(f"NetworkPolicy {policy['metadata']['name']} does not keep job {name} to itself")
    outside = [h for h in hosts.names if h not in inside]
    for host in inside:
        for other in [*(hosts.address(h) for h in outside), hosts.gateway]:
            hosts.run(host, ["ip", "route", "add", "prohibit", f"{other}/32"], check=True)
    return outside


def start_tfjob(
    hosts: Hosts,
    job: dict,
    placement: dict[tuple[str, int], str],
    log_dir: Path,
    policy: dict | None = None,
) -> TFJobRun:
    """Start every replica of TFJob ``job`` on its host (``placement``: (type, index) -> host
    name; every replica needs one), after writing each host's ``/etc/hosts`` with the job's
    Services and enforcing the job's rendered ``policy`` (``enforce_network_policy``). Logs go
    to ``log_dir/<type>-<index>.log``.

    Raises:
        ValueError: ``job`` is not a TFJob, or a replica has no host.
    """
    if job.get("kind") != "TFJob":
        raise ValueError(f"not a TFJob: {job.get('kind')}")
    namespace = job["metadata"]["namespace"]
    names = {}
    for kind, spec in job["spec"]["tfReplicaSpecs"].items():
        for i in range(spec["replicas"]):
            if (kind, i) not in placement:
                raise ValueError(f"replica {kind} {i} of {job['metadata']['name']} has no host")
            names[service(job, kind, i)] = hosts.address(placement[(kind, i)])
    lines = ["127.0.0.1 localhost"] + [f"{a} {n} {n}.{namespace}.svc" for n, a in names.items()]
    for host in hosts.names:
        hosts.write_etc(host, "hosts", "\n".join(lines) + "\n")
    log_dir.mkdir(parents=True, exist_ok=True)
    run = TFJobRun(hosts, job)
    for kind, spec in job["spec"]["tfReplicaSpecs"].items():
        container = spec["template"]["spec"]["containers"][0]
        command = [sys.executable if c == "python" else c for c in container["command"]]
        pod_env = {e["name"]: e["value"] for e in container.get("env", [])}
        for i in range(spec["replicas"]):
            env = job_environment({**pod_env, "TF_CONFIG": json.dumps(tf_config(job, kind, i))})
            log = log_dir / f"{kind.lower()}-{i}.log"
            run.replicas.append(
                Replica(kind, i, placement[(kind, i)], command, env, spec["restartPolicy"], log)
            )
    if policy is not None:
        enforce_network_policy(hosts, policy, job, {r.host for r in run.replicas})
    for r in run.replicas:
        run._start(r)
    return run
