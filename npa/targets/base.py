"""The one interface every provisioning target implements, the capabilities some declare, and
the records they share.

A target is where ``provision-if-absent``, ``teardown`` and ``plan-spec`` put a project's
infrastructure: the Pulumi stacks it consists of (in apply order; teardown is the reverse), the
quota it is measured against, and what it needs of a kube context. The services talk to a
target only through :class:`Target`; what only some targets do is a capability, a small mixin
below that a target inherits and callers test with ``isinstance``, never by comparing a
target's name. docs/development.md lists the methods and capabilities, and which target has
which.
"""

from __future__ import annotations

import abc
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from npa.core.errors import InvalidInput
from npa.core.paths import NpaPaths
from npa.plan.quota import ExistingCheck, QuotaAssessment, QuotaScope, QuotaSource
from npa.spec.model import Infrastructure

if TYPE_CHECKING:
    from npa.adapters.infra.runner import InfraRunner, StackSpec
    from npa.plan.evidence import DiskReader
    from npa.plan.infra import DiskNeed, QuotaRequirement
    from npa.spec.model import Workflow

Plugin = tuple[str, str, str]  # a pulumi plugin: kind, name, version
Progress = Callable[[str], None]


@dataclass(frozen=True)
class QuotaApiAsk:
    """The cloud quota API a command's flags point at: the project asked about, the region of
    its quotas and an API address override. Only a target that declares :class:`AsksQuotaApi`
    reads it; the flags are ``QUOTA_API_FLAGS``, in this order."""

    project: str | None = None
    region: str | None = None
    endpoint: str | None = None

    def flags(self) -> list[tuple[str, str | None]]:
        """Each flag with its value (None when not given), in ``QUOTA_API_FLAGS`` order."""
        return list(zip(QUOTA_API_FLAGS, (self.project, self.region, self.endpoint), strict=True))


#: The flags of ``provision-if-absent`` and ``plan-spec`` that name the cloud quota API asked.
QUOTA_API_FLAGS = ("--nebius-project", "--nebius-region", "--nebius-endpoint")


@dataclass
class ProvisionRequest:
    """Everything ``provision-if-absent`` was asked to do."""

    project: str | None
    target: str
    context: str | None = None
    kubeconfig: Path | None = None
    backend_url: str | None = None
    preview_only: bool = False
    yes: bool = False
    spec: Path | None = None
    quota_files: Sequence[Path] = ()
    quota_api: QuotaApiAsk = field(default_factory=QuotaApiAsk)
    extra_sources: list[QuotaSource] = field(default_factory=list)
    progress: Progress | None = None  # gets a line per resource step while a stack applies


def request_options(req: ProvisionRequest) -> list[str]:
    """The quota and cloud options of ``req`` as flags, for the command that resumes it."""
    argv: list[str] = []
    if req.spec:
        argv += ["--spec", str(req.spec.resolve())]
    for quota_file in req.quota_files:
        argv += ["--quota-file", str(Path(quota_file).resolve())]
    for flag, value in req.quota_api.flags():
        argv += [flag, value] if value else []
    return argv


@dataclass(frozen=True)
class KubeSource:
    """Where a target copies its kube context from."""

    value: str  # a path or a KUBECONFIG list; empty when only the placed file was named
    explicit: bool  # from --kubeconfig (else $KUBECONFIG or ~/.kube/config)
    dropped_placed: bool  # the list named npa's own placed kubeconfig, which was left out


@dataclass(frozen=True)
class StackInput:
    """A config value of one stack that an earlier stack of the layout outputs: known only once
    that one is applied, so the later stack is previewed then."""

    stack: str  # the stack that reads it
    source: str  # the stack whose output it is
    output: str
    config_key: str
    wait_note: str  # why the stack's preview waits
    missing: str  # the error when the source gave no such output


@dataclass
class Layout:
    """The stacks of one project on one target, in apply order (teardown is the reverse)."""

    project: str
    target: str
    context: str | None
    stacks: list[StackSpec]
    operation: str
    source: KubeSource | None = None
    notes: list[str] = field(default_factory=list)
    inputs: list[StackInput] = field(default_factory=list)

    def input_of(self, stack: str) -> StackInput | None:
        return next((i for i in self.inputs if i.stack == stack), None)


@dataclass(frozen=True)
class LayoutAsk:
    """What a layout is built from: the command's flags and the project's settings."""

    context: str | None  # chosen in the one order (services.configure.choose_context)
    kubeconfig: Path | None
    infra: Infrastructure | None = None
    quota_api: QuotaApiAsk = field(default_factory=QuotaApiAsk)
    need_source: bool = True  # False for teardown: destroy runs from state


