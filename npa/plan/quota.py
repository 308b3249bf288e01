"""Quota arithmetic: required vs available, in exact bytes and counts.

Evidence comes from :class:`QuotaSource` implementations (a reviewed file, the Nebius quota
API, the local store's filesystem). The arithmetic trusts nothing it cannot check:

- a source that fails, a usage above its limit, a negative figure, a line that is both
  unlimited and limited, or two sources that disagree give ``blocked-unknown``;
- a reading counts only for the region (and project) the plan builds in (:class:`QuotaScope`):
  evidence read for another region is no evidence at all;
- an existing resource is deducted only when its proof was checked (:class:`ExistingCheck`
  ``proven``: the stack state or the provider records exactly the claimed disks, and the proof
  proves no other claim; see :mod:`npa.plan.evidence`). A claim in words is "claimed,
  unproven" and deducts nothing; a claim that does not match what the plan needs gives
  ``blocked-unknown``.

Only complete, consistent evidence can say ``ok``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    model_validator,
)

from npa.core.errors import NpaError
from npa.plan.infra import DISK_COUNT, GIB, DiskNeed, QuotaRequirement, Role, Unit
from npa.spec.model import DiskType

LineVerdict = Literal["ok", "blocked", "unknown"]
Verdict = Literal["ok", "blocked", "blocked-unknown", "not-checked"]
ProofStatus = Literal["proven", "unproven", "refuted", "unavailable"]


class QuotaReading(BaseModel):
    """What one source says about one quota. ``error`` set means the source could not answer.
    ``region`` and ``project`` say what the figures were read for (None: not said)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    name: str
    limit: int | None = None
    usage: int | None = None
    unlimited: bool = False
    region: str | None = None
    project: str | None = None
    error: str | None = None


class QuotaScope(BaseModel):
    """Where the plan builds: readings for another region or project are not evidence.
    ``region`` None is the local target, whose only source answers for no region."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str | None = None
    project: str | None = None

    def mismatch(self, reading: QuotaReading) -> str | None:
        """Why ``reading`` is not evidence for this scope, or None when it is."""
        if reading.region != self.region:
            said = f"region {reading.region}" if reading.region else "no region"
            return f"{reading.source} names {said}, not {self.region}, where the plan builds"
        if self.project and reading.project and reading.project != self.project:
            return f"{reading.source} is for project {reading.project}, not {self.project}"
        return None


class QuotaSource(Protocol):
    """Anything that can report quota limits and usage."""

    @property
    def name(self) -> str:
        """Short label used in reports (``file:quota.yaml``, ``nebius:eu-north1``, ``local``)."""
        ...

    def read(self, names: Sequence[str]) -> list[QuotaReading]:
        """Readings for the quotas it knows among ``names``; may raise NpaError or OSError
        when the source cannot be asked at all."""
        ...


# Evidence files are input: strict types, as in the spec (size_gib: "100" is not a number).
_Frozen = ConfigDict(extra="forbid", frozen=True, strict=True)
Name = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class PulumiOutputRef(BaseModel):
    """What in a stack's state proves the claim: an output or a resource (exactly one)."""

    model_config = _Frozen

    stack: Name = Field(description="Stack name (npa's, or organization/project/stack).")
    output: Name | None = Field(
        default=None,
        description="An output that is the id of a disk-holding resource in the stack's state, "
        "or a record of the disks ({id, role, size_gib, disk_type}, or a list of them).",
    )
    resource: Name | None = Field(
        default=None, description="A disk-holding resource of the stack, by URN or name."
    )
    backend: Name | None = Field(
        default=None, description="State backend URL (default: npa's, file://$NPA_HOME/pulumi)."
    )
    value: str | None = Field(
        default=None, description="The value the output (or the resource's id) must have."
    )

    @model_validator(mode="after")
    def _one_citation(self) -> PulumiOutputRef:
        if (self.output is None) == (self.resource is None):
            raise ValueError("name exactly one of output and resource")
        return self


class PulumiOutputProof(BaseModel):
    """``evidence: {pulumi: {stack: S, output: O}}`` or ``{pulumi: {stack: S, resource: R}}``."""

    model_config = _Frozen

    pulumi: PulumiOutputRef


class NebiusDiskProof(BaseModel):
    """``evidence: {nebius_disk: ID}``: the Nebius compute API is asked for the disk."""

    model_config = _Frozen

    nebius_disk: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9-]{1,128}$")]


def _evidence_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict | PulumiOutputProof) and "pulumi" in _keys(value):
        return "pulumi"
    if isinstance(value, dict | NebiusDiskProof) and "nebius_disk" in _keys(value):
        return "nebius_disk"
    return None


def _keys(value: Any) -> set[str]:
    return set(value) if isinstance(value, dict) else set(type(value).model_fields)


