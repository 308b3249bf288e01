"""A CoreV1 client for exactly one kubeconfig file and context."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

REQUEST_TIMEOUT = 10


def core_api(kubeconfig: Path, context: str | None) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(
        config.new_client_from_config(config_file=str(kubeconfig), context=context)
    )


def context_namespace(kubeconfig: Path, context: str | None) -> str:
    """The namespace the context selects (``default`` when it names none)."""
    from kubernetes import config

    contexts, active = config.list_kube_config_contexts(config_file=str(kubeconfig))
    chosen = next((c for c in contexts if c["name"] == context), active) if context else active
    return str((chosen or {}).get("context", {}).get("namespace") or "default")


def project_namespace(project: str) -> str:
    """The namespace provisioning creates for a project: ``npa-<project>`` as a DNS label. The
    jobs controller, the task pods and the image probe all run there."""
    label = re.sub(r"[^a-z0-9-]", "-", project.lower()).strip("-")
    return f"npa-{label}"[:63].rstrip("-")
