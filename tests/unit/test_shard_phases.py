"""The record of one shard attempt's phases (npa.backends.phases): its shape, its key, its
outcome in words, its phases in order, how it is written and read. That the SkyPilot stage
library writes exactly this shape is tests/integration/test_stage_library_store.py's."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from npa.adapters.storage.file import FileStore
from npa.backends.phases import SUCCEEDED, ShardPhases, read_phases, write_phases
from npa.core.layout import attempts_key

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 4, 15, 0, tzinfo=UTC)
PREFIX = "wf/20261204-150000-abcdef/npa-workflow"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def record(**fields: object) -> ShardPhases:
    base: dict[str, object] = {
        "stage": "square", "wave": 1, "shard": 3, "attempt": 2, "backend": "local",
        "started_at": at(0), "inputs_at": at(1), "command_started_at": at(2),
        "command_ended_at": at(12), "exit_code": 0, "uploaded_at": at(15), "ended_at": at(15),
    }  # fmt: skip
    return ShardPhases.model_validate({**base, **fields})


def test_a_record_lives_beside_its_shards_start_count_and_round_trips() -> None:
    r = record()
    assert r.key(PREFIX) == attempts_key(PREFIX, "square", 1, 3) + ".attempt-2.json"
    assert r.key(PREFIX) == f"{PREFIX}/stages/square/attempts/wave-1-shard-3.attempt-2.json"
    assert ShardPhases.model_validate_json(r.dumps()) == r
    assert json.loads(r.dumps())["started_at"] == "2026-12-04T15:00:00Z"


def test_its_shape_is_strict_and_its_times_are_utc_aware() -> None:
    with pytest.raises(ValidationError):
        record(phase="extra")
    with pytest.raises(ValidationError):
        record(started_at=datetime(2026, 12, 4, 15, 0))  # no zone: not a moment
    with pytest.raises(ValidationError):
        ShardPhases.model_validate({"stage": "s", "wave": 0, "shard": 0, "attempt": 1})


@pytest.mark.parametrize(
    ("fields", "outcome", "phases"),
    [
        ({}, SUCCEEDED, ["setup", "start", "run", "upload"]),
        ({"exit_code": 3, "uploaded_at": None}, "failed (exit 3)", ["setup", "start", "run"]),
        ({"uploaded_at": None}, "exit 0, outputs not uploaded", ["setup", "start", "run"]),
        ({"command_ended_at": None, "exit_code": None, "uploaded_at": None},
         "interrupted (no exit recorded)", ["setup", "start", "run"]),
        ({"command_started_at": None, "command_ended_at": None, "exit_code": None,
          "uploaded_at": None}, "did not start its command", ["setup"]),
    ],
)  # fmt: skip
def test_the_outcome_is_said_in_words_and_the_phases_follow_in_order(
    fields: dict[str, object], outcome: str, phases: list[str]
) -> None:
    r = record(**fields)
    assert r.outcome == outcome
    spans = r.phases()
    assert [name for name, _, _ in spans] == phases
    assert all(begin <= end for _, begin, end in spans)
    assert all(a[2] == b[1] for a, b in itertools.pairwise(spans))  # no gap, no overlap
    assert r.seconds()["setup"] == 1.0


def test_an_unended_command_runs_to_when_the_record_was_written() -> None:
    r = record(command_ended_at=None, exit_code=None, uploaded_at=None, ended_at=at(30))
    assert r.phases()[-1] == ("run", at(2), at(30))


def test_records_are_read_by_wave_shard_attempt_and_unreadable_ones_counted(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "store")
    for r in (record(attempt=1), record(shard=0), record(wave=0, shard=5)):
        assert write_phases(store, PREFIX, r) is None
    store.put(attempts_key(PREFIX, "square", 1, 3), b"2\n")  # the start count: not a record
    store.put(attempts_key(PREFIX, "square", 2, 0) + ".attempt-1.json", b"{not json")
    found, unreadable = read_phases(store, PREFIX, "square")
    assert [(r.wave, r.shard, r.attempt) for r in found] == [(0, 5, 2), (1, 0, 2), (1, 3, 1)]
    assert unreadable == 1
    assert read_phases(store, PREFIX, "total") == ([], 0)


def test_a_store_that_cannot_take_the_record_is_said_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "store"
    blocker.write_text("a file where the store's folder would be")
    failed = write_phases(FileStore(blocker), PREFIX, record())
    assert failed is not None and failed.strip()
