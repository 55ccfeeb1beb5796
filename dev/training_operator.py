"""A stand-in for Kubeflow's training operator in the multi-host tests: it starts the replicas of
a ``TFJob`` manifest that ``recpipe.launch.kubeflow.render`` wrote, one replica a host
(``dev.hosts.Hosts``), as the operator starts its pods.

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
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dev.hosts import Hosts
from recpipe.forkserver import forked
from recpipe.launch.isolation import job_environment
from recpipe.launch.local import tail

PORT = 2222  # the training operator's default port for TFJob replicas
# the image's programs a container's command names, as this machine has them
IMAGE_BIN = {"python": sys.executable, "horovodrun": str(Path(sys.executable).parent / "horovodrun")}
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
        # the container's python forks from the suite's warm process when one is configured
        # (recpipe.forkserver), in the pod's network and mounts, as the local launcher's do
        r.proc = self.hosts.popen(r.host, forked(r.argv), log=r.log, cwd=ROOT, env=r.env)

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
        raise TimeoutError(
            f"TFJob {self.job['metadata']['name']} still running after {timeout_s} s; "
            f"its replicas' threads:\n{self.stacks()}"
        )

    def stacks(self) -> str:
        """Each live replica's Python threads (``trainer.entry`` prints them on SIGUSR1 into
        its log), the tail of each log: where a job that does not end stands."""
        live = [r for r in self.replicas if r.proc is not None and r.proc.poll() is None]
        for r in live:
            try:
                os.kill(r.proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(3)
        return "\n".join(f"--- {r.kind} {r.index}:\n{tail(r.log)}" for r in live)

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
        command = [IMAGE_BIN.get(c, c) for c in container["command"]]
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


# --- MPIJob (mpi-operator v2) -------------------------------------------------------------

HOSTFILE = "/etc/mpi/hostfile"  # where mpi-operator mounts the job's hostfile (its ConfigMap)
SSHD_CONFIG = """\
Port 22
HostKey /etc/ssh/ssh_host_ed25519_key
AuthorizedKeysFile {keys}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
"""
SSH_CONFIG = """\
Host *
    IdentityFile {keys}/id_ed25519
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    ConnectTimeout 10
"""


def mpi_worker(job: dict, index: int) -> str:
    """Worker ``index``'s host name as mpi-operator v2 writes it into the hostfile: the pod
    ``<job>-worker-<i>`` under the job's headless Service ``<job>``."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    return f"{name}-worker-{index}.{name}.{namespace}.svc"


@dataclass
class MPIJobRun:
    """An MPIJob's pods running on hosts: the workers' ``sshd`` and the launcher."""

    hosts: Hosts
    job: dict
    launcher: Replica
    workers: list[Replica]

    def wait(self, timeout_s: float) -> int:
        """Until the launcher ends (the job's outcome, mpi-operator's rule): its exit code.

        Raises:
            TimeoutError: the launcher ran past ``timeout_s``.
        """
        try:
            return self.launcher.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            name = self.job["metadata"]["name"]
            raise TimeoutError(f"MPIJob {name} still running after {timeout_s} s") from None

    def stop(self) -> None:
        """Delete the pods (cleanPodPolicy ``Running``): the launcher, then the workers."""
        for r in [self.launcher, *self.workers]:
            if r.proc is not None and r.proc.poll() is None:
                os.killpg(r.proc.pid, signal.SIGKILL)
                r.proc.wait()


