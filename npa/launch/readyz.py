"""Is the selected Kubernetes API stable enough to launch into?

The probe reads ``/readyz`` through the very kubeconfig file SkyPilot will be given (the file
npa passes as ``KUBECONFIG``), with the selected context. It needs ``count`` consecutive
successes whose first and last are at least ``window`` seconds apart; a failure restarts the
streak. A flapping or restarting API server therefore cannot pass on one lucky answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from npa.core.commands import kubectl_command as kubectl
from npa.core.errors import Unavailable

DEFAULT_WINDOW = 10.0
DEFAULT_COUNT = 3
DEFAULT_DEADLINE = 120.0


class ProbeAnswer(BaseModel):
    at: float  # seconds since the epoch
    ok: bool
    status: int | None
    detail: str


class ReadinessRecord(BaseModel):
    context: str
    kubeconfig: str
    window_seconds: float
    required: int
    stable: bool
    spanned_seconds: float
    probes: list[ProbeAnswer]


class NotStable(Unavailable):
    kind = "api_not_stable"


def kube_readyz(kubeconfig: Path, context: str) -> Callable[[], tuple[int | None, str]]:
    """A function that asks the context's API server for ``/readyz`` once."""

    state: dict[str, Any] = {}

    def ask() -> tuple[int | None, str]:
        from kubernetes import config
        from kubernetes.client.exceptions import ApiException

        try:
            if "client" not in state:
                state["client"] = config.new_client_from_config(
                    config_file=str(kubeconfig), context=context
                )
            body, status, _ = state["client"].call_api(
                "/readyz",
                "GET",
                auth_settings=["BearerToken"],
                response_type="str",
                _return_http_data_only=False,
                _request_timeout=5,
            )
            return int(status), str(body or "").strip()[:200]
        except ApiException as exc:
            return int(exc.status or 0) or None, str(exc.reason or exc)[:200]
        except Exception as exc:  # connection refused, TLS, bad kubeconfig: all "not ready"
            return None, f"{type(exc).__name__}: {str(exc)[:200]}"

    return ask


@dataclass
class ReadinessProbe:
    """Establishes API stability; ``window``/``interval`` are injectable for tests."""

    context: str
    kubeconfig: Path
    ask: Callable[[], tuple[int | None, str]]
    window: float = DEFAULT_WINDOW
    interval: float = DEFAULT_WINDOW / (DEFAULT_COUNT - 1)
    count: int = DEFAULT_COUNT
    deadline: float = DEFAULT_DEADLINE
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    history: list[ProbeAnswer] = field(default_factory=list)

    def establish(self) -> ReadinessRecord:
        """Probe until stable; raises NotStable (exit 4) when the deadline passes first."""
        started = self.clock()
        streak: list[ProbeAnswer] = []
        answers: list[ProbeAnswer] = []
        while True:
            status, detail = self.ask()
            answer = ProbeAnswer(at=self.clock(), ok=status == 200, status=status, detail=detail)
            answers.append(answer)
            self.history.append(answer)
            streak = [*streak, answer] if answer.ok else []
            spanned = streak[-1].at - streak[0].at if streak else 0.0
            if len(streak) >= self.count and spanned >= self.window:
                return self._record(answers, True, spanned)
            if self.clock() - started > self.deadline:
                record = self._record(answers, False, spanned)
                raise NotStable(
                    f"the API server of context {self.context} did not answer /readyz ok "
                    f"{self.count} times in a row over {self.window:g}s within "
                    f"{self.deadline:g}s (last: {answer.status} {answer.detail})",
                    fix=kubectl(self.kubeconfig, self.context, "get", "--raw", "/readyz")
                    + "  # then rerun the same submit",
                    details={"readiness": record.model_dump(mode="json")},
                )
            # Wait so the streak can reach the window with exactly ``count`` probes.
            self.sleep(self.interval)

    def _record(self, answers: list[ProbeAnswer], stable: bool, spanned: float) -> ReadinessRecord:
        return ReadinessRecord(
            context=self.context,
            kubeconfig=str(self.kubeconfig),
            window_seconds=self.window,
            required=self.count,
            stable=stable,
            spanned_seconds=round(spanned, 3),
            probes=answers,
        )
