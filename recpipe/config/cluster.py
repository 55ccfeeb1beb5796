"""Cluster resources, kept apart from the model config (PaddleRec's ``backend.yaml`` idea).

``conf/cluster/*.yaml`` names the launcher and sizes each role; the same pipeline config can
run on a laptop (``local``) or a cluster (``kubernetes``) by swapping only this file.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from recpipe.config.base import Section

_MEMORY = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti)?$")


class RoleResources(Section):
    """How many processes of one role, and what each gets.

    ``cpu`` in cores, ``memory`` as a Kubernetes quantity (``512Mi``, ``4Gi``), ``gpu`` a count.
    """

    count: int = Field(0, ge=0)
    """Processes of this role (a worker role needs at least 1)."""
    cpu: float = Field(1.0, gt=0)
    """CPU cores each process asks for (a Kubernetes request and limit)."""
    memory: str = "2Gi"
    """Memory of each process, as a Kubernetes quantity (``512Mi``, ``4Gi``)."""
    gpu: int = Field(0, ge=0)
    """GPUs of each process (``nvidia.com/gpu``)."""

    @field_validator("memory")
    @classmethod
    def _quantity(cls, value: str) -> str:
        if not _MEMORY.match(value):
            raise ValueError(f"{value!r} is not a memory quantity like 512Mi or 4Gi")
        return value


class SharedVolume(Section):
    """A PersistentVolumeClaim every pod mounts: model_dir and the features must be on it."""

    claim_name: str
    """The PersistentVolumeClaim's name, in the job's ``namespace``."""
    mount_path: str = "/var/lib/recpipe"
    """Where each pod mounts it."""


class ClusterConfig(Section):
    """Launcher and per-role resources (ps, worker, evaluator).

    For ``kubernetes``: ``namespace``, ``image`` (the recpipe image), ``shared_volume``,
    ``kubernetes_conn_id`` (the Airflow connection of the cluster) and ``poll_interval_s``.
    """

    launcher: str = Field("local", pattern="^(local|kubernetes)$")
    """``local``: the job's processes on the Airflow worker; ``kubernetes``: a TFJob / MPIJob
    manifest applied to the cluster."""
    namespace: str = "default"
    """Kubernetes namespace of the job's pods."""
    image: str | None = None
    """The recpipe image the pods run (kubernetes; required there)."""
    shared_volume: SharedVolume | None = None
    """The volume every pod mounts (kubernetes)."""
    kubernetes_conn_id: str = "kubernetes_default"
    """The Airflow connection of the cluster."""
    poll_interval_s: float = Field(30.0, gt=0)
    """Seconds between the operator's looks at a running job (kubernetes)."""
    ps: RoleResources = Field(default_factory=RoleResources)
    """Parameter servers (``PSStrategy`` and PaddleRec's PS modes; 0 otherwise)."""
    worker: RoleResources = Field(default_factory=lambda: RoleResources(count=1))
    """Workers, the chief among them; a job's ``--num_workers`` overrides ``count``."""
    evaluator: RoleResources = Field(default_factory=RoleResources)
    """The separate evaluator (``eval_config.eval_method: separate``)."""

    @field_validator("worker")
    @classmethod
    def _one_worker(cls, worker: RoleResources) -> RoleResources:
        if worker.count < 1:
            raise ValueError("at least one worker is needed")
        return worker
