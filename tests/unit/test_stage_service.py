"""stage-source as a service on the embedded local store: source choice and journal."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from npa.core.errors import InvalidInput
from npa.core.paths import NpaPaths
from npa.services.runs import prepare_run, stage_run_source

pytestmark = pytest.mark.unit

SPEC = "apiVersion: npa/v1\nkind: Workflow\nmetadata:\n  name: flow-a\n"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "spec.yaml").write_text(SPEC)
    (spec_dir / "default.txt").write_text("the default source is the spec's directory\n")
    user = tmp_path / "user-src"
    user.mkdir()
    (user / "main.py").write_text("print('user')\n")
    other = tmp_path / "other-src"
    other.mkdir()
    (other / "main.py").write_text("print('other')\n")
    return spec_dir / "spec.yaml", user, other


def test_a_user_supplied_source_is_never_replaced_by_the_default(
    npa_home: Path, layout: tuple[Path, Path, Path]
) -> None:
    spec, user, other = layout
    run = prepare_run(spec, "p1").run_id
    first = stage_run_source(spec, "p1", run, user)
    assert first.source == str(user) and first.files == 1
    # A retry without --source stages the user's tree again, not the spec's directory.
    again = stage_run_source(spec, "p1", run, None)
    assert again.source == str(user) and again.source_digest == first.source_digest
    assert again.uploaded == 0
    with pytest.raises(InvalidInput, match="never changes"):
        stage_run_source(spec, "p1", run, other)
    # With no source ever given, the default is the spec's directory.
    run2 = prepare_run(spec, "p1").run_id
    assert stage_run_source(spec, "p1", run2, None).source == str(spec.parent)


def test_the_journal_records_each_step_and_the_resume_command(
    npa_home: Path, layout: tuple[Path, Path, Path]
) -> None:
    spec, user, _ = layout
    run = prepare_run(spec, "p1").run_id
    result = stage_run_source(spec, "p1", run, user)
    journal = Path(result.journal)
    assert journal.parent == NpaPaths.from_env().operations_dir
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [r["step"] for r in records] == [
        "begin", "scanned", "hashed", "blobs", "committed", "done",
    ]  # fmt: skip
    assert records[0]["resume"] == result.resume_command
    assert result.resume_command == (
        f"npa workbench workflow stage-source {spec} --project p1 --run-id {run} --source {user}"
    )
    assert result.manifest.startswith((npa_home / "store").as_uri())
