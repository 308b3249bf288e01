"""One ``/readyz`` question to a context's API server (the launch transaction's readiness check
asks it repeatedly, :mod:`npa.launch.readiness`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from npa.adapters.kube.client import api_client
from npa.core.text import clipped


def readyz_asker(kubeconfig: Path, context: str) -> Callable[[], tuple[int | None, str]]:
    """A function that asks the context's API server for ``/readyz`` once: (HTTP status or None
    when nothing answered, a short detail). The client is built on the first question."""

    state: dict[str, Any] = {}

    def ask() -> tuple[int | None, str]:
        from kubernetes.client.exceptions import ApiException

        try:
            if "client" not in state:
                state["client"] = api_client(kubeconfig, context)
            body, status, _ = state["client"].call_api(
                "/readyz",
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
