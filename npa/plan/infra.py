"""The infrastructure a workflow needs, and the quota lines it turns into.

Quota names follow Nebius' allowance names: disk capacity per disk type is a byte allowance
(``compute.disk.size.network-ssd``) and the number of disks is a separate count allowance
(``compute.disk.count``). Sizes are exact integers; GiB = 2^30 bytes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from npa.spec.model import DiskType, Infrastructure, NodeGroup, Workflow

GIB = 2**30
DISK_COUNT = "compute.disk.count"
LOCAL_STORE_SIZE = "local.store.size"
# Where the nebius target builds when neither --nebius-region nor infrastructure.region says.
DEFAULT_REGION = "eu-north1"

Role = Literal["agent", "cpu_node", "gpu_node"]
Unit = Literal["bytes", "count"]


class DiskNeed(BaseModel):
    """Disks of one role the cluster needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    count: int
    size_gib: int
    disk_type: DiskType

    @property
    def quota_name(self) -> str:
        return disk_size_quota(self.disk_type)


class QuotaRequirement(BaseModel):
    """How much of one quota a plan needs in total (before deducting what exists)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    unit: Unit
    required: int


def disk_size_quota(disk_type: DiskType) -> str:
    """``NETWORK_SSD`` -> ``compute.disk.size.network-ssd``."""
    return "compute.disk.size." + disk_type.value.lower().replace("_", "-")


def known_quotas() -> list[str]:
    """Every quota name npa can require: evidence naming anything else is misspelt."""
    return sorted({disk_size_quota(t) for t in DiskType} | {DISK_COUNT, LOCAL_STORE_SIZE})


def build_region(infra: Infrastructure, flag: str | None = None) -> str:
    """The region the nebius target builds in (``--nebius-region``, else the spec's, else the
    default): quota evidence counts only for this region."""
    return flag or infra.region or DEFAULT_REGION


def disk_needs(infra: Infrastructure) -> list[DiskNeed]:
    """Agent root disk, then the CPU and GPU node boot disks (groups with no nodes omitted)."""
    needs = [
        DiskNeed(
            role="agent", count=1, size_gib=infra.agent.disk_gib, disk_type=infra.agent.disk_type
        )
    ]
    groups: list[tuple[Role, NodeGroup]] = [
        ("cpu_node", infra.cpu_nodes),
        ("gpu_node", infra.gpu_nodes),
    ]
    for role, group in groups:
        if group.count:
            needs.append(
                DiskNeed(
                    role=role, count=group.count, size_gib=group.disk_gib, disk_type=group.disk_type
                )
            )
    return needs


def cluster_requirements(needs: list[DiskNeed]) -> list[QuotaRequirement]:
    """Byte allowance per disk type, then the disk count."""
    by_quota: dict[str, int] = {}
    for need in needs:
        by_quota[need.quota_name] = (
            by_quota.get(need.quota_name, 0) + need.count * need.size_gib * GIB
        )
    lines = [
        QuotaRequirement(name=n, unit="bytes", required=b) for n, b in sorted(by_quota.items())
    ]
    lines.append(
        QuotaRequirement(name=DISK_COUNT, unit="count", required=sum(n.count for n in needs))
    )
    return lines


def local_requirements(workflow: Workflow) -> list[QuotaRequirement]:
    """The local target keeps every stage's data in the store: each stage may use its disk_gib
    once per concurrently running shard."""
    total = sum((s.resources.disk_gib or 0) * s.waves.parallel for s in workflow.stages)
    return [QuotaRequirement(name=LOCAL_STORE_SIZE, unit="bytes", required=total * GIB)]
