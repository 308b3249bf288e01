"""Why a pending job's pods wait, read from the pods themselves.

A managed job that waits on an image pull or on the scheduler stays PENDING in SkyPilot's queue
forever; only the pod says which. The pods of one managed job are found by the
``skypilot-cluster-name`` annotation SkyPilot puts on every pod it creates, whose value is the
job's cluster name (one per task: ``sky.jobs.utils.generate_managed_job_cluster_name``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from npa.adapters.kube.client import REQUEST_TIMEOUT, context_namespace, core_api

CLUSTER_ANNOTATION = "skypilot-cluster-name"
CLUSTER_LABEL = "skypilot-cluster-name"
IMAGE_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName"})


class PodReason(BaseModel):
    """One reason one pod is not running."""

    namespace: str
    pod: str
    phase: str | None
    reason: str  # ImagePullBackOff, ErrImagePull, Unschedulable, CreateContainerConfigError...
    message: str
    image: str | None = None
    container: str | None = None


def managed_job_clusters(task_names: list[str], job_id: int) -> set[str]:
    """The cluster names SkyPilot gives the tasks of managed job ``job_id``."""
    from sky.jobs.utils import generate_managed_job_cluster_name

    return {generate_managed_job_cluster_name(name, job_id) for name in task_names}


def _reasons(pod: Any) -> list[PodReason]:
    meta, status = pod.metadata, pod.status
    base = {"namespace": meta.namespace, "pod": meta.name, "phase": status.phase}
    found: list[PodReason] = []
    for condition in status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            found.append(
                PodReason(
                    **base,
                    reason=condition.reason or "Unschedulable",
                    message=condition.message or "",
                )
            )
    for cs in [*(status.init_container_statuses or []), *(status.container_statuses or [])]:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason not in (
            None,
            "ContainerCreating",
            "PodInitializing",
        ):
            found.append(
                PodReason(
                    **base,
                    reason=waiting.reason,
                    message=waiting.message or "",
                    image=cs.image,
                    container=cs.name,
                )
            )
    return found


def pending_reasons(kubeconfig: Path, context: str | None, clusters: set[str]) -> list[PodReason]:
    """Reasons the pods of ``clusters`` are not running; [] when they run or do not exist yet.

    Raises whatever the Kubernetes client raises: the caller reports it as "unavailable".
    """
    api = core_api(kubeconfig, context)
    try:
        pods = api.list_pod_for_all_namespaces(
            label_selector=CLUSTER_LABEL, _request_timeout=REQUEST_TIMEOUT
        ).items
    except Exception as exc:
        if getattr(exc, "status", None) != 403:
            raise
        # No cluster-wide list permission: the context's own namespace is where SkyPilot puts them.
        namespace = context_namespace(kubeconfig, context)
        pods = api.list_namespaced_pod(
            namespace, label_selector=CLUSTER_LABEL, _request_timeout=REQUEST_TIMEOUT
        ).items
    reasons: list[PodReason] = []
    for pod in sorted(pods, key=lambda p: (p.metadata.namespace, p.metadata.name)):
        if (pod.metadata.annotations or {}).get(CLUSTER_ANNOTATION) in clusters:
            reasons += _reasons(pod)
    return reasons
