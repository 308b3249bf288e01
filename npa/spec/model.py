"""The workflow spec (``apiVersion: npa/v1``, ``kind: Workflow``) as pydantic models.

The models check the shape of each field (types, ranges, name syntax). Rules that need the
whole document (references between stages, cycles, duplicates) live in
:mod:`npa.spec.validate`, which runs after these models and reports every problem at once.
Unknown keys are rejected everywhere so a misspelt field is an error, not a silent default.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

API_VERSION = "npa/v1"
KIND = "Workflow"

# DNS-1123 label: what Kubernetes accepts as a name; the workflow and stage names end up in
# job and pod names.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# Tool refs, input and output names become parts of environment variable names.
IDENT = r"^[a-z][a-z0-9_]{0,62}$"
TOOL_REF = r"^[a-z][a-z0-9_-]{0,62}$"
ACCELERATOR = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_.-]{0,63}):(?P<count>[1-9][0-9]{0,2})$")
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# Object-store URIs a stage may read from directly.
URI = re.compile(r"^(s3|gs|r2|file)://[^\s]+$")

DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL)]
Ident = Annotated[str, StringConstraints(pattern=IDENT)]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]
GiB = Annotated[int, Field(ge=1, le=1_048_576, description="Whole GiB (2^30 bytes).")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Metadata(_Strict):
    """Identity of the workflow."""

    name: DnsLabel = Field(description="Workflow identity; a DNS-1123 label (e.g. physical-ai).")
    description: str | None = Field(default=None, description="Free text for humans.")
    labels: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._/-]{1,63}$")], str] = (
        Field(default_factory=dict, description="Key/value labels copied onto run records.")
    )


class Storage(_Strict):
    """Where runs of this workflow keep their data."""

    uri: str = Field(
        description=(
            "Object-store prefix (s3://bucket/prefix or file:///path). A run's prefix is "
            "<uri>/<workflow>/<run-id>."
        )
    )

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        if not URI.fullmatch(value):
            raise ValueError("must be an object-store URI such as s3://bucket/prefix")
        return value.rstrip("/")


class ToolBuild(_Strict):
    """How to build a tool's image when the registry does not have it."""

    context: NonEmpty = Field(description="Build context directory, relative to the spec.")
    dockerfile: NonEmpty = Field(default="Dockerfile", description="Dockerfile inside context.")


class ImageContract(_Strict):
    """The user the image is built to run as; rendered into the pod securityContext."""

    run_as_user: int = Field(default=1000, ge=1, le=2_147_483_647, description="Non-root UID.")
    run_as_group: int = Field(default=1000, ge=0, le=2_147_483_647, description="GID.")
    fs_group: int = Field(default=1000, ge=0, le=2_147_483_647, description="Volume group.")


class Tool(_Strict):
    """A container image a stage runs, referred to by its TOOL_REF (the key in ``tools``)."""

    image: NonEmpty = Field(
        description=(
            "Image reference: registry/repo:tag or registry/repo@sha256:<digest>. Render needs "
            "a digest, from the reference itself or from --digests."
        )
    )
    build: ToolBuild | None = Field(default=None, description="Build info for a missing image.")
    contract: ImageContract = Field(
        default_factory=ImageContract, description="Declared user of the image."
    )

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if any(c.isspace() for c in value):
            raise ValueError("an image reference cannot contain whitespace")
        return value


