"""Why a pending job's pods wait, read from the pods themselves and from their events.

A managed job that waits on an image pull or on the scheduler stays PENDING in SkyPilot's queue
forever; only the pod says which. The pods of one managed job are found by the
``skypilot-cluster-name`` annotation SkyPilot puts on every pod it creates, whose value is the
job's cluster name (one per task: ``sky.jobs.utils.generate_managed_job_cluster_name``).

SkyPilot deletes a pod that fails to start (an image it cannot pull) after a few seconds and
tries again with a new one, so the pod itself is usually gone when anyone looks. Its events
outlive it (an hour by default): :func:`startup_failures` reads them, one failure per pod that
ever existed, by the pod name SkyPilot derives from the cluster name (``<cluster>-<user>-head``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from npa.adapters.kube.client import REQUEST_TIMEOUT, context_namespace, core_api
from npa.core.faults import PULL_REASONS

CLUSTER_ANNOTATION = "skypilot-cluster-name"
CLUSTER_LABEL = "skypilot-cluster-name"
# The waiting reasons of a container whose image could not be pulled (one list: npa.core.faults).
IMAGE_REASONS = PULL_REASONS


class PodReason(BaseModel):
    """One reason one pod is not running."""

    namespace: str
    pod: str
    phase: str | None
    reason: str  # ImagePullBackOff, ErrImagePull, Unschedulable, CreateContainerConfigError...
    message: str
    image: str | None = None
    container: str | None = None
    # "pod": read from the pod now; "events": the pod is gone, its events say why it failed.
    source: str = "pod"
    uid: str | None = None
    count: int = 1  # how many times the events report it


# Event messages of a pod that cannot start, by the waiting reason they stand for (the kubelet's
# wording, pkg/kubelet/images and kuberuntime).
_PULL_FAILURE = ("Failed to pull image", "ErrImagePull", "ErrImageNeverPull", "InvalidImageName")
_PULL_BACKOFF = ("Back-off pulling image", "ImagePullBackOff")
_START_FAILURE = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError")


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


def _event_reason(event: Any) -> str | None:
    """The waiting reason a pod event stands for, when it means the pod cannot start."""
    message = event.message or ""
    if any(m in message for m in _PULL_FAILURE):
        return "ErrImagePull"
    if any(m in message for m in _PULL_BACKOFF):
        return "ImagePullBackOff"
    if event.reason == "Failed" and any(m in message for m in _START_FAILURE):
        return next(m for m in _START_FAILURE if m in message)
    return None


def _image_of(message: str) -> str | None:
    """The image a kubelet pull message names (``... image "REF" ...``)."""
    start = message.find('image "')
    if start < 0:
        return None
    rest = message[start + len('image "') :]
    end = rest.find('"')
    return rest[:end] if end > 0 else None


# A pull failure outranks the back-off that follows it; any other reason ranks after both.
_RANK = {"ErrImagePull": 0, "ImagePullBackOff": 1}


def _failure_of(event: Any, namespace: str) -> PodReason | None:
    """The start failure one pod event reports, or None when it reports none."""
    reason = _event_reason(event)
    if reason is None:
        return None
    obj = event.involved_object
    return PodReason(
        namespace=namespace,
        pod=obj.name,
        phase=None,
        reason=reason,
        message=(event.message or "").strip(),
        image=_image_of(event.message or ""),
        source="events",
        uid=obj.uid,
        count=int(event.count or 1),
    )


def _keep_worst(by_pod: dict[str, PodReason], uid: str, found: PodReason) -> None:
    """Each pod reads as the failure that stopped it; repeats of that failure add up. Of one
    reason's events, the one that carries the runtime's answer is kept: the kubelet records
    ``Failed to pull image "X": <answer>`` and then ``Error: ErrImagePull``, and only the first
    says whether the registry is failing or the image is not there."""
    current = by_pod.get(uid)
    if current is None or _RANK.get(found.reason, 2) < _RANK.get(current.reason, 2):
        by_pod[uid] = found
    elif current.reason == found.reason:
        count = current.count + found.count
        if found.image and not current.image:  # the pull's own message names the image
            by_pod[uid] = current = found
        current.count = count


def startup_failures(
    kubeconfig: Path, context: str | None, namespace: str, clusters: set[str]
) -> list[PodReason]:
    """Every pod of ``clusters`` whose events say it could not start, one entry per pod (by
    uid), oldest first; pods that are gone included. A pull failure outranks the back-off that
    follows it, so each pod reads as the failure that stopped it.

    Raises whatever the Kubernetes client raises: the caller reports it as "unavailable".
    """
    api = core_api(kubeconfig, context)
    events = api.list_namespaced_event(
        namespace, field_selector="involvedObject.kind=Pod", _request_timeout=REQUEST_TIMEOUT
    ).items
    prefixes = tuple(f"{cluster}-" for cluster in clusters)
    by_pod: dict[str, PodReason] = {}
    first_seen: dict[str, Any] = {}
    for event in events:
        obj = event.involved_object
        if not obj or not obj.name or not obj.name.startswith(prefixes):
            continue
        found = _failure_of(event, namespace)
        if found is None:
            continue
        uid = obj.uid or obj.name
        seen = event.first_timestamp or event.event_time or event.metadata.creation_timestamp
        if uid not in first_seen or (seen and first_seen[uid] and seen < first_seen[uid]):
            first_seen[uid] = seen
        _keep_worst(by_pod, uid, found)

    def when(uid: str) -> float:
        seen = first_seen.get(uid)
        return seen.timestamp() if seen is not None else float("inf")

    return [by_pod[uid] for uid in sorted(by_pod, key=when)]
