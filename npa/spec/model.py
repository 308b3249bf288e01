"""The workflow spec (``apiVersion: npa/v1``, ``kind: Workflow``) as pydantic models.

These models are the one definition of the spec: ``validate-spec`` validates with them and
``schema`` prints their JSON Schema, so an editor and npa cannot disagree about a field's type
or syntax. They validate in strict mode (``shards: "2"`` is a string, not a number, in both) and
carry every rule that one field can decide on its own (syntax, ranges, paths that must stay under
the run prefix), so a document with several problems in one stage gets all of them reported.
Rules that need the whole document (references between stages and tools, cycles, duplicates,
accelerator fit) live in :mod:`npa.spec.validate`. Unknown keys are rejected everywhere so a
misspelt field is an error, not a silent default.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from npa.core.paths import context_problem
from npa.spec import imageref

API_VERSION = "npa/v1"
KIND = "Workflow"
RULE_ERROR = "npa_rule"

# Patterns are written for three regex engines at once (pydantic's, Python's, an editor's
# ECMAScript one): anchored, ASCII classes only, no lookaround.
# DNS-1123 label: what Kubernetes accepts as a name; the workflow and stage names end up in
# job and pod names.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# Tool refs, input and output names become parts of environment variable names.
IDENT = r"^[a-z][a-z0-9_]{0,62}$"
TOOL_REF = r"^[a-z][a-z0-9_-]{0,62}$"
ACCELERATORS = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}:[1-9][0-9]{0,2}$"
ACCELERATOR = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_.-]{0,63}):(?P<count>[1-9][0-9]{0,2})$")
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
LABEL_KEY = r"^[A-Za-z0-9._/-]{1,63}$"
# Kube contexts become path components (clusters/<context>/kubeconfig).
# Object-store URIs: a scheme npa or SkyPilot can read, then printable ASCII without spaces
# (anything else is percent-encoded, as in any URI).
STORE_URI = r"^(s3|gs|r2|file)://[!-~]+$"
URI = re.compile(STORE_URI)


CONTEXT_HINT = "name a context of `kubectl config get-contexts -o name`"
# An input's one rule across its fields (the model and the validator's raw pass both check it).
ONE_SOURCE = ("an input needs exactly one of 'uri' or 'from'", "keep one of the two")


def rule_error(message: str, hint: str) -> PydanticCustomError:
    """A spec rule broken: the message and hint reach the user as they are."""
    return PydanticCustomError(RULE_ERROR, "{message}", {"message": message, "hint": hint})


def _whole_number(value: Any) -> Any:
    """``2.0`` is the number 2 in YAML and in JSON Schema ("integer"); strings never are."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_whole_number)]
DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL)]
Ident = Annotated[str, StringConstraints(pattern=IDENT)]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]
GiB = Annotated[Int, Field(ge=1, le=1_048_576, description="Whole GiB (2^30 bytes).")]
StoreUri = Annotated[str, StringConstraints(pattern=STORE_URI, max_length=2048)]
ImageReference = Annotated[
    str, StringConstraints(pattern=imageref.PATTERN, max_length=imageref.MAX_LENGTH)
]


def relative_path_problem(value: str) -> str | None:
    """Why ``value`` cannot be a path under the run prefix, or None if it can."""
    if value.startswith("/"):
        return "is absolute; it must be relative to the run prefix"
    if "://" in value:
        return "is a URI; outputs and checkpoints live under the run prefix, give a relative path"
    if "\\" in value:
        return "contains a backslash"
    parts = value.rstrip("/").split("/")
    if any(p in {"", ".", ".."} for p in parts):
        return "contains an empty, '.' or '..' segment, which could escape the run prefix"
    if any(not p.isprintable() or p != p.strip() for p in parts):
        return "contains whitespace at a segment edge or an unprintable character"
    return None


def store_uri_problem(value: str) -> str | None:
    """Why ``value`` is not an object-store URI npa accepts, or None. Used for ``storage.uri``,
    input URIs and ``render --store-uri`` alike."""
    if not URI.fullmatch(value):
        return "is not an object-store URI (s3://, gs://, r2:// or file:///) in printable ASCII"
    rest = value.split("://", 1)[1]
    if value.startswith("file://") and not rest.startswith("/"):
        return "is a file:// URI without an absolute path (file:///abs/path)"
    if not value.startswith("file://") and not rest.split("/", 1)[0]:
        return "names no bucket"
    if any(p in {".", ".."} for p in rest.split("/")):
        return "contains a '.' or '..' segment"
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Metadata(_Strict):
    """Identity of the workflow."""

    name: DnsLabel = Field(description="Workflow identity; a DNS-1123 label (e.g. physical-ai).")
    description: str | None = Field(default=None, description="Free text for humans.")
    labels: dict[Annotated[str, StringConstraints(pattern=LABEL_KEY)], str] = Field(
        default_factory=dict, description="Key/value labels copied onto run records."
    )


