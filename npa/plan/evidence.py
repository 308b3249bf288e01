"""Checking the proof that a resource exists before it is deducted from what a plan needs.

A claim (:class:`~npa.plan.quota.ExistingDisk`) names a role, a disk type, a size and a count,
and cites the state that proves it. One rule holds for every kind of proof: the state the proof
cites must record exactly the claimed disks (the same role, type, size and count), and what one
proof resolves to (a stack output, a resource in the state, a disk id) proves one claim only.
Two kinds of proof can be checked:

- ``{pulumi: {stack, output | resource}}``: npa reads the stack's state (its checkpoint) and
  resolves the proof to a disk record (:func:`resource_record`, :func:`output_record`): an
  output whose value is the id of a resource in that state (the nebius stack's
  ``agent_boot_disk_id``, ``cpu_node_group_id``, ``gpu_node_group_id``), an output that is
  itself a record of disks (``{id, role, size_gib, disk_type}``, or a list of them), or a
  resource the proof names by URN or name;
- ``{nebius_disk: ID}``: npa asks the Nebius compute API for the disk; it must be READY, in the
  plan's project, and one disk of the claimed size and type (the API records no npa role).

A proof whose stack, output, resource or disk is not there (or cannot be read, or is a resource
the state marks for deletion: :func:`leaving`) deducts nothing and the plan says why. A proof
that resolves to something other than the claim, or to what an earlier claim already used, is
refused (InvalidInput) with the claim, what the state records, and the edit that fixes it.
Evidence in words is "claimed, unproven", never deducted. The readers come in as parameters
(the pulumi state and the Nebius SDK live in adapters), so nothing here does I/O.
``provision-if-absent`` checks the disks its own refreshed state records with the same
:func:`check_existing`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from npa.core.commands import edit_command
from npa.core.errors import InvalidInput, NpaError
from npa.core.text import clipped, number, plural
from npa.plan.infra import GIB
from npa.plan.quota import (
    ExistingCheck,
    ExistingDisk,
    NebiusDiskProof,
    ProofStatus,
    PulumiOutputProof,
    PulumiOutputRef,
    QuotaScope,
    unproven,
)
from npa.spec.model import DiskType

# What `pulumi stack output --json` shows for a secret output.
SECRET = "[secret]"
# The key pulumi marks an encrypted value with in a checkpoint or an export.
_SECRET_SIG = "4dabf18193072939515e22adb298388d"
ROLES = ("agent", "cpu_node", "gpu_node")
# npa's nebius stack: the resources that hold disks, by type and name (stacks/nebius.py).
_NODE_GROUP = "mk8sV1NodeGroup:Mk8sV1NodeGroup"
_DISK = "computeV1Disk:ComputeV1Disk"
_GROUP_ROLES = {"cpu-nodes": "cpu_node", "gpu-nodes": "gpu_node"}
_AGENT_DISK = "agent-boot-disk"


@dataclass(frozen=True)
class DiskFacts:
    """What the provider says about one disk."""

    id: str
    project: str
    size_bytes: int
    disk_type: str
    state: str


@dataclass(frozen=True)
class StackState:
    """What a stack's state records: its outputs (a secret shows as ``[secret]``) and its
    resources (``urn``, ``type``, ``id``, ``outputs``, as in ``pulumi stack export``)."""

    outputs: dict[str, Any]
    resources: list[dict[str, Any]] = field(default_factory=list)


StateReader = Callable[[PulumiOutputRef], "StackState | None"]
"""The state of the stack ``ref`` names; None when the backend has no such stack. Raises
NpaError when the backend cannot be read."""
DiskReader = Callable[[str], "DiskFacts | None"]
"""The disk with this id; None when the provider says there is none. Raises NpaError when it
cannot be asked."""


@dataclass(frozen=True)
class Disks:
    """Disks of one kind: a role (None where the source records none), type, size, count."""

    role: str | None
    disk_type: str
    size_bytes: int
    count: int

    def text(self) -> str:
        size = (
            f"{number(self.size_bytes // GIB)} GiB"
            if self.size_bytes % GIB == 0
            else plural(self.size_bytes, "byte")
        )
        disks = f"{number(self.count)} x {size} {self.disk_type}"
        return f"{self.role}: {disks}" if self.role else f"{disks} (no role recorded)"


@dataclass(frozen=True)
class DiskRecord:
    """What a proof resolved to: the disks the cited state records there, where it records
    them, and the identities (resources, disk ids) that can prove no other claim."""

    disks: tuple[Disks, ...]
    where: str
    keys: frozenset[str]

    def text(self) -> str:
        return "; ".join(d.text() for d in self.disks) or "no disks"


def claimed(disk: ExistingDisk) -> Disks:
    return Disks(disk.role, disk.disk_type.value, disk.size_gib * GIB, disk.count)


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def resource_record(resource: dict[str, Any], place: str = "") -> DiskRecord | None:
    """The disks one resource of npa's nebius stack records (a node group's boot disks, the
    agent's disk), or None when the resource is not one of them or records no size or count.
    ``place`` prefixes the identity keys (the backend and stack)."""
    outputs = resource.get("outputs") or {}
    urn = str(resource.get("urn", ""))
    name = urn.rsplit("::", 1)[-1]
    kind = str(resource.get("type", ""))
    if kind.endswith(_NODE_GROUP) and name in _GROUP_ROLES:
        boot = ((outputs.get("template") or {}).get("bootDisk")) or {}
        size, count = _whole(boot.get("sizeGibibytes")), _whole(outputs.get("fixedNodeCount"))
        role, disk_type = _GROUP_ROLES[name], boot.get("type", DiskType.NETWORK_SSD.value)
    elif kind.endswith(_DISK) and name == _AGENT_DISK:
        size, count = _whole(outputs.get("sizeGibibytes")), 1
        role, disk_type = "agent", outputs.get("type", DiskType.NETWORK_SSD.value)
    else:
        return None
    if size is None or count is None or disk_type not in {t.value for t in DiskType}:
        return None
    keys = {f"resource {place}{urn}"}
    if resource.get("id"):
        keys.add(f"id {resource['id']}")
    return DiskRecord(
        disks=(Disks(role, str(disk_type), size * GIB, count),),
        where=f"resource {name} (id {resource.get('id')})",
        keys=frozenset(keys),
    )


def output_record(value: Any) -> DiskRecord | str:
    """An output that records disks itself: ``{id, role, size_gib, disk_type}`` for one disk,
    or a list of them (one entry per disk, each id once). The record, or why it is not one."""
    entries = value if isinstance(value, list) else [value]
    if not entries or not all(isinstance(e, dict) for e in entries):
        return "it is not a disk record ({id, role, size_gib, disk_type}, or a list of them)"
    counted: dict[tuple[str, str, int], int] = {}
    ids: list[str] = []
    for entry in entries:
        if set(entry) != {"id", "role", "size_gib", "disk_type"}:
            return f"entry {entry!r} must have exactly id, role, size_gib and disk_type"
        disk_id, size = entry["id"], _whole(entry["size_gib"])
        if not isinstance(disk_id, str) or not disk_id or disk_id in ids:
            return f"entry {entry!r} has no id, or an id another entry has"
        if entry["role"] not in ROLES or entry["disk_type"] not in {t.value for t in DiskType}:
            return f"entry {entry!r} names an unknown role or disk type"
        if size is None:
            return f"entry {entry!r} has no whole positive size_gib"
        ids.append(disk_id)
        kind = (entry["role"], entry["disk_type"], size * GIB)
        counted[kind] = counted.get(kind, 0) + 1
    return DiskRecord(
        disks=tuple(Disks(r, t, s, n) for (r, t, s), n in counted.items()),
        where="",
        keys=frozenset(f"id {i}" for i in ids),
    )


def leaving(resource: dict[str, Any]) -> bool:
    """Whether the state marks the resource for deletion (``delete: true``: a replaced
    resource a later update deletes, or one whose deletion was interrupted). Such a resource
    proves nothing: the disks it records are going, or already gone."""
    return resource.get("delete") is True


def state_from_deployment(deployment: dict[str, Any]) -> StackState:
    """A stack's state from its checkpoint (``deployment`` of ``pulumi stack export``): the root
    stack resource's outputs (an encrypted value as ``[secret]``) and every resource; a resource
    a pending ``deleting`` operation names is marked ``delete: true`` (see :func:`leaving`)."""
    going = {
        (str(op["resource"].get("urn")), str(op["resource"].get("id")))
        for op in deployment.get("pending_operations") or []
        if isinstance(op, dict)
        and op.get("type") == "deleting"
        and isinstance(op.get("resource"), dict)
    }
    resources = [
        {**r, "delete": True} if (str(r.get("urn")), str(r.get("id"))) in going else r
        for r in deployment.get("resources") or []
        if isinstance(r, dict)
    ]
    outputs: dict[str, Any] = {}
    for resource in resources:
        if resource.get("type") == "pulumi:pulumi:Stack" and not resource.get("parent"):
            outputs = _hide_secrets(resource.get("outputs") or {})
    return StackState(outputs=outputs, resources=resources)


def _hide_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        if _SECRET_SIG in value:
            return SECRET
        return {k: _hide_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hide_secrets(v) for v in value]
    return value


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _has_secret(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_secret(v) for v in value)
    return bool(value == SECRET)


@dataclass
class Finding:
    """What a proof resolved to: a record to compare with the claim, or a status (not
    deducted) and why."""

    record: DiskRecord | None = None
    status: ProofStatus = "refuted"
    detail: str = ""
    refused: str | None = None  # the proof resolved, but to nothing that can prove a disk


def _resolve_output(ref: PulumiOutputRef, state: StackState, where: str, place: str) -> Finding:
    assert ref.output is not None
    if ref.output not in state.outputs:
        have = ", ".join(sorted(state.outputs)) or "none"
        return Finding(detail=f"stack {ref.stack} has no output {ref.output} (it has: {have})")
    value = state.outputs[ref.output]
    if _empty(value):
        return Finding(detail=f"{where} is empty")
    if _has_secret(value):
        return Finding(status="unproven", detail=f"{where} is a secret npa cannot compare")
    if ref.value is not None and str(value) != ref.value:
        return Finding(detail=f"{where} is {_short(value)}, not {ref.value!r}")
    if not isinstance(value, str):
        return _listed(value, state, where, f"output {place}{ref.output}")
    matches = [r for r in state.resources if r.get("id") == value]
    if matches and all(leaving(r) for r in matches):
        return Finding(
            detail=f"{where} is {value!r}, and the stack's state marks {_going(matches)}"
        )
    matches = [r for r in matches if not leaving(r)]
    if len(matches) != 1:
        return Finding(
            refused=f"{where} is {value!r}, and the stack's state has "
            f"{'no resource' if not matches else f'{len(matches)} resources'} with that id, so "
            "nothing there records its size or count"
        )
    record = resource_record(matches[0], place)
    if record is None:
        return Finding(refused=f"{where} is {value!r}, the id of {_named(matches[0])}")
    return Finding(
        record=DiskRecord(
            record.disks,
            f"{where} = {value}, {record.where}",
            record.keys | {f"output {place}{ref.output}"},
        )
    )


def _listed(value: Any, state: StackState, where: str, key: str) -> Finding:
    """An output that records disks itself, checked against the state's resources."""
    listed = output_record(value)
    if isinstance(listed, str):
        return Finding(refused=f"{where} is {_short(value)}: {listed}")
    contradiction = _contradicted(value, state)
    if contradiction is not None:
        return Finding(refused=f"{where}: {contradiction}")
    return Finding(record=DiskRecord(listed.disks, where, listed.keys | {key}))


