"""The ``kubernetes`` target: a cluster that exists. One stack places the context's kubeconfig
and makes the project's namespace and RBAC; npa creates no disks there, so no quota applies.

The cluster stack itself (:func:`cluster_stack`) is shared with targets that create the
cluster first."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from npa.adapters.infra.runner import InfraRunner, StackSpec
from npa.adapters.infra.sdk_plugins import sdk_plugin
from npa.core.commands import kubectl_command, npa_command
from npa.core.errors import InvalidInput
from npa.core.paths import NpaPaths, check_context_name
from npa.plan.infra import DiskNeed, QuotaRequirement
from npa.plan.quota import ExistingCheck, QuotaAssessment
from npa.spec.model import Infrastructure, Workflow
from npa.targets.base import (
    ChecksReachability,
    CopiesKubeconfig,
    ExistingCluster,
    KubeSource,
    Layout,
    LayoutAsk,
    Plugin,
    ProvisionRequest,
    Target,
    namespace_for,
    not_checked,
    stack_token,
)

# The plugin the installed pulumi-kubernetes SDK asks for; its version is pinned only in
# pyproject.toml (see the comment there for why it is a pre-release).
K8S_PLUGIN: Plugin = sdk_plugin("pulumi_kubernetes")


def cluster_stack(
    paths: NpaPaths, project: str, context: str, *, source: str | None, document: str | None
) -> StackSpec:
    """The stack that places ``context``'s kubeconfig and makes the project's namespace."""
    config = {
        "npa:context": context,
        "npa:kubeconfigPath": str(paths.cluster_kubeconfig(context)),
        "npa:namespace": namespace_for(project),
        "npa:serviceAccount": "sky-sa",
    }
    if source:
        config["npa:kubeconfigSource"] = source
    if document is not None:
        config["npa:kubeconfigDocument"] = document
    return StackSpec(f"{project}.kubernetes.{stack_token(context)}", "kubernetes", config)


def prepare_cluster_destroy(spec: StackSpec) -> None:
    """Destroy runs from state; the cluster program's config only has to be well formed."""
    if spec.kind == "kubernetes" and "npa:kubeconfigSource" not in spec.config:
        spec.config["npa:kubeconfigDocument"] = "(unused by destroy)"


def kubeconfig_source(paths: NpaPaths, explicit: Path | None, context: str | None) -> KubeSource:
    """The files the context is copied from, as kubectl would read them, without npa's own
    placed kubeconfig for the context: copying that file onto itself would say nothing."""
    from npa.adapters.kube import kubeconfig

    files = kubeconfig.source_files(explicit)
    placed = paths.cluster_kubeconfig(context).absolute() if context else None
    kept = [f for f in files if placed is None or f != placed]
    return KubeSource(kubeconfig.join_list(kept), explicit is not None, len(kept) < len(files))


def _command(*argv: str) -> str:
    return shlex.join(["npa", *argv])


def _defines(path: Path, context: str) -> bool:
    from npa.adapters.kube import kubeconfig

    try:
        return context in kubeconfig.merge([path]).contexts
    except kubeconfig.KubeconfigError:
        return False


