"""``npa skypilot status / verify / bootstrap``: is the SkyPilot side of a submit healthy?
The SkyPilot backend offers these through :class:`~npa.backends.base.ChecksItsSide`.

Every check ends in one of three verdicts: ``ok``, ``failed`` (something answered and the
answer is wrong; the check carries the command that fixes it) or ``unknown`` (the source could
not be asked; never read as absent or ok). A command exits 1 when any check failed, otherwise 4
when any is unknown, otherwise 0.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from npa.adapters.skypilot import environment as env
from npa.core.commands import kubectl_command as kubectl
from npa.core.commands import provision_command
from npa.core.errors import EXIT_FAILURE, EXIT_UNAVAILABLE, InvalidInput
from npa.core.output import Result
from npa.core.paths import NpaPaths, safe_component
from npa.core.text import clipped, number, plural

Verdict = Literal["ok", "failed", "unknown"]
SERVICE_ACCOUNT = "sky-sa"


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    verdict: Verdict
    answer: str  # what the source said, in its own words: healthy, absent, 35.0.0, ...
    detail: str = ""
    fix: str | None = None
    facts: dict[str, Any] = Field(default_factory=dict)


def _exit(checks: list[Check]) -> int:
    verdicts = {c.verdict for c in checks}
    if "failed" in verdicts:
        return EXIT_FAILURE
    if "unknown" in verdicts:
        return EXIT_UNAVAILABLE
    return 0


def _lines(title: str, checks: list[Check]) -> list[str]:
    from npa.core.table import table

    lines = [title]
    lines += table(
        ["VERDICT", "CHECK", "ANSWER", "DETAIL"],
        [[c.verdict, c.name, c.answer, c.detail or None] for c in checks],
    )
    lines += [f"  fix ({c.name}): {c.fix}" for c in checks if c.fix and c.verdict != "ok"]
    return lines


class _ClusterChecks(Result):
    """A result that is a list of checks against one cluster; its exit code is theirs."""

    kubeconfig: str
    namespace: str
    checks: list[Check]

    def exit_code(self) -> int:
        return _exit(self.checks)


class SkyPilotStatus(_ClusterChecks):
    project: str
    context: str

    def text_lines(self) -> list[str]:
        return _lines(
            f"SkyPilot for project {self.project} on context {self.context} "
            f"(namespace {self.namespace})",
            self.checks,
        )


class VerifyResult(_ClusterChecks):
    cluster: str

    def text_lines(self) -> list[str]:
        return _lines(f"can SkyPilot use cluster {self.cluster}?", self.checks)


class BootstrapResult(Result):
    venv: str
    created: bool
    changed: list[str]  # what bootstrap did, in order (empty when nothing was needed)
    before: Check
    after: Check

    def exit_code(self) -> int:
        return _exit([self.after])

    def text_lines(self) -> list[str]:
        lines = [f"SkyPilot environment {self.venv}"]
        if self.changed:
            lines += [f"  changed: {what}" for what in self.changed]
        elif self.after.verdict == "ok":
            lines.append("  nothing to change")
        else:
            lines.append("  nothing changed: an existing environment is only changed with --repair")
        return lines + _lines("", [self.after])[1:]


# --- shared checks ---------------------------------------------------------------------------
def _bootstrap_cmd(venv: Path, repair: bool = True) -> str:
    cmd = "npa skypilot bootstrap"
    if venv != env.current_environment():
        cmd += f" --venv {shlex.quote(str(venv))}"
    return cmd + (" --repair" if repair else "")


def client_check(facts: env.EnvironmentFacts) -> Check:
    """Does SkyPilot's environment hold a kubernetes client SkyPilot can validate pods with?"""
    venv = facts.venv
    base = {
        "venv": str(venv),
        "skypilot": facts.skypilot,
        "kubernetes": facts.kubernetes,
        "skypilot_declares": list(facts.declared),
        "pod_config_validation": facts.pod_config_ok,
    }
    if not facts.exists:
        return Check(
            name="kubernetes client",
            verdict="failed",
            answer="no environment",
            detail=facts.detail,
            fix=_bootstrap_cmd(venv, repair=False),
            facts=base,
        )
    if facts.detail:
        return Check(
            name="kubernetes client", verdict="unknown", answer="not inspected",
            detail=facts.detail, facts=base,
        )  # fmt: skip
    if facts.skypilot != env.SKYPILOT_VERSION:
        return Check(
            name="kubernetes client",
            verdict="failed",
            answer=f"skypilot {facts.skypilot or 'missing'}",
            detail=f"npa is pinned to skypilot {env.SKYPILOT_VERSION}",
            fix=_bootstrap_cmd(venv),
            facts=base,
        )
    major = env.client_major(facts.kubernetes)
    if facts.kubernetes is None or major is None or major >= env.FIRST_BROKEN_MAJOR:
        reason = facts.pod_config_reason or "client 36+ breaks pod_config validation"
        return Check(
            name="kubernetes client",
            verdict="failed",
            answer=f"kubernetes {facts.kubernetes or 'missing'}",
            detail=f"SkyPilot's pod_config validation: {reason}",
            fix=_bootstrap_cmd(venv),
            facts=base,
        )
    if facts.pod_config_ok is False:
        return Check(
            name="kubernetes client",
            verdict="failed",
            answer=f"kubernetes {facts.kubernetes}",
            detail=f"SkyPilot's pod_config validation fails: {facts.pod_config_reason}",
            fix=_bootstrap_cmd(venv),
            facts=base,
        )
    return Check(
        name="kubernetes client",
        verdict="ok",
        answer=f"kubernetes {facts.kubernetes}",
        detail=f"skypilot {facts.skypilot}; pod_config validation works",
        facts=base,
    )


