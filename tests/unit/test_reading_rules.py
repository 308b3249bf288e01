"""The rules every reader of a stored run applies (npa/runs/reading.py), through each reader's
CLI in this process against a local file:// store: whose manifest it is (one identity check
for list, status, artifacts, logs, cancel and insights ingest-run), waves counted against the
plan, and only final stage states in a final run."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.adapters.storage import open_store
from npa.backends.base import JobState
from npa.core.layout import manifest_key, output_key, run_index_key, run_prefix
from npa.plan.model import WorkflowPlan, build_plan
from npa.runs.manifest import RunManifest, StageRecord, WaveRecord, write_manifest, write_plan
from npa.runs.reading import FINAL, RunKey, check_run_identity, shown_stage_states
from npa.spec.validate import load_workflow
from tests.harness.cli import CliResult, invoke_npa
from tests.tiers import examples

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WF = ("workbench", "workflow")
RUN_A = "20260101-120000-aaaaaa"
RUN_B = "20260102-120000-bbbbbb"
NOW = "2026-01-01T12:00:00+00:00"


# --- a store with runs written the way submit and the executor write them ---------------------


@dataclass
class Home:
    root: Path  # NPA_HOME
    spec: Path

    @property
    def env(self) -> dict[str, str | None]:
        return {"NPA_HOME": str(self.root), "HOME": str(self.root.parent)}

    @property
    def store_uri(self) -> str:
        return (self.root / "store").as_uri()

    def prefix_uri(self, workflow: str, run_id: str) -> str:
        return f"{self.store_uri}/{run_prefix(workflow, run_id)}"

    def npa(self, *args: str) -> CliResult:
        return invoke_npa(*args, env=self.env)

    def plan(self, run_id: str) -> WorkflowPlan:
        return build_plan(load_workflow(self.spec), run_id, store_uri=self.store_uri)

    def write_run(
        self,
        run_id: str,
        state: str,
        stages: dict[str, StageRecord],
        *,
        workflow: str = "tiny",
        project: str = "demo",
    ) -> RunManifest:
        plan = self.plan(run_id)
        store = open_store(self.store_uri)
        prefix = run_prefix(workflow, run_id)
        write_plan(store, prefix, plan)
        m = RunManifest(
            project=project, workflow=workflow, run_id=run_id, backend="local", infra="local",
            state=state, submitted_at=NOW, updated_at=NOW, store=self.store_uri, prefix=prefix,
            spec_sha256="x", source_digest=None, plan_digest="x",
            tasks={s: "0" * 64 for s in plan.order}, order=plan.order, images={},
            job_name=f"npa-{run_id}", job_id=7, stages=stages,
        )  # fmt: skip
        write_manifest(store, m)
        return m

    def put_output(self, run_id: str, stage: str, path: str, data: bytes = b"1\n") -> None:
        store = open_store(self.store_uri)
        store.put(output_key(run_prefix("tiny", run_id), stage, path), data)

    def manifest_path(self, workflow: str, run_id: str) -> Path:
        return self.root / "store" / manifest_key(run_prefix(workflow, run_id))


@pytest.fixture(autouse=True, params=["in the manifest", "in pages"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every rule holds whether the run's stage records are in its manifest or, as a large
    run's are, in pages beside it (here a page a stage)."""
    if request.param == "in pages":
        monkeypatch.setattr("npa.runs.manifest.PAGE_STAGES", 1)
    return str(request.param)


@pytest.fixture
def home(tmp_path: Path) -> Home:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "tiny-local.yaml").read_text())
    doc["metadata"]["name"] = "tiny"
    doc["stages"][1]["waves"] = {"shards": 2, "parallel": 1}  # square: two waves
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    root = tmp_path / ".npa"
    root.mkdir()
    made = Home(root=root, spec=spec)
    assert made.npa("configure", "--project", "demo").code == 0
    return made


def ok(state: str = "SUCCEEDED", waves: int = 1) -> StageRecord:
    return StageRecord(
        state=state,
        started_at=NOW,
        ended_at=NOW,
        waves=[WaveRecord(wave=w, shards=[w], state="SUCCEEDED") for w in range(waves)],
    )


def finished(home: Home, run_id: str = RUN_A, **kw: Any) -> RunManifest:
    return home.write_run(
        run_id, "SUCCEEDED", {"generate": ok(), "square": ok(waves=2), "total": ok()}, **kw
    )


# --- one identity check -------------------------------------------------------------------------

IDS = st.sampled_from([RUN_A, RUN_B])
NAMES = st.sampled_from(["tiny", "other"])
PROJECTS = st.sampled_from(["demo", "elsewhere"])


