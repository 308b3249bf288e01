"""Run identity records: reservations, the legacy run-id file, selection, receipts, journals."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from npa.core.errors import InvalidInput, NotFound
from npa.core.paths import NpaPaths
from npa.runs.identity import load_record, new_run_id
from npa.runs.journal import OperationJournal
from npa.runs.receipts import JobIdentity, Receipt, list_receipts, read_receipt, write_receipt
from npa.runs.secrets import SecretLeak
from npa.runs.selection import choose_run
from npa.services.configure import record_project
from npa.services.runs import prepare_run

pytestmark = pytest.mark.unit

SPEC = "apiVersion: npa/v1\nkind: Workflow\nmetadata:\n  name: flow-a\n"


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC)
    return p


def test_run_ids_are_distinct_and_name_safe() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    ids = {new_run_id(start + timedelta(seconds=i)) for i in range(500)}
    assert len(ids) == 500  # different seconds: always distinct
    assert all(i.replace("-", "").isalnum() and i == i.lower() for i in ids)
    # Within one second, 24 random bits: 500 ids collided in 0.75% of runs (a birthday pair),
    # so the same-second sample allows one pair; two would take about 1 run in 10 million.
    same = [new_run_id(start) for _ in range(200)]
    assert len(set(same)) >= 199
    assert all(len(i.rsplit("-", 1)[1]) == 6 for i in same)


def test_prepare_run_reserves_distinct_runs_in_a_private_record(npa_home: Path, spec: Path) -> None:
    a = prepare_run(spec, "p1")
    b = prepare_run(spec, "p1")
    assert a.run_id != b.run_id
    assert a.text_lines() == [a.run_id]
    assert a.workflow == "flow-a"
    record_path = NpaPaths.from_env().run_reservation("p1", "flow-a")
    assert stat.S_IMODE(record_path.stat().st_mode) == 0o600
    record = load_record(NpaPaths.from_env(), "p1", "unconfigured:p1", "flow-a")
    assert [r.run_id for r in record.runs] == [a.run_id, b.run_id]


def test_record_is_scoped_by_project_identity(npa_home: Path, spec: Path) -> None:
    prepare_run(spec, "p1")
    record_project("p1", {})  # the alias now has a recorded identity of its own
    with pytest.raises(InvalidInput, match="will not mix"):
        prepare_run(spec, "p1")


def test_spec_without_name_is_refused(npa_home: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Workflow\n")
    with pytest.raises(InvalidInput, match=r"metadata\.name"):
        prepare_run(bad, "p1")
    with pytest.raises(NotFound):
        prepare_run(tmp_path / "missing.yaml", "p1")


def test_legacy_run_id_is_warned_about_never_touched(npa_home: Path, spec: Path) -> None:
    legacy = NpaPaths.from_env().legacy_first_run_id
    legacy.parent.mkdir(parents=True, exist_ok=True)
    legacy.write_bytes(b"legacy-run-0001\n")
    os.utime(legacy, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    before = (legacy.read_bytes(), legacy.stat().st_mtime_ns)
    result = prepare_run(spec, "p1")
    assert result.run_id != "legacy-run-0001"
    assert any("legacy-run-0001" in w and "untouched" in w for w in result.warnings)
    assert (legacy.read_bytes(), legacy.stat().st_mtime_ns) == before


def test_selection_never_picks_silently(npa_home: Path, spec: Path) -> None:
    paths = NpaPaths.from_env()
    empty = load_record(paths, "p1", "unconfigured:p1", "flow-a")
    kw = {"spec_sha256": "x", "prepare_command": "npa prepare"}
    with pytest.raises(InvalidInput, match="no run is reserved"):
        choose_run(empty, None, interactive=False, **kw)  # type: ignore[arg-type]
    a = prepare_run(spec, "p1")
    record = load_record(paths, "p1", "unconfigured:p1", "flow-a")
    # Even a single candidate is not picked without being named.
    with pytest.raises(InvalidInput, match="--resume-run") as err:
        choose_run(record, None, interactive=False, **kw)  # type: ignore[arg-type]
    assert a.run_id in err.value.message and "prepare-run" not in err.value.message
    with pytest.raises(NotFound):
        choose_run(record, "20000101-000000-abcdef", interactive=False, **kw)  # type: ignore[arg-type]
    entry, warnings = choose_run(record, a.run_id, interactive=False, **kw)  # type: ignore[arg-type]
    assert entry.run_id == a.run_id and warnings  # the spec digest "x" differs: stale warning
    asked: list[int] = []

    def ask(cands: list[object]) -> str | None:
        asked.append(len(cands))
        return None

    with pytest.raises(InvalidInput, match="no run chosen"):
        choose_run(record, None, interactive=True, ask=ask, **kw)  # type: ignore[arg-type]
    assert asked == [1]


def _receipt(run_id: str, at: str) -> Receipt:
    return Receipt(
        project="p1",
        project_identity="abc",
        workflow="flow-a",
        run_id=run_id,
        submitted_at=at,
        store="s3://bucket/x",
        workflow_prefix=f"s3://bucket/x/flow-a/{run_id}/npa-workflow",
        endpoint_url="http://127.0.0.1:9000",
        credentials_source="environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)",
        job=JobIdentity(backend="skypilot", job_id="17", job_name="flow-a-x"),
    )


def test_receipts_round_trip_owner_only(npa_home: Path) -> None:
    paths = NpaPaths.from_env()
    path = write_receipt(paths, _receipt("r2", "2026-01-02T00:00:00+00:00"))
    write_receipt(paths, _receipt("r1", "2026-01-01T00:00:00+00:00"))
    assert path == npa_home / "workflow-submissions" / "p1" / "r2.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_receipt(paths, "p1", "r2").job == JobIdentity(
        backend="skypilot", job_id="17", job_name="flow-a-x"
    )
    assert [r.run_id for r in list_receipts(paths, "p1")] == ["r1", "r2"]
    with pytest.raises(NotFound):
        read_receipt(paths, "p1", "r3")


def test_a_credential_value_is_never_persisted(
    npa_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "leaky-secret-value")
    paths = NpaPaths.from_env()
    bad = _receipt("r9", "2026-01-01T00:00:00+00:00").model_copy(
        update={"endpoint_url": "http://x/?sig=leaky-secret-value"}
    )
    with pytest.raises(SecretLeak):
        write_receipt(paths, bad)
    assert not paths.submission_receipt("p1", "r9").exists()
    journal = OperationJournal(paths, "op.test")
    with pytest.raises(SecretLeak):
        journal.append("step", "done", note="leaky-secret-value")


def test_journal_resume_command_is_deterministic(npa_home: Path) -> None:
    paths = NpaPaths.from_env()
    j = OperationJournal(paths, "stage-source.p1.r1")
    argv = ["npa", "workbench", "workflow", "stage-source", "/a b/spec.yaml", "--run-id", "r1"]
    first = j.begin("stage-source", argv)
    assert first == "npa workbench workflow stage-source '/a b/spec.yaml' --run-id r1"
    j.append("scanned", "done", files=3)
    # A resume with differently spelled arguments still prints the original command.
    again = OperationJournal(paths, "stage-source.p1.r1").begin("stage-source", [*argv, "-v"])
    assert again == first
    steps = [r["step"] for r in j.records()]
    assert steps == ["begin", "scanned", "resume"]
    assert stat.S_IMODE(j.path.stat().st_mode) == 0o600
    # A line cut short by a crash at the end is tolerated.
    with j.path.open("a") as f:
        f.write('{"step": "cut')
    assert len(j.records()) == 3