def _kubeconfig(
    paths: NpaPaths, context: str, project: str | None, *, honour_env: bool = False
) -> tuple[Path, Check]:
    """The kubeconfig for ``context`` and whether the context resolves through it: npa's
    placed file, or (``honour_env``) the file kubectl would read first (``$KUBECONFIG``)."""
    from npa.adapters.kube import kubeconfig
    from npa.adapters.skypilot import kubeaccess

    if honour_env:
        try:
            chosen = kubeconfig.for_context(paths, context)
        except kubeconfig.KubeconfigError as exc:
            return paths.cluster_kubeconfig(context), Check(
                name="kube context", verdict="failed", answer="unreadable kubeconfig",
                detail=exc.message, fix=exc.fix,
            )  # fmt: skip
        # A KUBECONFIG list is passed on as it is: every client npa uses splits it.
        path, origin = Path(chosen.value), chosen.origin
    else:
        path, origin = paths.cluster_kubeconfig(context), "placed by npa"
    provision = provision_command(context, project)
    name = "kube context"
    if origin == "placed by npa" and not path.is_file():
        return path, Check(
            name=name, verdict="failed", answer="no kubeconfig",
            detail=f"{path} does not exist", fix=provision,
        )  # fmt: skip
    try:
        names = kubeaccess.context_names(path)
    except Exception as exc:
        return path, Check(
            name=name, verdict="failed", answer="unreadable kubeconfig",
            detail=f"{path}: {type(exc).__name__}: {exc}", fix=provision,
        )  # fmt: skip
    if context not in names:
        return path, Check(
            name=name, verdict="failed", answer="context not in kubeconfig",
            detail=f"{path} has {', '.join(names) or 'no contexts'}", fix=provision,
        )  # fmt: skip
    return path, Check(name=name, verdict="ok", answer="resolves", detail=f"{path} ({origin})")


def _readyz(path: Path, context: str) -> Check:
    from npa.adapters.kube.readyz import readyz_asker

    status, detail = readyz_asker(path, context)()
    fix = kubectl(path, context, "get", "--raw", "/readyz")
    if status == 200:
        return Check(name="readyz", verdict="ok", answer="200", detail=detail)
    if status is None:
        return Check(name="readyz", verdict="unknown", answer="no answer", detail=detail, fix=fix)
    return Check(name="readyz", verdict="failed", answer=str(status), detail=detail, fix=fix)


def _identity(client: Any) -> Check:
    from npa.adapters.skypilot import kubeaccess

    who = kubeaccess.whoami(client)
    if who.username is None:
        return Check(name="identity", verdict="unknown", answer="not known", detail=who.detail)
    return Check(
        name="identity",
        verdict="ok",
        answer=who.username,
        detail="groups: " + ", ".join(who.groups),
        facts={"username": who.username, "groups": who.groups},
    )


