"""Finding one run from any shell: the resolver ``status``, ``logs``, ``artifacts``, ``cancel``
and ``load-artifact`` share.

A run is named by its id (with ``--project``) or by its run prefix (``s3://…/<workflow>/<run>``
or ``file://…``, with or without the trailing ``/npa-workflow``). The resolver asks each source
that could know the run and keeps every answer: the project's receipt, the project's
reservation records, and the run's canonical prefix in the store (its manifest, or any object
under it). Every answer is one of found / absent (authoritative) / unavailable (could not ask),
so a caller can never mistake "could not verify" for "absent". It reads only.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ValidationError

from npa.adapters.storage import (
    BucketAbsent,
    ObjectStore,
    StoreUnavailable,
    configured_store_uri,
    normalize_store_uri,
)
from npa.core.commands import cancel_command, status_command
from npa.core.errors import InvalidInput, NotFound, NpaError, RunMismatch, StateCorrupt
from npa.core.layout import (
    PREFIX_LEAF,
    RUN_ID_SHAPE,
    manifest_key,
    run_index_prefix,
    run_prefix,
)
from npa.core.paths import NpaPaths, safe_component
from npa.runs.identity import ReservationRecord, RunEntry
from npa.runs.index import is_complete, workflows_of
from npa.runs.manifest import RunManifest, read_manifest
from npa.runs.reading import RunKey, check_run_identity
from npa.runs.receipts import Receipt, read_receipt
from npa.services.configure import ProjectSettings, resolve_project
from npa.services.runstore import open_run_store as open_run_store

Answer = Literal["found", "absent", "unavailable", "skipped", "not_applicable"]


class SourceAnswer(BaseModel):
    """What one source said about the run."""

    source: str  # receipt | reservation | store-scan | manifest | run-prefix | backend-job | ...
    where: str
    answer: Answer
    detail: str = ""
    error: str | None = None
    fix: str | None = None


def cmd(*argv: str) -> str:
    return shlex.join(["npa", *argv])


@dataclass
class RunRef:
    """A run argument, parsed: its id, and the store and workflow when a prefix named them."""

    run_id: str
    store_uri: str | None = None
    workflow: str | None = None


def parse_run_ref(value: str, project: str = "default") -> RunRef:
    """``RUN_ID``, or a run prefix ``s3://B[/P]/<workflow>/<run>[/npa-workflow]`` / ``file://``.

    Only the exact run prefix is accepted: a deeper or shallower key, or a last part that is
    not a run id, is refused rather than guessed at (and :func:`locate` checks that the
    manifest found there is this run's own).
    """
    if "://" not in value:
        return RunRef(run_id=safe_component(value, "run id"))
    scheme = urlparse(value).scheme
    if scheme not in ("s3", "file"):
        raise InvalidInput(
            f"{value!r} is neither a run id nor an s3:// or file:// run prefix",
            fix=cmd("workbench", "workflow", "list", "--project", project) + "  # the run ids",
        )
    parts = value.rstrip("/").split("/")
    if parts[-1] == PREFIX_LEAF:
        parts = parts[:-1]
    head = "/".join(parts[:-2])
    shaped = len(parts) >= 5 and (scheme == "file" or len(parts) >= 6 or head != "s3:/")
    if not shaped or not parts[-1] or not parts[-2]:
        raise InvalidInput(
            f"{value!r} is not a run prefix: expected "
            f"{scheme}://…/<workflow>/<run-id>[/{PREFIX_LEAF}]",
            fix=cmd("workbench", "workflow", "list", "--project", project, "--json")
            + "  # prints each run's prefix",
        )
    if not RUN_ID_SHAPE.fullmatch(parts[-1]):
        raise InvalidInput(
            f"{value!r} is not a run prefix: its last part {parts[-1]!r} is not a run id (run "
            f"ids look like 20260101-120000-a1b2c3); expected "
            f"{scheme}://…/<workflow>/<run-id>[/{PREFIX_LEAF}]",
            fix=cmd("workbench", "workflow", "list", "--project", project, "--json")
            + "  # prints each run's prefix",
        )
    workflow = safe_component(parts[-2], "workflow in the run prefix")
    run_id = safe_component(parts[-1], "run id in the run prefix")
    return RunRef(run_id=run_id, store_uri=normalize_store_uri(head), workflow=workflow)


@dataclass
class Located:
    """A run as the resolver found it, with every source's answer."""

    settings: ProjectSettings
    run_id: str
    workflow: str | None
    store_uri: str | None
    store: ObjectStore | None
    receipt: Receipt | None
    reservation: RunEntry | None
    manifest: RunManifest | None
    partial: list[str]  # keys found under the prefix when there is no manifest
    sources: list[SourceAnswer] = field(default_factory=list)
    # The manifest under the run's key is another run's (see npa.runs.reading): every reader
    # reports this one error and shows none of that manifest's state.
    mismatch: RunMismatch | None = None
    project_asked: str | None = None  # --project, when it was given

    def require_own_run(self) -> None:
        """Raise the mismatch, if the manifest under the run's key is another run's."""
        if self.mismatch is not None:
            raise self.mismatch

    @property
    def project(self) -> str:
        return self.settings.project

    @property
    def prefix(self) -> str | None:
        if self.workflow is None:
            return None
        return run_prefix(self.workflow, self.run_id)

    @property
    def prefix_uri(self) -> str | None:
        if self.prefix is None or self.store_uri is None:
            return None
        return f"{self.store_uri}/{self.prefix}"

    def answer(self, source: str) -> SourceAnswer | None:
        return next((s for s in self.sources if s.source == source), None)

    @property
    def unavailable(self) -> list[SourceAnswer]:
        return [s for s in self.sources if s.answer == "unavailable"]

    @property
    def backend_name(self) -> str | None:
        if self.manifest is not None:
            return self.manifest.backend
        if self.receipt is not None and self.receipt.job is not None:
            return self.receipt.job.backend
        return None

    @property
    def job_id(self) -> int | None:
        """The current attempt's job id. The manifest is authoritative: a relaunch clears its
        id until the new job is known, and the receipt may still name the old attempt's job
        then; its id counts only for the job the manifest names."""
        m, job = self.manifest, self.receipt.job if self.receipt is not None else None
        if m is not None and m.job_id is not None:
            return m.job_id
        if job is None or not job.job_id or (m is not None and job.job_name != m.job_name):
            return None
        return int(job.job_id)

    @property
    def job_name(self) -> str | None:
        if self.manifest is not None:
            return self.manifest.job_name
        if self.receipt is not None and self.receipt.job is not None:
            return self.receipt.job.job_name
        return None

    @property
    def kube_context(self) -> str | None:
        from npa.backends import infra_context

        return infra_context(self.manifest.infra) if self.manifest is not None else None

    def status_command(self, *extra: str) -> str:
        return status_command(self.run_id, self.project, *extra)

    def cancel_command(self) -> str:
        return cancel_command(self.run_id, self.project)


def _error(source: str, where: str, error: NpaError, detail: str = "") -> SourceAnswer:
    return SourceAnswer(
        source=source,
        where=where,
        answer="unavailable",
        detail=detail or "could not be read; nothing is concluded from it",
        error=f"{error.kind}: {error.message}",
        fix=error.fix,
    )


BUCKET_ABSENT = "the bucket itself does not exist"


def _bucket_absent(source: str, where: str, error: BucketAbsent) -> SourceAnswer:
    return SourceAnswer(
        source=source,
        where=where,
        answer="absent",
        detail=BUCKET_ABSENT,
        error=error.message,
        fix=error.fix,
    )


def _receipt(paths: NpaPaths, project: str, run_id: str) -> tuple[Receipt | None, SourceAnswer]:
    where = str(paths.submission_receipt(project, run_id))
    try:
        receipt = read_receipt(paths, project, run_id)
    except NotFound:
        return None, SourceAnswer(source="receipt", where=where, answer="absent")
    except (StateCorrupt, OSError) as exc:
        error = exc if isinstance(exc, NpaError) else StateCorrupt(str(exc))
        return None, _error("receipt", where, error)
    job = receipt.job
    detail = f"submitted {receipt.submitted_at}" + (
        f"; {job.backend} job {job.job_id or '(id not yet recorded)'}" if job else ""
    )
    return receipt, SourceAnswer(source="receipt", where=where, answer="found", detail=detail)


def _reservation(
    paths: NpaPaths, project: str, run_id: str, workflow: str | None
) -> tuple[RunEntry | None, str | None, SourceAnswer]:
    folder = paths.reservations_dir / safe_component(project, "project")
    where = str(folder)
    try:
        files = sorted(folder.glob("*.json")) if folder.is_dir() else []
        for path in files:
            if workflow is not None and path.stem != workflow:
                continue
            record = ReservationRecord.model_validate(json.loads(path.read_text("utf-8")))
            entry = record.find(run_id)
            if entry is not None:
                return (
                    entry,
                    record.workflow,
                    SourceAnswer(
                        source="reservation",
                        where=str(path),
                        answer="found",
                        detail=f"reserved {entry.reserved_at} for workflow {record.workflow}",
                    ),
                )
    except (OSError, ValueError, ValidationError) as exc:
        error = StateCorrupt(f"{where}: {exc}", fix=f"ls -l {where}")
        return None, None, _error("reservation", where, error)
    return None, None, SourceAnswer(source="reservation", where=where, answer="absent")


def _scan_store(store: ObjectStore, run_id: str) -> tuple[list[str], SourceAnswer]:
    """Workflows of the store holding exactly ``<workflow>/<run_id>/npa-workflow/``."""
    where = f"{store.uri}/*/{run_id}/{PREFIX_LEAF}/"
    found = []
    try:
        for workflow in store.children(""):
            try:
                safe_component(workflow, "workflow")
            except InvalidInput:
                continue
            if store.list_page(f"{workflow}/{run_id}/{PREFIX_LEAF}/", page_size=1).objects:
                found.append(workflow)
    except BucketAbsent as error:
        # The store's own answer: nothing can be under a bucket that does not exist.
        return [], _bucket_absent("store-scan", where, error)
    except StoreUnavailable as error:
        return [], _error("store-scan", where, error)
    answer: Answer = "found" if found else "absent"
    return found, SourceAnswer(
        source="store-scan", where=where, answer=answer, detail=", ".join(found)
    )


def _pinned(ref: RunRef, workflow_uri: str | None, project: str) -> RunRef:
    """The run named by ``--workflow-s3-uri`` (which must be the same run), else ``ref``."""
    if workflow_uri is None:
        return ref
    pinned = parse_run_ref(workflow_uri, project)
    if "://" not in workflow_uri:
        raise InvalidInput(
            "--workflow-s3-uri takes the run prefix (s3://…/<workflow>/<run>/npa-workflow)",
            fix=cmd("workbench", "workflow", "list", "--project", project, "--json"),
        )
    if pinned.run_id != ref.run_id:
        raise InvalidInput(
            f"--workflow-s3-uri names run {pinned.run_id}, not {ref.run_id}",
            fix=cmd("workbench", "workflow", "list", "--project", project, "--json")
            + "  # prints each run's prefix",
        )
    return pinned


def _indexed_workflows(located: Located, store: ObjectStore, run_id: str) -> list[str] | None:
    """The workflows the project's run index names for the run (one listing; a second, of the
    index's completeness mark, when it names none). None when the index cannot settle it: it is
    not complete yet (the first ``list`` completes it), so the store is scanned instead."""
    project = located.project
    where = f"{store.uri}/{run_index_prefix(project)}"
    try:
        workflows = workflows_of(store, project, run_id)
        complete = bool(workflows) or is_complete(store, project)
    except BucketAbsent as error:
        located.sources.append(_bucket_absent("run-index", where, error))
        return []
    except StoreUnavailable as error:
        located.sources.append(_error("run-index", where, error))
        return []
    # Without --project a run of any project is the run asked about (as by its prefix), and
    # the index is the default project's only: one it does not name is looked for everywhere.
    unasked = not workflows and located.project_asked is None
    if not complete or unasked:
        why = (
            f"no run {run_id} of project {project}, and no --project was given"
            if complete
            else "not complete for this project yet (the first list completes it)"
        )
        located.sources.append(
            SourceAnswer(
                source="run-index",
                where=where,
                answer="skipped",
                detail=f"{why}: the store was scanned instead",
            )
        )
        return None
    located.sources.append(
        SourceAnswer(
            source="run-index",
            where=where,
            answer="found" if workflows else "absent",
            detail=", ".join(workflows) if workflows else f"no run {run_id} of project {project}",
        )
    )
    return workflows


def _found_workflow(located: Located, store: ObjectStore, run_id: str) -> str | None:
    """The one workflow of the store that holds the run, as the project's run index says (the
    whole store scanned only when that index is not complete); None when none does."""
    workflows = _indexed_workflows(located, store, run_id)
    if workflows is None:
        workflows, scan = _scan_store(store, run_id)
        located.sources.append(scan)
    if len(workflows) > 1:
        store_uri = located.store_uri
        raise InvalidInput(
            f"run {run_id} exists under several workflows of {store_uri}: "
            f"{', '.join(workflows)}; npa will not pick one",
            fix=located.status_command(
                "--workflow-s3-uri", f"{store_uri}/{run_prefix(workflows[0], run_id)}"
            ),
        )
    return workflows[0] if workflows else None


def _read_run_manifest(located: Located, store: ObjectStore, prefix: str) -> bool:
    """Ask the store for the run's manifest; True when the answer settles the run (found, or
    the store could not answer), False when the manifest is absent."""
    where = f"{located.store_uri}/{manifest_key(prefix)}"
    try:
        located.manifest = read_manifest(store, prefix)
    except BucketAbsent as error:
        located.sources.append(_bucket_absent("manifest", where, error))
        return True
    except (StoreUnavailable, StateCorrupt) as error:
        located.sources.append(_error("manifest", where, error))
        return True
    m = located.manifest
    if m is None:
        located.sources.append(SourceAnswer(source="manifest", where=where, answer="absent"))
        return False
    assert located.workflow is not None
    # The project is compared when one was asked about: a run named by its prefix alone is
    # that run, whichever project it belongs to.
    key = RunKey(run_id=located.run_id, workflow=located.workflow, prefix=prefix,
                 project=located.project_asked)  # fmt: skip
    mismatch = check_run_identity(m, key, where)
    if mismatch is not None:
        # Not this run's record (copied or written under its key, or another project's):
        # reporting its state would report another run.
        located.manifest, located.mismatch = None, mismatch
        located.sources.append(
            _error("manifest", where, mismatch, "belongs to another run; nothing is concluded")
        )
        return True
    located.sources.append(
        SourceAnswer(
            source="manifest",
            where=where,
            answer="found",
            detail=f"recorded state {m.state}; {m.backend} job {m.job_id}",
        )
    )
    return True


def _list_run_prefix(located: Located, store: ObjectStore, prefix: str) -> None:
    """What lies under a run prefix that has no manifest."""
    where = f"{located.store_uri}/{prefix}/"
    try:
        page = store.list_page(f"{prefix}/", page_size=5)
    except (StoreUnavailable, BucketAbsent) as error:
        located.sources.append(_error("run-prefix", where, error))
        return
    located.partial = [o.key[len(prefix) + 1 :] for o in page.objects]
    located.sources.append(
        SourceAnswer(
            source="run-prefix",
            where=where,
            answer="found" if page.objects else "absent",
            detail=("holds " + ", ".join(located.partial)) if page.objects else "",
        )
    )


def locate(
    run: str,
    project: str | None,
    *,
    workflow_uri: str | None = None,
    paths: NpaPaths | None = None,
) -> Located:
    """Resolve ``run`` and ask every local and store source about it. Reads only."""
    paths = paths or NpaPaths.from_env()
    settings = resolve_project(project, paths=paths)
    ref = _pinned(parse_run_ref(run, settings.project), workflow_uri, settings.project)
    receipt, receipt_answer = _receipt(paths, settings.project, ref.run_id)
    entry, reserved_workflow, reservation_answer = _reservation(
        paths, settings.project, ref.run_id, ref.workflow
    )
    located = Located(
        settings=settings,
        run_id=ref.run_id,
        workflow=ref.workflow or (receipt.workflow if receipt else None) or reserved_workflow,
        store_uri=None,
        store=None,
        receipt=receipt,
        reservation=entry,
        manifest=None,
        partial=[],
        sources=[receipt_answer, reservation_answer],
        project_asked=project,
    )
    store_uri = (
        ref.store_uri
        or (receipt.store if receipt else None)
        or (entry.store if entry else None)
        or configured_store_uri(settings.value("store"), paths, settings.project)
    )
    located.store_uri = store_uri
    store = open_run_store(store_uri, settings, receipt, paths)
    located.store = store
    if located.workflow is None:
        located.workflow = _found_workflow(located, store, ref.run_id)
        if located.workflow is None:
            return located
    prefix = located.prefix
    assert prefix is not None
    if not _read_run_manifest(located, store, prefix):
        _list_run_prefix(located, store, prefix)
    return located
