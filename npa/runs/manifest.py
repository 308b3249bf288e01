"""The run manifest: ``<workflow>/<run>/npa-workflow/manifest.json`` in the run's store.

It says what was submitted (plan, source, tasks, images, backend, job identity) and how the run
is doing (its state, each stage and wave, and the supervisor's record of failures and the
recovery taken). ``submit`` writes it before launching; the run's watcher (and the executor it
hosts) updates it as the run progresses. Writers on one machine serialise on a local lock, and
every write replaces whole objects, so a reader sees one consistent version of each.

A run of more than :data:`PAGE_STAGES` stages keeps its stage records and task digests in pages
beside the manifest (``manifest-pages/NNNN.json``, each stage in :func:`page_of`), the manifest
itself holding the run's own fields: a step of one stage then rewrites its page and the small
manifest, not a record that grows with every stage (at 20,000 stages the whole record is 14.6
MB, and a run makes five steps a stage). Writers put the pages before the manifest and readers
read the manifest before the pages, so what a reader sees of a stage is never older than what it
sees of the run. A smaller run's records stay in the manifest, as they always were.

The run's ``plan.json`` beside it is written and read here too, always through its model.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from collections.abc import Callable, Collection, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from npa.adapters.storage import ObjectAbsent, ObjectStore, inspect_command
from npa.adapters.storage.base import read_map
from npa.backends.base import JobStages
from npa.core.errors import StateCorrupt
from npa.core.fsio import exclusive_lock
from npa.core.layout import (
    MANIFEST_PAGES,
    job_name,
    manifest_key,
    manifest_page_key,
    manifest_page_name,
    plan_key,
)
from npa.plan.model import WorkflowPlan
from npa.runs.secrets import ensure_secret_free

RUN_MANIFEST_VERSION = 1
# A run of more stages than this keeps its stage records in pages of about this many stages.
PAGE_STAGES = 128
MAX_PAGES = 100_000  # a manifest naming more is refused before any page is asked for


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WaveRecord(_Model):
    wave: int
    shards: list[int]
    state: str  # PENDING / RUNNING / SUCCEEDED / FAILED / CANCELLED
    attempts: int = 0
    # When the backend was asked to start the wave (the report's "launch" phase runs from here
    # to its first shard attempt's start), when it started, when it ended.
    launched_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    exit_codes: dict[str, int] = Field(default_factory=dict)  # shard -> exit code


class StageRecord(_Model):
    state: str = "PENDING"
    started_at: str | None = None
    ended_at: str | None = None
    waves: list[WaveRecord] = Field(default_factory=list)
    outputs: dict[str, int] = Field(default_factory=dict)  # declared output -> bytes stored
    classification: str | None = None
    detail: str | None = None


class SupervisorAttempt(_Model):
    at: str
    what: str  # the failing thing: "launch", "stage square wave 0", ...
    failure: str  # a stable signature of the failure (used to count identical ones)
    classification: str
    recovery: str
    detail: str
    # The controller side failed to bring the job up (a refused launch, a job that ended
    # FAILED_CONTROLLER): identical ones in a row end the run FAILED_STARTUP.
    startup: bool = False
    stage: str | None = None  # the stage that failed, when one did


class StrayJob(_Model):
    """A job that carried one of the run's names without being the run's job (a backend that
    created a second job for one request), cancelled by its id."""

    job_id: int
    job_name: str
    state: str  # as seen before the cancel
    at: str
    by: str  # "supervisor" or "cancel"


class SupervisorRecord(_Model):
    """What supervision concluded: the last classification and the recovery it took."""

    classification: str | None = None
    recovery: str | None = None
    startup_failures: int = 0
    infrastructure_recoveries: int = 0
    payload_retries: int = 0
    relaunches: int = 0  # new jobs the supervisor started for this run (job name -a<N>)
    job_ids: list[int] = Field(default_factory=list)  # every job the run had, oldest first
    strays: list[StrayJob] = Field(default_factory=list)  # duplicates found and cancelled
    attempts: list[SupervisorAttempt] = Field(default_factory=list)


class ResumeRecord(_Model):
    """One ``submit --resume-run``: the job it replaced and the work it adopted."""

    at: str
    attempt: int  # 1 for the first resume; the job name carries it (-r<attempt>)
    previous_job_id: int | None
    previous_state: str
    adopted_stages: list[str]  # complete, every declared output validated non-empty
    adopted_waves: dict[str, list[int]] = Field(default_factory=dict)  # partial stages
    job_name: str


class RunManifest(_Model):
    version: int = RUN_MANIFEST_VERSION
    project: str
    workflow: str
    run_id: str
    backend: str
    infra: str
    state: str
    submitted_at: str
    updated_at: str
    store: str
    prefix: str
    spec_sha256: str
    source_digest: str | None
    plan_digest: str
    tasks: dict[str, str]  # stage -> sha256 of its task file
    # The stages in plan order: the mappings here are written with sorted keys.
    order: list[str] = Field(default_factory=list)
    images: dict[str, str]  # TOOL_REF -> pinned reference
    accelerator_remap: dict[str, str] = Field(default_factory=dict)
    policy: dict[str, Any] = Field(default_factory=dict)
    job_name: str
    job_id: int | None = None
    launch_transaction: dict[str, Any] | None = None
    supervisor: SupervisorRecord = Field(default_factory=SupervisorRecord)
    stages: dict[str, StageRecord] = Field(default_factory=dict)
    resumes: list[ResumeRecord] = Field(default_factory=list)
    # How many pages beside the manifest hold ``stages`` and ``tasks`` (0: they are in it).
    # Chosen at the first write, from the run's stage count, and kept.
    stage_pages: int = Field(default=0, ge=0, le=MAX_PAGES)
    # The pages this copy was read with (None: all of them, or a copy never read) and each
    # one's bytes as read: a write puts only those, and only the ones it changed.
    _pages_read: set[int] | None = PrivateAttr(default=None)
    _page_bytes: dict[int | str, bytes] = PrivateAttr(default_factory=dict)


class StagePage(_Model):
    """One page of a paged manifest: the records and task digests of the stages in it."""

    run_id: str
    page: int
    pages: int
    tasks: dict[str, str] = Field(default_factory=dict)
    stages: dict[str, StageRecord] = Field(default_factory=dict)


class StageOrder(_Model):
    """A paged manifest's ``order`` (the stages in plan order), beside its pages: written at the
    first write and read only with every page, so a step rewrites no list of every stage."""

    run_id: str
    pages: int
    order: list[str]


ORDER = "order"  # the page of a paged manifest that holds its order


def page_of(stage: str, pages: int) -> int:
    """The page of a paged manifest that holds ``stage`` (a stable hash of its name)."""
    return zlib.crc32(stage.encode("utf-8")) % pages


def pages_for(stages: int) -> int:
    """How many pages a run of ``stages`` stages keeps its records in (0: in the manifest)."""
    return 0 if stages <= PAGE_STAGES else -(-stages // PAGE_STAGES)


def launch_generation(manifest: RunManifest | None) -> int:
    """Which of the run's launches the manifest's current job is: 0 for the first submit, N
    after the N-th resume (a watcher's relaunch stays in its launch's generation). The run's
    Secret records the generation it was written for, so a release decided on this manifest
    removes no Secret a later resume wrote (:func:`npa.adapters.kube.secrets.delete_run_secret`).
    A run without a manifest counts as 0: nothing written by a resume is older than it."""
    return len(manifest.resumes) if manifest is not None else 0


def base_job_name(manifest: RunManifest) -> str:
    """The name of the run's current job before any watcher relaunch: the last resume's job
    name, else the run's own. A relaunch's name is this plus ``-a<N>``."""
    return (
        manifest.resumes[-1].job_name
        if manifest.resumes
        else job_name(manifest.workflow, manifest.run_id)
    )


def job_stages(manifest: RunManifest) -> JobStages:
    """The stages the manifest's current job runs: every stage but those the last resume
    adopted, and the waves it adopted of a partly run stage (a watcher's relaunch of a resumed
    job runs the same)."""
    last = manifest.resumes[-1] if manifest.resumes else None
    return JobStages(
        run_id=manifest.run_id,
        stages=list(manifest.tasks),
        adopted=list(last.adopted_stages) if last else [],
        adopted_waves={k: list(v) for k, v in last.adopted_waves.items()} if last else {},
    )


def read_manifest(
    store: ObjectStore, prefix: str, *, stages: Iterable[str] | None = None
) -> RunManifest | None:
    """The manifest, or None when the store says it does not exist (errors propagate).

    ``stages`` reads a paged manifest's records of those stages only (the pages holding them):
    the copy then has no other stage's record or task, and writing it puts only those pages.
    """
    try:
        raw = store.get(manifest_key(prefix))
    except ObjectAbsent:
        return None
    key = manifest_key(prefix)
    manifest = parse_manifest(raw, f"{store.uri}/{key}", inspect_command(store, key))
    if manifest.prefix == prefix:
        # A manifest that records another prefix is not this run's (every reader's identity
        # check says whose it is): its pages are not looked for here.
        read_pages(store, prefix, manifest, stages)
    return manifest


def parse_manifest(raw: bytes, where: str, inspect: str) -> RunManifest:
    """A stored manifest's bytes as the model; StateCorrupt names ``where`` when they are not,
    with ``inspect`` (the command that shows the stored object) as its fix. A paged manifest's
    stage records are not in these bytes: :func:`read_pages` adds them."""
    try:
        return RunManifest.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise StateCorrupt(
            f"{where} is not an npa run manifest: {exc}",
            fix=inspect + "  # inspect before resubmitting",
        ) from None


def _page_key(prefix: str, page: int | str) -> str:
    # A store opened at the run prefix itself (insights) names the page without one.
    return manifest_page_key(prefix, page) if prefix else manifest_page_name(page)


def read_pages(
    store: ObjectStore, prefix: str, manifest: RunManifest, stages: Iterable[str] | None = None
) -> None:
    """Add a paged manifest's stage records, task digests and order to ``manifest`` (read from
    its store under ``prefix``): every page's, or only the records and digests of the pages
    holding ``stages``. Nothing to do for a manifest that holds its records itself."""
    count = manifest.stage_pages
    if not count:
        return
    numbered = sorted(range(count) if stages is None else {page_of(s, count) for s in stages})
    wanted: list[int | str] = [*([ORDER] if stages is None else []), *numbered]
    with contextlib.ExitStack() as stack:
        fetch = read_map(store, stack) if len(wanted) > 1 else map
        raws = list(fetch(lambda n: _get_page(store, prefix, n), wanted))
    for number, raw in zip(wanted, raws, strict=True):
        key = _page_key(prefix, number)
        if number == ORDER:
            order = _parse_page(raw, StageOrder, store, key)
            _check_page(store, key, manifest, ("order", count), ("order", order.pages), order)
            manifest.order = order.order
        else:
            page = _parse_page(raw, StagePage, store, key)
            _check_page(store, key, manifest, (number, count), (page.page, page.pages), page)
            _check_members(store, key, page)
            manifest.tasks.update(page.tasks)
            manifest.stages.update(page.stages)
        manifest._page_bytes[number] = raw
    if stages is None:  # the whole record: in plan order, as a manifest that holds it is
        rank = {name: i for i, name in enumerate(manifest.order)}
        ranked = sorted(manifest.tasks.keys() | manifest.stages.keys(), key=_by(rank))
        manifest.tasks = {n: manifest.tasks[n] for n in ranked if n in manifest.tasks}
        manifest.stages = {n: manifest.stages[n] for n in ranked if n in manifest.stages}
    else:
        manifest._pages_read = set(numbered)


def _check_page(
    store: ObjectStore,
    key: str,
    manifest: RunManifest,
    expected: tuple[int | str, int],
    found: tuple[int | str, int],
    page: StagePage | StageOrder,
) -> None:
    """A page is the one its key names, of this run's manifest, or it is refused by name."""
    if (page.run_id, *found) != (manifest.run_id, *expected):
        raise StateCorrupt(
            f"{store.uri}/{key} is not page {expected[0]} of {expected[1]} of run "
            f"{manifest.run_id}'s manifest: it says page {found[0]} of {found[1]} of run "
            f"{page.run_id}",
            fix=inspect_command(store, key) + "  # inspect before resubmitting",
        )