def _access_check(name: str, answers: list[Any], fix: str) -> Check:
    """Fold SelfSubjectAccessReviews into one check: denied beats unknown beats allowed."""
    denied = [a for a in answers if a.allowed is False]
    unknown = [a for a in answers if a.allowed is None]
    facts = {f"{a.verb} {a.resource}": (None if a.allowed is None else a.allowed) for a in answers}
    if denied:
        what = ", ".join(f"{a.verb} {a.resource}" for a in denied)
        return Check(
            name=name, verdict="failed", answer=f"denied: {what}",
            detail=denied[0].detail, fix=fix, facts=facts,
        )  # fmt: skip
    if unknown:
        return Check(
            name=name, verdict="unknown", answer="review failed",
            detail=unknown[0].detail, facts=facts,
        )  # fmt: skip
    what = ", ".join(f"{a.verb} {a.resource}" for a in answers)
    return Check(name=name, verdict="ok", answer=f"allowed: {what}", facts=facts)


def _presence_check(name: str, answer: Any, fix: str) -> Check:
    if answer.presence == "present":
        return Check(name=name, verdict="ok", answer="present")
    if answer.presence == "unknown":
        return Check(name=name, verdict="unknown", answer="not known", detail=answer.detail)
    # absent (the API server said 404) or forbidden (it said we may not look): both need action.
    return Check(name=name, verdict="failed", answer=answer.presence, detail=answer.detail, fix=fix)


# --- status ----------------------------------------------------------------------------------
def _server_checks() -> list[Check]:
    from npa.adapters.skypilot import api

    start = f"{env.interpreter(env.current_environment()).parent / 'sky'} api start"
    try:
        server = api.api_server()
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        return [
            Check(name="api server", verdict="unknown", answer="not asked", detail=detail),
            Check(name="jobs controller", verdict="unknown", answer="not asked", detail=detail),
        ]
    facts = {"url": server.url, "local": server.local, "version": server.version,
             "api_version": server.api_version, "commit": server.commit}  # fmt: skip
    not_asked = "the API server is not healthy, so it was not asked"
    if server.state == "healthy":
        mismatch = server.version != env.SKYPILOT_VERSION
        checks = [
            Check(
                name="api server",
                verdict="failed" if mismatch else "ok",
                answer=f"healthy {server.version}",
                detail=(
                    f"{server.url}; npa is pinned to {env.SKYPILOT_VERSION}"
                    if mismatch
                    else server.url
                ),
                fix=f"sky api stop && {start}" if mismatch and server.local else None,
                facts=facts,
            )
        ]
    else:
        verdict: Verdict = "unknown" if server.state == "unreachable" else "failed"
        fix = start if server.local else f"curl -sS {server.url}/api/health"
        return [
            Check(
                name="api server", verdict=verdict, answer=server.state.replace("_", " "),
                detail=f"{server.url}: {server.detail}", fix=fix, facts=facts,
            ),
            Check(name="jobs controller", verdict="unknown", answer="not asked", detail=not_asked),
        ]  # fmt: skip
    controller = api.jobs_controller()
    cfacts = {"clusters": controller.names}
    explain = {
        "up": "managed jobs are accepted now",
        "stopped": "SkyPilot restarts it on the next managed-job launch (adds minutes)",
        "absent": "SkyPilot creates it on the first managed-job launch (adds minutes)",
        "init": "being provisioned or in a state SkyPilot could not confirm",
    }
    if controller.state == "unknown":
        checks.append(
            Check(name="jobs controller", verdict="unknown", answer="unknown",
                  detail=controller.detail, facts=cfacts)
        )  # fmt: skip
    else:
        verdict = "unknown" if controller.state == "init" else "ok"
        checks.append(
            Check(
                name="jobs controller",
                verdict=verdict,
                answer=controller.state,
                detail=f"{explain[controller.state]} ({', '.join(controller.names) or 'none'})",
                facts=cfacts,
            )
        )
    return checks


