"""The per-project run index: a project's runs in a shared store, found by listing one folder.

A store may hold many projects' runs under ``<workflow>/<run>/``, and nothing in that path says
whose a run is: only its manifest does. So every project has a folder of small markers in the
store, ``.npa-index/<project>/<order>.<run>@<workflow>`` (:mod:`npa.core.layout` names them),
and ``list`` and ``status`` list that folder instead of reading other projects' manifests:

- **Written first.** ``stage-source`` and ``submit`` write a run's marker before the run's first
  object (its source commit, its plan, its manifest), so every run a current npa wrote is in
  its project's index. A crash between the two leaves a marker whose run holds less than a
  manifest, which reads as what it is (``PLAN_ONLY``, or nothing at all), never a run missing.
- **Newest first in one page.** ``<order>`` is the run id with each hex digit complemented
  (:func:`npa.core.layout.newest_first`), so an ascending listing, the only order S3 has, starts
  with the newest run: ``list --limit 50`` lists one page of 52 keys whatever the project's size.
- **Complete, or repaired once.** ``.complete`` (which sorts before every marker, so it comes in
  that same page) says every run of the project written before the index existed is indexed
  too. Until it exists (a store written by an older npa, or an index someone removed), ``list``
  repairs it (:func:`repair`): it lists the store's run folders and every project's markers, the
  pages of each folder concurrently, reads the manifest of each run no project's index names,
  writes a marker for it under the project that manifest names, then writes ``.complete``.
- **Where to look, not whose it is.** A marker is never evidence of identity: the manifest found
  under it still goes through :func:`npa.runs.reading.check_run_identity`, as everywhere else.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from npa.adapters.storage import ObjectStore, StoreUnavailable
from npa.core.errors import InvalidInput, NpaError, StateCorrupt
from npa.core.layout import (
    RUN_ID_SHAPE,
    RUN_INDEX,
    run_index_complete_key,
    run_index_key,
    run_index_prefix,
    run_index_run_prefix,
    run_of_index_key,
    run_prefix,
)
from npa.core.paths import safe_component

# Concurrent store requests of one listing or repair (the read path opens 16 connections).
CONCURRENCY = 16

RunRef = tuple[str, str]  # (run id, workflow)
T = TypeVar("T")
R = TypeVar("R")


def _marker_body(project: str, workflow: str, run_id: str) -> bytes:
    from npa.runs.manifest import now_iso  # the manifest models: not on list's read path

    body = {
        "project": project,
        "workflow": workflow,
        "run_id": run_id,
        "prefix": run_prefix(workflow, run_id),
        "indexed_at": now_iso(),
    }
    return (json.dumps(body, sort_keys=True) + "\n").encode()


def mark_run(store: ObjectStore, project: str, workflow: str, run_id: str) -> None:
    """Write the run's marker (idempotent: one PUT of a few bytes). Called before the run's
    first object is written, so the index never misses a run that exists."""
    if RUN_ID_SHAPE.fullmatch(run_id):
        store.put(run_index_key(project, workflow, run_id), _marker_body(project, workflow, run_id))


def workflows_of(store: ObjectStore, project: str, run_id: str) -> list[str]:
    """The workflows the project's index names for ``run_id`` (one listing request)."""
    prefix = run_index_run_prefix(project, run_id)
    page = store.list_page(prefix, page_size=100)
    return sorted(
        ref[1]
        for obj in page.objects
        if (ref := run_of_index_key(project, obj.key)) is not None and ref[0] == run_id
    )


def is_complete(store: ObjectStore, project: str) -> bool:
    return store.exists(run_index_complete_key(project))


@dataclass
class IndexReader:
    """The project's markers newest first, a page at a time: the first page also says whether
    the index is complete (its mark sorts first)."""

    store: ObjectStore
    project: str
    page_size: int
    complete: bool = False
    _buffer: deque[RunRef] = field(default_factory=deque)
    _token: str | None = None
    _read: bool = False

    def _page(self) -> None:
        prefix = run_index_prefix(self.project)
        page = self.store.list_page(prefix, token=self._token, page_size=self.page_size)
        for obj in page.objects:
            if obj.key == run_index_complete_key(self.project):
                self.complete = True
            elif (ref := run_of_index_key(self.project, obj.key)) is not None:
                self._buffer.append(ref)
        self._token, self._read = page.next_token, True

    def open(self) -> IndexReader:
        if not self._read:
            self._page()
        return self

    def take(self, n: int) -> list[RunRef]:
        """Up to ``n`` more runs, newest first (reading further pages as needed)."""
        self.open()
        while len(self._buffer) < n and self._token is not None:
            self._page()
        return [self._buffer.popleft() for _ in range(min(n, len(self._buffer)))]

    @property
    def more(self) -> bool:
        return bool(self._buffer) or self._token is not None


# --- repair ---------------------------------------------------------------------------------