def _manifest(run_id: str, workflow: str, prefix: str, project: str) -> RunManifest:
    return RunManifest(
        project=project, workflow=workflow, run_id=run_id, backend="local", infra="local",
        state="SUCCEEDED", submitted_at=NOW, updated_at=NOW, store="file:///s", prefix=prefix,
        spec_sha256="x", source_digest=None, plan_digest="x", tasks={}, images={}, job_name="n",
    )  # fmt: skip


@settings(max_examples=examples(200), deadline=None)
@given(
    m_id=IDS, m_wf=NAMES, m_project=PROJECTS, own_prefix=st.booleans(),
    k_id=IDS, k_wf=NAMES, k_project=st.one_of(st.none(), PROJECTS),
)  # fmt: skip
def test_a_manifest_is_the_runs_only_when_id_workflow_prefix_and_project_agree(
    m_id: str,
    m_wf: str,
    m_project: str,
    own_prefix: bool,
    k_id: str,
    k_wf: str,
    k_project: str | None,
) -> None:
    prefix = run_prefix(m_wf, m_id) if own_prefix else f"{m_wf}/{m_id}/elsewhere"
    key = RunKey(run_id=k_id, workflow=k_wf, prefix=run_prefix(k_wf, k_id), project=k_project)
    found = check_run_identity(_manifest(m_id, m_wf, prefix, m_project), key, "file:///s/x")
    differ = [
        name
        for name, a, b in (
            ("run_id", m_id, k_id),
            ("workflow", m_wf, k_wf),
            ("prefix", prefix, key.prefix),
        )
        if a != b
    ]
    project_differs = k_project is not None and m_project != k_project
    if not differ and not project_differs:
        assert found is None
        return
    assert found is not None and found.kind == "run_mismatch" and found.exit_code == 4
    assert found.details["disagree"] == (differ or ["project"])
    assert found.fix is not None and f"--project {m_project}" in found.fix


@dataclass
class Misplaced:
    """A manifest under a key that is not its run's, and the key readers are asked about."""

    workflow: str
    run_id: str
    # What a list of the store shows for the key: a row reported as unreadable, or nothing
    # (another project's own run in a shared store is in that project's index, not this one's).
    listed: str


def misplace(home: Home, case: str) -> Misplaced:
    """Plant one disagreeing manifest in the store (the run A it was copied from is genuine)."""
    finished(home)
    home.put_output(RUN_A, "generate", "numbers/numbers.txt")
    source = home.manifest_path("tiny", RUN_A)
    if case == "other run id":  # copied under another run of the same workflow
        target = home.manifest_path("tiny", RUN_B)
        found = Misplaced("tiny", RUN_B, "error")
    elif case == "other workflow":  # copied under the same run id of another workflow
        target = home.manifest_path("other", RUN_A)
        found = Misplaced("other", RUN_A, "error")
    elif case == "prefix":  # its own key, but it records another prefix
        doc = json.loads(source.read_text())
        doc["prefix"] = "tiny/elsewhere/npa-workflow"
        source.write_text(json.dumps(doc))
        return Misplaced("tiny", RUN_A, "error")
    else:  # another project's own run
        doc = json.loads(source.read_text())
        doc["project"] = "elsewhere"
        source.write_text(json.dumps(doc))
        return Misplaced("tiny", RUN_A, "skipped")
    shutil.copytree(source.parent, target.parent, dirs_exist_ok=True)
    return found


CASES = ["other run id", "other workflow", "prefix", "other project"]


