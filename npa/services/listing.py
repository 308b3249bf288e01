"""``list``: the runs of a project from the durable store, newest first, through the project's
run index (:mod:`npa.runs.index`).

Kept apart from :mod:`npa.services.status` so that its read path imports neither the backends
nor the plan and manifest models: it reads each listed run's manifest head
(:mod:`npa.runs.manifest_head`) and decides whose run it is with the one identity rule
(:func:`npa.runs.identity_rule.check_run_identity`) ``status`` applies too. Nor does it import
pydantic: its rows and result are dataclasses (:class:`npa.core.emit.PlainResult`), since
pydantic's import alone costs several times what listing 50 runs does.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass

from npa.adapters.storage import ObjectStore, configured_store_uri
from npa.adapters.storage.base import read_map
from npa.core.emit import PlainResult
from npa.core.errors import EXIT_UNAVAILABLE, NpaError
from npa.core.layout import manifest_key, run_prefix
from npa.core.paths import NpaPaths
from npa.core.text import plural
from npa.runs.identity_rule import RunKey, check_run_identity
from npa.runs.index import IndexReader, Repair, mark_run, repair
from npa.runs.manifest_head import read_manifest_head
from npa.services.runstore import open_run_store

# Run states npa decides itself (not a backend's), shared with ``status``.
PLAN_ONLY = "PLAN_ONLY"
VERIFICATION_UNAVAILABLE = "VERIFICATION_UNAVAILABLE"


@dataclass(kw_only=True)
class RunRow:
    run_id: str
    workflow: str
    recorded_state: str  # as the store records it: list never contacts a backend
    backend: str | None = None
    job_id: int | None = None
    submitted_at: str | None = None
    updated_at: str | None = None
    run_prefix: str
    error: str | None = None


@dataclass(kw_only=True)
class RunList(PlainResult):
    """``list``: the project's runs in its store, newest first."""

    project: str
    store: str
    runs: list[RunRow]
    truncated: bool
    skipped_other_projects: int = 0
    # What the repair of the project's run index did, when this list repaired it.
    index_note: str | None = None
    note: str = "states as recorded in the store; run status RUN_ID for a live answer"

    def text_lines(self) -> list[str]:
        from npa.core.table import table

        lines = [
            f"{plural(len(self.runs), 'run')} of project {self.project} in {self.store}, "
            "newest first"
        ]
        if self.runs:
            lines += table(
                ["RUN", "WORKFLOW", "STATE", "JOB", "SUBMITTED"],
                [
                    [
                        r.run_id,
                        r.workflow,
                        r.recorded_state,
                        f"{r.backend} {r.job_id}" if r.job_id is not None else None,
                        r.submitted_at,
                    ]
                    for r in self.runs
                ],
            )
        if self.truncated:
            lines.append("  (more runs exist: raise --limit)")
        if self.index_note:
            lines.append(f"  {self.index_note}")
        lines.append(f"  {self.note}")
        return lines

    def exit_code(self) -> int:
        return EXIT_UNAVAILABLE if any(r.error for r in self.runs) else 0


