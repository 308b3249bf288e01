"""Run verbs: reserve a run id (``prepare-run``) and stage a run's source (``stage-source``)."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from pydantic import Field

from npa.adapters.storage import ObjectStore, configured_store_uri, normalize_store_uri, open_store
from npa.core.errors import Interrupted, InvalidInput, NpaError, with_rerun
from npa.core.fsio import exclusive_lock
from npa.core.layout import run_prefix
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.core.text import number, plural
from npa.runs.identity import (
    legacy_run_id_warning,
    load_record,
    read_spec_identity,
    remember_source,
    reserve_run,
)
from npa.runs.ignore import IgnoreRules
from npa.runs.index import mark_run
from npa.runs.journal import OperationJournal
from npa.runs.selection import Ask, choose_run
from npa.runs.staging import Progress, default_jobs, stage_source
from npa.services.configure import ProjectSettings, resolve_project

# How long a stager waits for another one staging the same run.
STAGE_LOCK_WAIT_SECONDS = 600.0


def _prepare_command(spec: Path, project: str) -> str:
    return shlex.join(
        ["npa", "workbench", "workflow", "prepare-run", str(spec), "--project", project]
    )


class PreparedRun(Result):
    """``prepare-run``: the reserved run. Text output is the run id alone, for ``$(...)``."""

    run_id: str
    project: str
    project_identity: str
    workflow: str
    store: str
    workflow_prefix: str
    reservation: str
    warnings: list[str]

    def text_lines(self) -> list[str]:
        return [self.run_id]


def prepare_run(spec: Path, project: str | None, *, paths: NpaPaths | None = None) -> PreparedRun:
    """Reserve a new, distinct run of the workflow ``spec`` names, for ``project``."""
    paths = paths or NpaPaths.from_env()
    settings = resolve_project(project, paths=paths)
    workflow, spec_sha256 = read_spec_identity(spec)
    store = configured_store_uri(settings.value("store"), paths, settings.project)
    warnings = [w for w in [legacy_run_id_warning(paths)] if w]
    entry = reserve_run(
        paths,
        project=settings.project,
        project_identity=settings.identity,
        workflow=workflow,
        spec=spec,
        spec_sha256=spec_sha256,
        store=store,
    )
    return PreparedRun(
        run_id=entry.run_id,
        project=settings.project,
        project_identity=settings.identity,
        workflow=workflow,
        store=store,
        workflow_prefix=f"{store}/{run_prefix(workflow, entry.run_id)}",
        reservation=str(paths.run_reservation(settings.project, workflow)),
        warnings=warnings,
    )


class StagedSource(Result):
    """``stage-source``: the committed source of a run and what this staging did."""

    run_id: str
    project: str
    workflow: str
    source: str  # the directory that was staged
    manifest: str
    source_digest: str
    files: int
    bytes: int
    left_out: list[str] = Field(default_factory=list)  # npa state inside the tree, never staged
    blobs: int
    hashed: int  # files read and hashed; the others' digests came from the stat index
    uploaded: int
    uploaded_bytes: int
    repaired: int
    already_committed: bool
    listed: bool  # the store's blobs were listed and checked (--verify, or nothing trusted)
    seconds: float
    journal: str
    resume_command: str
    warnings: list[str]

    def text_lines(self) -> list[str]:
        if not self.already_committed:
            state = "committed"
        elif self.listed:
            state = "already committed, blobs verified"
        else:
            state = "already committed, confirmed"
        return [
            f"source {self.source_digest} {state} for run {self.run_id}",
            f"  staged {self.source}: {plural(self.files, 'file')}, {plural(self.bytes, 'byte')}, "
            f"{plural(self.blobs, 'distinct blob')}; {plural(self.hashed, 'file')} read and hashed",
            *(
                [f"  left out (npa state, never staged): {', '.join(self.left_out)}"]
                if self.left_out
                else []
            ),
            f"  uploaded {plural(self.uploaded, 'blob')} ({plural(self.uploaded_bytes, 'byte')}), "
            f"repaired {number(self.repaired)} in {self.seconds:.2f}s",
            f"  manifest: {self.manifest}",
        ]


def _store_for(settings: ProjectSettings, paths: NpaPaths, jobs: int) -> tuple[str, ObjectStore]:
    uri = configured_store_uri(settings.value("store"), paths, settings.project)
    store = open_store(
        uri,
        endpoint_url=settings.value("endpoint_url"),
        region=settings.value("region"),
        profile=settings.value("profile"),
        max_connections=jobs + 4,
        fix_hint=f"npa configure --show --project {settings.project}",
        paths=paths,
    )
    return uri, store


def _state_dirs(paths: NpaPaths, store_uri: str) -> list[Path]:
    """npa's own state, which a source tree may contain but must never stage: NPA_HOME, and a
    file:// store kept elsewhere."""
    dirs = [paths.root]
    parsed = urlparse(store_uri)
    if parsed.scheme == "file":
        dirs.append(Path(unquote(parsed.path)))
    return dirs


