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

from pydantic import Field

from npa.adapters.storage import ObjectStore, inspect_command, open_store
from npa.backends.base import TERMINAL_STATES
from npa.core.commands import logs_command, status_command
from npa.core.errors import EXIT_FAILURE, InvalidInput, NotFound, Unavailable
from npa.core.layout import output_key, plan_key
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.plan.model import WorkflowPlan
from npa.runs.manifest import read_plan
from npa.runs.outputs import StageArtifacts, check_stage
from npa.runs.reading import ShownStage, shown_stage_states
from npa.services.locate import Located, cmd, locate
from npa.services.status import FAILED_STATES, plan_order, run_spec, submit_again

ENDED = frozenset(state.value for state in TERMINAL_STATES)


class ArtifactsResult(Result):
    project: str
    run_id: str
    workflow: str
    run_prefix: str
    run_state: str  # recorded in the manifest
    stages: list[StageArtifacts]
    first_stage_without_outputs: str | None
    failures: list[str]
    # Stages of a final run that never started, so never wrote their declared outputs: why, and
    # what to run next (as ``status`` prints it).
    never_ran: list[str] = Field(default_factory=list)
    next: list[str] = Field(default_factory=list)

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
        lines += [f"  not run: {f}" for f in self.never_ran]
        lines += [f"  next: {n}" for n in self.next]
        return lines

    def exit_code(self) -> int:
        return EXIT_FAILURE if self.failures or self.never_ran else 0


def _require_manifest(located: Located) -> None:
    located.require_own_run()
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


def _checked_stages(
    located: Located, shown: dict[str, ShownStage], plan: WorkflowPlan, stage: str | None
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
    by_name = {p.name: p for p in plan.stages}
    return [
        check_stage(located.store, located.prefix, by_name[name], shown[name].state)
        for name in shown
        if name in by_name and (stage is None or name == stage)
    ]


def _never_ran(
    located: Located, checked: list[StageArtifacts], shown: dict[str, ShownStage]
) -> tuple[list[str], list[str]]:
    """Why each stage of a final run that never started has no outputs, and what to run next:
    the failed stage's logs, then the resume that runs what is left."""
    why = [
        f"stage {s.stage} {shown[s.stage].note}: its declared outputs "
        f"({', '.join(o.name for o in s.outputs)}) were never written"
        for s in checked
        if shown[s.stage].never_ran and any(o.status != "ok" for o in s.outputs)
    ]
    if not why:
        return [], []
    first = shown[checked[0].stage]
    out = []
    if first.ended_at is not None and shown[first.ended_at].state in FAILED_STATES:
        out.append(logs_command(located.run_id, located.project, first.ended_at))
    again = submit_again(located, run_spec(located), resume=True)
    return why, [*out, *([again] if again else [])]


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
    plan = _plan(located.store, located.prefix)
    shown = shown_stage_states(m, plan_order(m, plan))
    checked = _checked_stages(located, shown, plan, stage)
    first = next(
        (s.stage for s in checked if s.outputs and all(o.status != "ok" for o in s.outputs)),
        None,
    )
    # Every stage that has ended, whatever its state, is held to what it declared; one still
    # to run (or running) is not judged yet, and one a final run never started is reported
    # as never run, with why.
    failures = [
        f"stage {s.stage} is {s.state} {'but' if s.state == 'SUCCEEDED' else 'and'} output "
        f"{o.name} is {o.status} ({o.key})"
        for s in checked
        if s.state in ENDED and not shown[s.stage].never_ran
        for o in s.outputs
        if o.status != "ok"
    ]
    never_ran, next_commands = _never_ran(located, checked, shown)
    failed = next((s.stage for s in checked if s.state in FAILED_STATES), None)
    if not next_commands and failed is not None:
        # Why a stage failed (and left its outputs unwritten) is in its log.
        next_commands = [logs_command(located.run_id, located.project, failed)]
    return ArtifactsResult(
        project=located.project,
        run_id=located.run_id,
        workflow=m.workflow,
        run_prefix=located.prefix_uri or "",
        run_state=m.state,
        stages=checked,
        first_stage_without_outputs=first,
        failures=failures,
        never_ran=never_ran,
        next=next_commands,
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
            fix=status_command(result.run_id, result.project),
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
    # The project's S3 settings: its endpoint and profile are where "s3://" means for it.
    settings = located.settings
    target = open_store(
        target_uri,
        endpoint_url=settings.value("endpoint_url"),
        region=settings.value("region"),
        profile=settings.value("profile"),
        fix_hint=cmd("configure", "--show", "--project", settings.project),
        paths=paths,
    )
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
