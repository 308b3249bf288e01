"""The per-project run index (npa/runs/index.py) on a file:// store, in this process: ``list``
and ``status`` find a project's runs by listing its index, never by reading another project's
objects; the index is repaired from the manifests when it is missing or incomplete; a manifest
copied under another run's key is flagged by the one identity check, and a copy under a key no
index names is not listed at all. The store is wrapped in a counter, so the tests assert which
requests were made (the S3 twins are in tests/integration/test_run_index_s3.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npa.adapters.storage import ObjectStore, open_store
from npa.core.layout import (
    manifest_key,
    newest_first,
    plan_key,
    run_index_complete_key,
    run_index_key,
    run_index_prefix,
    run_of_index_key,
    run_prefix,
)
from npa.core.paths import NpaPaths
from npa.runs.index import mark_run
from npa.runs.manifest import RunManifest, write_manifest
from npa.runs.receipts import Receipt, write_receipt
from tests.harness.cli import invoke_npa
from tests.harness.counting import Counting

pytestmark = pytest.mark.unit

NOW = "2026-01-01T00:00:00+00:00"


def run_id(n: int) -> str:
    """The n-th run id: later n, later time."""
    return f"202601{1 + n // 1440:02d}-{n // 60 % 24:02d}{n % 60:02d}00-{n * 7919 % 0xFFFFFF:06x}"


class World:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.root = home / "store"
        self.uri = self.root.as_uri()
        self.store = open_store(self.uri)
        self.counted: list[Counting] = []

    def run(
        self, n: int, project: str, *, workflow: str = "wf", indexed: bool = True, **kw: Any
    ) -> str:
        """A run as submit leaves it: its marker (unless ``indexed`` is False: an older npa),
        its plan and its manifest."""
        rid = run_id(n)
        if indexed:
            mark_run(self.store, project, workflow, rid)
        prefix = run_prefix(workflow, rid)
        self.store.put(plan_key(prefix), b"{}")
        m = RunManifest(
            project=project, workflow=workflow, run_id=rid, backend="local", infra="local",
            state=kw.get("state", "SUCCEEDED"), submitted_at=NOW, updated_at=NOW,
            store=self.uri, prefix=prefix, spec_sha256="x", source_digest=None, plan_digest="x",
            tasks={}, images={}, job_name=f"npa-{workflow}-{rid}", job_id=n,
        )  # fmt: skip
        write_manifest(self.store, m)
        return rid

    def markers(self, project: str) -> set[str]:
        folder = self.root / run_index_prefix(project)
        return {p.name for p in folder.iterdir()} if folder.is_dir() else set()

    def list(self, project: str, limit: int = 50) -> tuple[dict[str, Any], Counting]:
        res = invoke_npa(*WF, "list", "--project", project, "--limit", str(limit), "--json")
        assert res.code in (0, 4), res.stdout + res.stderr
        return res.json(), self.counted[-1]

    def status(self, *argv: str) -> tuple[dict[str, Any], Counting]:
        res = invoke_npa(*WF, "status", *argv, "--cached", "--json")
        return res.json(), self.counted[-1]


WF = ("workbench", "workflow")


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    home = tmp_path / ".npa"
    monkeypatch.setenv("NPA_HOME", str(home))
    monkeypatch.setenv("HOME", str(tmp_path))
    made = World(home)
    for project in ("demo", "other"):
        assert invoke_npa("configure", "--project", project, "--store", made.uri).code == 0
    import npa.services.listing as listing
    import npa.services.locate as locate

    opened = locate.open_run_store

    def counting(*args: Any, **kwargs: Any) -> ObjectStore:
        store = Counting(opened(*args, **kwargs))
        made.counted.append(store)
        return store

    monkeypatch.setattr(locate, "open_run_store", counting)
    monkeypatch.setattr(listing, "open_run_store", counting)
    return made


# --- the keys -------------------------------------------------------------------------------


@given(st.lists(st.integers(min_value=0, max_value=20_000), min_size=2, max_size=20, unique=True))
def test_markers_sort_newest_first_and_name_their_run(ns: list[int]) -> None:
    ids = [run_id(n) for n in ns]
    keys = [run_index_key("demo", "wf@x.y", rid) for rid in ids]
    # An ascending listing (S3's only order, by UTF-8 bytes) is newest first.
    by_key = sorted(keys, key=str.encode)
    assert [run_of_index_key("demo", k) for k in by_key] == [
        (rid, "wf@x.y") for rid in sorted(ids, reverse=True)
    ]
    # The completeness mark sorts before every marker: it comes in the first page.
    assert str.encode(run_index_complete_key("demo")) < min(k.encode() for k in keys)
    assert run_of_index_key("other", keys[0]) is None
    assert run_of_index_key("demo", run_index_complete_key("demo")) is None
    forged = keys[0].replace(newest_first(ids[0]), newest_first(ids[1]), 1)
    assert run_of_index_key("demo", forged) is None  # its order must be its run id's


# --- list reads its own project's runs only ---------------------------------------------------


def test_list_reads_the_index_and_the_runs_it_prints_nothing_of_another_project(
    world: World,
) -> None:
    mine = [world.run(n, "demo") for n in range(0, 60, 2)]
    theirs = {world.run(n, "other") for n in range(1001, 1120, 3)}
    world.run(200, "other", workflow="elsewhere")
    # The index is complete once a first list has made sure of it (a store with no runs from
    # before the index: nothing to read, one mark written).
    newest = [manifest_key(run_prefix("wf", r)) for r in sorted(mine, reverse=True)[:10]]
    first, counted = world.list("demo", limit=10)
    assert first["index_note"] is None and sorted(counted.reads()) == sorted(newest)
    assert (world.root / run_index_complete_key("demo")).is_file()

    listed, counted = world.list("demo", limit=10)
    assert [r["run_id"] for r in listed["runs"]] == sorted(mine, reverse=True)[:10]
    assert listed["truncated"] is True and listed["skipped_other_projects"] == 0
    # One listing of the index, one read per run printed; no other project's key touched.
    assert counted.listings() == [f"a listing of {run_index_prefix('demo')}"]
    assert sorted(counted.reads()) == sorted(newest)
    assert not any(rid in call for call in counted.calls for rid in theirs)
    assert len(counted.calls) == 1 + 10

    everything, _ = world.list("demo", limit=1000)
    assert [r["run_id"] for r in everything["runs"]] == sorted(mine, reverse=True)
    assert everything["truncated"] is False


def test_list_of_fifty_among_ten_thousand_runs_of_each_project(world: World) -> None:
    """Issue 34's shape: 10,000 runs of the project and 10,000 of another in one store. The
    project's older runs are planted as markers alone, the other project's as markers, 1,000
    of them with manifests (files written directly: the layout's keys, not whole submits), so
    only a read of an older run or of the other project's objects could tell them apart; the
    list goes through the real code and asks for one listing and the 50 manifests it prints
    (the whole process, on S3: tests/integration/test_run_index_s3.py)."""
    count = 10_000
    newest = [world.run(2 * n, "demo") for n in range(count - 60, count)][::-1][:50]
    for n in range(count):
        mine, theirs = run_id(2 * n), run_id(2 * n + 1)
        _plant(world.root / run_index_key("demo", "wf", mine), b"{}")
        _plant(world.root / run_index_key("other", "wf", theirs), b"{}")
        if n < 1000:  # a manifest each for a tenth of them: a file costs, a marker less
            _plant(world.root / manifest_key(run_prefix("wf", theirs)), _MANIFEST % theirs.encode())
    _plant(world.root / run_index_complete_key("demo"), b"{}")

    listed, counted = world.list("demo", limit=50)
    assert [r["run_id"] for r in listed["runs"]] == newest and listed["truncated"] is True
    assert counted.listings() == [f"a listing of {run_index_prefix('demo')}"]
    assert sorted(counted.reads()) == sorted(manifest_key(run_prefix("wf", r)) for r in newest)
    assert len(counted.calls) == 1 + 50


# Another project's manifest with only the fields list reads (the run id goes in at %s).
_MANIFEST = b'{"project": "other", "workflow": "wf", "run_id": "%s", "state": "SUCCEEDED"}'


def _plant(path: Path, body: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)


def test_a_marker_without_a_manifest_reads_as_what_is_there(world: World) -> None:
    """A crash between a marker and the run's first objects: a marker over nothing is no row,
    over a plan alone a PLAN_ONLY row."""
    done = world.run(1, "demo")
    mark_run(world.store, "demo", "wf", run_id(2))  # nothing else was written
    mark_run(world.store, "demo", "wf", run_id(3))
    world.store.put(plan_key(run_prefix("wf", run_id(3))), b"{}")
    world.list("demo")
    listed, _ = world.list("demo")
    assert [(r["run_id"], r["recorded_state"]) for r in listed["runs"]] == [
        (run_id(3), "PLAN_ONLY"),
        (done, "SUCCEEDED"),
    ]


# --- repair -----------------------------------------------------------------------------------


def test_an_index_that_is_missing_is_repaired_from_the_manifests_once(world: World) -> None:
    """A store an older npa wrote (no markers at all), then an index someone deleted."""
    mine = {world.run(n, "demo", indexed=False) for n in range(0, 40, 2)}
    theirs = {world.run(n, "other", indexed=False) for n in range(1, 40, 2)}
    folder_only = run_id(99)  # an old run folder without a manifest: nobody's run yet
    world.store.put(plan_key(run_prefix("wf", folder_only)), b"{}")

    listed, counted = world.list("demo")
    assert {r["run_id"] for r in listed["runs"]} == mine
    assert listed["index_note"] is not None and "indexed 40 runs" in listed["index_note"]
    # Each run no index named was read once, to learn whose it is (then the rows printed); and
    # each is now indexed where its manifest says it belongs.
    assert len(counted.reads()) == len(mine) + len(theirs) + 1 + len(mine)
    assert {run_of_index_key("demo", f"{run_index_prefix('demo')}{m}") for m in
            world.markers("demo")} - {None} == {(r, "wf") for r in mine}  # fmt: skip
    assert len(world.markers("other")) == len(theirs)
    assert ".complete" in world.markers("demo") and ".complete" not in world.markers("other")

    # Later lists read the index alone.
    again, counted = world.list("demo", limit=5)
    assert again["index_note"] is None and len(counted.calls) == 1 + 5

    # The other project's repair reads nothing: every run is indexed by now.
    other, counted = world.list("other")
    assert {r["run_id"] for r in other["runs"]} == theirs
    assert sorted(counted.reads()) == sorted(
        manifest_key(run_prefix("wf", r)) for r in [folder_only, *theirs]
    )

    # The index deleted: the next list shows every run and writes the markers again.
    shutil.rmtree(world.root / run_index_prefix("demo"))
    repaired, _ = world.list("demo")
    assert {r["run_id"] for r in repaired["runs"]} == mine
    assert len(world.markers("demo")) == len(mine) + 1


def test_a_run_written_without_its_marker_is_found_by_the_repair(world: World) -> None:
    """One marker missing in an index that was never completed (a crash of an older writer)."""
    kept = world.run(1, "demo")
    lost = world.run(2, "demo", indexed=False)
    listed, _ = world.list("demo")
    assert [r["run_id"] for r in listed["runs"]] == [lost, kept]
    assert run_index_key("demo", "wf", lost).rsplit("/", 1)[1] in world.markers("demo")


# --- whose manifest it is -----------------------------------------------------------------------


def test_a_copied_manifest_is_flagged_under_its_marker_and_unlisted_without_one(
    world: World,
) -> None:
    genuine = world.run(1, "demo")
    victim = world.run(2, "demo")
    world.list("demo")  # the index is complete
    source = world.root / manifest_key(run_prefix("wf", genuine))
    # Copied over another run of the project (whose marker exists) ...
    shutil.copy(source, world.root / manifest_key(run_prefix("wf", victim)))
    # ... and under a key no index names (a new folder, and a workflow of its own).
    stray = world.root / manifest_key(run_prefix("copied", run_id(3)))
    stray.parent.mkdir(parents=True)
    shutil.copy(source, stray)

    listed, _ = world.list("demo")
    rows = {r["run_id"]: r for r in listed["runs"]}
    assert set(rows) == {genuine, victim}  # the unmarked copy is nobody's run
    assert rows[genuine]["recorded_state"] == "SUCCEEDED" and rows[genuine]["error"] is None
    flagged = rows[victim]
    assert flagged["recorded_state"] == "VERIFICATION_UNAVAILABLE" and flagged["job_id"] is None
    assert flagged["error"].startswith("run_mismatch: ")
    # The same message status gives for the same key: one rule, one definition.
    status, _ = world.status(f"{world.uri}/{run_prefix('wf', victim)}", "--project", "demo")
    assert status["reason"] == flagged["error"].removeprefix("run_mismatch: ")


def test_another_projects_run_under_this_projects_marker_is_skipped_and_indexed_as_theirs(
    world: World,
) -> None:
    theirs = world.run(1, "other", indexed=False)
    mark_run(world.store, "demo", "wf", theirs)  # a wrong marker
    world.list("demo")
    listed, _ = world.list("demo")
    assert listed["runs"] == [] and listed["skipped_other_projects"] == 1
    assert run_index_key("other", "wf", theirs).rsplit("/", 1)[1] in world.markers("other")


# --- status without a receipt -------------------------------------------------------------------


def test_status_by_run_id_asks_the_index_not_every_workflow(world: World) -> None:
    for n in range(10):
        world.run(n, "other", workflow=f"wf{n}")
    rid = world.run(50, "demo", workflow="mine")
    world.list("demo")

    found, counted = world.status(rid, "--project", "demo")
    assert found["state"] == "CACHED" and found["workflow"] == "mine"
    index = [s for s in found["sources"] if s["source"] == "run-index"]
    assert index and index[0]["answer"] == "found"
    # One listing of the run's markers, then its manifest (and the plan, for stage order).
    assert counted.listings() == [f"a listing of {run_index_prefix('demo')}"
                                  f"{newest_first(rid)}.{rid}@"]  # fmt: skip
    assert counted.reads()[0] == manifest_key(run_prefix("mine", rid))
    assert len(counted.calls) <= 3

    missing, counted = world.status(run_id(77), "--project", "demo")
    assert missing["state"] == "NOT_FOUND"
    assert [s["answer"] for s in missing["sources"] if s["source"] == "run-index"] == ["absent"]
    assert len(counted.calls) == 2  # the run's markers, then the completeness mark


def test_status_with_a_receipt_reads_the_run_alone(world: World) -> None:
    """With the receipt submit leaves, ``status`` of one run among many asks the store for that
    run alone: its manifest and plan, no listing of the index or of any other run (the twin of
    the S3 test in tests/integration/test_run_index_s3.py)."""
    for n in range(10):
        world.run(n, "other", workflow=f"wf{n}")
        world.run(100 + n, "demo", workflow=f"wf{n}")
    rid = world.run(50, "demo", workflow="mine")
    world.list("demo")
    write_receipt(
        NpaPaths(world.home),
        Receipt(
            project="demo", project_identity="x", workflow="mine", run_id=rid, submitted_at=NOW,
            store=world.uri, workflow_prefix=f"{world.uri}/{run_prefix('mine', rid)}",
            credentials_source="none (file store)",
        ),
    )  # fmt: skip

    found, counted = world.status(rid, "--project", "demo")
    assert found["state"] == "CACHED" and found["workflow"] == "mine"
    assert counted.listings() == [], counted.calls
    assert counted.reads() == [
        manifest_key(run_prefix("mine", rid)),
        plan_key(run_prefix("mine", rid)),
    ]
    assert 1 <= len(counted.calls) <= 3, counted.calls


def test_status_scans_the_store_while_the_index_is_not_complete(world: World) -> None:
    rid = world.run(5, "demo", indexed=False)
    found, _ = world.status(rid, "--project", "demo")
    assert found["workflow"] == "wf" and found["state"] == "CACHED"
    answers = {s["source"]: s["answer"] for s in found["sources"]}
    assert answers["run-index"] == "skipped" and answers["store-scan"] == "found"


def test_status_without_a_project_still_finds_any_projects_run(world: World) -> None:
    """Without --project, a run of any project is the run asked about: the default project's
    index not naming it sends status to the store scan, not to NOT_FOUND."""
    rid = world.run(5, "other")
    assert invoke_npa(*WF, "list", "--json").code == 0  # the default project's index: complete
    found, _ = world.status(rid)
    answers = {s["source"]: s["answer"] for s in found["sources"]}
    assert (answers["run-index"], answers["store-scan"]) == ("skipped", "found")
    assert found["state"] == "CACHED" and found["workflow"] == "wf"
