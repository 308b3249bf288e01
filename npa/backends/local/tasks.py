"""What the local backend runs for each stage: a JSON task file (``tasks/<stage>.json``).

A task says everything the executor does for the stage, in the stage contract's terms
(:mod:`npa.backends.contract`): the variables and the working directory the command sees, where
each input comes from and where each output goes in the store, and the runtime: ``container``
(the stage's image, pinned by digest, through the named engine, as the contract's user) or
``process`` (a host process; the contract's ``/npa`` paths move under each shard's root folder).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from npa.backends import contract
from npa.backends.base import RunTasks
from npa.core.errors import InvalidInput

Runtime = Literal["container", "process"]


class LocalInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    path: str  # where the stage sees it (/npa/inputs/<name>)
    key: str | None  # store key of an upstream output
    kind: str  # file | prefix
    uri: str | None  # an external URI (file://, s3://), fetched as it is


class LocalOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    path: str  # where the stage writes it (/npa/outputs/<declared path>)
    kind: str
    key: str


class LocalTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stage: str
    command: str
    runtime: Runtime
    engine: str | None  # podman | docker, for the container runtime
    image: str | None  # pinned by digest, for the container runtime
    user: str | None  # uid:gid the container runs as (the tool's contract)
    workdir: str
    env: dict[str, str]  # the contract's variables fixed for the stage, then the stage's own
    # The stage's secrets: name -> source (env:VAR), read when a shard starts; never a value.
    secrets: dict[str, str] = Field(default_factory=dict)
    depends_on: list[str]
    shards: int
    parallel: int
    waves: int
    retries: int
    inputs: list[LocalInput]
    outputs: list[LocalOutput]


def encoded(run: RunTasks, *, runtime: Runtime, engine: str | None) -> Iterator[tuple[str, str]]:
    """(stage, the JSON text of its local task) in plan order, each made as it is asked for;
    a stage the runtime cannot run is refused before the first."""
    for task in run.tasks:
        if runtime == "container" and task.image is None:
            # No fix here: the caller knows the spec and the project the fix line names.
            raise InvalidInput(
                f"stage {task.stage}: the container runtime needs its image pinned by digest "
                "(or run the stages as host processes: --runtime process)",
                details={"unpinned": True},
            )
    for task in run.tasks:
        local = LocalTask(
            stage=task.stage,
            command=task.command,
            runtime=runtime,
            engine=engine if runtime == "container" else None,
            image=task.image if runtime == "container" else None,
            user=f"{task.run_as_user}:{task.run_as_group}" if runtime == "container" else None,
            workdir=contract.SOURCE_DIR,
            env=contract.stage_env(task, run),
            secrets=dict(task.secrets),
            depends_on=task.depends_on,
            shards=task.shards,
            parallel=task.parallel,
            waves=task.waves,
            retries=task.retries,
            inputs=[
                LocalInput(
                    name=i.name,
                    path=contract.input_path(i.name),
                    key=i.key,
                    kind=i.kind,
                    uri=None if i.key is not None else i.uri,
                )
                for i in task.inputs
            ],
            outputs=[
                LocalOutput(name=o.name, path=contract.output_path(o.path), kind=o.kind, key=o.key)
                for o in task.outputs
            ],
        )
        yield task.stage, json.dumps(local.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def encode(run: RunTasks, *, runtime: Runtime, engine: str | None) -> dict[str, str]:
    """Stage -> the JSON text of its local task, in plan order (:func:`encoded`, all at once)."""
    return dict(encoded(run, runtime=runtime, engine=engine))


def parse(text: str) -> LocalTask:
    data: Any = json.loads(text)
    return LocalTask.model_validate(data)
