"""``preflight-images``: every tool's image, resolved to a digest and verified, in one table.

For each tool: choose the image (override, global fallback, spec), fetch its manifest exactly as
a node would, and classify the answer. For an image that is there, prove it can run the stage
bootstrap: from the cache, from its contract labels, or by one bounded capability probe in the
selected Kubernetes context. Images are checked concurrently, a bounded number at a time.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from npa.adapters.kube.client import project_namespace
from npa.core.commands import kubectl_command, provision_command
from npa.core.errors import EXIT_FAILURE, EXIT_UNAVAILABLE, InvalidInput
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.images.cache import VerificationCache
from npa.images.contract import (
    CONTRACT_VERSION,
    ContractViolation,
    enforce_declared_user,
    read_attestation,
)
from npa.images.credentials import flag_fix, load_store
from npa.images.overrides import ChosenImage, ImageSource, choose_images, parse_overrides
from npa.images.probe import (
    DEFAULT_TIMEOUT,
    CapabilityProber,
    ProbeOutcome,
    ProbeSetupError,
    ProbeTarget,
    core_api,
    select_target,
)
from npa.images.reference import ImageReference, parse_reference, parse_registry
from npa.images.registry import RegistryClient, RegistryProblem, Status, is_loopback
from npa.spec.model import Tool

RowStatus = Literal["ok", "not_found", "forbidden", "unreachable", "rejected", "unverified"]
# "registry": only that the image exists at its digest (a runtime that needs no contract).
VerifiedBy = Literal["contract", "probe", "cache", "registry"]
MAX_CONCURRENCY = 8
FAILING: set[str] = {"not_found", "forbidden", "rejected"}
_ROW_STATUS: dict[Status, RowStatus] = {
    Status.OK: "ok",
    Status.NOT_FOUND: "not_found",
    Status.FORBIDDEN: "forbidden",
    Status.UNREACHABLE: "unreachable",
}


class ImageRow(BaseModel):
    """One tool's image and what preflight found."""

    tool: str
    reference: str  # the chosen image as written
    source: ImageSource  # where the choice came from
    resolved: str  # normalised: registry/path[:tag][@digest]
    status: RowStatus
    digest: str | None = None
    pinned: str | None = None  # registry/path@digest: what render writes
    verified_by: VerifiedBy | None = None
    credential_source: str | None = None  # a source name, never a value
    user: int | None = None  # the declared (contract) or observed (probe) UID
    detail: str
    fix: str | None = None


class PreflightResult(Result):
    """``npa workbench workflow preflight-images``."""

    spec: str
    registry: str | None
    context: str | None
    contract_version: int
    images: list[ImageRow]
    digests: dict[str, str]  # TOOL_REF -> pinned reference, for every ok image

    @property
    def ok(self) -> bool:
        return all(r.status == "ok" for r in self.images)

    def exit_code(self) -> int:
        """0 when every image is ok; 1 when one is missing, forbidden or rejected; 4 when the
        rest could only not be verified."""
        if self.ok:
            return 0
        if any(r.status in FAILING for r in self.images):
            return EXIT_FAILURE
        return EXIT_UNAVAILABLE

    def text_lines(self) -> list[str]:
        from npa.core.table import table
        from npa.core.text import plural

        head = ["TOOL", "STATUS", "VERIFIED", "DIGEST", "CREDENTIALS", "REFERENCE"]
        rows = [
            [
                r.tool,
                r.status,
                r.verified_by,
                (r.digest or "-")[:19],
                r.credential_source or "anonymous",
                r.reference,
            ]
            for r in self.images
        ]
        lines = table(head, rows, indent=0)
        for r in self.images:
            if r.status != "ok":
                lines.append(f"{r.tool}: {r.status}: {r.detail}")
                if r.fix:
                    lines.append(f"  fix: {r.fix}")
        bad = sum(r.status != "ok" for r in self.images)
        lines.append(
            f"{plural(len(self.images), 'image')}, all ok"
            if not bad
            else f"{bad} of {plural(len(self.images), 'image')} not ok"
        )
        return lines


