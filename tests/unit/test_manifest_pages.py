"""A large run's manifest keeps its stage records in pages beside it (npa/runs/manifest.py), so a
step of one stage rewrites that stage's page and the run's own fields, never every stage's
record. On a file:// store in this process, through a store that records each request:

- whatever is written reads back the same, in plan order, in either layout (a property over
  stage sets around the page threshold);
- a sequence of steps, each read and written for its own stage, ends where the same steps applied
  to one whole copy end, and each step writes its stage's page (when it changed) and the
  manifest, pages first;
- a manifest's page that is missing, damaged or another run's is refused by name, with a fix;
- a copy read for some stages cannot write a record it never read;
- a run at or under the threshold is written exactly as before: one object, no page field;
- the order of a paged run's stages is an object of its own, read only with every page.

The readers (status, list, artifacts, logs, cancel, insights) are run over both layouts in
tests/unit/test_reading_rules.py; a real 300-stage run writes pages in
tests/integration/test_bounded_resources.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npa.adapters.storage import ObjectStore, open_store
from npa.core.errors import StateCorrupt, StoreUnavailable
from npa.core.layout import manifest_key, manifest_page_key, run_prefix
from npa.launch.progress import ManifestRecorder
from npa.launch.supervision import Policy
from npa.runs import manifest as manifest_module
from npa.runs.manifest import (
    RunManifest,
    StageRecord,
    WaveRecord,
    delete_manifest,
    page_of,
    pages_for,
    read_manifest,
    update_manifest,
    write_manifest,
)
from tests.harness.counting import Counting as Recording
from tests.tiers import examples

pytestmark = pytest.mark.unit

T = TypeVar("T")

NOW = "2026-01-01T00:00:00+00:00"
RUN = "20260101-000000-abcdef"
PREFIX = run_prefix("wf", RUN)


def manifest(stages: list[str], records: dict[str, StageRecord] | None = None) -> RunManifest:
    return RunManifest(
        project="demo", workflow="wf", run_id=RUN, backend="local", infra="local",
        state="RUNNING", submitted_at=NOW, updated_at=NOW, store="file:///s", prefix=PREFIX,
        spec_sha256="x", source_digest=None, plan_digest="x",
        tasks={s: f"{i:064x}" for i, s in enumerate(stages)}, order=stages, images={},
        job_name="n", stages=records or {},
    )  # fmt: skip


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> int:
    """Pages of about 3 stages, so a handful of stages makes a paged run."""
    monkeypatch.setattr(manifest_module, "PAGE_STAGES", 3)
    return 3


def fresh_store(tmp_path: Path, name: str) -> Recording:
    root = tmp_path / name
    root.mkdir(parents=True)
    return Recording(open_store(root.as_uri()))


NAMES = st.lists(
    st.text("abcdefghij-0123456789", min_size=1, max_size=12), min_size=0, max_size=14, unique=True
)
RECORDS = st.builds(
    StageRecord,
    state=st.sampled_from(["PENDING", "RUNNING", "SUCCEEDED", "FAILED"]),
    started_at=st.none() | st.just(NOW),
    outputs=st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 10**12), max_size=2),
)


# small_pages only sets a constant, the same for every example.
ONE_SETTING = [HealthCheck.function_scoped_fixture]


@settings(max_examples=examples(150), deadline=None, suppress_health_check=ONE_SETTING)
@given(names=NAMES, data=st.data())
def test_what_is_written_reads_back_the_same_in_plan_order(
    small_pages: int,
    tmp_path_factory: pytest.TempPathFactory,
    names: list[str],
    data: st.DataObject,
) -> None:
    recorded = data.draw(st.lists(st.sampled_from(names), unique=True) if names else st.just([]))
    records = {n: data.draw(RECORDS) for n in reversed(recorded)}  # not in plan order
    store = Recording(open_store(tmp_path_factory.mktemp("s").as_uri()))
    written = manifest(names, records)
    write_manifest(store, written)
    back = read_manifest(store, PREFIX)
    assert back is not None
    assert back.model_dump() == written.model_dump()
    pages = pages_for(len(names))
    assert list(back.tasks) == names
    # Pages are merged in plan order; one object keeps the order it was written in.
    assert list(back.stages) == ([n for n in names if n in records] if pages else list(records))
    assert back.stage_pages == pages == (0 if len(names) <= small_pages else -(-len(names) // 3))
    head = json.loads(store.inner.get(manifest_key(PREFIX)))
    if pages:
        # The manifest holds the run's own fields; each stage is in the page its name hashes to.
        assert head["stages"] == {} and head["tasks"] == {} and head["stage_pages"] == pages
        for name in names:
            page = json.loads(store.inner.get(manifest_page_key(PREFIX, page_of(name, pages))))
            assert page["tasks"][name] == written.tasks[name]
        order = json.loads(store.inner.get(manifest_page_key(PREFIX, "order")))
        assert order["order"] == names and head["order"] == []
        # Every page and the order, then the manifest.
        assert len(store.writes()) == pages + 2 and store.writes()[-1] == manifest_key(PREFIX)
    else:
        assert "stage_pages" not in head and store.writes() == [manifest_key(PREFIX)]


def reads_back(store: ObjectStore, expected: RunManifest) -> None:
    """The stored manifest reads as ``expected`` (but for the time of its last write)."""
    back = read_manifest(store, PREFIX)
    assert back is not None
    assert back.model_dump(exclude={"updated_at"}) == expected.model_dump(exclude={"updated_at"})


STEPS = st.lists(
    st.tuples(st.integers(0, 9), st.sampled_from(["start", "wave", "end", "fail", "run-only"])),
    max_size=25,
)


def apply(step: str, stage: str, m: RunManifest) -> None:
    """One recorder-like step on one stage (or, for run-only, on the run's own fields)."""
    if step == "run-only":
        m.state = "RUNNING" if m.state != "RUNNING" else "STARTING"
        m.supervisor.payload_retries += 1
        return
    rec = m.stages.setdefault(stage, StageRecord())
    if step == "start":
        rec.state, rec.started_at = "RUNNING", rec.started_at or NOW
    elif step == "wave":
        rec.waves.append(WaveRecord(wave=len(rec.waves), shards=[0], state="RUNNING"))
    elif step == "end":
        rec.state, rec.ended_at, rec.outputs = "SUCCEEDED", NOW, {"out": 7}
    else:
        rec.state, rec.detail = "FAILED", f"stage {stage} exited 3"


@settings(max_examples=examples(120), deadline=None, suppress_health_check=ONE_SETTING)
@given(steps=STEPS, count=st.sampled_from([2, 3, 4, 10]))
def test_steps_of_one_stage_each_end_where_one_whole_copy_ends(
    small_pages: int, tmp_path_factory: pytest.TempPathFactory, steps: list, count: int
) -> None:
    names = [f"stage-{i}" for i in range(count)]
    store = Recording(open_store(tmp_path_factory.mktemp("s").as_uri()))
    lock = tmp_path_factory.mktemp("l") / "m.lock"
    whole = manifest(names)
    write_manifest(store, whole)
    pages = whole.stage_pages
    for index, step in steps:
        stage = names[index % count]
        store.calls.clear()
        own = [] if step == "run-only" else [stage]
        update_manifest(store, PREFIX, lock, lambda m, s=step, n=stage: apply(s, n, m), stages=own)
        apply(step, stage, whole)
        if pages:
            # The run's own fields and at most the stage's own page: read, then written.
            page = {manifest_page_key(PREFIX, page_of(n, pages)) for n in own}
            assert store.reads() == [manifest_key(PREFIX), *sorted(page)]
            assert store.writes()[-1] == manifest_key(PREFIX)
            assert set(store.writes()[:-1]) <= page
        else:
            assert store.writes() == [manifest_key(PREFIX)]
    reads_back(store, whole)


def test_a_step_that_changes_nothing_of_its_page_writes_only_the_manifest(
    small_pages: int, tmp_path: Path
) -> None:
    store = fresh_store(tmp_path, "s")
    write_manifest(store, manifest([f"s{i}" for i in range(9)], {"s1": StageRecord()}))
    store.calls.clear()
    update_manifest(store, PREFIX, tmp_path / "lock", lambda m: None, stages=["s1"])
    assert store.writes() == [manifest_key(PREFIX)]


def test_a_snapshot_written_back_puts_back_every_page_changed_since(
    small_pages: int, tmp_path: Path
) -> None:
    """What submit's rollback does: the records as they were before it, written back after
    steps changed some pages, read back as they were (a page is skipped as unchanged only
    within one locked read and write)."""
    names = [f"s{i}" for i in range(10)]
    store = fresh_store(tmp_path, "s")
    write_manifest(store, manifest(names, {n: StageRecord() for n in names}))
    snapshot = read_manifest(store, PREFIX)
    assert snapshot is not None
    for name in names[:4]:
        update_manifest(store, PREFIX, tmp_path / "lock", lambda m, n=name: apply("end", n, m),
                        stages=[name])  # fmt: skip
    write_manifest(store, snapshot)
    reads_back(store, snapshot)


def test_a_copy_read_for_one_stage_cannot_write_anothers_record(
    small_pages: int, tmp_path: Path
) -> None:
    names = [f"s{i}" for i in range(12)]
    store = fresh_store(tmp_path, "s")
    write_manifest(store, manifest(names))
    pages = pages_for(len(names))
    other = next(n for n in names if page_of(n, pages) != page_of("s0", pages))
    before = {p.name: p.read_bytes() for p in (tmp_path / "s").rglob("*.json")}
    store.calls.clear()

    def touch_other(m: RunManifest) -> None:
        m.stages.setdefault(other, StageRecord()).state = "RUNNING"

    with pytest.raises(RuntimeError, match="never read"):
        update_manifest(store, PREFIX, tmp_path / "lock", touch_other, stages=["s0"])
    assert store.writes() == []
    assert {p.name: p.read_bytes() for p in (tmp_path / "s").rglob("*.json")} == before


@pytest.mark.parametrize("page", [1, "order"])
@pytest.mark.parametrize("damage", ["missing", "not json", "another run", "another page"])
def test_a_page_that_is_not_the_runs_is_refused_by_name(
    small_pages: int, tmp_path: Path, damage: str, page: int | str
) -> None:
    names = [f"s{i}" for i in range(9)]
    store = fresh_store(tmp_path, "s")
    write_manifest(store, manifest(names, {n: StageRecord(state="SUCCEEDED") for n in names}))
    key = manifest_page_key(PREFIX, page)
    path = tmp_path / "s" / key
    doc = json.loads(path.read_text())
    if damage == "missing":
        path.unlink()
    elif damage == "not json":
        path.write_text("{")
    elif damage == "another run":
        path.write_text(json.dumps({**doc, "run_id": "20250101-000000-000000"}))
    else:  # the page of another place in the run: another number, or a count of pages
        path.write_text(json.dumps({**doc, "pages": 4} if page == "order" else {**doc, "page": 2}))
    with pytest.raises(StateCorrupt) as refused:
        read_manifest(store, PREFIX)
    assert f"{store.uri}/{key}" in refused.value.message
    assert refused.value.fix and "inspect before resubmitting" in refused.value.fix
    # The stages of the other pages still read, and the damaged page is never rewritten.
    fine = next(n for n in names if page_of(n, 3) != 1)
    assert read_manifest(store, PREFIX, stages=[fine]) is not None


def test_a_page_holding_a_stage_of_another_page_is_refused(
    small_pages: int, tmp_path: Path
) -> None:
    """A step of a stage reads its own page only: a record of it elsewhere would be a second
    one, so a page is refused by name when it holds a stage that hashes to another."""
    names = [f"s{i}" for i in range(9)]
    store = fresh_store(tmp_path, "s")
    write_manifest(store, manifest(names))
    stranger = next(n for n in names if page_of(n, 3) != 1)
    path = tmp_path / "s" / manifest_page_key(PREFIX, 1)
    doc = json.loads(path.read_text())
    doc["stages"][stranger] = {"state": "RUNNING"}
    path.write_text(json.dumps(doc))
    with pytest.raises(StateCorrupt, match=f"holds the record of stage {stranger}, which belongs"):
        read_manifest(store, PREFIX)


def test_a_run_within_the_threshold_is_one_object_as_before(tmp_path: Path) -> None:
    names = [f"s{i}" for i in range(manifest_module.PAGE_STAGES)]
    store = fresh_store(tmp_path, "s")
    write_manifest(store, manifest(names, {n: StageRecord() for n in names}))
    assert store.writes() == [manifest_key(PREFIX)]
    head = json.loads(store.inner.get(manifest_key(PREFIX)))
    assert "stage_pages" not in head and list(head["stages"]) == names
    # One more stage pages it: two pages of about PAGE_STAGES each, the order, the manifest.
    store.calls.clear()
    write_manifest(store, manifest([*names, "one-more"]))
    assert len(store.writes()) == 4 and store.writes()[-1] == manifest_key(PREFIX)


def test_a_large_run_written_as_one_object_is_paged_whole_at_its_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest an earlier npa wrote as one object for a run of many stages: a step of one
    stage reads it whole (there are no pages to read part of), and its write pages every
    record."""
    names = [f"s{i}" for i in range(10)]
    store = fresh_store(tmp_path, "s")
    write_manifest(store, manifest(names, {n: StageRecord(state="SUCCEEDED") for n in names}))
    assert "stage_pages" not in json.loads(store.inner.get(manifest_key(PREFIX)))
    monkeypatch.setattr(manifest_module, "PAGE_STAGES", 3)
    update_manifest(store, PREFIX, tmp_path / "lock", lambda m: apply("start", "s4", m),
                    stages=["s4"])  # fmt: skip
    head = json.loads(store.inner.get(manifest_key(PREFIX)))
    assert head["stage_pages"] == 4 and head["stages"] == {}
    back = read_manifest(store, PREFIX)
    assert back is not None and list(back.stages) == names and list(back.tasks) == names
    assert {n: r.state for n, r in back.stages.items()} == {
        n: "RUNNING" if n == "s4" else "SUCCEEDED" for n in names
    }


def test_deleting_a_paged_manifest_removes_its_pages_after_it(
    small_pages: int, tmp_path: Path
) -> None:
    store = fresh_store(tmp_path, "s")
    write_manifest(store, manifest([f"s{i}" for i in range(10)]))
    delete_manifest(store, PREFIX)
    deletes = [c for c in store.calls if c.startswith("a delete of ")]
    assert deletes[0] == f"a delete of {manifest_key(PREFIX)}" and len(deletes) == 4 + 1 + 1
    assert read_manifest(store, PREFIX) is None
    assert not list((tmp_path / "s").rglob("*.json"))


@pytest.mark.parametrize("pages", [-1, 100_001, 2.5, "many", None])
def test_a_manifest_naming_an_impossible_count_of_pages_is_refused_before_any_read(
    tmp_path: Path, pages: object
) -> None:
    store = fresh_store(tmp_path, "s")
    write_manifest(store, manifest([f"s{i}" for i in range(300)]))
    path = tmp_path / "s" / manifest_key(PREFIX)
    path.write_text(json.dumps({**json.loads(path.read_text()), "stage_pages": pages}))
    store.calls.clear()
    with pytest.raises(StateCorrupt, match="is not an npa run manifest"):
        read_manifest(store, PREFIX)
    assert store.reads() == [manifest_key(PREFIX)]


class HeadFails(Recording):
    """A store whose next write of the manifest fails once (``armed``): a step's page is then
    written and its manifest is not, the one partial write pages allow."""

    armed = False

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        if self.armed and what == f"a write of {manifest_key(PREFIX)}":
            self.armed = False
            raise StoreUnavailable("the store did not answer (injected)")
        return super()._call(what, fn)


def recorder_step(rec: ManifestRecorder, step: str, stage: str) -> None:
    """One of the executor's steps of a stage, made through the recorder it reports to."""
    if step == "stage_started":
        rec.stage_started(stage)
    elif step == "wave_started":
        rec.wave_started(stage, 0, [0, 1], 1)
    elif step == "wave_succeeded":
        rec.wave_succeeded(stage, 0, [0, 1], {0: 0, 1: 0}, 1, {"out": 9})
    elif step == "stage_succeeded":
        rec.stage_succeeded(stage, {"out": 9})
    else:
        rec.outputs_missing(stage, {"out": 0}, ["out"])


RECORDER_STEPS = ["stage_started", "wave_started", "wave_succeeded", "stage_succeeded", "missing"]
TIMES = {"updated_at", "started_at", "ended_at", "launched_at", "at"}


def _untimed(value: object) -> object:
    """A manifest's dump without its clock readings (a step made again reads the clock again)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


@settings(max_examples=examples(60), deadline=None, suppress_health_check=ONE_SETTING)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from(RECORDER_STEPS)), min_size=1, max_size=12
    ),
    cut=st.integers(0, 11),
)
def test_a_step_cut_between_its_page_and_the_manifest_then_made_again_ends_as_one_step(
    small_pages: int,
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[int, str]],
    cut: int,
) -> None:
    names = [f"stage-{i}" for i in range(6)]
    ends = []
    for interrupted in (False, True):
        root = tmp_path_factory.mktemp("s")
        store = HeadFails(open_store(root.as_uri()))
        write_manifest(store, manifest(names))
        rec = ManifestRecorder(store, PREFIX, root / "lock", Policy(), "npa status")
        for i, (index, step) in enumerate(steps):
            stage = names[index]
            if interrupted and i == cut % len(steps):
                before = read_manifest(store, PREFIX)
                store.armed = True
                with pytest.raises(StoreUnavailable):
                    recorder_step(rec, step, stage)
                # What a reader sees meanwhile: the stage's page may be newer, the run not.
                meanwhile = read_manifest(store, PREFIX)
                assert meanwhile is not None and before is not None
                assert meanwhile.updated_at == before.updated_at
                assert meanwhile.supervisor == before.supervisor
            recorder_step(rec, step, stage)
        ends.append(_untimed(read_manifest(store, PREFIX).model_dump()))  # type: ignore[union-attr]
    assert ends[0] == ends[1]
