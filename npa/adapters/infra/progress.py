"""Live progress of a stack operation, read from the Pulumi engine's events as they arrive.

``pulumi up`` shows each resource as its step starts and ends. The engine sends the same facts
as events: a ``resourcePreEvent`` when a step starts, a ``resOutputsEvent`` when it is done, a
``resOpFailedEvent`` when it failed, with the reason in the ``diagnosticEvent`` before it. This
module folds them into one :class:`StepProgress` per transition, with the time the step took
and the time since the operation started, and remembers what completed so a failed operation
can say exactly what it left behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from npa.adapters.infra.changes import MUTATING, OP_NAMES

Status = Literal["started", "done", "failed", "warning", "error"]
_PAST = {"create": "created", "update": "updated", "replace": "replaced", "delete": "deleted"}


@dataclass(frozen=True)
class StepProgress:
    """One transition of one resource step (or an engine warning/error about one)."""

    stack: str
    urn: str
    type: str
    name: str
    op: str
    status: Status
    step_seconds: float | None  # how long the step took (done/failed)
    elapsed: float  # since the operation started
    detail: str = ""

    def text(self) -> str:
        """A progress line: ``[  3.1s] + create kubernetes:core/v1:Namespace namespace ...``."""
        sign = {"create": "+", "update": "~", "replace": "+-", "delete": "-"}.get(self.op, " ")
        head = f"[{self.elapsed:6.1f}s] {self.stack}: {sign} {self.type} {self.name}"
        if not self.type:
            head = f"[{self.elapsed:6.1f}s] {self.stack}"
        if self.status == "started":
            return f"{head}: {self.op} started"
        if self.status == "done":
            return f"{head}: {_PAST.get(self.op, self.op)} in {self.step_seconds or 0:.1f}s"
        if self.status == "failed":
            took = f" after {self.step_seconds:.1f}s" if self.step_seconds is not None else ""
            return f"{head}: {self.op} FAILED{took}" + (f": {self.detail}" if self.detail else "")
        return f"{head}: {self.status}: {self.detail}"


def _gist(message: str) -> str:
    """One line for a diagnostic: the exception line of a provider's traceback, else the
    message with its whitespace folded."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):
        return lines[-1]
    return " ".join(" ".join(lines).split())


@dataclass
class EngineWatch:
    """An ``on_event`` handler for the Automation API that reports step transitions."""

    stack: str
    report: Callable[[StepProgress], None] | None = None
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)
    completed: list[str] = field(default_factory=list)  # "created kubernetes:...::name"
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _begun: dict[str, tuple[str, float]] = field(default_factory=dict)
    _diagnostics: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.started = self.started or self.clock()

    def __call__(self, event: Any) -> None:
        with self._lock:
            self._handle(event)

    def _handle(self, event: Any) -> None:
        now = self.clock()
        diagnostic = getattr(event, "diagnostic_event", None)
        if diagnostic is not None:
            self._diagnostic(diagnostic, now)
            return
        steps: tuple[tuple[str, Status], ...] = (
            ("resource_pre_event", "started"),
            ("res_outputs_event", "done"),
            ("res_op_failed_event", "failed"),
        )
        for attr, status in steps:
            payload = getattr(event, attr, None)
            if payload is not None:
                self._step(payload.metadata, status, now)
                return

    def _step(self, meta: Any, status: Status, now: float) -> None:
        op_value = getattr(meta.op, "value", str(meta.op))
        op = OP_NAMES.get(op_value, op_value)
        if op not in MUTATING or meta.type == "pulumi:pulumi:Stack":
            return
        if meta.type.startswith("pulumi:providers:"):
            return
        name = meta.urn.rsplit("::", 1)[-1]
        seconds = None
        if status == "started":
            self._begun[meta.urn] = (op, now)
        else:
            begun = self._begun.pop(meta.urn, None)
            seconds = round(now - begun[1], 2) if begun else None
        detail = self._diagnostics.pop(meta.urn, "") if status == "failed" else ""
        if status == "done":
            self.completed.append(f"{_PAST.get(op, op)} {meta.type} {name}")
        self._emit(StepProgress(self.stack, meta.urn, meta.type, name, op, status, seconds,
                                round(now - self.started, 2), detail))  # fmt: skip

    def _diagnostic(self, diagnostic: Any, now: float) -> None:
        severity = str(getattr(diagnostic, "severity", ""))
        if severity not in ("warning", "error"):
            return
        message = _gist(str(getattr(diagnostic, "message", "")))
        urn = str(getattr(diagnostic, "urn", "") or "")
        (self.errors if severity == "error" else self.warnings).append(message)
        if urn and severity == "error":
            # Shown with the step that failed, which the engine reports next.
            self._diagnostics[urn] = message
            return
        name = urn.rsplit("::", 1)[-1] if urn else "(stack)"
        kind = urn.split("::")[-2] if urn.count("::") >= 2 else ""
        status: Status = "error" if severity == "error" else "warning"
        self._emit(StepProgress(self.stack, urn, kind, name, "", status, None,
                                round(now - self.started, 2), message))  # fmt: skip

    def settle(self, before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
        """Add what the stack's state shows was created or deleted and no event reported.

        When one step fails the engine cancels the operation, and a step that was still running
        beside it can finish, and be written to the state, without its event reaching the
        handler. The state is the record; the events only add the order and the updates."""
        for line in state_steps(before, after):
            if line not in self.completed:
                self.completed.append(line)

    def _emit(self, progress: StepProgress) -> None:
        if self.report is not None:
            self.report(progress)


def _managed(resources: list[dict[str, Any]]) -> dict[str, str]:
    """urn -> type of the resources a reviewer sees (not the stack, not providers)."""
    kept = {}
    for resource in resources:
        kind = str(resource.get("type", ""))
        if kind == "pulumi:pulumi:Stack" or kind.startswith("pulumi:providers:"):
            continue
        kept[str(resource.get("urn", ""))] = kind
    return kept


def state_steps(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    """The creates and deletes between two recorded states of one stack, in the words of
    :attr:`EngineWatch.completed` (``created TYPE NAME``), creates first, each in state order."""
    old, new = _managed(before), _managed(after)
    created = [f"created {kind} {_name(urn)}" for urn, kind in new.items() if urn not in old]
    deleted = [f"deleted {kind} {_name(urn)}" for urn, kind in old.items() if urn not in new]
    return created + deleted


def _name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]