@pytest.mark.parametrize("case", CASES)
def test_every_reader_reports_a_disagreeing_manifest_the_same_way(
    home: Home, tmp_path: Path, case: str
) -> None:
    bad = misplace(home, case)
    prefix = home.prefix_uri(bad.workflow, bad.run_id)
    where = f"{prefix}/manifest.json"
    readers = {
        "status": home.npa(*WF, "status", prefix, "--project", "demo", "--json"),
        "artifacts": home.npa(*WF, "artifacts", prefix, "--project", "demo", "--json"),
        "logs": home.npa(*WF, "logs", prefix, "--project", "demo", "--stage", "square", "--json"),
        "cancel": home.npa(*WF, "cancel", prefix, "--project", "demo", "--json"),
        "insights": home.npa("workbench", "insights", "ingest-run", "--input-path", prefix,
                             "--output-path", str(tmp_path / "facts.db"), "--json"),
    }  # fmt: skip
    if case == "other project":
        # insights is asked about a prefix and no project: another project's own run is a run;
        # so is it for status named by its prefix without --project.
        assert readers.pop("insights").code == 0
        unasked = home.npa(*WF, "status", prefix, "--json")
        assert unasked.code == 0 and unasked.json()["state"] == "SUCCEEDED", unasked.stdout
    messages = set()
    for reader, res in readers.items():
        assert res.code == 4, (reader, res.stdout, res.stderr)
        body = res.json()
        if reader == "status":
            assert body["state"] == "VERIFICATION_UNAVAILABLE" and body["job_id"] is None
            assert body["stages"] == {} and body["last_known_state"] is None
            [source] = [s for s in body["sources"] if s["source"] == "manifest"]
            kind, _, message = source["error"].partition(": ")
            assert body["reason"] == message
        else:
            kind, message = body["error"]["kind"], body["error"]["message"]
        assert kind == "run_mismatch", (reader, body)
        if reader != "insights":  # insights asks about a prefix, with no project
            messages.add(message)
        assert where in message and "none of its state is shown" in message, (reader, message)
    assert len(messages) == 1, messages  # one definition, one message
    if case != "other project":
        assert not (tmp_path / "facts.db").exists()  # nothing of it was ingested

    listed = home.npa(*WF, "list", "--project", "demo", "--json")
    rows = {(r["workflow"], r["run_id"]): r for r in listed.json()["runs"]}
    if bad.listed == "skipped":
        # Another project's own run: the repair of demo's run index put its marker in that
        # project's index, so demo's lists never read it again.
        assert listed.code == 0 and (bad.workflow, bad.run_id) not in rows
        store = home.root / "store"
        assert (store / run_index_key("elsewhere", bad.workflow, bad.run_id)).is_file()
        assert not (store / run_index_key("demo", bad.workflow, bad.run_id)).exists()
        return
    assert listed.code == 4, listed.stdout
    row = rows[(bad.workflow, bad.run_id)]
    assert row["recorded_state"] == "VERIFICATION_UNAVAILABLE" and row["job_id"] is None
    assert row["error"] == f"run_mismatch: {messages.pop()}"
    # Only the genuine run shows a state: no run id is shown twice with one record.
    shown = [r for r in listed.json()["runs"] if r["error"] is None]
    assert [(r["workflow"], r["run_id"], r["recorded_state"]) for r in shown] == (
        [] if case == "prefix" else [("tiny", RUN_A, "SUCCEEDED")]
    )


def test_the_genuine_run_reads_normally_beside_a_copy(home: Home) -> None:
    misplace(home, "other run id")
    status = home.npa(*WF, "status", RUN_A, "--project", "demo", "--json")
    assert status.code == 0 and status.json()["state"] == "SUCCEEDED", status.stdout


def test_a_manifest_copied_alone_under_another_run_is_that_mismatch(home: Home) -> None:
    """Only manifest.json copied (a paged run's pages stay where they were): the readers still
    say whose record it is, not that a page of it is missing."""
    finished(home)
    target = home.manifest_path("tiny", RUN_B)
    target.parent.mkdir(parents=True)
    shutil.copyfile(home.manifest_path("tiny", RUN_A), target)
    prefix = home.prefix_uri("tiny", RUN_B)
    res = home.npa(*WF, "status", prefix, "--project", "demo", "--json")
    assert res.code == 4, res.stdout
    [source] = [s for s in res.json()["sources"] if s["source"] == "manifest"]
    assert source["error"].startswith("run_mismatch: "), source


# --- waves against the plan ---------------------------------------------------------------------


def test_waves_are_counted_against_the_plan_not_the_records_written_so_far(home: Home) -> None:
    running = StageRecord(
        state="RUNNING", started_at=NOW, waves=[WaveRecord(wave=0, shards=[0], state="RUNNING")]
    )
    home.write_run(RUN_A, "RUNNING", {"generate": ok(), "square": running})
    res = home.npa(*WF, "status", RUN_A, "--project", "demo", "--cached", "--json")
    assert res.code == 0, res.stdout + res.stderr
    stages = res.json()["stages"]
    assert stages["square"]["waves"] == "0/2 waves succeeded"
    assert (stages["square"]["waves_succeeded"], stages["square"]["waves_planned"]) == (0, 2)
    assert stages["total"]["waves"] == "0/1 waves succeeded"
    text = home.npa(*WF, "status", RUN_A, "--project", "demo", "--cached").stdout
    assert "stage square: RUNNING (0/2 waves succeeded" in text


# --- a final run shows only final stage states --------------------------------------------------


def test_a_final_run_shows_the_stage_it_ended_in_and_never_a_live_stage(home: Home) -> None:
    stale = StageRecord(state="RUNNING", started_at=NOW, waves=[])
    home.write_run(RUN_A, "FAILED_CONTROLLER", {"generate": ok(), "square": stale})
    res = home.npa(*WF, "status", RUN_A, "--project", "demo", "--json")
    assert res.code == 0, res.stdout
    stages = res.json()["stages"]
    assert {n: s["state"] for n, s in stages.items()} == {
        "generate": "SUCCEEDED", "square": "FAILED_CONTROLLER", "total": "CANCELLED",
    }  # fmt: skip
    assert stages["square"]["recorded_state"] == "RUNNING"
    assert stages["total"]["detail"] == (
        "never ran, because the run ended FAILED_CONTROLLER at stage square"
    )
    text = home.npa(*WF, "status", RUN_A, "--project", "demo").stdout
    assert "RUNNING (" not in text and "PENDING (" not in text, text