def _check_members(store: ObjectStore, key: str, page: StagePage) -> None:
    """Every stage in a page belongs there: a stage read or written for itself is looked for in
    its own page only, so a record elsewhere would be a second record of it."""
    stray = sorted(
        n for n in page.tasks.keys() | page.stages.keys() if page_of(n, page.pages) != page.page
    )
    if stray:
        raise StateCorrupt(
            f"{store.uri}/{key} holds the record of stage {stray[0]}, which belongs in page "
            f"{page_of(stray[0], page.pages)} of {page.pages}",
            fix=inspect_command(store, key) + "  # inspect before resubmitting",
        )


def _by(rank: dict[str, int]) -> Callable[[str], tuple[int, str]]:
    return lambda name: (rank.get(name, len(rank)), name)


def _get_page(store: ObjectStore, prefix: str, page: int | str) -> bytes:
    key = _page_key(prefix, page)
    try:
        return store.get(key)
    except ObjectAbsent:
        raise StateCorrupt(
            f"{store.uri}/{key} is missing: the run's manifest keeps its stage records in pages "
            "and this one is not in the store",
            fix=inspect_command(
                store, f"{prefix}/{MANIFEST_PAGES}" if prefix else MANIFEST_PAGES, listing=True
            )
            + "  # inspect before resubmitting",
        ) from None