def stage_run_source(
    spec: Path,
    project: str | None,
    run_id: str | None,
    source: Path | None,
    *,
    jobs: int | None = None,
    interactive: bool = False,
    ask: Ask | None = None,
    progress: Progress | None = None,
    paths: NpaPaths | None = None,
    verify: bool = False,
) -> StagedSource:
    """Stage the source of a reserved run: content-addressed, idempotent, committed once.

    A run whose source is committed already is confirmed with one request; ``verify`` lists
    the stored blobs instead and repairs missing or damaged ones."""
    paths = paths or NpaPaths.from_env()
    settings = resolve_project(project, paths=paths)
    workflow, spec_sha256 = read_spec_identity(spec)
    prepare = _prepare_command(spec.resolve(), settings.project)
    record = load_record(paths, settings.project, settings.identity, workflow)
    entry, warnings = choose_run(
        record,
        run_id,
        spec_sha256=spec_sha256,
        interactive=interactive,
        ask=ask,
        prepare_command=prepare,
    )
    if source is not None:
        tree = source.resolve()
        if entry.source is not None and Path(entry.source) != tree:
            raise InvalidInput(
                f"run {entry.run_id} is staged from {entry.source}, not {tree}; "
                "a run's source never changes",
                fix=f'RUN_ID="$({prepare})"  # a new run for the other source',
            )
    elif entry.source is not None:
        # The user's earlier choice, never replaced by the default below.
        tree = Path(entry.source)
    else:
        tree = spec.resolve().parent
    jobs = jobs or default_jobs()
    uri, store = _store_for(settings, paths, jobs)
    if uri != entry.store:
        raise InvalidInput(
            f"run {entry.run_id} was reserved in store {entry.store}, but project "
            f"{settings.project} now resolves to {uri}",
            fix=f"npa configure --show --project {settings.project}",
        )
    resume_argv = [
        "npa", "workbench", "workflow", "stage-source", str(spec.resolve()),
        "--project", settings.project, "--run-id", entry.run_id, "--source", str(tree),
    ]  # fmt: skip
    journal = OperationJournal(paths, f"stage-source.{settings.project}.{entry.run_id}")
    prefix = run_prefix(workflow, entry.run_id)
    rules = IgnoreRules.for_tree(tree, _state_dirs(paths, uri))
    started = time.monotonic()
    # Staging is idempotent, so a second stager (e.g. a concurrent submit of the same run)
    # waits for the first and then finds everything in place instead of failing.
    with exclusive_lock(
        paths.lock(f"stage.{settings.project}.{entry.run_id}"),
        timeout=STAGE_LOCK_WAIT_SECONDS,
        purpose=f"staging the source of run {entry.run_id}",
    ):
        resume = journal.begin(
            "stage-source", resume_argv, store=uri, prefix=prefix, source=str(tree)
        )
        remember_source(
            paths,
            project=settings.project,
            project_identity=settings.identity,
            workflow=workflow,
            run_id=entry.run_id,
            source=tree,
        )
        try:
            plan = stage_source(
                store,
                tree,
                prefix,
                jobs=jobs,
                progress=progress,
                step=lambda name, details: journal.append(name, "done", **details),
                refuse_fix=f'RUN_ID="$({prepare})"  # a new run for a different source',
                index=paths.source_index(tree),
                verify=verify,
                rules=rules,
                before_commit=lambda: mark_run(store, settings.project, workflow, entry.run_id),
            )
        except NpaError as error:
            journal.append("failed", "failed", kind=error.kind, message=error.message)
            if error.details.get("errno") is not None:
                # The system refused (a full or read-only store): its fix, then this command.
                with_rerun(error, resume)
            elif error.fix is None or error.exit_code == 4:
                error.fix = resume
            raise
        except KeyboardInterrupt:
            journal.append("interrupted", "failed")
            raise Interrupted(
                f"staging the source of run {entry.run_id} was interrupted; rerunning the "
                "same command is safe and reuses what is already stored",
                fix=resume,
            ) from None
        journal.append("done", "done", source_digest=plan.digest)
    return StagedSource(
        run_id=entry.run_id,
        project=settings.project,
        workflow=workflow,
        source=str(tree),
        manifest=f"{store.uri}/{prefix}/source/manifest.json",
        source_digest=plan.digest,
        files=len(plan.files),
        bytes=sum(h.file.size for h in plan.files),
        left_out=sorted(rules.found.left_out),
        blobs=len({h.sha256 for h in plan.files}),
        hashed=plan.hashed,
        uploaded=plan.uploaded,
        uploaded_bytes=plan.uploaded_bytes,
        repaired=plan.repaired,
        already_committed=plan.already_committed,
        listed=plan.listed,
        seconds=round(time.monotonic() - started, 3),
        journal=str(journal.path),
        resume_command=resume,
        warnings=warnings,
    )