class Input(_Strict):
    """Data a stage reads: an object-store URI, or another stage's declared output."""

    name: Ident = Field(description="Input name; exposed as $NPA_INPUT_<NAME>.")
    uri: str | None = Field(default=None, description="Object-store URI to read.")
    from_: str | None = Field(
        default=None,
        alias="from",
        description="<stage>.<output> of an upstream stage (adds the dependency).",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class OutputKind(StrEnum):
    FILE = "file"
    PREFIX = "prefix"


class Output(_Strict):
    """Something a stage promises to write under its outputs prefix; it must exist and be
    non-empty when the stage succeeds."""

    name: Ident = Field(description="Output name; exposed as $NPA_OUTPUT_<NAME>.")
    path: NonEmpty = Field(
        description="Path under the stage's outputs prefix (e.g. curated/clips/)."
    )
    kind: OutputKind = Field(default=OutputKind.PREFIX, description="file or prefix.")


class Resources(_Strict):
    """What one task of the stage needs."""

    accelerators: str | None = Field(default=None, description="NAME:N, e.g. H100:8.")
    cpus: float | None = Field(default=None, gt=0, le=1024, description="vCPUs (minimum).")
    memory_gib: float | None = Field(default=None, gt=0, le=65536, description="Memory in GiB.")
    disk_gib: GiB | None = Field(default=None, description="Local disk of the task in GiB.")


class Waves(_Strict):
    """How a stage's work is split: ``shards`` pieces, ``parallel`` of them at a time."""

    shards: int = Field(default=1, ge=1, le=100_000, description="Number of shards.")
    parallel: int = Field(default=1, ge=1, le=10_000, description="Shards running at once.")


class Checkpoint(_Strict):
    """Mid-stage resume: where the stage keeps checkpoints and what loads them."""

    path: NonEmpty = Field(description="Checkpoint path under the stage's checkpoints prefix.")
    loader: NonEmpty = Field(description="Command that resumes from $NPA_CHECKPOINT_URI.")


class Stage(_Strict):
    """One step of the workflow."""

    name: DnsLabel = Field(description="Stage name; a DNS-1123 label, unique in the workflow.")
    tool: str = Field(description="TOOL_REF of the image this stage runs.")
    command: NonEmpty = Field(description="Shell command run in the container.")
    env: dict[Annotated[str, StringConstraints(pattern=ENV_NAME)], str] = Field(
        default_factory=dict, description="Extra environment variables (NPA_* is reserved)."
    )
    inputs: list[Input] = Field(default_factory=list, description="Data the stage reads.")
    outputs: list[Output] = Field(default_factory=list, description="Data the stage writes.")
    resources: Resources = Field(default_factory=Resources, description="Per-task resources.")
    waves: Waves = Field(default_factory=Waves, description="Sharding and concurrency.")
    depends_on: list[str] = Field(default_factory=list, description="Stages that run before.")
    retries: int = Field(default=0, ge=0, le=100, description="Restarts after a failure.")
    checkpoint: Checkpoint | None = Field(default=None, description="Mid-stage resume.")


class DiskType(StrEnum):
    NETWORK_SSD = "NETWORK_SSD"
    NETWORK_HDD = "NETWORK_HDD"
    NETWORK_SSD_NON_REPLICATED = "NETWORK_SSD_NON_REPLICATED"
    NETWORK_SSD_IO_M3 = "NETWORK_SSD_IO_M3"


class AgentInfra(_Strict):
    """The VM that drives runs (SkyPilot API server and controller)."""

    disk_gib: GiB = Field(default=100, description="Root disk size.")
    disk_type: DiskType = Field(default=DiskType.NETWORK_SSD, description="Root disk type.")


class NodeGroup(_Strict):
    count: int = Field(ge=0, le=1000, description="Number of nodes.")
    disk_gib: GiB = Field(description="Boot disk per node.")
    disk_type: DiskType = Field(default=DiskType.NETWORK_SSD, description="Boot disk type.")


class CpuNodes(NodeGroup):
    """The CPU node group of the cluster."""

    count: int = Field(default=1, ge=0, le=1000, description="Number of nodes.")
    disk_gib: GiB = Field(default=128, description="Boot disk per node.")


class GpuNodes(NodeGroup):
    """The GPU node group of the cluster."""

    count: int = Field(default=1, ge=0, le=1000, description="Number of nodes.")
    disk_gib: GiB = Field(default=1023, description="Boot disk per node.")
    accelerators: str = Field(default="H100:8", description="GPUs per node, NAME:N.")


class Infrastructure(_Strict):
    """The cluster shape the workflow needs; the quota arithmetic is computed from it."""

    context: str | None = Field(
        default=None, description="Kubernetes context; render writes resources.infra k8s/<it>."
    )
    region: str | None = Field(default=None, description="Cloud region of the quotas.")
    agent: AgentInfra = Field(default_factory=AgentInfra)
    cpu_nodes: CpuNodes = Field(default_factory=CpuNodes)
    gpu_nodes: GpuNodes = Field(default_factory=GpuNodes)


class Workflow(_Strict):
    """A whole workflow spec."""

    apiVersion: Literal["npa/v1"] = Field(description="Always npa/v1.")
    kind: Literal["Workflow"] = Field(description="Always Workflow.")
    metadata: Metadata
    storage: Storage | None = Field(default=None, description="Where run data lives.")
    tools: dict[Annotated[str, StringConstraints(pattern=TOOL_REF)], Tool] = Field(
        description="Images by TOOL_REF."
    )
    stages: list[Stage] = Field(min_length=1, description="The steps, in any order.")
    infrastructure: Infrastructure = Field(default_factory=Infrastructure)

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)


def parse_accelerators(value: str) -> tuple[str, int] | None:
    """``"H100:8"`` -> ``("H100", 8)``; ``None`` when the syntax is wrong."""
    match = ACCELERATOR.fullmatch(value)
    if not match:
        return None
    return match.group("name"), int(match.group("count"))


def env_suffix(name: str) -> str:
    """The environment-variable form of an input/output name."""
    return name.upper()
