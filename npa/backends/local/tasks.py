"""What the local backend runs for each stage: a JSON task file (``tasks/<stage>.json``).

The local backend runs commands as host processes, so a task names store keys (not mounts):
inputs are fetched from the store into the stage's work directory, outputs are written there
and put back into the store after every wave. The image is recorded for the record only; no
container is started.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from npa.backends.base import TaskContext


class LocalInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    key: str | None  # store key of an upstream output
    kind: str  # file | prefix
    uri: str | None  # an external URI, passed through as is


class LocalOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    path: str
    kind: str
    key: str


class LocalTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stage: str
    command: str
    env: dict[str, str]
    image: str | None
    depends_on: list[str]
    shards: int
    parallel: int
    waves: int
    retries: int
    inputs: list[LocalInput]
    outputs: list[LocalOutput]


def stage_key(prefix: str, stage: str) -> str:
    return f"{prefix}/stages/{stage}"


def render(context: TaskContext, prefix: str) -> dict[str, str]:
    """Stage -> the JSON text of its local task, in plan order."""
    workflow = context.workflow
    plan = context.plan
    stages = {s.name: s for s in workflow.stages}
    kinds = {(s.name, o.name): (o.kind.value, o.path) for s in workflow.stages for o in s.outputs}
    out: dict[str, str] = {}
    for planned in plan.stages:
        stage = stages[planned.name]
        inputs = []
        for inp in planned.inputs:
            if inp.from_stage is not None and inp.from_output is not None:
                kind, path = kinds[(inp.from_stage, inp.from_output)]
                key = f"{stage_key(prefix, inp.from_stage)}/outputs/{path}"
                inputs.append(LocalInput(name=inp.name, key=key.rstrip("/"), kind=kind, uri=None))
            else:
                inputs.append(LocalInput(name=inp.name, key=None, kind="prefix", uri=inp.uri))
        task = LocalTask(
            stage=stage.name,
            command=stage.command,
            env=dict(stage.env),
            image=context.images.get(stage.tool),
            depends_on=planned.depends_on,
            shards=planned.waves.shards,
            parallel=planned.waves.parallel,
            waves=planned.waves.waves,
            retries=planned.retries,
            inputs=inputs,
            outputs=[
                LocalOutput(
                    name=o.name,
                    path=o.path,
                    kind=o.kind,
                    key=f"{stage_key(prefix, stage.name)}/outputs/{o.path}".rstrip("/"),
                )
                for o in planned.outputs
            ],
        )
        out[stage.name] = json.dumps(task.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    return out


def parse(text: str) -> LocalTask:
    data: Any = json.loads(text)
    return LocalTask.model_validate(data)