def _registry(project: str | None, registry: str | None) -> str | None:
    from npa.services.configure import resolve_project

    return resolve_project(project, {"registry": registry}).value("registry")


def _probe_context(
    context: str | None, project: str | None, spec_context: str | None, paths: NpaPaths
) -> str | None:
    """The context unattested images are probed in, in the one order (``choose_context``),
    stopping before the kubeconfig's current-context: a probe starts a pod, so it runs only
    on a context someone named (the flag, the spec or the project)."""
    from npa.services.configure import choose_context

    chosen = choose_context(
        context, project=project, spec_context=spec_context, paths=paths, use_current=False
    )
    return chosen.name if chosen else None


def preflight(
    spec_path: Path,
    *,
    registry: str | None = None,
    project: str | None = None,
    context: str | None = None,
    image_overrides: Sequence[str] = (),
    image: str | None = None,
    registry_auth: Sequence[str] = (),
    probe_timeout: float = DEFAULT_TIMEOUT,
    concurrency: int = MAX_CONCURRENCY,
    paths: NpaPaths | None = None,
    prober_factory: Callable[[ProbeTarget], CapabilityProber] | None = None,
    tools: Mapping[str, Tool] | None = None,
    cache: VerificationCache | None = None,
    contract: bool = True,
) -> PreflightResult:
    """Resolve and verify every tool's image of the spec at ``spec_path``.

    ``contract=False``: resolve each image to its digest and check it exists, nothing more (an
    engine that starts the stage's command itself needs no bootstrap contract).

    ``tools``: the spec's tools when the caller has them but the spec as a whole may be
    invalid (submit's gates check images whatever else is wrong); ``cache``: where
    verifications go (a deferring one writes nothing until the caller commits it)."""
    paths = paths or NpaPaths.from_env()
    spec_context = None
    if tools is None:
        from npa.spec.validate import load_workflow

        workflow = load_workflow(spec_path)
        tools, spec_context = workflow.tools, workflow.infrastructure.context
    registry = _registry(project, registry)
    default_registry = parse_registry(registry) if registry else None
    selected_context = _probe_context(context, project, spec_context, paths)

    overrides = parse_overrides(image_overrides, tools)
    chosen = choose_images({k: t.image for k, t in tools.items()}, overrides, image)
    refs = {c.tool: parse_reference(c.image, default_registry=default_registry) for c in chosen}

    checker = _Checker(
        project=_project_name(project),
        spec_path=spec_path,
        workflow_tools=tools,
        client=RegistryClient(load_store(registry_auth)),
        cache=cache or VerificationCache(paths),
        context=selected_context,
        kubeconfig=_kubeconfig_for(paths, selected_context),
        probe_timeout=probe_timeout,
        prober_factory=prober_factory,
        contract=contract,
    )
    workers = max(1, min(concurrency, len(chosen)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="npa-preflight") as pool:
        rows = list(pool.map(lambda c: checker.check(c, refs[c.tool]), chosen))
    return PreflightResult(
        spec=str(spec_path),
        registry=default_registry,
        context=selected_context,
        contract_version=CONTRACT_VERSION,
        images=rows,
        digests={r.tool: r.pinned for r in rows if r.status == "ok" and r.pinned},
    )


def _kubeconfig_for(paths: NpaPaths, context: str | None) -> Path | None:
    """The kubeconfig provisioning placed for ``context``, else the client's usual lookup."""
    if context is None:
        return None
    try:
        placed = paths.cluster_kubeconfig(context)
    except InvalidInput:
        return None
    return placed if placed.is_file() else None


def _project_name(project: str | None) -> str | None:
    """The project preflight checks for, when one is given or configured: its namespace is
    where the probe runs."""
    from npa.core.errors import NpaError
    from npa.services.configure import resolve_project

    try:
        return resolve_project(project).project
    except NpaError:
        return None


class _Checker:
    """Checks one chosen image at a time; shared by the worker threads."""

    def __init__(
        self,
        *,
        project: str | None,
        spec_path: Path,
        workflow_tools: Mapping[str, Tool],
        client: RegistryClient,
        cache: VerificationCache,
        context: str | None,
        kubeconfig: Path | None,
        probe_timeout: float,
        prober_factory: Callable[[ProbeTarget], CapabilityProber] | None,
        contract: bool = True,
    ) -> None:
        self.project = project
        self.spec_path = spec_path
        self.tools = workflow_tools
        self.client = client
        self.cache = cache
        self.context = context
        self.kubeconfig = kubeconfig
        self.probe_timeout = probe_timeout
        self.prober_factory = prober_factory
        self.contract = contract
        self._lock = threading.Lock()
        self._prober: CapabilityProber | ProbeSetupError | None = None
        # One probe per (digest, user), however many tools share the image.
        self._probes: dict[tuple[str, int], Future[ProbeOutcome]] = {}

    def check(self, chosen: ChosenImage, ref: ImageReference) -> ImageRow:
        row = ImageRow(
            tool=chosen.tool,
            reference=chosen.image,
            source=chosen.source,
            resolved=str(ref),
            status="unreachable",
            detail="",
        )
        answer = self.client.check_manifest(ref)
        row.credential_source = answer.credential_source
        if answer.status is not Status.OK or answer.digest is None:
            row.status = _ROW_STATUS[answer.status]
            row.detail = answer.detail
            row.fix = self._fix(answer.status, chosen, ref)
            return row
        row.digest = answer.digest
        row.pinned = ref.pinned(answer.digest)
        if not self.contract:
            row.status, row.verified_by = "ok", "registry"
            row.detail = "exists at this digest (the runtime needs no bootstrap contract)"
            return row
        self._verify(row, chosen, ref, answer.digest)
        return row

    # --- the bootstrap contract ----------------------------------------------------------
    def _verify(self, row: ImageRow, chosen: ChosenImage, ref: ImageReference, digest: str) -> None:
        contract = self.tools[chosen.tool].contract
        run_as_user = int(contract.run_as_user)
        run_as_group = int(contract.run_as_group)
        fs_group = int(contract.fs_group)
        cached = self.cache.lookup(digest, run_as_user)
        if cached is not None:
            if cached.verified_by == "contract" and not self._user_allowed(
                row, chosen, cached.user, run_as_user
            ):
                return
            row.status, row.verified_by, row.user = "ok", "cache", cached.user
            row.detail = f"verified by {cached.verified_by} on {cached.checked_at} (cached)"
            return
        try:
            config = self.client.image_config(ref, digest)
        except RegistryProblem as problem:
            unknown = problem.status is Status.UNREACHABLE
            row.status = "unverified" if unknown else _ROW_STATUS[problem.status]
            row.detail = f"cannot read the image config: {problem.detail}"
            return
        try:
            attestation = read_attestation(config)
        except ContractViolation as violation:
            row.status = "rejected"
            row.detail = f"the image claims the bootstrap contract but breaks it: {violation}"
            row.fix = self._build_fix(chosen, ref)
            return
        if attestation is not None:
            if not self._user_allowed(row, chosen, attestation.uid, run_as_user):
                return
            row.status, row.verified_by, row.user = "ok", "contract", attestation.uid
            row.detail = (
                f"contract {attestation.version} attested: user {attestation.uid}, "
                f"{', '.join(attestation.capabilities)}"
            )
            self.cache.store(digest, "contract", attestation.uid, None)
            return
        self._probe(row, ref, digest, run_as_user, run_as_group, fs_group)

    def _user_allowed(
        self, row: ImageRow, chosen: ChosenImage, declared: int, run_as_user: int
    ) -> bool:
        try:
            enforce_declared_user(chosen.tool, str(row.pinned), declared, run_as_user)
        except InvalidInput as refused:
            row.status, row.detail, row.fix = "rejected", refused.message, refused.fix
            return False
        return True

    def _probe(
        self,
        row: ImageRow,
        ref: ImageReference,
        digest: str,
        run_as_user: int,
        run_as_group: int,
        fs_group: int,
    ) -> None:
        prober = self._get_prober()
        if isinstance(prober, ProbeSetupError) or prober is None:
            row.status = "unverified"
            why = str(prober) if prober else "no kube context is selected"
            row.detail = f"the image carries no bootstrap contract and cannot be probed: {why}"
            row.fix = self._probe_fix()
            return
        key = (digest, run_as_user)
        with self._lock:
            future = self._probes.get(key)
            owner = future is None
            if future is None:
                future = self._probes[key] = Future()
        if owner:
            try:
                outcome = prober.run(
                    ref.pinned(digest),
                    digest,
                    run_as_user=run_as_user,
                    run_as_group=run_as_group,
                    fs_group=fs_group,
                )
            except Exception as exc:  # never leave a waiting thread hanging
                outcome = ProbeOutcome("unverified", f"probe error: {type(exc).__name__}", "-", "-")
            future.set_result(outcome)
        outcome = future.result()
        if outcome.verdict == "passed":
            row.status, row.verified_by = "ok", "probe"
            row.user = outcome.uid if outcome.uid is not None else run_as_user
            row.detail = outcome.detail
            if owner:
                self.cache.store(digest, "probe", row.user, run_as_user)
            return
        row.status = "rejected" if outcome.verdict == "failed" else "unverified"
        row.detail = f"capability probe in context {self.context}: {outcome.detail}"
        row.fix = outcome.fix
        if outcome.namespace_missing and self.project and self.context:
            row.fix = provision_command(self.context, self.project)

    def _probe_fix(self) -> str:
        """What gets a probe going: the selected context's cluster answering, or (none selected)
        the contexts there are to choose from."""
        if self.context is None:
            return (
                "kubectl config get-contexts -o name  # then rerun with --context set to the "
                "cluster the stages run on"
            )
        config = self.kubeconfig or Path.home() / ".kube" / "config"
        return kubectl_command(config, self.context, "auth", "can-i", "create", "pods")

    def _get_prober(self) -> CapabilityProber | ProbeSetupError | None:
        if self.context is None:
            return None
        with self._lock:
            if self._prober is None:
                try:
                    namespace = project_namespace(self.project) if self.project else None
                    target = select_target(self.context, self.kubeconfig, namespace)
                    if self.prober_factory is not None:
                        self._prober = self.prober_factory(target)
                    else:
                        self._prober = CapabilityProber(
                            core_api(target), target, timeout=self.probe_timeout
                        )
                except ProbeSetupError as exc:
                    self._prober = exc
            return self._prober

    # --- fixes ---------------------------------------------------------------------------
    def _fix(self, status: Status, chosen: ChosenImage, ref: ImageReference) -> str | None:
        if status is Status.NOT_FOUND:
            return self._build_fix(chosen, ref)
        if status is Status.FORBIDDEN:
            return f"docker login {ref.credential_host}  # or: {flag_fix(ref.credential_host)}"
        if status is Status.UNREACHABLE:
            scheme = "http" if is_loopback(ref.api_host) else "https"
            return f"curl -sSI {scheme}://{ref.api_host}/v2/  # check the registry answers, rerun"
        return None

    def _build_fix(self, chosen: ChosenImage, ref: ImageReference) -> str:
        tag_ref = f"{ref.name}:{ref.tag}" if ref.tag else f"{ref.name}:TAG"
        build = self.tools[chosen.tool].build
        if build is None:
            return (
                f"docker push {tag_ref}  # tools.{chosen.tool} has no build: section; push the "
                f"image you mean to {ref.credential_host}"
            )
        context_dir = _relative(self.spec_path.parent / build.context)
        dockerfile = _relative(self.spec_path.parent / build.context / build.dockerfile)
        command = (
            f"docker build -t {shlex.quote(tag_ref)} -f {shlex.quote(dockerfile)} "
            f"{shlex.quote(context_dir)} && docker push {shlex.quote(tag_ref)}"
        )
        if ref.digest:
            command += f"  # then pin tools.{chosen.tool}.image to the digest docker prints"
        return command


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path.resolve())