class Storage(_Strict):
    """Where runs of this workflow keep their data."""

    uri: StoreUri = Field(
        description=(
            "Object-store prefix (s3://bucket/prefix or file:///path). A run's prefix is "
            "<uri>/<workflow>/<run-id>."
        )
    )

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        problem = store_uri_problem(value)
        if problem:
            raise rule_error(f"{value!r} {problem}", "e.g. s3://bucket/prefix")
        return value.rstrip("/")


class ToolBuild(_Strict):
    """How to build a tool's image when the registry does not have it."""

    context: NonEmpty = Field(description="Build context directory, relative to the spec.")
    dockerfile: NonEmpty = Field(default="Dockerfile", description="Dockerfile inside context.")


class ImageContract(_Strict):
    """The user the image is built to run as; rendered into the pod securityContext."""

    run_as_user: Int = Field(default=1000, ge=1, le=2_147_483_647, description="Non-root UID.")
    run_as_group: Int = Field(default=1000, ge=0, le=2_147_483_647, description="GID.")
    fs_group: Int = Field(default=1000, ge=0, le=2_147_483_647, description="Volume group.")


class Tool(_Strict):
    """A container image a stage runs, referred to by its TOOL_REF (the key in ``tools``)."""

    image: Annotated[
        str, StringConstraints(pattern=imageref.PATTERN, max_length=imageref.MAX_LENGTH)
    ] = Field(
        description=(
            "Image reference: registry/repo:tag or registry/repo@sha256:<digest>. Render needs "
            "a digest, from the reference itself or from --digests."
        )
    )
    build: ToolBuild | None = Field(default=None, description="Build info for a missing image.")
    contract: ImageContract = Field(
        default_factory=ImageContract, description="Declared user of the image."
    )


# The spec's tools section, by TOOL_REF; also validated alone where the rest of a spec is not.
ToolMap = dict[Annotated[str, StringConstraints(pattern=TOOL_REF)], Tool]


class Input(_Strict):
    """Data a stage reads: an object-store URI, or another stage's declared output."""

    name: Ident = Field(description="Input name; exposed as $NPA_INPUT_<NAME>.")
    uri: StoreUri | None = Field(default=None, description="Object-store URI to read.")
    from_: str | None = Field(
        default=None,
        alias="from",
        description="<stage>.<output> of an upstream stage (adds the dependency).",
    )

    # Written "from" in a spec; "from_" is only the Python name, never accepted as a key.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        problem = None if value is None else store_uri_problem(value)
        if problem:
            raise rule_error(f"{value!r} {problem}", "e.g. s3://bucket/raw/")
        return value

    @field_validator("from_")
    @classmethod
    def _from(cls, value: str | None) -> str | None:
        if value is not None:
            src, _, output = value.partition(".")
            if not src or not output:
                raise rule_error(
                    f"{value!r} is not <stage>.<output>",
                    "name the upstream stage and one of its outputs, e.g. curate.clips",
                )
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Input:
        if (self.uri is None) == (self.from_ is None):
            raise rule_error(*ONE_SOURCE)
        return self


class OutputKind(StrEnum):
    FILE = "file"
    PREFIX = "prefix"


def _relative(value: str, example: str) -> str:
    problem = relative_path_problem(value)
    if problem:
        raise rule_error(f"{value!r} {problem}", f"e.g. {example}")
    return value


class Output(_Strict):
    """Something a stage promises to write under its outputs prefix; it must exist and be
    non-empty when the stage succeeds."""

    name: Ident = Field(description="Output name; exposed as $NPA_OUTPUT_<NAME>.")
    path: NonEmpty = Field(
        description="Path under the stage's outputs prefix (e.g. curated/clips/)."
    )
    # Enums arrive as plain strings from YAML and JSON alike.
    kind: OutputKind = Field(default=OutputKind.PREFIX, strict=False, description="file or prefix.")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _relative(value, "curated/clips/")


class Resources(_Strict):
    """What one task of the stage needs."""

    accelerators: Annotated[str, StringConstraints(pattern=ACCELERATORS)] | None = Field(
        default=None, description="NAME:N, e.g. H100:8."
    )
    cpus: float | None = Field(default=None, gt=0, le=1024, description="vCPUs (minimum).")
    memory_gib: float | None = Field(default=None, gt=0, le=65536, description="Memory in GiB.")
    disk_gib: GiB | None = Field(default=None, description="Local disk of the task in GiB.")


class Waves(_Strict):
    """How a stage's work is split: ``shards`` pieces, ``parallel`` of them at a time."""

    shards: Int = Field(default=1, ge=1, le=100_000, description="Number of shards.")
    parallel: Int = Field(
        default=1, ge=1, le=10_000, description="Shards running at once (at most shards)."
    )

    @field_validator("parallel")
    @classmethod
    def _parallel(cls, value: int, info: ValidationInfo) -> int:
        shards = info.data.get("shards")
        if isinstance(shards, int) and value > shards:
            raise rule_error(
                f"parallel ({value}) is larger than shards ({shards})",
                "set parallel to at most the number of shards",
            )
        return value