Evidence = Annotated[
    Annotated[PulumiOutputProof, Tag("pulumi")]
    | Annotated[NebiusDiskProof, Tag("nebius_disk")]
    | Annotated[str, Tag("text"), StringConstraints(min_length=1)],
    Discriminator(
        _evidence_kind,
        custom_error_type="evidence",
        custom_error_message="evidence must be text (a claim), {pulumi: {stack, output}}, "
        "{pulumi: {stack, resource}} or {nebius_disk: ID}",
    ),
]


class ExistingDisk(BaseModel):
    """A disk claimed to exist already, with what proves it. Only a checkable proof
    (:class:`PulumiOutputProof`, :class:`NebiusDiskProof`) can make it count; text is a claim."""

    model_config = _Frozen

    role: Role
    disk_type: DiskType = Field(default=DiskType.NETWORK_SSD, strict=False)
    size_gib: int = Field(ge=1, le=1_048_576)
    count: int = Field(default=1, ge=1, le=1000)
    evidence: Evidence = Field(description="What proves it exists.")


class ExistingCheck(BaseModel):
    """A claim and what npa found when it checked the proof; only ``proven`` is deducted."""

    model_config = ConfigDict(extra="forbid")

    disk: ExistingDisk
    status: ProofStatus
    detail: str


def unproven(disk: ExistingDisk) -> ExistingCheck:
    """A claim whose evidence is words, not something npa can read back."""
    return ExistingCheck(
        disk=disk,
        status="unproven",
        detail=f"claimed, unproven ({disk.evidence!r} is not a stack output or a provider "
        "lookup npa can check): not deducted",
    )


class QuotaLine(BaseModel):
    """The arithmetic for one quota. Byte figures are exact; the GiB figures round toward
    caution (available down, shortfall up), so they are exact whenever the bytes are whole GiB."""

    model_config = ConfigDict(extra="forbid")

    name: str
    unit: Unit
    required: int
    existing: int
    required_new: int
    available: int | None
    shortfall: int | None
    unlimited: bool = False
    required_gib: int | None = None
    existing_gib: int | None = None
    required_new_gib: int | None = None
    available_gib: int | None = None
    shortfall_gib: int | None = None
    verdict: LineVerdict
    reason: str
    sources: list[str]
    # Readings that were not counted, each with why (another region or project).
    not_counted: list[str] = Field(default_factory=list)


class QuotaAssessment(BaseModel):
    """The quota gate's answer for a plan."""

    model_config = ConfigDict(extra="forbid")

    verdict: Verdict
    lines: list[QuotaLine]
    existing: list[ExistingCheck]
    scope: QuotaScope = Field(default_factory=QuotaScope)
    sources: list[str]
    problems: list[str]
    fix: str | None = None