_Page = TypeVar("_Page", StagePage, StageOrder)


def _parse_page(raw: bytes, model: type[_Page], store: ObjectStore, key: str) -> _Page:
    try:
        return model.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise StateCorrupt(
            f"{store.uri}/{key} is not a page of an npa run manifest: {exc}",
            fix=inspect_command(store, key) + "  # inspect before resubmitting",
        ) from None


def write_manifest(store: ObjectStore, manifest: RunManifest, *, fresh_pages: bool = False) -> None:
    """Store the manifest as indented JSON, its fields in the model's order. Written by
    pydantic's serializer: ``json.dumps`` with an indent is the pure-Python encoder, 85% of a
    manifest update (0.049 s against 0.005 s a write at 2,000 stages).

    A run of more than :data:`PAGE_STAGES` stages is written paged: first the pages this copy
    was read with, then the manifest without the stage records. ``fresh_pages``: the copy was
    read just now under the manifest lock (:func:`update_manifest`), so a page whose bytes it
    did not change is still the stored one and is not put again. Any other copy (a snapshot
    put back by a rollback) writes every page it holds.
    """
    manifest.updated_at = now_iso()
    if not manifest.stage_pages:
        manifest.stage_pages = pages_for(len(manifest.tasks.keys() | manifest.stages.keys()))
    key = manifest_key(manifest.prefix)
    if manifest.stage_pages:  # the run's own fields; its stage records are in the pages
        beside: dict[str, Any] = {"stages": {}, "tasks": {}, "order": []}
        text = manifest.model_copy(update=beside).model_dump_json(indent=2)
    else:
        text = manifest.model_dump_json(indent=2, exclude={"stage_pages"})
    text += "\n"
    # Every object is checked before any is written: a refusal writes nothing.
    head = ensure_secret_free(text, f"manifest {store.uri}/{key}").encode("utf-8")
    for number, data in _changed_pages(store, manifest, fresh_pages):
        store.put(manifest_page_key(manifest.prefix, number), data)
        manifest._page_bytes[number] = data
    store.put(key, head)


