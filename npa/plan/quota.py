"""Quota arithmetic: required vs available, in exact bytes and counts.

Evidence comes from :class:`QuotaSource` implementations (a reviewed file, the Nebius quota
API, the local store's filesystem). The arithmetic trusts nothing it cannot check: a source
that fails, a usage above its limit, a negative figure, two sources that disagree, or an
existing-resource claim that does not match what the plan needs all give ``blocked-unknown``.
Only complete, consistent evidence can say ``ok``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from npa.core.errors import NpaError
from npa.plan.infra import DISK_COUNT, GIB, DiskNeed, QuotaRequirement, Role, Unit
from npa.spec.model import DiskType

LineVerdict = Literal["ok", "blocked", "unknown"]
Verdict = Literal["ok", "blocked", "blocked-unknown", "not-checked"]


class QuotaReading(BaseModel):
    """What one source says about one quota. ``error`` set means the source could not answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    name: str
    limit: int | None = None
    usage: int | None = None
    unlimited: bool = False
    region: str | None = None
    error: str | None = None


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


class ExistingDisk(BaseModel):
    """A disk proven to exist already (e.g. from stack state), deducted from what is needed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    disk_type: DiskType = DiskType.NETWORK_SSD
    size_gib: int = Field(ge=1)
    count: int = Field(default=1, ge=1)
    evidence: str = Field(min_length=1, description="What proves it exists.")


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


class QuotaAssessment(BaseModel):
    """The quota gate's answer for a plan."""

    model_config = ConfigDict(extra="forbid")

    verdict: Verdict
    lines: list[QuotaLine]
    existing: list[ExistingDisk]
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


def _consensus(readings: list[QuotaReading]) -> tuple[int | None, bool, str | None]:
    """(available, unlimited, problem) from every reading of one quota."""
    if not readings:
        return None, False, "no source reported this quota"
    failed = [r for r in readings if r.error]
    if failed:
        return None, False, "; ".join(f"{r.source}: {r.error}" for r in failed)
    answers: dict[str, tuple[int | None, bool]] = {}
    for r in readings:
        if r.unlimited:
            answers[r.source] = (None, True)
            continue
        if r.limit is None or r.usage is None:
            return None, False, f"{r.source} gave no limit or usage"
        if r.limit < 0 or r.usage < 0:
            return (
                None,
                False,
                f"{r.source} reported a negative figure (limit {r.limit}, usage {r.usage})",
            )
        if r.usage > r.limit:
            return None, False, f"{r.source} reports usage {r.usage} above its limit {r.limit}"
        answers[r.source] = (r.limit - r.usage, False)
    distinct = set(answers.values())
    if len(distinct) > 1:
        said = ", ".join(
            f"{src}: {'unlimited' if unl else avail}"
            for src, (avail, unl) in sorted(answers.items())
        )
        return None, False, f"sources disagree on what is available ({said})"
    available, unlimited = distinct.pop()
    return available, unlimited, None


def _readings(sources: Sequence[QuotaSource], names: list[str]) -> dict[str, list[QuotaReading]]:
    """Every source's answer for each quota; a source that fails answers "unavailable"."""
    readings: dict[str, list[QuotaReading]] = {n: [] for n in names}
    for source in sources:
        try:
            got = source.read(names)
        except (NpaError, OSError) as exc:
            message = exc.message if isinstance(exc, NpaError) else str(exc)
            got = [
                QuotaReading(source=source.name, name=n, error=f"unavailable: {message}")
                for n in names
            ]
        for reading in got:
            if reading.name in readings:
                readings[reading.name].append(reading)
    return readings


def _line(
    req: QuotaRequirement,
    readings: list[QuotaReading],
    existing: Sequence[ExistingDisk],
    existing_problems: list[str],
) -> QuotaLine:
    """One requirement against its readings, after what already exists is deducted."""
    deducted = _deduction(req.name, existing) if not existing_problems else 0
    new = max(req.required - deducted, 0)
    available, unlimited, problem = _consensus(readings)
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
    existing: Sequence[ExistingDisk] = (),
) -> QuotaAssessment:
    """Compare what the plan needs with what the sources say is available."""
    readings = _readings(sources, [r.name for r in requirements])
    existing_problems = _existing_problems(needs, existing)
    problems: list[str] = list(existing_problems)
    lines = []
    for req in requirements:
        line = _line(req, readings[req.name], existing, existing_problems)
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
        sources=[s.name for s in sources],
        problems=problems,
    )