class RunStore(Result):
    """Where one run's data lives, and what says so."""

    run_id: str
    project: str
    store: str | None  # the store URI (None when nothing names one)
    source: str  # reservation | --store-uri | storage.uri | none
    detail: str


def run_store(
    workflow: str,
    run_id: str,
    *,
    project: str | None,
    store_uri: str | None,
    spec_store: str | None,
    paths: NpaPaths | None = None,
) -> RunStore:
    """The store of run ``run_id``: the one ``prepare-run`` fixed when it reserved the run (what
    ``submit`` and ``status`` use), so ``render`` and ``plan-spec`` describe exactly that run. A
    run that is not reserved (a review before any project exists) takes ``--store-uri``, else
    the spec's ``storage.uri``. A ``--store-uri`` that contradicts the reservation is refused."""
    paths = paths or NpaPaths.from_env()
    settings = resolve_project(project, paths=paths)
    entry = load_record(paths, settings.project, settings.identity, workflow).find(run_id)
    given = normalize_store_uri(store_uri, paths) if store_uri else None

    def named(store: str | None, source: str, detail: str) -> RunStore:
        return RunStore(
            run_id=run_id, project=settings.project, store=store, source=source, detail=detail
        )

    if entry is not None:
        if given is not None and given != entry.store:
            raise InvalidInput(
                f"run {run_id} was reserved in {entry.store} (project {settings.project}); "
                f"--store-uri {given} would describe another run's prefix",
                fix="--store-uri " + shlex.quote(entry.store),  # the run's own store
            )
        return named(
            entry.store, "reservation", f"reserved by prepare-run for project {settings.project}"
        )
    not_reserved = f"run {run_id} is not reserved in project {settings.project}"
    if given is not None:
        return named(given, "--store-uri", f"{not_reserved}; --store-uri names the store")
    if spec_store is not None:
        return named(
            spec_store,
            "storage.uri",
            f"{not_reserved}; the spec's storage.uri names the store (prepare-run fixes the "
            "store submit uses)",
        )
    return named(None, "none", f"{not_reserved} and the spec has no storage.uri")
