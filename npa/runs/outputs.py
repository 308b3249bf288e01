"""A stage's declared outputs against the store: present, missing or empty.

Shared by ``artifacts`` (which reports them) and the run watcher (which fails a stage whose task
ended well without them, as the local backend does).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from npa.adapters.storage import ObjectStore
from npa.core.layout import output_key
from npa.plan.model import StagePlan


class OutputCheck(BaseModel):
    name: str
    path: str
    kind: str  # file | prefix
    key: str
    status: str  # ok | missing | empty
    objects: int
    bytes: int
    empty_objects: list[str] = Field(default_factory=list)  # zero-byte files inside a prefix


class StageArtifacts(BaseModel):
    stage: str
    state: str  # as the manifest records it
    outputs: list[OutputCheck]
    undeclared: list[str] = Field(default_factory=list)  # produced, not declared
    ok: bool


def check_stage(store: ObjectStore, prefix: str, planned: StagePlan, state: str) -> StageArtifacts:
    """Declared outputs of one stage against the store (one listing of its outputs)."""
    name = planned.name
    base = output_key(prefix, name, "")
    produced = {o.key[len(base) :]: o.size for o in store.list(base)}
    used: set[str] = set()
    checks = []
    for out in planned.outputs:
        path = out.path.rstrip("/")
        if out.kind == "file":
            size = produced.get(path)
            members = {path: size} if size is not None else {}
        else:
            members = {k: v for k, v in produced.items() if k.startswith(path + "/")}
        used |= set(members)
        total = sum(members.values())
        status = "missing" if not members else ("empty" if total == 0 else "ok")
        checks.append(
            OutputCheck(
                name=out.name,
                path=out.path,
                kind=out.kind,
                key=f"{base}{path}",
                status=status,
                objects=len(members),
                bytes=total,
                empty_objects=sorted(k for k, v in members.items() if v == 0),
            )
        )
    return StageArtifacts(
        stage=name,
        state=state,
        outputs=checks,
        undeclared=sorted(set(produced) - used),
        ok=all(c.status == "ok" for c in checks),
    )