def stack_token(value: str, limit: int = 64) -> str:
    """A name usable inside a Pulumi stack name (letters, digits, ``-_.``, at most ``limit``
    characters); a short hash is added when characters had to be replaced or cut, so two
    contexts never share a stack."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", value)
    if cleaned != value or len(cleaned) > limit:
        cleaned = cleaned[: limit - 7] + "-" + hashlib.sha256(value.encode()).hexdigest()[:6]
    return cleaned


def namespace_for(project: str) -> str:
    """The Kubernetes namespace of a project: ``npa-<project>`` as a DNS label."""
    from npa.adapters.kube.client import project_namespace

    return project_namespace(project)


def not_checked(
    existing: Sequence[ExistingCheck] = (), scope: QuotaScope | None = None
) -> QuotaAssessment:
    """The verdict of a target with no quota for npa to check."""
    return QuotaAssessment(
        verdict="not-checked",
        lines=[],
        existing=list(existing),
        scope=scope or QuotaScope(),
        sources=[],
        problems=[],
    )


class Target(abc.ABC):
    """One provisioning target."""

    name: ClassVar[str]
    plugins: ClassVar[tuple[Plugin, ...]] = ()  # pulumi plugins its programs need
    # Where the project a quota API is asked about is written, when no flag names it.
    profile_hint: ClassVar[str] = ""

    @abc.abstractmethod
    def layout(self, paths: NpaPaths, project: str, ask: LayoutAsk) -> Layout:
        """Its stacks for ``project``, in apply order, and the operation id of provisioning."""

    @abc.abstractmethod
    def quota_gate(
        self,
        req: ProvisionRequest,
        infra: Infrastructure,
        *,
        store: str | None,
        local_jobs: Path,
        existing: Sequence[ExistingCheck],
    ) -> QuotaAssessment:
        """The quota arithmetic of provisioning ``req`` against the target's quota sources
        (``store`` is the project's store when the target measures this machine's disk)."""

    def infrastructure(self, spec: Path | None) -> Infrastructure:
        """The cluster shape a provisioning builds (npa's defaults unless the target reads the
        spec's ``infrastructure``)."""
        return Infrastructure()

    def profile_project(self) -> str | None:
        """The project its quota API is asked about when no flag names one (the one of its
        cloud CLI's profile), or None."""
        return None

    def resume_args(self, lay: Layout) -> list[str]:
        """The flags that name the same stacks again, for a resume or a teardown."""
        return ["--context", lay.context] if lay.context else []

    def prepare_destroy(self, spec: StackSpec) -> None:
        """Make ``spec``'s config well formed for a destroy, which runs from state (nothing
        to do unless a stack's config is known only from another stack's output)."""
        return None

    # What plan-spec measures: the disks npa creates and the quota lines they need.
    def plan_needs(self, infra: Infrastructure) -> list[DiskNeed]:
        return []

    @abc.abstractmethod
    def plan_requirements(
        self, needs: list[DiskNeed], workflow: Workflow
    ) -> list[QuotaRequirement]:
        """What the target's quota must allow for ``workflow``."""

    def plan_scope(
        self, infra: Infrastructure, region: str | None, project: str | None
    ) -> QuotaScope:
        return QuotaScope()


# --- capabilities ----------------------------------------------------------------------------


class MeasuresLocalDisk:
    """Its quota is the disk of this machine that holds the project's store: the quota gate
    measures that store, and cluster disks (``--existing``) do not apply."""


class ExistingCluster(abc.ABC):
    name: ClassVar[str]

    """A cluster that exists: npa creates no disks there, so it has no cloud quota to check;
    cloud-quota evidence is refused, and a kube context must be named or current."""

    @abc.abstractmethod
    def plan_note(self, spec: Path, context: str | None) -> str:
        """Why plan-spec checks no quota, and what it can check instead."""

    @abc.abstractmethod
    def cloud_evidence_refused(self, flags: list[str]) -> str:
        """Why plan-spec refuses cloud-quota evidence (``flags``) for this target."""

    @abc.abstractmethod
    def no_context(self, paths: NpaPaths, argv: list[str]) -> InvalidInput:
        """The refusal of a teardown (``argv``) that names no context."""


class CopiesKubeconfig(abc.ABC):
    """Its cluster stack copies a context from a kubeconfig on this machine."""

    @abc.abstractmethod
    def source_notes(self, lay: Layout, runner: InfraRunner) -> list[str]:
        """Notes on where the context is copied from (it may be the source the last apply
        recorded); an error when no usable source is left."""


class ChecksReachability(abc.ABC):
    """Its API server must answer before a preview can be trusted."""

    @abc.abstractmethod
    def unreachable(self, lay: Layout) -> tuple[str, str] | None:
        """Why the API server cannot be used and the command that shows it, or None."""


class AsksQuotaApi(abc.ABC):
    """Its cloud has a quota API (and a disk API) npa can ask: ``QUOTA_API_FLAGS`` name the
    project, region and address; the plan and the quota gate ask it as one more source."""

    @abc.abstractmethod
    def quota_api_source(self, api: QuotaApiAsk, scope: QuotaScope) -> QuotaSource | None:
        """The quota API as a source for ``scope`` (its region), when ``api`` names a project;
        else None."""

    @abc.abstractmethod
    def disk_reader(self, api: QuotaApiAsk) -> DiskReader:
        """What proves a disk a claim names exists, asked through ``api``'s address."""


class ProvesExistingDisks(abc.ABC):
    """Its state records disks that exist; the quota gate deducts them."""

    @abc.abstractmethod
    def existing(self, lay: Layout, runner: InfraRunner, *, refresh: bool) -> list[ExistingCheck]:
        """The disks the (refreshed, when ``refresh``) state of its stacks proves exist."""
