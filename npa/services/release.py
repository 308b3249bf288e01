"""``release``: the project's sweep of what ended runs left on a cluster (their Secrets).

A run's Secret (its stages' declared secrets, :mod:`npa.adapters.kube.secrets`) is removed by
whichever npa path first learns that the run is final (its watcher, ``status``, ``cancel``;
:func:`~npa.backends.base.release_ended_run`). A run that ended while none of them ran for it
keeps its Secret until one does: this command runs ``status`` for the run of every Secret npa
wrote in the project's namespace on one context, so each is decided by that one rule. A Secret
is removed only when its run's live state is final; the Secret of a run still going, of a run
whose job ended with its verdict not recorded yet, or of a run whose state npa cannot tell
(VERIFICATION_UNAVAILABLE: unknown is never taken for ended) is kept and says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from npa.core.commands import kubectl_command, provision_command
from npa.core.errors import EXIT_UNAVAILABLE, InvalidInput, NpaError, Unavailable
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.core.text import plural
from npa.services.configure import resolve_project

if TYPE_CHECKING:
    from npa.adapters.kube.secrets import RunSecret


class SweptSecret(BaseModel):
    """One run's Secret and what the sweep did with it."""

    name: str
    run_id: str | None
    workflow: str | None
    run_state: str | None  # the run's state as ``status`` decided it now (None: not asked)
    action: Literal["removed", "kept", "not_removed"]
    reason: str
    fix: str | None = None


class ReleaseResult(Result):
    """``release``: every run's Secret in the project's namespace, removed or kept, and why."""

    project: str
    context: str
    namespace: str
    secrets: list[SweptSecret] = Field(default_factory=list)
    next: list[str] = Field(default_factory=list)

    def text_lines(self) -> list[str]:
        removed = sum(1 for s in self.secrets if s.action == "removed")
        head = (
            f"project {self.project} on {self.context} (namespace {self.namespace}): "
            f"{plural(len(self.secrets), 'run Secret')}, {removed} removed"
        )
        lines = [head]
        for s in self.secrets:
            run = f"run {s.run_id}" if s.run_id else "no run recorded"
            state = f" {s.run_state}" if s.run_state else ""
            lines.append(f"  {s.action} secret/{s.name} ({run}{state}): {s.reason}")
        return lines + [f"  next: {n}" for n in self.next]

    def exit_code(self) -> int:
        return EXIT_UNAVAILABLE if any(s.action == "not_removed" for s in self.secrets) else 0


def release(project: str | None, context: str, *, paths: NpaPaths | None = None) -> ReleaseResult:
    """Ask each run's Secret's run for its state (``status``), which removes the Secret of a
    final run; report every Secret."""
    from npa.adapters.kube.client import project_namespace
    from npa.adapters.kube.secrets import run_secrets

    paths = paths or NpaPaths.from_env()
    name = resolve_project(project).project
    kubeconfig = paths.cluster_kubeconfig(context)
    if not kubeconfig.is_file():
        raise InvalidInput(
            f"npa placed no kubeconfig for context {context} ({kubeconfig}): it never "
            "launched a run there",
            fix=provision_command(context, name),
        )
    namespace = project_namespace(name)
    try:
        found = run_secrets(kubeconfig, context, namespace)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise Unavailable(
            f"cannot list Secrets in namespace {namespace} on {context}: "
            f"{type(exc).__name__}: {first}",
            fix=kubectl_command(kubeconfig, context, "auth", "can-i", "list", "secrets", "-n",
                                namespace) + "  # then rerun the same command",
        ) from None  # fmt: skip
    result = ReleaseResult(project=name, context=context, namespace=namespace)
    for secret in found:
        result.secrets.append(_sweep_one(secret, name, paths))
    result.next = list(dict.fromkeys(s.fix for s in result.secrets if s.fix))
    return result


def _sweep_one(secret: RunSecret, project: str, paths: NpaPaths) -> SweptSecret:
    """One Secret: its run's live state decides, through ``status`` (which releases)."""
    from npa.services.status import status

    base = {"name": secret.name, "run_id": secret.run_id, "workflow": secret.workflow}
    if secret.run_id is None:
        return SweptSecret(
            **base, run_state=None, action="kept",
            reason="it names no run (written before npa recorded the run on it); npa removes "
            "only a Secret whose run it can ask",
        )  # fmt: skip
    try:
        answer = status(secret.run_id, project, paths=paths)
    except NpaError as error:
        return SweptSecret(
            **base, run_state=None, action="kept",
            reason=f"its run's state cannot be told ({error.message}); unknown is never ended",
            fix=error.fix,
        )  # fmt: skip
    state = answer.state
    done = answer.release
    if f"secret/{secret.name}" in done.released:
        return SweptSecret(**base, run_state=state, action="removed",
                           reason="the run is final: nothing of it can use the Secret")  # fmt: skip
    if done.error is not None:
        return SweptSecret(
            **base, run_state=state, action="not_removed",
            reason=f"the run is final, but {done.error}", fix=done.fix,
        )  # fmt: skip
    if secret.workflow is not None and answer.workflow not in (None, secret.workflow):
        why = f"the run {secret.run_id} found is of workflow {answer.workflow}, not its own"
    else:
        why = _kept_because(state, answer.reason, answer.verdict_pending)
    return SweptSecret(**base, run_state=state, action="kept", reason=why)


def _kept_because(state: str, reason: str, verdict_pending: bool) -> str:
    from npa.services.status import NOT_FOUND, TERMINAL, VERIFICATION_UNAVAILABLE

    if state == NOT_FOUND:
        return (
            f"npa finds no such run from here ({reason}); it removes only a Secret whose run "
            "it sees final"
        )
    if state == VERIFICATION_UNAVAILABLE:
        return f"npa cannot tell the run's state ({reason}); unknown is never ended"
    if verdict_pending:
        return (
            f"the run's job ended and npa's verdict is not recorded yet ({reason}); the "
            "supervisor that records it may relaunch, which reads the Secret"
        )
    if state in TERMINAL:
        return f"the run is {state}, but its Secret was not the one its release removes"
    return f"the run is {state}: it can still use the Secret ({reason})"