def _resolve_resource(ref: PulumiOutputRef, state: StackState, where: str, place: str) -> Finding:
    name = ref.resource
    matches = [
        r
        for r in state.resources
        if name in (r.get("urn"), str(r.get("urn", "")).rsplit("::", 1)[-1])
    ]
    if not matches:
        return Finding(detail=f"stack {ref.stack} records no resource {name}")
    if all(leaving(r) for r in matches):
        return Finding(detail=f"the state of stack {ref.stack} marks {_going(matches)}")
    matches = [r for r in matches if not leaving(r)]  # a replaced resource shares the URN
    if len(matches) > 1:
        return Finding(detail=f"{len(matches)} resources of stack {ref.stack} are named {name}")
    if ref.value is not None and matches[0].get("id") != ref.value:
        return Finding(detail=f"{where} has id {matches[0].get('id')!r}, not {ref.value!r}")
    record = resource_record(matches[0], place)
    if record is None:
        return Finding(refused=f"{where} is {_named(matches[0])}")
    return Finding(record=DiskRecord(record.disks, f"{where}, {record.where}", record.keys))


def _going(resources: list[dict[str, Any]]) -> str:
    names = ", ".join(sorted({str(r.get("urn", "")).rsplit("::", 1)[-1] for r in resources}))
    return f"{names} for deletion, so it proves no disk that will stay"