STATES = st.sampled_from([s.value for s in JobState] + ["PENDING"])


@settings(max_examples=examples(300), deadline=None)
@given(
    run_state=STATES,
    records=st.lists(
        st.one_of(st.none(), st.tuples(STATES, st.booleans(), st.integers(0, 2))),
        min_size=1,
        max_size=4,
    ),
)
def test_final_runs_show_only_final_states_and_change_no_final_record(
    run_state: str, records: list[tuple[str, bool, int] | None]
) -> None:
    order = [f"s{i}" for i in range(len(records))]
    m = _manifest(RUN_A, "tiny", run_prefix("tiny", RUN_A), "demo")
    m.state = run_state
    for name, rec in zip(order, records, strict=True):
        if rec is not None:
            state, started, waves = rec
            m.stages[name] = StageRecord(
                state=state,
                started_at=NOW if started else None,
                waves=[WaveRecord(wave=w, shards=[w], state="SUCCEEDED") for w in range(waves)],
            )
    shown = shown_stage_states(m, order)
    for name in order:
        recorded = m.stages[name].state if name in m.stages else "PENDING"
        assert shown[name].recorded == recorded
        if run_state not in FINAL or recorded in FINAL:
            assert shown[name].state == recorded  # nothing else is ever rewritten
            continue
        assert shown[name].state in FINAL and shown[name].note
        # The run's end is shown for at most one stage whose record was not final.
        if shown[name].never_ran:
            assert shown[name].state == "CANCELLED"
            rec = m.stages.get(name)
            assert rec is None or (rec.state == "PENDING" and not rec.waves and not rec.started_at)
    rewritten = [n for n in order if shown[n].state != shown[n].recorded]
    assert sum(shown[n].state == run_state for n in rewritten if run_state != "CANCELLED") <= 1


# --- artifacts of a final run whose later stages never ran -------------------------------------


def test_artifacts_of_stages_that_never_ran_fail_and_say_why_and_what_next(home: Home) -> None:
    failed = ok("FAILED", waves=0)
    failed.detail = "exit 4"
    home.write_run(RUN_A, "FAILED", {"generate": ok(), "square": failed})
    home.put_output(RUN_A, "generate", "numbers/numbers.txt")
    res = home.npa(*WF, "artifacts", RUN_A, "--project", "demo", "--json")
    assert res.code == 1, res.stdout + res.stderr
    body = res.json()
    assert body["never_ran"] == [
        "stage total never ran, because the run ended FAILED at stage square: its declared "
        "outputs (total) were never written"
    ]
    assert [f for f in body["failures"] if "total" in f] == []  # not a failure of its own
    assert body["next"][0] == (f"npa workbench workflow logs {RUN_A} --project demo --stage square")
    # No reservation of the run on this machine: where its spec is cannot be known, so no
    # resume is suggested (never one with a placeholder for the spec).
    assert body["next"] == [body["next"][0]]
    assert [s["state"] for s in body["stages"]] == ["SUCCEEDED", "FAILED", "CANCELLED"]
    text = home.npa(*WF, "artifacts", RUN_A, "--project", "demo")
    assert text.code == 1
    assert "not run: stage total never ran, because the run ended FAILED at stage square" in (
        text.stdout
    )
    assert f"next: npa workbench workflow logs {RUN_A}" in text.stdout
    # A run that has not ended judges no stage still to run.
    home.write_run(RUN_B, "RUNNING", {"generate": ok()})
    home.put_output(RUN_B, "generate", "numbers/numbers.txt")
    live = home.npa(*WF, "artifacts", RUN_B, "--project", "demo", "--json")
    assert live.code == 0 and live.json()["never_ran"] == [], live.stdout


def test_insights_ingests_the_stage_states_every_reader_shows(home: Home) -> None:
    from npa.insights.scan import scan

    stale = StageRecord(state="RUNNING", started_at=NOW)
    home.write_run(RUN_A, "CANCELLED", {"generate": ok(), "square": stale})
    prefix = home.prefix_uri("tiny", RUN_A)
    facts = scan(open_store(prefix), prefix)
    assert [(s.stage, s.state) for s in facts.stages] == [
        ("generate", "SUCCEEDED"), ("square", "CANCELLED"), ("total", "CANCELLED"),
    ]  # fmt: skip
