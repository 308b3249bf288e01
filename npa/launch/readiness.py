"""Is the API a launch goes to stable enough to launch into?

The check asks the backend's readiness question (for Kubernetes, ``/readyz`` through the very
kubeconfig file SkyPilot will be given, :mod:`npa.adapters.kube.readyz`) until it has ``count``
consecutive successes whose first and last are at least ``window`` seconds apart; a failure
restarts the streak. A flapping or restarting API server therefore cannot pass on one lucky
answer. The question comes in as a function, so this module does no I/O of its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from npa.backends.base import ExecutionBackend, NeedsReadinessCheck
from npa.core.commands import kubectl_command as kubectl
from npa.core.errors import NotStable

DEFAULT_WINDOW = 10.0
DEFAULT_COUNT = 3
DEFAULT_DEADLINE = 120.0
# Environment overrides of the window, so end-to-end tests need not wait 10 s each.
WINDOW_ENV = "NPA_READYZ_WINDOW_SECONDS"
INTERVAL_ENV = "NPA_READYZ_INTERVAL_SECONDS"


class ReadyzAnswer(BaseModel):
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
    probes: list[ReadyzAnswer]


@dataclass
class ReadinessCheck:
    """Establishes API stability; ``window``/``interval``, the clock and sleep are injectable."""

    context: str
    kubeconfig: Path
    ask: Callable[[], tuple[int | None, str]]
    window: float = DEFAULT_WINDOW
    interval: float = DEFAULT_WINDOW / (DEFAULT_COUNT - 1)
    count: int = DEFAULT_COUNT
    deadline: float = DEFAULT_DEADLINE
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    history: list[ReadyzAnswer] = field(default_factory=list)

    def establish(self) -> ReadinessRecord:
        """Probe until stable; raises NotStable (exit 4) when the deadline passes first."""
        started = self.clock()
        streak: list[ReadyzAnswer] = []
        answers: list[ReadyzAnswer] = []
        while True:
            status, detail = self.ask()
            answer = ReadyzAnswer(at=self.clock(), ok=status == 200, status=status, detail=detail)
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

    def _record(self, answers: list[ReadyzAnswer], stable: bool, spanned: float) -> ReadinessRecord:
        return ReadinessRecord(
            context=self.context,
            kubeconfig=str(self.kubeconfig),
            window_seconds=self.window,
            required=self.count,
            stable=stable,
            spanned_seconds=round(spanned, 3),
            probes=answers,
        )


def readiness_window() -> tuple[float, float]:
    """The window and the interval between questions (``NPA_READYZ_*`` override them)."""
    window = float(os.environ.get(WINDOW_ENV, DEFAULT_WINDOW))
    return window, float(os.environ.get(INTERVAL_ENV, window / (DEFAULT_COUNT - 1)))


def readiness_check(
    backend: ExecutionBackend, *, window: float | None = None, interval: float | None = None
) -> ReadinessCheck | None:
    """The check a launch into ``backend`` must pass first; None when it needs none."""
    if not isinstance(backend, NeedsReadinessCheck):
        return None
    target = backend.readiness_target()
    if target is None:
        return None
    default_window, default_interval = readiness_window()
    return ReadinessCheck(
        context=target.context,
        kubeconfig=target.kubeconfig,
        ask=target.ask,
        window=default_window if window is None else window,
        interval=default_interval if interval is None else interval,
    )
