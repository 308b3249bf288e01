"""``gpus``: per node, the GPU label name, allocatable and requestable GPUs; with a spec, which
stages fit and the accelerator remap submit would apply.

SkyPilot places every GPU of a task on one node, so ``NAME:N`` fits only where one node has N
GPUs of that label; two nodes with one GPU each never run ``NAME:2``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from npa.adapters.kube.nodes import GPU_LABELS, NodeGpus, cluster_names
from npa.core.commands import kubectl_command, provision_command
from npa.core.errors import NotFound, Unavailable
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.core.text import plural
from npa.launch.accelerators import AcceleratorRemap, resolve


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
    kubeconfig: str | None = None  # the file(s) read, and why those
    nodes: list[NodeRow]
    labels: list[str]
    remap: dict[str, str] = Field(default_factory=dict)
    remap_detail: list[AcceleratorRemap] = Field(default_factory=list)
    stages: list[StageFit] = Field(default_factory=list)

    def text_lines(self) -> list[str]:
        from npa.core.table import table

        where = f" (kubeconfig {self.kubeconfig})" if self.kubeconfig else ""
        lines = [f"cluster {self.cluster}: {plural(len(self.nodes), 'node')}{where}"]
        if self.nodes:
            lines += table(
                ["NODE", "GPU LABEL", "ALLOCATABLE", "REQUESTABLE", "READY", "SCHEDULABLE"],
                [
                    [n.node, n.gpu_label, n.allocatable, n.requestable, n.ready, n.schedulable]
                    for n in self.nodes
                ],
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


def _nodes(cluster: str, paths: NpaPaths) -> tuple[str, list[NodeGpus]]:
    """The kubeconfig read (with why that one) and the cluster's nodes."""
    from npa.adapters.kube import kubeconfig as kubeconfigs
    from npa.adapters.kube.nodes import node_gpus

    chosen = kubeconfigs.for_context(paths, cluster)
    # A KUBECONFIG list is passed on as it is: the kubernetes client splits it as kubectl does.
    kubeconfig = Path(chosen.value)
    if chosen.origin == "placed by npa" and not kubeconfig.is_file():
        raise NotFound(
            f"no kubeconfig defines context {cluster!r}: not $KUBECONFIG, not ~/.kube/config, "
            f"and npa placed none at {kubeconfig}",
            fix=provision_command(cluster),
        )
    try:
        return f"{chosen.value} ({chosen.origin})", node_gpus(kubeconfig, cluster)
    except Exception as exc:
        raise Unavailable(
            f"cannot read nodes of {cluster}: {type(exc).__name__}: {exc}",
            fix=kubectl_command(kubeconfig, cluster, "get", "nodes"),
        ) from None


def _row(n: NodeGpus) -> NodeRow:
    label, key = _label(n.labels)
    return NodeRow(
        node=n.node,
        gpu_label=label,
        label_key=key,
        allocatable=n.allocatable,
        requestable=n.requestable if n.ready and n.schedulable else 0,
        ready=n.ready,
        schedulable=n.schedulable,
    )


def _fit(
    stage: str,
    requested: str,
    count: int,
    answer: AcceleratorRemap,
    rows: list[NodeRow],
    placement: str,
) -> StageFit:
    """Whether one stage's GPUs fit on one node of the cluster, now or once free."""
    target = answer.resolved or answer.requested
    holders = [r for r in rows if r.gpu_label == target and r.allocatable >= count]
    now = [r for r in holders if r.requestable >= count]
    if holders:
        detail = f"{plural(len(holders), 'node')} with {count} allocatable {target}"
    elif answer.resolved:
        most = max((r.allocatable for r in rows if r.gpu_label == target), default=0)
        detail = f"no single node has {count} {target} GPUs (largest: {most}); {placement}"
    else:
        detail = f"{answer.detail} for {answer.requested}"
    return StageFit(
        stage=stage,
        requested=requested,
        resolved=answer.resolved,
        count=count,
        fits=bool(holders),
        fits_now=bool(now),
        nodes=[r.node for r in holders],
        detail=detail,
    )


def _placement(cluster: str, paths: NpaPaths) -> str:
    """How the backend that runs on ``cluster`` places a task's GPUs on nodes."""
    from npa.backends import backend_for_infra, infra_for_context
    from npa.backends.base import ResolvesAccelerators

    backend = backend_for_infra(infra_for_context(cluster), paths)
    assert isinstance(backend, ResolvesAccelerators)
    return backend.placement


def gpus(cluster: str, *, spec: Path | None = None, paths: NpaPaths | None = None) -> GpusResult:
    from npa.spec.model import parse_accelerators
    from npa.spec.validate import load_workflow

    paths = paths or NpaPaths.from_env()
    # The input first: a bad spec is the user's to fix before any cluster is asked.
    workflow = load_workflow(spec) if spec is not None else None
    read, found = _nodes(cluster, paths)
    rows = [_row(n) for n in found]
    names = cluster_names([n.labels for n in found])
    result = GpusResult(cluster=cluster, kubeconfig=read, nodes=rows, labels=names)
    if workflow is None:
        return result
    placement = _placement(cluster, paths)
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
        requested = stage.resources.accelerators or ""
        result.stages.append(_fit(stage.name, requested, count, answer, rows, placement))
    return result