@dataclass
class Repair:
    """What one repair found and did."""

    runs: list[RunRef]  # the project's runs, newest first
    marked: int = 0  # markers written for runs no index named (any project's)
    unattributed: int = 0  # run folders without a manifest: nobody's run yet
    # Runs whose manifest could not be read now (the store did not answer): whose they are is
    # unknown, so the repair is not complete and the next list tries again.
    unreadable: dict[RunRef, NpaError] = field(default_factory=dict)
    unwritten: NpaError | None = None  # a marker or the completeness mark that was refused
    complete: bool = False


def _each(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``fn`` over ``items``, up to CONCURRENCY at a time, in order."""
    items = list(items)
    if len(items) <= 1:
        return [fn(i) for i in items]
    from concurrent.futures import ThreadPoolExecutor  # the repair's: list's path needs none

    with ThreadPoolExecutor(max_workers=min(CONCURRENCY, len(items))) as pool:
        return list(pool.map(fn, items))


def _names(store: ObjectStore, prefix: str) -> list[str]:
    """The folders under ``prefix`` that could name a workflow or a project."""
    found = []
    for name in store.children(prefix):
        try:
            safe_component(name, "name")
        except InvalidInput:
            continue
        found.append(name)
    return found


def run_folders(store: ObjectStore) -> list[RunRef]:
    """Every run folder of the store: one delimiter listing of the workflows, then those of
    every workflow's run ids, concurrently."""
    workflows = _names(store, "")
    per_workflow = _each(lambda wf: store.children(f"{wf}/"), workflows)
    return [
        (run_id, wf) for wf, runs in zip(workflows, per_workflow, strict=True)
        for run_id in runs if RUN_ID_SHAPE.fullmatch(run_id)
    ]  # fmt: skip


def indexed_runs(store: ObjectStore) -> dict[str, set[RunRef]]:
    """Every project's markers: project -> its runs (each project's folder listed concurrently)."""
    projects = _names(store, f"{RUN_INDEX}/")

    def markers(project: str) -> set[RunRef]:
        return {
            ref
            for obj in store.list(run_index_prefix(project))
            if (ref := run_of_index_key(project, obj.key)) is not None
        }

    return dict(zip(projects, _each(markers, projects), strict=True))


def _owner(store: ObjectStore, ref: RunRef, asking: str) -> str | None:
    """The project a run belongs to as its manifest says: None without a manifest; the asking
    project for a manifest nobody can read (it stays in sight of the one who found it, whose
    ``list`` shows why). StoreUnavailable propagates."""
    from npa.runs.manifest import read_manifest  # the repair only: not on list's read path

    run_id, workflow = ref
    try:
        manifest = read_manifest(store, run_prefix(workflow, run_id))
    except StateCorrupt:
        return asking
    if manifest is None:
        return None
    try:
        return safe_component(manifest.project, "project")
    except InvalidInput:
        return asking


def repair(store: ObjectStore, project: str) -> Repair:
    """Index every run of the store no project's index names yet, then mark the project's
    index complete (unless a manifest or a write could not be done now)."""
    folders = run_folders(store)
    indexed = indexed_runs(store)
    anyone = set().union(*indexed.values()) if indexed else set()
    missing = [ref for ref in folders if ref not in anyone]

    def owner(ref: RunRef) -> str | NpaError | None:
        try:
            return _owner(store, ref, project)
        except StoreUnavailable as error:
            return error

    owners = _each(owner, missing)
    result = Repair(runs=[])
    mine = set(indexed.get(project, set()))
    to_mark: list[tuple[str, RunRef]] = []
    for ref, found in zip(missing, owners, strict=True):
        if isinstance(found, NpaError):
            result.unreadable[ref] = found
        elif found is None:
            result.unattributed += 1
        else:
            to_mark.append((found, ref))
            if found == project:
                mine.add(ref)

    def mark(item: tuple[str, RunRef]) -> NpaError | None:
        owner_project, (run_id, workflow) = item
        try:
            mark_run(store, owner_project, workflow, run_id)
        except StoreUnavailable as error:
            return error
        return None

    refused = [e for e in _each(mark, to_mark) if e is not None]
    result.marked = len(to_mark) - len(refused)
    result.unwritten = refused[0] if refused else None
    if not refused and not result.unreadable:
        try:
            store.put(run_index_complete_key(project), _complete_body(project, len(mine)))
            result.complete = True
        except StoreUnavailable as error:
            result.unwritten = error
    result.runs = sorted(mine, key=lambda ref: run_index_key(project, ref[1], ref[0]))
    return result


def _complete_body(project: str, runs: int) -> bytes:
    from npa.runs.manifest import now_iso

    body = {"project": project, "runs_indexed": runs, "completed_at": now_iso()}
    return (json.dumps(body, sort_keys=True) + "\n").encode()