def skypilot_status(project: str, context: str, *, paths: NpaPaths | None = None) -> SkyPilotStatus:
    """One report of everything a submit to ``context`` for ``project`` depends on."""
    from npa.adapters.kube.client import project_namespace
    from npa.adapters.skypilot import kubeaccess

    paths = paths or NpaPaths.from_env()
    safe_component(project, "project")
    ns = project_namespace(project)
    checks = _server_checks()
    path, resolved = _kubeconfig(paths, context, project)
    checks.append(resolved)
    provision = provision_command(context, project)
    if resolved.verdict == "ok":
        checks.append(_readyz(path, context))
        client = kubeaccess.api_client(path, context)
        checks.append(_identity(client))
        checks.append(
            _presence_check(f"namespace {ns}", kubeaccess.namespace(client, ns), provision)
        )
        checks.append(
            _presence_check(
                f"service account {SERVICE_ACCOUNT}",
                kubeaccess.service_account(client, ns, SERVICE_ACCOUNT),
                provision,
            )
        )
        checks.append(
            _presence_check(
                f"role binding {SERVICE_ACCOUNT}-rb",
                kubeaccess.role_binding(client, ns, f"{SERVICE_ACCOUNT}-rb"),
                provision,
            )
        )
        checks.append(_service_account_access(path, context, ns, provision))
    checks.append(client_check(env.inspect(env.current_environment())))
    return SkyPilotStatus(
        project=project, context=context, kubeconfig=str(path), namespace=ns, checks=checks
    )


def _service_account_access(path: Path, context: str, ns: str, fix: str) -> Check:
    """What the provisioned service account may do, asked as it (impersonation + SSAR).

    Impersonation needs the ``impersonate`` permission; an identity without it gets "unknown",
    not a guess.
    """
    from npa.adapters.skypilot import kubeaccess

    user = f"system:serviceaccount:{ns}:{SERVICE_ACCOUNT}"
    client = kubeaccess.api_client(path, context, impersonate=user)
    answers = [
        kubeaccess.can_i(client, "create", "pods", ns),
        kubeaccess.can_i(client, "delete", "pods", ns),
        kubeaccess.can_i(client, "list", "nodes", None),
    ]
    check = _access_check(f"RBAC of {SERVICE_ACCOUNT}", answers, fix)
    if check.verdict == "unknown" and "403" in check.detail:
        check.detail = f"this identity may not impersonate {user}: {check.detail}"
    return check


# --- verify ----------------------------------------------------------------------------------
def verify(
    cluster: str,
    *,
    project: str | None = None,
    namespace: str | None = None,
    paths: NpaPaths | None = None,
) -> VerifyResult:
    """Can SkyPilot use the cluster whose kubeconfig npa placed for context ``cluster``?"""
    from npa.adapters.kube.client import project_namespace
    from npa.adapters.skypilot import api, kubeaccess

    paths = paths or NpaPaths.from_env()
    if project is not None and namespace is not None:
        raise InvalidInput("give --project or --namespace, not both")
    path, resolved = _kubeconfig(paths, cluster, project, honour_env=True)
    checks = [resolved]
    ns = namespace or (project_namespace(project) if project else None)
    if resolved.verdict != "ok":
        return VerifyResult(
            cluster=cluster, kubeconfig=str(path), namespace=ns or "default", checks=checks
        )
    ns = ns or kubeaccess.context_namespace(path, cluster) or "default"
    client = kubeaccess.api_client(path, cluster)
    checks.append(_identity(client))
    checks += _node_checks(client, path, cluster)
    fix = (
        provision_command(cluster, project)
        if project
        else kubectl(path, cluster, "auth", "can-i", "--list", "-n", ns)
        + "  # then grant create/delete pods"
    )
    pods = [
        kubeaccess.can_i(client, "create", "pods", ns),
        kubeaccess.can_i(client, "delete", "pods", ns),
    ]
    checks.append(_access_check(f"pods in {ns}", pods, fix))
    ours_ok = all(c.verdict == "ok" for c in checks)
    try:
        sky_ok, reason = api.check_kubernetes(path, cluster)
    except Exception as exc:
        checks.append(
            Check(name="sky check", verdict="unknown", answer="not run",
                  detail=f"{type(exc).__name__}: {exc}")
        )  # fmt: skip
    else:
        agree = "agrees" if sky_ok == ours_ok else "disagrees"
        checks.append(
            Check(
                name="sky check",
                verdict="ok" if sky_ok and ours_ok else "failed",
                answer=f"{'enabled' if sky_ok else 'disabled'} ({agree})",
                detail=clipped(" ".join(reason.split()), 400),
                fix=None if sky_ok else f"KUBECONFIG={shlex.quote(str(path))} sky check kubernetes",
                facts={"skypilot_ok": sky_ok, "npa_checks_ok": ours_ok},
            )
        )
    return VerifyResult(cluster=cluster, kubeconfig=str(path), namespace=ns, checks=checks)


