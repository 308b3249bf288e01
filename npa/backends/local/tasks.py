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

from npa.backends.base import RunTasks


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


def encode(run: RunTasks) -> dict[str, str]:
    """Stage -> the JSON text of its local task, in plan order."""
    out: dict[str, str] = {}
    for task in run.tasks:
        local = LocalTask(
            stage=task.stage,
            command=task.command,
            env=dict(task.env),
            image=task.image,
            depends_on=task.depends_on,
            shards=task.shards,
            parallel=task.parallel,
            waves=task.waves,
            retries=task.retries,
            inputs=[
                LocalInput(
                    name=i.name,
                    key=i.key,
                    kind=i.kind,
                    uri=None if i.key is not None else i.uri,
                )
                for i in task.inputs
            ],
            outputs=[
                LocalOutput(name=o.name, path=o.path, kind=o.kind, key=o.key) for o in task.outputs
            ],
        )
        out[task.stage] = json.dumps(local.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    return out


def parse(text: str) -> LocalTask:
    data: Any = json.loads(text)
    return LocalTask.model_validate(data)