class KubernetesTarget(Target, ExistingCluster, CopiesKubeconfig, ChecksReachability):
    name = "kubernetes"
    plugins = (K8S_PLUGIN,)

    def layout(self, paths: NpaPaths, project: str, ask: LayoutAsk) -> Layout:
        # Chosen by the caller in the one order (services.configure.choose_context).
        ctx = ask.context
        if ctx is None:
            raise self._no_current_context(paths, project, ask.kubeconfig)
        check_context_name(ctx)
        source = kubeconfig_source(paths, ask.kubeconfig, ctx) if ask.need_source else None
        if source is not None and source.value:
            self._check_context(source, ctx, project)
        spec = cluster_stack(
            paths, project, ctx, source=source.value if source else None, document=None
        )
        op = f"provision.{project}.kubernetes.{stack_token(ctx)}"
        return Layout(project, self.name, ctx, [spec], op, source)

    def _retry(self, project: str, context: str, kubeconfig: str) -> str:
        return _command(
            "provision-if-absent", "--project", project, "--target", self.name,
            "--context", context, "--kubeconfig", kubeconfig,
        )  # fmt: skip

    def _no_current_context(
        self, paths: NpaPaths, project: str, explicit: Path | None
    ) -> InvalidInput:
        """No --context, none configured, and the kubeconfig sets no current context."""
        from npa.adapters.kube import kubeconfig

        source = kubeconfig_source(paths, explicit, None).value
        names = sorted(kubeconfig.merge(kubeconfig.split_list(source)).contexts)
        known = f" ({source} has: {', '.join(names)})" if names else f" ({source} has none)"
        if len(names) == 1:
            fix = _command(
                "provision-if-absent", "--project", project, "--target", self.name,
                "--context", names[0],
            )  # fmt: skip
        else:
            fix = f"KUBECONFIG={shlex.quote(source)} kubectl config get-contexts -o name"
        return InvalidInput(
            f"the {self.name} target needs a kube context: pass --context, or set a current "
            f"context{known}",
            fix=fix,
        )

    def _check_context(self, source: KubeSource, context: str, project: str) -> None:
        from npa.adapters.kube import kubeconfig

        try:
            kubeconfig.minimal_from(source.value, context)
        except kubeconfig.KubeconfigError as exc:
            fallback = kubeconfig.default_kubeconfig()
            usable = source.value != str(fallback) and _defines(fallback, context)
            raise InvalidInput(
                f"cannot use context {context!r}: {exc}",
                fix=self._retry(project, context, str(fallback))
                if usable
                else f"KUBECONFIG={shlex.quote(source.value)} kubectl config get-contexts -o name",
            ) from None

    def quota_gate(
        self,
        req: ProvisionRequest,
        infra: Infrastructure,
        *,
        store: str | None,
        local_jobs: Path,
        existing: Sequence[ExistingCheck],
    ) -> QuotaAssessment:
        # An existing cluster: npa creates only namespaced objects and RBAC, which use no
        # disk or node quota.
        return not_checked()

    def plan_requirements(
        self, needs: list[DiskNeed], workflow: Workflow
    ) -> list[QuotaRequirement]:
        return []

    def plan_note(self, spec: Path, context: str | None) -> str:
        # Without the spec's context, gpus picks the project's or the current one itself.
        ctx = ["--context", context] if context else []
        gpus = npa_command("workbench", "workflow", "gpus", *ctx, "--spec", str(spec))
        return (
            "an existing cluster has no cloud quota for npa to check; which stages its nodes "
            f"can run: {gpus}"
        )

    def cloud_evidence_refused(self, flags: list[str]) -> str:
        return (
            f"{', '.join(flags)} describe{'s' if len(flags) == 1 else ''} the disks npa creates "
            f"on nebius; the {self.name} target is a cluster that exists, where it creates none"
        )

    def no_context(self, paths: NpaPaths, argv: list[str]) -> InvalidInput:
        """Offer the contexts npa placed a kubeconfig for (their folder names reverse to the
        context names)."""
        from npa.core.paths import context_from_folder

        placed = sorted(
            name
            for folder in (paths.clusters_dir.iterdir() if paths.clusters_dir.is_dir() else [])
            if (name := context_from_folder(folder.name)) is not None
        )
        # One placed cluster is the one to name; of several, npa cannot pick one to tear down.
        return InvalidInput(
            f"teardown of the {self.name} target needs --context"
            + (f" (npa placed kubeconfigs for: {', '.join(placed)})" if placed else ""),
            fix=npa_command(*argv, "--context", placed[0])
            if len(placed) == 1
            else None
            if placed
            else "kubectl config get-contexts -o name",
        )

    def resume_args(self, lay: Layout) -> list[str]:
        argv = super().resume_args(lay)
        source = lay.stacks[0].config.get("npa:kubeconfigSource")
        return [*argv, "--kubeconfig", source] if source else argv

    def prepare_destroy(self, spec: StackSpec) -> None:
        prepare_cluster_destroy(spec)

    def unreachable(self, lay: Layout) -> tuple[str, str] | None:
        """Why the API server cannot be used, and the command that shows it; None when it
        answers ``/readyz`` with 200 and answers a read of the project's namespace itself (a
        server can be ready by ``/readyz`` and still answer every API request 503, and a
        preview against it would claim everything is to be created)."""
        from npa.adapters.kube.readyz import readyz_asker, serves

        if lay.source is None or not lay.source.value:
            return None
        context, kubeconfig = str(lay.context), Path(lay.source.value)
        status, detail = readyz_asker(kubeconfig, context)()
        where = "/readyz"
        if status == 200:
            where = f"/api/v1/namespaces/{namespace_for(lay.project)}"
            status, detail = readyz_asker(kubeconfig, context, where)()
            if serves(status):
                return None
        said = f"answered HTTP {status}" if status is not None else "did not answer"
        fix = kubectl_command(lay.source.value, context, "get", "--raw", where)
        return f"the API server of context {context!r} {said} on {where} ({detail})", fix

    def source_notes(self, lay: Layout, runner: InfraRunner) -> list[str]:
        """When ``$KUBECONFIG`` names only the kubeconfig npa placed for the context (as npa's
        own ``export KUBECONFIG=...`` advice leads to), copy the context from the source the
        stack recorded instead, and say so."""
        source = lay.source
        if source is None or not source.dropped_placed:
            return []
        [spec] = lay.stacks
        placed = spec.config["npa:kubeconfigPath"]
        if source.value:
            return [f"{placed} (npa's own placed kubeconfig) is left out of the kubeconfig list"]
        recorded = next(
            (
                str((r.get("inputs") or {}).get("source") or "")
                for r in runner.resources(spec.name)
                if str(r.get("urn", "")).endswith("::kubeconfig")
            ),
            "",
        )
        if not recorded or recorded == placed:
            raise InvalidInput(
                f"$KUBECONFIG names only {placed}, the kubeconfig npa placed for context "
                f"{lay.context!r}; npa copies that context from the kubeconfig it came from",
                fix=self._retry(
                    lay.project, str(lay.context), str(Path.home() / ".kube" / "config")
                ),
            )
        lay.source = KubeSource(recorded, explicit=True, dropped_placed=True)
        spec.config["npa:kubeconfigSource"] = recorded
        return [
            f"$KUBECONFIG names npa's placed kubeconfig {placed}; the context is copied from "
            f"{recorded}, the source the last apply recorded"
        ]
