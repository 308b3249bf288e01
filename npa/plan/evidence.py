"""Checking the proof that a resource exists before it is deducted from what a plan needs.

A claim (:class:`~npa.plan.quota.ExistingDisk`) carries its evidence as written. Only two
kinds can be checked, and are:

- ``{pulumi: {stack, output}}``: npa reads the stack's outputs back (the pulumi CLI against
  the named state backend); the output must be there, non-empty, and equal ``value`` if given;
- ``{nebius_disk: ID}``: npa asks the Nebius compute API for the disk; it must be READY, in
  the plan's project, and of the claimed size and type.

Anything else is a claim in words: "claimed, unproven", never deducted. The readers come in as
parameters (the pulumi CLI and the Nebius SDK live in adapters), so nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from npa.core.errors import NpaError
from npa.plan.infra import GIB
from npa.plan.quota import (
    ExistingCheck,
    ExistingDisk,
    NebiusDiskProof,
    PulumiOutputProof,
    PulumiOutputRef,
    QuotaScope,
    unproven,
)

# What `pulumi stack output --json` shows for a secret output.
SECRET = "[secret]"


@dataclass(frozen=True)
class DiskFacts:
    """What the provider says about one disk."""

    id: str
    project: str
    size_bytes: int
    disk_type: str
    state: str


OutputReader = Callable[[PulumiOutputRef], "dict[str, Any] | None"]
"""The outputs of the stack ``ref`` names; None when the backend has no such stack. Raises
NpaError when the backend cannot be read."""
DiskReader = Callable[[str], "DiskFacts | None"]
"""The disk with this id; None when the provider says there is none. Raises NpaError when it
cannot be asked."""


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _pulumi(
    disk: ExistingDisk,
    ref: PulumiOutputRef,
    read: OutputReader,
    cache: dict[tuple[str | None, str], dict[str, Any] | None],
) -> ExistingCheck:
    where = f"pulumi stack {ref.stack} output {ref.output}"
    backend = f"backend {ref.backend}" if ref.backend else "npa's backend"
    key = (ref.backend, ref.stack)
    try:
        if key not in cache:
            cache[key] = read(ref)
        outputs = cache[key]
    except NpaError as error:
        return ExistingCheck(
            disk=disk,
            status="unavailable",
            detail=f"{where} could not be read from {backend} ({error.message}): not deducted",
        )
    if outputs is None:
        return ExistingCheck(
            disk=disk, status="refuted", detail=f"no stack {ref.stack} in {backend}: not deducted"
        )
    if ref.output not in outputs:
        have = ", ".join(sorted(outputs)) or "none"
        return ExistingCheck(
            disk=disk,
            status="refuted",
            detail=f"stack {ref.stack} has no output {ref.output} (it has: {have}): not deducted",
        )
    value = outputs[ref.output]
    if _empty(value):
        return ExistingCheck(disk=disk, status="refuted", detail=f"{where} is empty: not deducted")
    if ref.value is not None:
        if value == SECRET:
            return ExistingCheck(
                disk=disk,
                status="unproven",
                detail=f"{where} is a secret, so it cannot be compared with {ref.value!r}: "
                "not deducted",
            )
        if str(value) != ref.value:
            return ExistingCheck(
                disk=disk,
                status="refuted",
                detail=f"{where} is {value!r}, not {ref.value!r}: not deducted",
            )
    shown = value if value == SECRET or len(str(value)) <= 80 else f"{str(value)[:77]}..."
    return ExistingCheck(
        disk=disk, status="proven", detail=f"{where} = {shown} (read back from {backend})"
    )


def _nebius(
    disk: ExistingDisk, disk_id: str, scope: QuotaScope, read: DiskReader | None
) -> ExistingCheck:
    def verdict(status: Any, why: str) -> ExistingCheck:
        return ExistingCheck(disk=disk, status=status, detail=f"nebius disk {disk_id}: {why}")

    if disk.count != 1:
        return verdict("refuted", f"one disk id proves one disk, not {disk.count}: not deducted")
    if read is None:
        return verdict("unavailable", "no Nebius API client: not deducted")
    try:
        facts = read(disk_id)
    except NpaError as error:
        return verdict("unavailable", f"the compute API could not be asked ({error.message})")
    if facts is None:
        return verdict("refuted", "the compute API says there is no such disk: not deducted")
    if facts.state != "READY":
        return verdict("refuted", f"its state is {facts.state}, not READY: not deducted")
    if scope.project is None:
        return verdict(
            "unproven",
            f"it is in project {facts.project}, and the plan names no project to compare "
            "(--nebius-project): not deducted",
        )
    if facts.project != scope.project:
        return verdict(
            "refuted", f"it is in project {facts.project}, not {scope.project}: not deducted"
        )
    if facts.size_bytes != disk.size_gib * GIB:
        return verdict(
            "refuted",
            f"it is {facts.size_bytes} bytes, not {disk.size_gib} GiB: not deducted",
        )
    if facts.disk_type != disk.disk_type.value:
        return verdict(
            "refuted", f"it is {facts.disk_type}, not {disk.disk_type.value}: not deducted"
        )
    return verdict("proven", f"READY in {facts.project}, {disk.size_gib} GiB {facts.disk_type}")


def check_existing(
    claims: Sequence[ExistingDisk],
    scope: QuotaScope,
    *,
    read_outputs: OutputReader,
    read_disk: DiskReader | None = None,
) -> list[ExistingCheck]:
    """Each claim with what its proof showed; a stack is read once however often it is named."""
    cache: dict[tuple[str | None, str], dict[str, Any] | None] = {}
    checks = []
    for disk in claims:
        evidence = disk.evidence
        if isinstance(evidence, PulumiOutputProof):
            checks.append(_pulumi(disk, evidence.pulumi, read_outputs, cache))
        elif isinstance(evidence, NebiusDiskProof):
            checks.append(_nebius(disk, evidence.nebius_disk, scope, read_disk))
        else:
            checks.append(unproven(disk))
    return checks