def _node_checks(client: Any, path: Path, context: str) -> list[Check]:
    from npa.adapters.skypilot import kubeaccess

    try:
        found = kubeaccess.nodes(client)
    except Exception as exc:
        status, text = kubeaccess.describe_error(exc)
        verdict: Verdict = "failed" if status == 403 else "unknown"
        fix = kubectl(path, context, "get", "nodes")
        return [
            Check(name="nodes", verdict=verdict, answer="not listed", detail=text, fix=fix),
            Check(name="GPUs", verdict="unknown", answer="not known", detail="nodes not listed"),
        ]
    ready = [n for n in found if n.ready]
    nodes = Check(
        name="nodes",
        verdict="ok" if ready else "failed",
        answer=f"{plural(len(found), 'node')} visible, {number(len(ready))} ready",
        detail="" if ready else "SkyPilot cannot place a pod without a ready node",
        fix=None if ready else kubectl(path, context, "get", "nodes", "-o", "wide"),
        facts={"nodes": [n.name for n in found]},
    )
    return [nodes, _gpu_check(found, context)]


def _gpu_check(found: list[Any], context: str) -> Check:
    """Whether any node both carries a GPU label SkyPilot reads and offers allocatable GPUs."""
    labelled = [n for n in found if n.gpu_label]
    allocatable = [n for n in found if n.allocatable_gpus > 0]
    both = [n for n in labelled if n.allocatable_gpus > 0]
    facts = {
        "per_node": {
            n.name: {
                "label": n.gpu_label,
                "resource": n.gpu_resource,
                "allocatable": n.allocatable_gpus,
            }
            for n in found
        }
    }
    if both:
        return Check(
            name="GPUs",
            verdict="ok",
            answer=f"{number(sum(n.allocatable_gpus for n in both))} on "
            f"{plural(len(both), 'labelled node')}",
            detail=", ".join(sorted({str(n.gpu_label) for n in both})),
            facts=facts,
        )
    if labelled:
        detail = "nodes carry GPU labels but no allocatable GPUs (device plugin not ready?)"
    elif allocatable:
        detail = "nodes offer GPUs but carry no GPU label SkyPilot reads"
    else:
        detail = "no node has a GPU label or allocatable GPUs"
    return Check(
        name="GPUs",
        verdict="failed",
        answer="none usable",
        detail=detail,
        fix=shlex.join(["npa", "workbench", "workflow", "gpus", "--context", context]),
        facts=facts,
    )


# --- bootstrap -------------------------------------------------------------------------------
def bootstrap(venv: Path | None = None, *, repair: bool = False) -> BootstrapResult:
    """Create SkyPilot's environment, or check it and (with ``repair``) pin a working client."""
    target = (venv or env.current_environment()).expanduser().absolute()
    before_facts = env.inspect(target)
    before = client_check(before_facts)
    changed: list[str] = []
    created = False
    pins = [f"skypilot[kubernetes]=={env.SKYPILOT_VERSION}", f"kubernetes=={env.KNOWN_GOOD_CLIENT}"]
    try:
        if not before_facts.exists:
            if target.exists() and any(target.iterdir()):
                raise InvalidInput(
                    f"{target} exists but is not a Python environment (no bin/python)",
                    fix=f"npa skypilot bootstrap --venv {shlex.quote(str(target))}-new",
                )
            changed.append(env.create(target))
            changed.append(env.pip_install(target, pins))
            created = True
        elif before.verdict == "failed":
            if not repair:
                return BootstrapResult(
                    venv=str(target), created=False, changed=[], before=before, after=before
                )
            wanted = pins if before_facts.skypilot != env.SKYPILOT_VERSION else pins[1:]
            changed.append(env.pip_install(target, wanted))
    except env.CommandFailed as exc:
        after = client_check(env.inspect(target))
        after.detail = f"{exc}"
        return BootstrapResult(
            venv=str(target), created=created, changed=changed, before=before, after=after
        )
    after = client_check(env.inspect(target)) if changed else before
    return BootstrapResult(
        venv=str(target), created=created, changed=changed, before=before, after=after
    )
