"""The one place npa builds a Kubernetes client: for exactly one kubeconfig file and context.

Every Kubernetes read npa makes (readiness, node labels and GPUs, pod reasons, the cluster
facts SkyPilot relies on, the image probe's pods) starts from :func:`api_client`, so the file
and context a command was given are the ones used, and nothing falls back to ``~/.kube``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

REQUEST_TIMEOUT = 10


def api_client(
    kubeconfig: Path | str, context: str | None, *, impersonate: str | None = None
) -> Any:
    """A client for exactly this file (or ``KUBECONFIG``-style list of files) and context;
    optionally acting as another user."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(kubeconfig), context=context)
    _trim_token_file(client, kubeconfig, context)
    if impersonate:
        client.set_default_header("Impersonate-User", impersonate)
    return client


def _trim_token_file(client: Any, kubeconfig: Path | str, context: str | None) -> None:
    """A user's ``tokenFile`` is read as kubectl reads it: client-go trims the whitespace
    around it (``strings.TrimSpace``), so a token file ending in a newline (what ``echo`` and
    most editors write) works; the Python client sends it as read, a header urllib3 refuses.
    The client reads the file again before each request (its refresh hook): trimmed each time."""
    from npa.adapters.kube import kubeconfig as kubeconfigs

    merged = kubeconfigs.merge(kubeconfigs.split_list(str(kubeconfig)))
    context_body = merged.contexts.get(context or merged.current_context or "", {})
    user_name = (context_body.get("context") or {}).get("user")
    user = (merged.users.get(user_name) or {}).get("user") or {} if user_name else {}
    if not user.get("tokenFile"):
        return
    configuration = client.configuration
    refresh = configuration.refresh_api_key_hook

    def trimmed(conf: Any) -> None:
        if refresh is not None:
            refresh(conf)  # which sets a hook of its own again: put this one back
        conf.refresh_api_key_hook = trimmed
        header = conf.api_key.get("authorization")
        scheme, _, token = header.partition(" ") if isinstance(header, str) else ("", "", "")
        if scheme == "Bearer":
            conf.api_key["authorization"] = f"Bearer {token.strip()}"

    trimmed(configuration)


def core_api(kubeconfig: Path | str, context: str | None) -> Any:
    """A CoreV1 client for exactly this file and context."""
    from kubernetes import client

    return client.CoreV1Api(api_client(kubeconfig, context))


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
