"""Whether a job controller running as a pod can be reached, as the cluster itself sees it.

SkyPilot reaches its jobs controller through the controller pod's kubelet (``exec`` and port
forwarding go API server -> kubelet -> container). When that kubelet stops, the pod keeps
running but every queue request fails, and SkyPilot's own error names something unrelated.
The cluster can say what is wrong: the API server answers for the pod and its node, and its
proxy to the node's kubelet (``nodes/<node>/proxy/healthz``) fails the way the controller's
requests do.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from npa.adapters.kube.client import REQUEST_TIMEOUT, core_api
from npa.core.text import clipped

Reach = Literal["reachable", "unreachable", "absent", "unknown"]


class ControllerReach(BaseModel):
    """What the cluster says about the controller pod and the kubelet that serves it."""

    answer: Reach
    detail: str
    pod: str | None = None
    node: str | None = None


def _first_line(exc: Exception) -> str:
    """The API server's own message for a refused request (its Status body), else the error."""
    body = getattr(exc, "body", None)
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    with contextlib.suppress(ValueError, AttributeError):
        text = str(json.loads(text).get("message", text))
    lines = text.strip().splitlines() or [str(getattr(exc, "reason", None) or type(exc).__name__)]
    return clipped(lines[0], 200)


def controller_reach(
    kubeconfig: Path, context: str | None, namespace: str, prefix: str
) -> ControllerReach:
    """The controller pod (named ``prefix...``) in ``namespace`` and whether its node's kubelet
    answers. Never raises: a question the cluster does not answer is ``unknown``."""
    try:
        api = core_api(kubeconfig, context)
        pods = api.list_namespaced_pod(namespace, _request_timeout=REQUEST_TIMEOUT).items
    except Exception as exc:
        return ControllerReach(
            answer="unknown", detail=f"cannot list the pods of {namespace}: {_first_line(exc)}"
        )
    live = [
        p
        for p in pods
        if p.metadata.name.startswith(prefix) and p.metadata.deletion_timestamp is None
    ]
    if not live:
        return ControllerReach(answer="absent", detail=f"no jobs controller pod in {namespace}")
    pod = live[0]
    name, node, phase = pod.metadata.name, pod.spec.node_name, pod.status.phase
    if not node:
        return ControllerReach(
            answer="unreachable",
            pod=name,
            detail=f"the jobs controller's pod {name} is {phase}, on no node yet",
        )
    return _kubelet_reach(api, name, node)


def _kubelet_reach(api: Any, pod: str, node: str) -> ControllerReach:
    from kubernetes.client.rest import ApiException

    where = f"the jobs controller's pod {pod} runs on node {node}"
    try:
        api.connect_get_node_proxy_with_path(node, "healthz", _request_timeout=REQUEST_TIMEOUT)
    except ApiException as exc:
        if exc.status in (401, 403):
            return ControllerReach(
                answer="unknown", pod=pod, node=node,
                detail=f"{where}; this kubeconfig may not ask its kubelet ({exc.status})",
            )  # fmt: skip
        return ControllerReach(
            answer="unreachable", pod=pod, node=node,
            detail=f"{where}, whose kubelet does not answer ({exc.status}: {_first_line(exc)})",
        )  # fmt: skip
    except Exception as exc:
        return ControllerReach(
            answer="unreachable", pod=pod, node=node,
            detail=f"{where}, whose kubelet does not answer ({type(exc).__name__})",
        )  # fmt: skip
    return ControllerReach(
        answer="reachable", pod=pod, node=node, detail=f"{where}, whose kubelet answers"
    )