class Checkpoint(_Strict):
    """Mid-stage resume: where the stage keeps checkpoints and what loads them."""

    path: NonEmpty = Field(description="Checkpoint path under the stage's checkpoints prefix.")
    loader: NonEmpty = Field(description="Command that resumes from $NPA_CHECKPOINT_URI.")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _relative(value, "checkpoints/augment/")


def _not_reserved(name: str) -> str:
    if name.upper().startswith("NPA_"):
        raise rule_error(
            f"environment variable {name!r} uses the reserved NPA_ prefix",
            "rename it; npa sets NPA_* variables itself (run id, stage, inputs, outputs)",
        )
    return name


EnvName = Annotated[
    str,
    StringConstraints(pattern=ENV_NAME),
    AfterValidator(_not_reserved),
    Field(json_schema_extra={"not": {"pattern": "^[Nn][Pp][Aa]_"}}),
]


class Stage(_Strict):
    """One step of the workflow."""

    name: DnsLabel = Field(description="Stage name; a DNS-1123 label, unique in the workflow.")
    tool: str = Field(description="TOOL_REF of the image this stage runs.")
    command: NonEmpty = Field(description="Shell command run in the container.")
    env: dict[EnvName, str] = Field(
        default_factory=dict, description="Extra environment variables (NPA_* is reserved)."
    )
    inputs: list[Input] = Field(default_factory=list, description="Data the stage reads.")
    outputs: list[Output] = Field(default_factory=list, description="Data the stage writes.")
    resources: Resources = Field(default_factory=Resources, description="Per-task resources.")
    waves: Waves = Field(default_factory=Waves, description="Sharding and concurrency.")
    depends_on: list[str] = Field(default_factory=list, description="Stages that run before.")
    retries: Int = Field(default=0, ge=0, le=100, description="Restarts after a failure.")
    checkpoint: Checkpoint | None = Field(default=None, description="Mid-stage resume.")


class DiskType(StrEnum):
    NETWORK_SSD = "NETWORK_SSD"
    NETWORK_HDD = "NETWORK_HDD"
    NETWORK_SSD_NON_REPLICATED = "NETWORK_SSD_NON_REPLICATED"
    NETWORK_SSD_IO_M3 = "NETWORK_SSD_IO_M3"


DiskTypeField = Annotated[DiskType, Field(strict=False)]


class AgentInfra(_Strict):
    """The VM that drives runs (SkyPilot API server and controller)."""

    disk_gib: GiB = Field(default=100, description="Root disk size.")
    disk_type: DiskTypeField = Field(default=DiskType.NETWORK_SSD, description="Root disk type.")


class NodeGroup(_Strict):
    count: Int = Field(ge=0, le=1000, description="Number of nodes.")
    disk_gib: GiB = Field(description="Boot disk per node.")
    disk_type: DiskTypeField = Field(default=DiskType.NETWORK_SSD, description="Boot disk type.")


class CpuNodes(NodeGroup):
    """The CPU node group of the cluster."""

    count: Int = Field(default=1, ge=0, le=1000, description="Number of nodes.")
    disk_gib: GiB = Field(default=128, description="Boot disk per node.")


class GpuNodes(NodeGroup):
    """The GPU node group of the cluster."""

    count: Int = Field(default=1, ge=0, le=1000, description="Number of nodes.")
    disk_gib: GiB = Field(default=1023, description="Boot disk per node.")
    accelerators: Annotated[str, StringConstraints(pattern=ACCELERATORS)] = Field(
        default="H100:8", description="GPUs per node, NAME:N."
    )


class Infrastructure(_Strict):
    """The cluster shape the workflow needs; the quota arithmetic is computed from it."""

    context: str | None = Field(
        default=None,
        description="Kubernetes context, as kubectl names it; render writes resources.infra "
        "k8s/<it>.",
    )
    region: str | None = Field(default=None, description="Cloud region of the quotas.")
    agent: AgentInfra = Field(default_factory=AgentInfra)
    cpu_nodes: CpuNodes = Field(default_factory=CpuNodes)
    gpu_nodes: GpuNodes = Field(default_factory=GpuNodes)

    @field_validator("context")
    @classmethod
    def _context(cls, value: str | None) -> str | None:
        problem = None if value is None else context_problem(value)
        if problem:
            raise rule_error(f"kube context {value!r} {problem}", CONTEXT_HINT)
        return value


class Workflow(_Strict):
    """A whole workflow spec."""

    apiVersion: Literal["npa/v1"] = Field(description="Always npa/v1.")
    kind: Literal["Workflow"] = Field(description="Always Workflow.")
    metadata: Metadata
    storage: Storage | None = Field(default=None, description="Where run data lives.")
    tools: ToolMap = Field(description="Images by TOOL_REF.")
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
