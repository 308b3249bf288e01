"""The record of one shard attempt's phases: when it began, when its inputs were in place, when
its command started and ended (with its exit code), when its outputs were uploaded.

Every backend's stage library writes one such record per shard attempt, as a small JSON object
beside the shard's start count (:func:`npa.core.layout.phases_key`), when the attempt ends,
also when it fails. The record is evidence, never the result: the run's manifest decides what
happened to a wave; a record that could not be written leaves a gap in the report's timeline
and nothing else. ``report`` reads them (:func:`read_phases`) to draw each attempt's bar split
into its phases.

What the phases mean on each backend:

- ``started_at``: on ``local``, the executor began preparing the shard's folder; in a SkyPilot
  pod, the node's setup began (the pod had started).
- ``inputs_at``: the shard's inputs in place (``local`` fetches a stage's inputs once and links
  or mounts them into each shard; a pod fetches its own in its setup).
- ``command_started_at`` / ``command_ended_at`` and ``exit_code``: the stage's command.
- ``uploaded_at``: the shard's outputs in the store (``local`` uploads a wave's shards together
  once all exited 0, so a failed wave's shards have none).
- ``ended_at``: when the record was written.

The SkyPilot stage library (``npa/templates/skypilot-stage.sh``) writes the same fields from the
shell; a unit test parses what it writes with this model.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, ValidationError

from npa.adapters.storage import ObjectStore
from npa.core.layout import PHASES_SUFFIX, attempts_folder, phases_key

SUCCEEDED = "succeeded"
# The phases a record holds, in order (the report draws a wave's launch before the first).
PHASE_NAMES = ("setup", "start", "run", "upload")


def now() -> datetime:
    return datetime.now(UTC)


class ShardPhases(BaseModel):
    """One attempt of one shard of one wave of a stage, phase by phase (UTC)."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    wave: int
    shard: int
    attempt: int
    backend: str
    started_at: AwareDatetime
    inputs_at: AwareDatetime | None = None
    command_started_at: AwareDatetime | None = None
    command_ended_at: AwareDatetime | None = None
    exit_code: int | None = None
    uploaded_at: AwareDatetime | None = None
    ended_at: AwareDatetime
    note: str = ""  # why it ended as it did, when its fields alone do not say

    def key(self, prefix: str) -> str:
        return phases_key(prefix, self.stage, self.wave, self.shard, self.attempt)

    @property
    def outcome(self) -> str:
        """The attempt's end in words: succeeded, failed (exit N), not uploaded, interrupted."""
        if self.command_started_at is None:
            return "did not start its command"
        if self.exit_code is None:
            return "interrupted (no exit recorded)"
        if self.exit_code != 0:
            return f"failed (exit {self.exit_code})"
        if self.uploaded_at is None:
            return "exit 0, outputs not uploaded"
        return SUCCEEDED

    def phases(self) -> list[tuple[str, datetime, datetime]]:
        """(phase, from, to) for each phase the record holds, in order: ``setup`` (the
        attempt's start to its inputs in place), ``start`` (to its command's start), ``run``
        (the command) and ``upload`` (the command's end to its outputs in the store). A phase
        whose end was not reached is left out; an unended command runs to ``ended_at``."""
        marks = [self.started_at, self.inputs_at, self.command_started_at]
        marks += [self.command_ended_at or (self.ended_at if self.command_started_at else None)]
        marks += [self.uploaded_at]
        spans: list[tuple[str, datetime, datetime]] = []
        begin: datetime = self.started_at
        for name, end in zip(PHASE_NAMES, marks[1:], strict=True):
            if end is None:
                continue
            spans.append((name, begin, max(begin, end)))
            begin = max(begin, end)
        return spans

    def seconds(self) -> dict[str, float]:
        """How long each recorded phase took."""
        return {name: (end - begin).total_seconds() for name, begin, end in self.phases()}

    def dumps(self) -> bytes:
        return (self.model_dump_json(exclude_defaults=False) + "\n").encode()


def write_phases(store: ObjectStore, prefix: str, record: ShardPhases) -> str | None:
    """Put the record in the store; why it could not be, else None. Never raises for the
    store: a shard's result does not depend on its evidence."""
    try:
        store.put(record.key(prefix), record.dumps())
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def read_phases(store: ObjectStore, prefix: str, stage: str) -> tuple[list[ShardPhases], int]:
    """Every phase record of a stage (by wave, shard, attempt), and how many objects under its
    attempts folder looked like records but could not be read as one. Store errors raise."""
    found: list[ShardPhases] = []
    unreadable = 0
    ending = PHASES_SUFFIX.split("%s", 1)[1]
    for obj in store.list(attempts_folder(prefix, stage)):
        if not obj.key.endswith(ending):
            continue
        try:
            found.append(ShardPhases.model_validate(json.loads(store.get(obj.key))))
        except (ValueError, ValidationError):
            unreadable += 1
    found.sort(key=lambda r: (r.wave, r.shard, r.attempt))
    return found, unreadable
