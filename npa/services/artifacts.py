"""``artifacts`` and ``load-artifact``: what a run's stages declared against what the store
holds.

A declared output that is missing, or holds zero bytes, is a failure even when its stage
exited 0. The first stage (in plan order) with no valid output is named, because that is where
a broken run usually went wrong, often before the stage that reported the error.
``load-artifact`` copies the final stages' outputs of a run whose every stage succeeded; it
reads the run and never launches anything.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from npa.adapters.storage import ObjectStore, inspect_command, open_store
from npa.core.errors import EXIT_FAILURE, InvalidInput, NotFound, NpaError, Unavailable
from npa.core.layout import output_key, plan_key
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.plan.model import StagePlan, WorkflowPlan
from npa.runs.manifest import RunManifest, read_plan
from npa.services.locate import Located, cmd, locate


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


class ArtifactsResult(Result):
    project: str
    run_id: str
    workflow: str
    run_prefix: str
    run_state: str  # recorded in the manifest
    stages: list[StageArtifacts]
    first_stage_without_outputs: str | None
    failures: list[str]

    def text_lines(self) -> list[str]:
        from npa.core.table import table

        lines = [f"run {self.run_id} ({self.run_state}): {self.run_prefix}"]
        for s in self.stages:
            lines.append(f"  stage {s.stage} [{s.state}] {'ok' if s.ok else 'NOT OK'}")
            if s.outputs:
                lines += table(
                    ["OUTPUT", "STATUS", "OBJECTS", "BYTES", "PATH"],
                    [[o.name, o.status, o.objects, o.bytes, o.path] for o in s.outputs],
                    indent=4,
                )
            for o in s.outputs:
                if o.empty_objects:
                    lines.append(f"    {o.name}: zero-byte: {', '.join(o.empty_objects[:5])}")
            if s.undeclared:
                lines.append(f"    undeclared: {', '.join(s.undeclared[:5])}")
        if self.first_stage_without_outputs:
            lines.append(f"  first stage with no outputs: {self.first_stage_without_outputs}")
        lines += [f"  failure: {f}" for f in self.failures]
        return lines

    def exit_code(self) -> int:
        return EXIT_FAILURE if self.failures else 0


def _require_manifest(located: Located) -> None:
    if located.manifest is not None:
        return
    for source in located.unavailable:
        raise Unavailable(
            f"run {located.run_id}: {source.source} could not be read ({source.error}); its "
            "artifacts cannot be listed, and nothing is concluded about them",
            fix=source.fix or located.status_command(),
        )
    raise NotFound(
        f"run {located.run_id} has no manifest in {located.store_uri}: it was never submitted "
        "(or the wrong store is selected)",
        fix=located.status_command(),
    )


def _plan(store: ObjectStore, prefix: str) -> WorkflowPlan:
    plan = read_plan(store, prefix)
    if plan is None:
        raise NotFound(
            f"{store.uri}/{plan_key(prefix)} is missing: the declared outputs are unknown",
            fix=inspect_command(store, prefix, listing=True) + "  # what the run stored",
        )
    return plan


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


def _checked_stages(
    located: Located, m: RunManifest, plan: WorkflowPlan, stage: str | None
) -> list[StageArtifacts]:
    """Each planned stage (or only ``stage``) in plan order, checked against the store."""
    assert located.store is not None and located.prefix is not None
    names = [p.name for p in plan.stages]
    if stage is not None and stage not in names:
        raise InvalidInput(
            f"run {located.run_id} has no stage {stage!r} (stages: {', '.join(names)})",
            fix=cmd("workbench", "workflow", "artifacts", located.run_id, "--project",
                    located.project),
        )  # fmt: skip
    order = {n: i for i, n in enumerate(plan.order or names)}
    planned = sorted(plan.stages, key=lambda p: order.get(p.name, len(order)))
    return [
        check_stage(
            located.store,
            located.prefix,
            p,
            m.stages[p.name].state if p.name in m.stages else "PENDING",
        )
        for p in planned
        if stage is None or p.name == stage
    ]


def artifacts(
    run: str,
    project: str | None,
    *,
    stage: str | None = None,
    workflow_uri: str | None = None,
    paths: NpaPaths | None = None,
) -> ArtifactsResult:
    paths = paths or NpaPaths.from_env()
    located = locate(run, project, workflow_uri=workflow_uri, paths=paths)
    _require_manifest(located)
    m = located.manifest
    assert m is not None and located.store is not None and located.prefix is not None
    checked = _checked_stages(located, m, _plan(located.store, located.prefix), stage)
    first = next(
        (s.stage for s in checked if s.outputs and all(o.status != "ok" for o in s.outputs)),
        None,
    )
    failures = [
        f"stage {s.stage} is {s.state} but output {o.name} is {o.status} ({o.key})"
        for s in checked
        if s.state == "SUCCEEDED"
        for o in s.outputs
        if o.status != "ok"
    ]
    return ArtifactsResult(
        project=located.project,
        run_id=located.run_id,
        workflow=m.workflow,
        run_prefix=located.prefix_uri or "",
        run_state=m.state,
        stages=checked,
        first_stage_without_outputs=first,
        failures=failures,
    )


# --- load-artifact -----------------------------------------------------------------------------


class LoadedArtifact(Result):
    project: str
    run_id: str
    destination: str
    stages: list[str]
    objects: int
    bytes: int
    relaunched: bool = False  # never: load-artifact only reads the run

    def text_lines(self) -> list[str]:
        from npa.core.text import plural

        return [
            f"loaded {plural(self.objects, 'object')} ({plural(self.bytes, 'byte')}) of run "
            f"{self.run_id} (final stages {', '.join(self.stages)}) into {self.destination}",
            "  nothing was relaunched",
        ]


def load_artifact(
    run: str,
    project: str | None,
    *,
    destination: str,
    workflow_uri: str | None = None,
    paths: NpaPaths | None = None,
) -> LoadedArtifact:
    """Copy the final stages' declared outputs to ``destination`` (a directory, file:// or
    s3:// URI), only when every stage succeeded and every declared output is valid."""
    paths = paths or NpaPaths.from_env()
    result = artifacts(run, project, workflow_uri=workflow_uri, paths=paths)
    not_done = [s.stage for s in result.stages if s.state != "SUCCEEDED"]
    if result.run_state != "SUCCEEDED" or not_done:
        raise InvalidInput(
            f"run {result.run_id} is {result.run_state}; stages not succeeded: "
            f"{', '.join(not_done) or '-'}. load-artifact only loads a run whose every stage "
            "succeeded (resume the run first)",
            fix=cmd("workbench", "workflow", "status", result.run_id, "--project", result.project),
        )
    if result.failures:
        raise InvalidInput(
            "declared outputs are missing or empty: " + "; ".join(result.failures),
            fix=cmd("workbench", "workflow", "artifacts", result.run_id, "--project",
                    result.project, "--json"),
        )  # fmt: skip
    located = locate(run, project, workflow_uri=workflow_uri, paths=paths)
    assert located.store is not None and located.prefix is not None
    plan = _plan(located.store, located.prefix)
    upstream = {d for p in plan.stages for d in p.depends_on}
    finals = [p for p in plan.stages if p.name not in upstream]
    target_uri = destination if "://" in destination else Path(destination).resolve().as_uri()
    try:
        target = open_store(target_uri, paths=paths)
    except NpaError:
        raise
    objects = size = 0
    for planned in finals:
        base = output_key(located.prefix, planned.name, "")
        for obj in located.store.list(base):
            rel = obj.key[len(base) :]
            target.put(f"{planned.name}/{rel}", located.store.get(obj.key))
            objects += 1
            size += obj.size
    return LoadedArtifact(
        project=located.project,
        run_id=located.run_id,
        destination=target.uri,
        stages=[p.name for p in finals],
        objects=objects,
        bytes=size,
    )