def _changed_pages(
    store: ObjectStore, manifest: RunManifest, fresh: bool
) -> list[tuple[int | str, bytes]]:
    """The pages of a paged manifest to write: those it was read with (when ``fresh``, the ones
    whose bytes it changed)."""
    count, held = manifest.stage_pages, manifest._pages_read
    if not count:
        return []
    tasks: dict[int, dict[str, str]] = {}
    records: dict[int, dict[str, StageRecord]] = {}
    for name, digest in manifest.tasks.items():
        tasks.setdefault(page_of(name, count), {})[name] = digest
    for name, rec in manifest.stages.items():
        records.setdefault(page_of(name, count), {})[name] = rec
    texts: dict[int | str, str] = {}
    if held is None:
        order = StageOrder(run_id=manifest.run_id, pages=count, order=manifest.order)
        texts[ORDER] = order.model_dump_json(indent=2)
    elif (stray := (tasks.keys() | records.keys()) - held) or manifest.order:
        # A copy read for some stages was given another's record (or an order): writing would
        # lose what the pages it never read hold.
        raise RuntimeError(f"manifest pages {sorted(stray) or [ORDER]} were changed, never read")
    for page in sorted(range(count) if held is None else held):
        texts[page] = StagePage(
            run_id=manifest.run_id,
            page=page,
            pages=count,
            tasks=tasks.get(page, {}),
            stages=records.get(page, {}),
        ).model_dump_json(indent=2)
    changed: list[tuple[int | str, bytes]] = []
    for part, text in texts.items():
        where = f"manifest page {store.uri}/{manifest_page_key(manifest.prefix, part)}"
        data = ensure_secret_free(text + "\n", where).encode("utf-8")
        if not fresh or manifest._page_bytes.get(part) != data:
            changed.append((part, data))
    return changed


