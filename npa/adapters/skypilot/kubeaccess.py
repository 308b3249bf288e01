"""The cluster-side facts SkyPilot relies on, read through one kubeconfig file and context.

Answers are three-valued: a read that the API server answered with 404 is *absent*; one it
answered with 403 is *forbidden*; anything else that went wrong (connection refused, TLS, a
timeout, a 5xx) is *unknown*. Access questions are SelfSubjectAccessReviews, so nothing is
created to find out whether it could be.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from npa.adapters.kube.client import REQUEST_TIMEOUT
from npa.adapters.kube.client import api_client as api_client
from npa.adapters.kube.nodes import GPU_LABELS
from npa.core.text import clipped

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
Presence = Literal["present", "absent", "forbidden", "unknown"]


@dataclass(frozen=True)
class Answer:
    presence: Presence
    detail: str = ""


@dataclass(frozen=True)
class Access:
    """One SelfSubjectAccessReview: allowed is None when the review itself could not be made."""

    verb: str
    resource: str
    namespace: str | None
    allowed: bool | None
    detail: str = ""


@dataclass(frozen=True)
class NodeFacts:
    name: str
    gpu_label: str | None  # "<label>=<value>" of the most specific GPU label, if any
    gpu_resource: str | None
    allocatable_gpus: int
    ready: bool


@dataclass
class Identity:
    username: str | None
    groups: list[str] = field(default_factory=list)
    detail: str = ""


def context_names(kubeconfig: Path) -> list[str]:
    from kubernetes import config

    contexts, _active = config.list_kube_config_contexts(config_file=str(kubeconfig))
    return sorted(str(c["name"]) for c in contexts)


def context_namespace(kubeconfig: Path, context: str) -> str | None:
    from kubernetes import config

    contexts, _active = config.list_kube_config_contexts(config_file=str(kubeconfig))
    for entry in contexts:
        if entry["name"] == context:
            ns = (entry.get("context") or {}).get("namespace")
            return str(ns) if ns else None
    return None


def _describe(exc: Exception) -> tuple[int | None, str]:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        return exc.status, f"{exc.status} {exc.reason}"
    return None, f"{type(exc).__name__}: {clipped(str(exc), 200)}"


def _presence(call: Any) -> Answer:
    try:
        call()
    except Exception as exc:
        status, text = _describe(exc)
        if status == 404:
            return Answer("absent", text)
        if status == 403:
            return Answer("forbidden", text)
        return Answer("unknown", text)
    return Answer("present")


def namespace(client: Any, name: str) -> Answer:
    from kubernetes import client as k

    api = k.CoreV1Api(client)
    return _presence(lambda: api.read_namespace(name, _request_timeout=REQUEST_TIMEOUT))


def service_account(client: Any, ns: str, name: str) -> Answer:
    from kubernetes import client as k

    api = k.CoreV1Api(client)
    return _presence(
        lambda: api.read_namespaced_service_account(name, ns, _request_timeout=REQUEST_TIMEOUT)
    )


def role_binding(client: Any, ns: str, name: str) -> Answer:
    from kubernetes import client as k

    api = k.RbacAuthorizationV1Api(client)
    return _presence(
        lambda: api.read_namespaced_role_binding(name, ns, _request_timeout=REQUEST_TIMEOUT)
    )


def whoami(client: Any) -> Identity:
    """Who the API server says this client is (a SelfSubjectReview)."""
    from kubernetes import client as k

    try:
        review = k.AuthenticationV1Api(client).create_self_subject_review(
            k.V1SelfSubjectReview(), _request_timeout=REQUEST_TIMEOUT
        )
    except Exception as exc:
        return Identity(None, [], _describe(exc)[1])
    info = review.status.user_info if review.status else None
    if info is None:
        return Identity(None, [], "the API server returned no user info")
    return Identity(info.username, list(info.groups or []))


def can_i(client: Any, verb: str, resource: str, ns: str | None, group: str = "") -> Access:
    """Would the API server allow this client ``verb`` on ``resource``? (SelfSubjectAccessReview)"""
    from kubernetes import client as k

    body = k.V1SelfSubjectAccessReview(
        spec=k.V1SelfSubjectAccessReviewSpec(
            resource_attributes=k.V1ResourceAttributes(
                verb=verb, resource=resource, namespace=ns, group=group
            )
        )
    )
    try:
        review = k.AuthorizationV1Api(client).create_self_subject_access_review(
            body, _request_timeout=REQUEST_TIMEOUT
        )
    except Exception as exc:
        return Access(verb, resource, ns, None, _describe(exc)[1])
    status = review.status
    detail = (status.reason or status.evaluation_error or "") if status else ""
    return Access(verb, resource, ns, bool(status and status.allowed), detail)


def _quantity(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def nodes(client: Any) -> list[NodeFacts]:
    """Every node with its GPU label, GPU resource and readiness (raises what the client raises)."""
    from kubernetes import client as k

    items = k.CoreV1Api(client).list_node(_request_timeout=REQUEST_TIMEOUT).items
    found = []
    for node in items:
        labels = node.metadata.labels or {}
        label = next((f"{key}={labels[key]}" for key in GPU_LABELS if labels.get(key)), None)
        allocatable = (node.status.allocatable or {}) if node.status else {}
        resource = next((r for r in GPU_RESOURCES if _quantity(allocatable.get(r, 0)) > 0), None)
        conditions = (node.status.conditions or []) if node.status else []
        ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
        found.append(
            NodeFacts(
                name=node.metadata.name,
                gpu_label=label,
                gpu_resource=resource,
                allocatable_gpus=_quantity(allocatable.get(resource, 0)) if resource else 0,
                ready=ready,
            )
        )
    return found


def describe_error(exc: Exception) -> tuple[int | None, str]:
    """HTTP status (if the API server answered) and a short description of a client error."""
    return _describe(exc)
