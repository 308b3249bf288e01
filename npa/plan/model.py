"""The plan of one run: stage order, waves, resources, data locations and infrastructure."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from npa.core.collector import collector_paused
from npa.core.layout import PREFIX_LEAF, checkpoint_key, output_key, wave_count
from npa.core.paths import safe_component
from npa.plan.dag import dependencies, levels, topological_order
from npa.plan.infra import DiskNeed, disk_needs
from npa.spec.model import Workflow, parse_accelerators


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StageResources(_Model):
    accelerator: str | None
    accelerator_count: int
    cpus: float | None
    memory_gib: float | None
    disk_gib: int | None


class StageWaves(_Model):
    shards: int
    parallel: int
    waves: int


class PlannedInput(_Model):
    name: str
    uri: str | None
    from_stage: str | None
    from_output: str | None


class PlannedOutput(_Model):
    name: str
    path: str
    kind: str
    uri: str | None


class StagePlan(_Model):
    name: str
    level: int
    tool: str
    depends_on: list[str]
    resources: StageResources
    waves: StageWaves
    retries: int
    inputs: list[PlannedInput]
    outputs: list[PlannedOutput]
    checkpoint_uri: str | None


class WorkflowPlan(_Model):
    workflow: str
    run_id: str
    run_prefix: str | None
    order: list[str]
    stages: list[StagePlan]
    disks: list[DiskNeed]
    gpus_per_task_max: int


def run_prefix(store_uri: str | None, workflow: str, run_id: str) -> str | None:
    """``<store>/<workflow>/<run>``, the prefix everything of one run lives under."""
    if store_uri is None:
        return None
    return f"{store_uri.rstrip('/')}/{workflow}/{run_id}"


@collector_paused()  # every stage's plan stays alive: see collector_paused
def build_plan(workflow: Workflow, run_id: str, *, store_uri: str | None = None) -> WorkflowPlan:
    """Plan a run of a validated workflow. Pure: reads nothing, writes nothing. The cyclic
    garbage collector is paused while it builds (:func:`collector_paused`)."""
    safe_component(run_id, "run id")
    store = (
        store_uri if store_uri is not None else (workflow.storage.uri if workflow.storage else None)
    )
    prefix = run_prefix(store, workflow.metadata.name, run_id)
    deps = dependencies(workflow)
    order = topological_order(workflow, deps)
    level = levels(workflow, order, deps)
    position = {name: i for i, name in enumerate(order)}
    by_name = {s.name: s for s in workflow.stages}
    outputs_uri: dict[tuple[str, str], str | None] = {}
    for stage in workflow.stages:
        for out in stage.outputs:
            outputs_uri[(stage.name, out.name)] = (
                output_key(f"{prefix}/{PREFIX_LEAF}", stage.name, out.path) if prefix else None
            )

    stages = []
    for name in order:
        stage = by_name[name]
        accel = (
            parse_accelerators(stage.resources.accelerators)
            if stage.resources.accelerators
            else None
        )
        inputs = []
        for inp in stage.inputs:
            if inp.from_:
                src, out_name = inp.from_.split(".", 1)
                inputs.append(
                    PlannedInput(
                        name=inp.name,
                        uri=outputs_uri.get((src, out_name)),
                        from_stage=src,
                        from_output=out_name,
                    )
                )
            else:
                inputs.append(
                    PlannedInput(name=inp.name, uri=inp.uri, from_stage=None, from_output=None)
                )
        stages.append(
            StagePlan(
                name=name,
                level=level[name],
                tool=stage.tool,
                depends_on=sorted(deps[name], key=position.__getitem__),
                resources=StageResources(
                    accelerator=accel[0] if accel else None,
                    accelerator_count=accel[1] if accel else 0,
                    cpus=stage.resources.cpus,
                    memory_gib=stage.resources.memory_gib,
                    disk_gib=stage.resources.disk_gib,
                ),
                waves=StageWaves(
                    shards=stage.waves.shards,
                    parallel=stage.waves.parallel,
                    waves=wave_count(stage.waves.shards, stage.waves.parallel),
                ),
                retries=stage.retries,
                inputs=inputs,
                outputs=[
                    PlannedOutput(
                        name=o.name, path=o.path, kind=o.kind.value, uri=outputs_uri[(name, o.name)]
                    )
                    for o in stage.outputs
                ],
                checkpoint_uri=(
                    checkpoint_key(f"{prefix}/{PREFIX_LEAF}", name, stage.checkpoint.path)
                    if prefix and stage.checkpoint
                    else None
                ),
            )
        )
    return WorkflowPlan(
        workflow=workflow.metadata.name,
        run_id=run_id,
        run_prefix=prefix,
        order=order,
        stages=stages,
        disks=disk_needs(workflow.infrastructure),
        gpus_per_task_max=max((s.resources.accelerator_count for s in stages), default=0),
    )