def delete_manifest(store: ObjectStore, prefix: str) -> None:
    """Remove the manifest, then any pages of it (no reader sees a manifest without pages)."""
    store.delete(manifest_key(prefix))
    for found in store.list(f"{prefix}/{MANIFEST_PAGES}/"):
        store.delete(found.key)


def update_manifest(
    store: ObjectStore,
    prefix: str,
    lock: Path,
    mutate: Callable[[RunManifest], None],
    *,
    stages: Collection[str] | None = None,
) -> RunManifest:
    """Read, change and write the manifest under the run's local manifest lock. ``stages``
    names the only stages ``mutate`` touches: a paged manifest is then read and written for
    those alone (see :func:`read_manifest`)."""
    with exclusive_lock(lock, timeout=60, purpose="updating the run manifest"):
        manifest = read_manifest(store, prefix, stages=stages)
        if manifest is None:
            raise StateCorrupt(
                f"the manifest of {store.uri}/{prefix} disappeared while the run was live",
                fix=inspect_command(store, prefix, listing=True),
            )
        mutate(manifest)
        write_manifest(store, manifest, fresh_pages=True)
        return manifest


def plan_text(plan: WorkflowPlan) -> str:
    """``plan.json`` as submit stores it (its digest is the manifest's ``plan_digest``)."""
    return json.dumps(plan.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def write_plan(store: ObjectStore, prefix: str, plan: WorkflowPlan) -> None:
    store.put(plan_key(prefix), plan_text(plan).encode())


def read_plan(store: ObjectStore, prefix: str) -> WorkflowPlan | None:
    """The run's plan, or None when the store says it does not exist (errors propagate)."""
    try:
        raw = store.get(plan_key(prefix))
    except ObjectAbsent:
        return None
    key = plan_key(prefix)
    return parse_plan(raw, f"{store.uri}/{key}", inspect_command(store, key))


def parse_plan(raw: bytes, where: str, inspect: str) -> WorkflowPlan:
    """A stored plan's bytes as the model; StateCorrupt names ``where`` when they are not,
    with ``inspect`` (the command that shows the stored object) as its fix."""
    try:
        return WorkflowPlan.model_validate_json(raw)
    except ValidationError as exc:
        raise StateCorrupt(
            f"{where} is not an npa run plan: {exc.errors()[0]['msg']}",
            fix=inspect + "  # inspect before resubmitting",
        ) from None