def list_runs(project: str | None, *, limit: int = 50, paths: NpaPaths | None = None) -> RunList:
    """Runs from the durable store alone, newest first, found through the project's run index
    (:mod:`npa.runs.index`): never another project's objects.

    Requests: one listing of the index (its newest markers, and whether it is complete), then
    one manifest read per run listed (two for a run without a manifest). An index that is not
    complete yet is repaired first, once (see :func:`npa.runs.index.repair`).
    """
    from npa.services.configure import require_known_project, resolve_project

    paths = paths or NpaPaths.from_env()
    settings = resolve_project(project, paths=paths)
    store_uri = configured_store_uri(settings.value("store"), paths, settings.project)
    store = open_run_store(store_uri, settings, None, paths)
    reader = IndexReader(store, settings.project, page_size=limit + 2).open()
    repaired = None if reader.complete else repair(store, settings.project)
    pending = deque(repaired.runs) if repaired is not None else None

    def take(n: int) -> list[tuple[str, str]]:
        if pending is None:
            return reader.take(n)
        return [pending.popleft() for _ in range(min(n, len(pending)))]

    def row_of(candidate: tuple[str, str]) -> RunRow | str | None:
        """The row, "other" for another project's run, None for a folder that is no run."""
        return _run_row(store, store_uri, settings.project, *candidate)

    rows: list[RunRow] = []
    others = 0
    # Newest first, read in batches of what is still missing, so the reads stay proportional
    # to the runs listed; concurrently where the store gains by it.
    with contextlib.ExitStack() as stack:
        reads = read_map(store, stack)
        while len(rows) < limit and (batch := take(limit - len(rows))):
            for found in reads(row_of, batch):
                if found == "other":
                    others += 1
                elif isinstance(found, RunRow):
                    rows.append(found)
    truncated = bool(pending) if pending is not None else reader.more
    if repaired is not None:
        rows += _unreadable_rows(store_uri, repaired)
    if not rows and project is not None:
        require_known_project(settings, paths, "workbench", "workflow", "list")
    return RunList(
        project=settings.project,
        store=store_uri,
        runs=rows,
        truncated=truncated,
        skipped_other_projects=others,
        index_note=_index_note(repaired),
    )


def _run_row(
    store: ObjectStore, store_uri: str, project: str, run_id: str, workflow: str
) -> RunRow | str | None:
    """One indexed run's row from its manifest: "other" when the manifest is another project's
    own run (its marker is then written where it belongs), None when nothing is under it."""
    prefix = run_prefix(workflow, run_id)
    row = RunRow(
        run_id=run_id, workflow=workflow, recorded_state="?", run_prefix=f"{store_uri}/{prefix}"
    )
    try:
        manifest = read_manifest_head(store, prefix)
        if manifest is None:
            if not store.list_page(f"{prefix}/", page_size=1).objects:
                return None  # marked before its first object, which was never written
            row.recorded_state = PLAN_ONLY
        elif mismatch := check_run_identity(
            manifest,
            RunKey(run_id=run_id, workflow=workflow, prefix=prefix, project=project),
            f"{store_uri}/{manifest_key(prefix)}",
        ):
            if mismatch.details["disagree"] == ["project"]:
                # Another project's own run, marked in this project's index: index it where its
                # manifest says it belongs (the marker here only costs a read).
                with contextlib.suppress(NpaError):
                    mark_run(store, manifest.project, workflow, run_id)
                return "other"
            row.recorded_state = VERIFICATION_UNAVAILABLE
            row.error = f"{mismatch.kind}: {mismatch.message}"
        else:
            row.recorded_state = manifest.state
            row.backend = manifest.backend
            row.job_id = manifest.job_id
            row.submitted_at = manifest.submitted_at
            row.updated_at = manifest.updated_at
    except NpaError as error:
        row.recorded_state = VERIFICATION_UNAVAILABLE
        row.error = f"{error.kind}: {error.message}"
    return row


def _unreadable_rows(store_uri: str, repaired: Repair) -> list[RunRow]:
    """Runs a repair could not attribute because their manifest could not be read now: whose
    they are is unknown, so they are shown, as unverifiable, until a list can read them."""
    return [
        RunRow(
            run_id=run_id,
            workflow=workflow,
            recorded_state=VERIFICATION_UNAVAILABLE,
            run_prefix=f"{store_uri}/{run_prefix(workflow, run_id)}",
            error=f"{error.kind}: {error.message}",
        )
        for (run_id, workflow), error in repaired.unreadable.items()
    ]


def _index_note(repaired: Repair | None) -> str | None:
    """What a repair of the run index did, in one line; None when there is nothing to say."""
    if repaired is None or (repaired.complete and not repaired.marked):
        return None
    said = []
    if repaired.marked:
        said.append(
            f"indexed {plural(repaired.marked, 'run')} of this store written before its run "
            "index existed (once: later lists read the index alone)"
        )
    if repaired.unwritten is not None:
        said.append(
            "the run index could not be written, so each list reads every run folder until it "
            f"can ({repaired.unwritten.message})"
        )
    elif repaired.unreadable:
        said.append("the index is finished by the first list that can read every manifest")
    return "; ".join(said)