def _ceil_gib(value: int) -> int:
    return -(-value // GIB)


def _existing_problems(needs: Sequence[DiskNeed], existing: Sequence[ExistingDisk]) -> list[str]:
    """Existing-disk claims must each match a disk the plan needs, and not exceed its count."""
    problems = []
    claimed: dict[Role, int] = {}
    for disk in existing:
        match = [n for n in needs if n.role == disk.role]
        if not match:
            problems.append(f"existing {disk.role} disk is not part of this plan")
            continue
        need = match[0]
        if (need.size_gib, need.disk_type) != (disk.size_gib, disk.disk_type):
            problems.append(
                f"existing {disk.role} disk is {disk.size_gib} GiB {disk.disk_type.value}, "
                f"the plan needs {need.size_gib} GiB {need.disk_type.value}"
            )
        claimed[disk.role] = claimed.get(disk.role, 0) + disk.count
        if claimed[disk.role] > need.count:
            problems.append(
                f"{claimed[disk.role]} existing {disk.role} disks claimed, "
                f"the plan has {need.count}"
            )
    return problems


def _deduction(name: str, existing: Sequence[ExistingDisk]) -> int:
    if name == DISK_COUNT:
        return sum(d.count for d in existing)
    return sum(
        d.count * d.size_gib * GIB
        for d in existing
        if "compute.disk.size." + d.disk_type.value.lower().replace("_", "-") == name
    )


def _contradiction(r: QuotaReading) -> str | None:
    """Why one reading cannot be true as written, or None."""
    if r.unlimited and r.limit is not None:
        return f"{r.source} says both unlimited and limit {r.limit}: contradictory"
    if r.unlimited:
        if r.usage is not None and r.usage < 0:
            return f"{r.source} reported a negative usage ({r.usage})"
        return None
    if r.limit is None or r.usage is None:
        return f"{r.source} gave no limit or usage"
    if r.limit < 0 or r.usage < 0:
        return f"{r.source} reported a negative figure (limit {r.limit}, usage {r.usage})"
    if r.usage > r.limit:
        return f"{r.source} reports usage {r.usage} above its limit {r.limit}"
    return None


def _consensus(readings: list[QuotaReading]) -> tuple[int | None, bool, str | None]:
    """(available, unlimited, problem) from every (in-scope) reading of one quota."""
    if not readings:
        return None, False, "no source reported this quota"
    failed = [r for r in readings if r.error]
    if failed:
        return None, False, "; ".join(f"{r.source}: {r.error}" for r in failed)
    answers: dict[str, tuple[int | None, bool]] = {}
    for r in readings:
        problem = _contradiction(r)
        if problem:
            return None, False, problem
        answers[r.source] = (
            (None, True) if r.unlimited else ((r.limit or 0) - (r.usage or 0), False)
        )
    distinct = set(answers.values())
    if len(distinct) > 1:
        said = ", ".join(
            f"{src}: {'unlimited' if unl else avail}"
            for src, (avail, unl) in sorted(answers.items())
        )
        return None, False, f"sources disagree on what is available ({said})"
    available, unlimited = distinct.pop()
    return available, unlimited, None


def _readings(
    sources: Sequence[QuotaSource], names: list[str], scope: QuotaScope
) -> tuple[dict[str, list[QuotaReading]], dict[str, list[str]]]:
    """Every source's answer for each quota that counts for ``scope`` (a source that fails
    answers "unavailable"), and why each answer that does not count was set aside."""
    readings: dict[str, list[QuotaReading]] = {n: [] for n in names}
    off_scope: dict[str, list[str]] = {n: [] for n in names}
    for source in sources:
        try:
            got = source.read(names)
        except (NpaError, OSError) as exc:
            message = exc.message if isinstance(exc, NpaError) else str(exc)
            got = [
                QuotaReading(
                    source=source.name,
                    name=n,
                    region=scope.region,
                    error=f"unavailable: {message}",
                )
                for n in names
            ]
        for reading in got:
            if reading.name not in readings:
                continue
            why = scope.mismatch(reading)
            if why is None:
                readings[reading.name].append(reading)
            else:
                off_scope[reading.name].append(why)
    return readings, off_scope


def _line(
    req: QuotaRequirement,
    readings: list[QuotaReading],
    off_scope: list[str],
    proven: Sequence[ExistingDisk],
    existing_problems: list[str],
) -> QuotaLine:
    """One requirement against its readings, after the proven existing disks are deducted."""
    deducted = _deduction(req.name, proven) if not existing_problems else 0
    new = max(req.required - deducted, 0)
    available, unlimited, problem = _consensus(readings)
    if problem is not None and not readings and off_scope:
        problem = f"no evidence for this plan's scope ({'; '.join(off_scope)})"
    if existing_problems:
        problem = "existing-resource evidence does not match the plan"
    shortfall: int | None = None
    if problem is not None:
        verdict: LineVerdict = "unknown"
        reason = problem
    elif unlimited:
        verdict, reason, shortfall = "ok", "the source reports no limit", 0
    else:
        assert available is not None
        shortfall = max(new - available, 0)
        verdict = "ok" if shortfall == 0 else "blocked"
        reason = "enough is available" if verdict == "ok" else "not enough is available"
    line = QuotaLine(
        name=req.name,
        unit=req.unit,
        required=req.required,
        existing=deducted,
        required_new=new,
        available=available,
        shortfall=shortfall,
        unlimited=unlimited,
        verdict=verdict,
        reason=reason,
        sources=[r.source for r in readings],
        not_counted=off_scope,
    )
    if req.unit == "bytes":
        line.required_gib = _ceil_gib(req.required)
        line.existing_gib = deducted // GIB
        line.required_new_gib = _ceil_gib(new)
        line.available_gib = None if available is None else available // GIB
        line.shortfall_gib = None if shortfall is None else _ceil_gib(shortfall)
    return line


def assess(
    requirements: Sequence[QuotaRequirement],
    sources: Sequence[QuotaSource],
    *,
    needs: Sequence[DiskNeed] = (),
    existing: Sequence[ExistingCheck] = (),
    scope: QuotaScope | None = None,
) -> QuotaAssessment:
    """Compare what the plan needs with what the sources say is available for ``scope``
    (default: no region, the local target's), deducting the existing disks that were proven."""
    scope = scope or QuotaScope()
    readings, off_scope = _readings(sources, [r.name for r in requirements], scope)
    existing_problems = _existing_problems(needs, [c.disk for c in existing])
    problems: list[str] = list(existing_problems)
    proven = [c.disk for c in existing if c.status == "proven"]
    lines = []
    for req in requirements:
        line = _line(req, readings[req.name], off_scope[req.name], proven, existing_problems)
        lines.append(line)
        if line.verdict == "unknown":
            problems.append(f"{req.name}: {line.reason}")

    if any(line.verdict == "blocked" for line in lines):
        overall: Verdict = "blocked"
    elif any(line.verdict == "unknown" for line in lines):
        overall = "blocked-unknown"
    else:
        overall = "ok"
    return QuotaAssessment(
        verdict=overall,
        lines=lines,
        existing=list(existing),
        scope=scope,
        sources=[s.name for s in sources],
        problems=problems,
    )