def start_mpijob(
    hosts: Hosts,
    job: dict,
    placement: dict[tuple[str, int], str],
    log_dir: Path,
    policy: dict | None = None,
) -> MPIJobRun:
    """Start MPIJob ``job`` as mpi-operator v2 does: an SSH key pair for the job (its Secret),
    the hostfile of the workers' names with ``slotsPerWorker`` slots (its ConfigMap), each
    worker's container (``sshd``) on its host, then, once every worker's port 22 answers,
    the launcher's container. ``placement``: ("Launcher", 0) and ("Worker", i) -> host name.

    Where the operator mounts files the stand-in writes them elsewhere: the key and the sshd /
    ssh client settings go to each host's own ``/etc/ssh`` (``/etc/netns/<namespace>/ssh``,
    mounted by ``ip netns exec``) instead of ``/root/.ssh``, and the launcher's
    ``--hostfile /etc/mpi/hostfile`` is pointed at ``log_dir/hostfile``. Logs:
    ``log_dir/<launcher|worker-i>.log``.

    Raises:
        ValueError: ``job`` is not an MPIJob, or a pod has no host.
        TimeoutError: a worker's sshd did not answer within 30 s.
    """
    if job.get("kind") != "MPIJob":
        raise ValueError(f"not an MPIJob: {job.get('kind')}")
    name, spec = job["metadata"]["name"], job["spec"]
    workers = spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    pods = [("Launcher", 0), *(("Worker", i) for i in range(workers))]
    missing = [p for p in pods if p not in placement]
    if missing:
        raise ValueError(f"pods {missing} of {name} have no host")
    log_dir.mkdir(parents=True, exist_ok=True)
    keys = log_dir / "ssh"
    keys.mkdir(mode=0o700)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id_ed25519")], check=True
    )
    (keys / "authorized_keys").write_text((keys / "id_ed25519.pub").read_text())
    pod_names = {
        ("Launcher", 0): f"{name}-launcher",
        **{("Worker", i): mpi_worker(job, i).split(".")[0] for i in range(workers)},
    }
    fqdn = {("Launcher", 0): "", **{("Worker", i): mpi_worker(job, i) for i in range(workers)}}
    lines = ["127.0.0.1 localhost"]
    lines += [f"{hosts.address(placement[p])} {fqdn[p]} {pod_names[p]}" for p in pods]
    for host in hosts.names:
        hosts.write_etc(host, "hosts", "\n".join(lines) + "\n")
        etc = hosts.write_etc(host, "ssh/sshd_config", SSHD_CONFIG.format(keys=keys)).parent
        (etc / "ssh_config").write_text(SSH_CONFIG.format(keys=keys))
        host_key = etc / "ssh_host_ed25519_key"
        if not host_key.exists():  # a host's key outlives a job, as the image's does
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    hostfile = log_dir / "hostfile"
    slots = spec["slotsPerWorker"]
    hostfile.write_text("".join(f"{mpi_worker(job, i)} slots={slots}\n" for i in range(workers)))

    def replica(kind: str, i: int) -> Replica:
        container = spec["mpiReplicaSpecs"][kind]["template"]["spec"]["containers"][0]
        command = [str(hostfile) if c == HOSTFILE else IMAGE_BIN.get(c, c) for c in container["command"]]
        # a pod's own host name (Gloo finds its address by it), in a UTS namespace of its own
        pod = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', pod_names[(kind, i)]]
        command = [*pod, *command]
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        env = job_environment({**env, "K_MPI_JOB_ROLE": kind.lower()})
        log = log_dir / (f"{kind.lower()}-{i}.log" if kind == "Worker" else "launcher.log")
        restart = spec["mpiReplicaSpecs"][kind]["restartPolicy"]
        return Replica(kind, i, placement[(kind, i)], command, env, restart, log)

    run = MPIJobRun(hosts, job, replica("Launcher", 0), [replica("Worker", i) for i in range(workers)])
    if policy is not None:
        enforce_network_policy(hosts, policy, job, {placement[p] for p in pods})
    for r in run.workers:
        r.proc = hosts.popen(r.host, r.argv, log=r.log, cwd=ROOT, env=r.env)
    for r in run.workers:  # the operator starts the launcher once the workers are running
        deadline = time.monotonic() + 30
        while hosts.run(r.host, ["ss", "-ltnH", "sport = :22"]).stdout.strip() == "":
            if time.monotonic() > deadline or r.proc.poll() is not None:
                raise TimeoutError(f"worker {r.index}'s sshd: {r.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
    r = run.launcher
    r.proc = hosts.popen(r.host, r.argv, log=r.log, cwd=ROOT, env=r.env)
    return run
