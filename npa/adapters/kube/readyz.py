"""One ``/readyz`` question to a context's API server (the launch transaction's readiness check
asks it repeatedly, :mod:`npa.launch.readiness`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from npa.adapters.kube.client import api_client
from npa.core.text import clipped


def serves(status: int | None) -> bool:
    """Whether an API answer is the server's own answer to the question (200, or a refusal
    such as 403 or 404) rather than a server unable to answer (no answer, 429, any 5xx)."""
    return status is not None and status < 500 and status != 429


def readyz_asker(
    kubeconfig: Path, context: str, path: str = "/readyz"
) -> Callable[[], tuple[int | None, str]]:
    """A function that asks the context's API server for ``path`` (``/readyz`` unless told) once:
    (HTTP status or None when nothing answered, a short detail). The client is built on the
    first question."""

    state: dict[str, Any] = {}

    def ask() -> tuple[int | None, str]:
        from kubernetes.client.exceptions import ApiException

        try:
            if "client" not in state:
                state["client"] = api_client(kubeconfig, context)
            body, status, _ = state["client"].call_api(
                path,
                "GET",
                auth_settings=["BearerToken"],
                response_type="str",
                _return_http_data_only=False,
                _request_timeout=5,
            )
            return int(status), clipped(str(body or "").strip(), 200)
        except ApiException as exc:
            return int(exc.status or 0) or None, clipped(str(exc.reason or exc), 200)
        except Exception as exc:  # connection refused, TLS, bad kubeconfig: all "not ready"
            return None, f"{type(exc).__name__}: {clipped(str(exc), 200)}"

    return ask
