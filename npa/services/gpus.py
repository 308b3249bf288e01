"""``gpus``: per node, the GPU label name, allocatable and requestable GPUs; with a spec, which
stages fit and the accelerator remap submit would apply.

SkyPilot places every GPU of a task on one node, so ``NAME:N`` fits only where one node has N
GPUs of that label; two nodes with one GPU each never run ``NAME:2``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from npa.adapters.kube.nodes import NodeGpus
from npa.core.errors import NotFound, Unavailable
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.launch.accelerators import GPU_LABELS, AcceleratorRemap, cluster_names, resolve


class NodeRow(BaseModel):
    node: str
    gpu_label: str | None  # the label value Kubernetes (and SkyPilot) name the GPU by
    label_key: str | None
    allocatable: int
    requestable: int
    ready: bool
    schedulable: bool


class StageFit(BaseModel):
    stage: str
    requested: str  # NAME:N as the spec says
    resolved: str | None  # the name submit would use
    count: int
    fits: bool  # some node has N such GPUs allocatable
    fits_now: bool  # ... and requestable right now
    nodes: list[str]
    detail: str


class GpusResult(Result):
    cluster: str
    nodes: list[NodeRow]
    labels: list[str]
    remap: dict[str, str] = Field(default_factory=dict)
    remap_detail: list[AcceleratorRemap] = Field(default_factory=list)
    stages: list[StageFit] = Field(default_factory=list)

    def text_lines(self) -> list[str]:
        lines = [f"cluster {self.cluster}: {len(self.nodes)} nodes"]
        for n in self.nodes:
            flags = "" if n.ready and n.schedulable else " (not ready/schedulable)"
            lines.append(
                f"  {n.node:30} {n.gpu_label or '-':28} allocatable {n.allocatable} "
                f"requestable {n.requestable}{flags}"
            )
        for spec_name, label in self.remap.items():
            lines.append(f"  remap: {spec_name} -> {label}")
        for s in self.stages:
            verdict = "fits now" if s.fits_now else ("fits when free" if s.fits else "DOES NOT FIT")
            lines.append(f"  stage {s.stage}: {s.requested} -> {s.resolved}: {verdict}: {s.detail}")
        return lines

    def exit_code(self) -> int:
        return 1 if any(not s.fits for s in self.stages) else 0


def _label(labels: dict[str, str]) -> tuple[str | None, str | None]:
    for key in GPU_LABELS:
        if labels.get(key):
            return labels[key], key
    return None, None


def gpus(cluster: str, *, spec: Path | None = None, paths: NpaPaths | None = None) -> GpusResult:
    from npa.adapters.kube.nodes import node_gpus
    from npa.spec.model import parse_accelerators
    from npa.spec.validate import load_workflow

    paths = paths or NpaPaths.from_env()
    # The input first: a bad spec is the user's to fix before any cluster is asked.
    workflow = load_workflow(spec) if spec is not None else None
    kubeconfig = paths.cluster_kubeconfig(cluster)
    if not kubeconfig.is_file():
        raise NotFound(
            f"no kubeconfig for cluster {cluster} at {kubeconfig}",
            fix=f"npa provision-if-absent --project P --target kubernetes --context {cluster} "
            "--kubeconfig PATH",
        )
    try:
        found: list[NodeGpus] = node_gpus(kubeconfig, cluster)
    except Exception as exc:
        raise Unavailable(
            f"cannot read nodes of {cluster}: {type(exc).__name__}: {exc}",
            fix=f"KUBECONFIG={kubeconfig} kubectl --context {cluster} get nodes",
        ) from None
    rows = []
    for n in found:
        label, key = _label(n.labels)
        rows.append(
            NodeRow(
                node=n.node,
                gpu_label=label,
                label_key=key,
                allocatable=n.allocatable,
                requestable=n.requestable if n.ready and n.schedulable else 0,
                ready=n.ready,
                schedulable=n.schedulable,
            )
        )
    names = cluster_names([n.labels for n in found])
    result = GpusResult(cluster=cluster, nodes=rows, labels=names)
    if workflow is None:
        return result
    for stage in workflow.stages:
        parsed = parse_accelerators(stage.resources.accelerators or "")
        if parsed is None:
            continue
        name, count = parsed
        answer = resolve(name, names)
        if answer.resolved and answer.resolved != name:
            result.remap[name] = answer.resolved
        if answer not in result.remap_detail:
            result.remap_detail.append(answer)
        target = answer.resolved or name
        holders = [r for r in rows if r.gpu_label == target and r.allocatable >= count]
        now = [r for r in holders if r.requestable >= count]
        if holders:
            detail = f"{len(holders)} node(s) have {count} allocatable {target}"
        else:
            most = max((r.allocatable for r in rows if r.gpu_label == target), default=0)
            detail = (
                f"no single node has {count} {target} GPUs (largest: {most}); SkyPilot places "
                "all of a task's GPUs on one node"
                if answer.resolved
                else f"{answer.detail} for {name}"
            )
        result.stages.append(
            StageFit(
                stage=stage.name,
                requested=stage.resources.accelerators or "",
                resolved=answer.resolved,
                count=count,
                fits=bool(holders),
                fits_now=bool(now),
                nodes=[r.node for r in holders],
                detail=detail,
            )
        )
    return result