def _contradicted(value: Any, state: StackState) -> str | None:
    """Why a disk record (checked by :func:`output_record`) disagrees with the same state's
    resources: an entry whose id is a resource there that records other disks (or is marked
    for deletion). None when the state agrees or records nothing under those ids."""
    for entry in value if isinstance(value, list) else [value]:
        found = [r for r in state.resources if r.get("id") == entry["id"]]
        if not found:
            continue
        if all(leaving(r) for r in found):
            return f"entry {entry['id']} is a resource the state marks for deletion"
        record = resource_record(next(r for r in found if not leaving(r)))
        one = Disks(entry["role"], entry["disk_type"], entry["size_gib"] * GIB, 1)
        if record is None or record.disks != (one,):
            got = record.text() if record is not None else "no disk"
            return (
                f"entry {entry['id']} says {one.text()}, but the state's resource with that id "
                f"records {got}"
            )
    return None


def _named(resource: dict[str, Any]) -> str:
    urn = str(resource.get("urn", ""))
    return (
        f"{urn.rsplit('::', 1)[-1]} ({resource.get('type')}), which records no disk size and "
        "count npa can read (npa reads the agent-boot-disk disk and the cpu-nodes and "
        "gpu-nodes node groups)"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return clipped(text, 120)


class _Reads:
    """The states read so far: a stack is read once however often it is cited."""

    def __init__(self, read: StateReader) -> None:
        self.read = read
        self.cache: dict[tuple[str | None, str], StackState | None] = {}

    def state(self, ref: PulumiOutputRef) -> StackState | None:
        key = (ref.backend, ref.stack)
        if key not in self.cache:
            self.cache[key] = self.read(ref)
        return self.cache[key]


def _pulumi(ref: PulumiOutputRef, reads: _Reads) -> Finding:
    cited = f"output {ref.output}" if ref.output is not None else f"resource {ref.resource}"
    where = f"pulumi stack {ref.stack} {cited}"
    backend = f"backend {ref.backend}" if ref.backend else "npa's backend"
    try:
        state = reads.state(ref)
    except NpaError as error:
        return Finding(
            status="unavailable",
            detail=f"{where} could not be read from {backend} ({error.message})",
        )
    if state is None:
        return Finding(detail=f"no stack {ref.stack} in {backend}")
    place = f"{ref.backend or ''}|{ref.stack}|"
    if ref.output is not None:
        return _resolve_output(ref, state, where, place)
    return _resolve_resource(ref, state, where, place)


def _nebius(disk_id: str, scope: QuotaScope, read: DiskReader | None) -> Finding:
    where = f"nebius disk {disk_id}"
    if read is None:
        return Finding(status="unavailable", detail=f"{where}: no Nebius API client")
    try:
        facts = read(disk_id)
    except NpaError as error:
        return Finding(
            status="unavailable",
            detail=f"{where}: the compute API could not be asked ({error.message})",
        )
    if facts is None:
        return Finding(detail=f"{where}: the compute API says there is no such disk")
    if facts.state != "READY":
        return Finding(detail=f"{where}: its state is {facts.state}, not READY")
    if scope.project is None:
        return Finding(
            status="unproven",
            detail=f"{where}: it is in project {facts.project}, and the plan names no project "
            "to compare (--nebius-project)",
        )
    if facts.project != scope.project:
        return Finding(detail=f"{where}: it is in project {facts.project}, not {scope.project}")
    return Finding(
        record=DiskRecord(
            disks=(Disks(None, facts.disk_type, facts.size_bytes, 1),),
            where=f"{where}, READY in {facts.project}",
            keys=frozenset({f"id {disk_id}"}),
        )
    )


def proves(record: DiskRecord, disk: ExistingDisk) -> bool:
    """Whether the record is exactly the claimed disks: one kind of disk, of the claim's type,
    size and count, and of its role wherever the source records one."""
    if len(record.disks) != 1:
        return False
    (got,) = record.disks
    want = claimed(disk)
    return (got.role in (None, want.role)) and (got.disk_type, got.size_bytes, got.count) == (
        want.disk_type,
        want.size_bytes,
        want.count,
    )


def _edit_for(label: str, disk: ExistingDisk, record: DiskRecord | None) -> str:
    """The edit that makes the claim true: what the state records, when that is one kind of
    disk with a role, else a proof that records exactly the claim."""
    other = f"cite the output or resource that records exactly the {disk.role} disks claimed"
    if record is not None and len(record.disks) == 1 and record.disks[0].role is not None:
        (got,) = record.disks
        return (
            f"{label}: role: {got.role}, disk_type: {got.disk_type}, size_gib: "
            f"{got.size_bytes // GIB}, count: {got.count} (what its proof records), or {other}, "
            "or remove the claim"
        )
    return f"{label}: {other}, or remove the claim"


# Claims that came from no file the user can open (a target's own list).
NO_FILE = "the --existing file"


@dataclass
class _Refusal:
    label: str
    claim: ExistingDisk
    why: str
    edit: str


def check_existing(
    claims: Sequence[ExistingDisk],
    scope: QuotaScope,
    *,
    read_state: StateReader,
    read_disk: DiskReader | None = None,
    origin: str = NO_FILE,
) -> list[ExistingCheck]:
    """Each claim with what its proof showed; only ``proven`` is ever deducted. Raises
    InvalidInput, listing every such claim, when a proof resolves to disks other than the
    claimed ones or to what an earlier claim's proof already resolved to. ``origin`` names
    where the claims were written (the file to edit)."""
    reads = _Reads(read_state)
    used: dict[str, str] = {}
    checks: list[ExistingCheck] = []
    refusals: list[_Refusal] = []
    for index, disk in enumerate(claims):
        evidence = disk.evidence
        if isinstance(evidence, PulumiOutputProof):
            found = _pulumi(evidence.pulumi, reads)
        elif isinstance(evidence, NebiusDiskProof):
            found = _nebius(evidence.nebius_disk, scope, read_disk)
        else:
            checks.append(unproven(disk))
            continue
        check, refusal = _judge(f"existing[{index}]", disk, found, used)
        checks.append(check)
        if refusal is not None and isinstance(evidence, PulumiOutputProof):
            better = _proving_output(evidence.pulumi, reads, disk, used)
            if better is not None:
                refusal.edit = (
                    f"{refusal.label}: cite output {better} of stack {evidence.pulumi.stack}, "
                    f"which records exactly the {disk.role} disks claimed"
                )
        refusals += [refusal] if refusal else []
    if refusals:
        raise _refused(refusals, origin)
    return checks


def _proving_output(
    ref: PulumiOutputRef, reads: _Reads, disk: ExistingDisk, used: dict[str, str]
) -> str | None:
    """An output of the cited stack that proves exactly this claim and no earlier one: the
    proof the claim should have cited, if the stack has one."""
    state = reads.cache.get((ref.backend, ref.stack))
    if state is None:
        return None
    for name in sorted(state.outputs):
        other = ref.model_copy(update={"output": name, "resource": None, "value": None})
        record = _resolve_output(other, state, "", f"{ref.backend or ''}|{ref.stack}|").record
        if record is not None and proves(record, disk) and not record.keys & set(used):
            return name
    return None


def _judge(
    label: str, disk: ExistingDisk, found: Finding, used: dict[str, str]
) -> tuple[ExistingCheck, _Refusal | None]:
    """The claim's check (and its refusal, if any): proven only when the record is exactly
    the claim and none of its identities proved an earlier claim (``used``, updated here)."""
    record = found.record
    why, edit = found.refused, _edit_for(label, disk, None)
    if record is not None:
        earlier = sorted({used[k] for k in record.keys if k in used})
        if earlier:
            why = f"{record.where}, which already proves {', '.join(earlier)}"
        elif not proves(record, disk):
            why, edit = f"{record.where} records {record.text()}", _edit_for(label, disk, record)
        used.update({k: label for k in record.keys if k not in used})
    if why is not None:
        check = ExistingCheck(disk=disk, status="refuted", detail=f"{why}: refused")
        return check, _Refusal(label, disk, why, edit)
    if record is not None:
        detail = f"{record.where}: {record.text()}"
        return ExistingCheck(disk=disk, status="proven", detail=detail), None
    detail = f"{found.detail}: not deducted"
    return ExistingCheck(disk=disk, status=found.status, detail=detail), None


def _refused(refusals: list[_Refusal], origin: str) -> InvalidInput:
    parts = [f"{r.label} ({claimed(r.claim).text()}): {r.why}" for r in refusals]
    # The edits go in a comment: the command opens the file (when the claims came from one).
    edits = "  # " + "; ".join(r.edit for r in refusals)
    return InvalidInput(
        f"{origin}: a proof must prove exactly the disks its claim names, and one proof proves "
        "one claim; " + "; ".join(parts),
        fix=None if origin == NO_FILE else edit_command(origin) + edits,
        details={
            "refused": [
                {"claim": r.label, "claimed": claimed(r.claim).text(), "why": r.why}
                for r in refusals
            ]
        },
    )
