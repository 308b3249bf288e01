"""What an executor reports, recorded in the run's manifest under the supervision policy.

A backend that npa executes itself (:class:`npa.backends.base.HostsExecutor`) runs the waves and
reports each step to a :class:`npa.backends.base.RunRecorder`; :class:`ManifestRecorder` is the
one npa gives it. It owns what the executor must not: the run manifest's records and the
decision (:mod:`npa.launch.supervision`) whether a failed wave runs again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from npa.adapters.storage import ObjectStore
from npa.backends.base import JobState, StageProgress, WaveProgress, WaveVerdict
from npa.core.errors import StateCorrupt
from npa.core.fsio import ensure_private_dir, refusals_named
from npa.launch.supervision import Classification, Policy, Recovery, classify_exit, record
from npa.runs.manifest import (
    RunManifest,
    StageRecord,
    WaveRecord,
    now_iso,
    read_manifest,
    update_manifest,
)


class ManifestRecorder:
    """Records an executing job's progress in its run's manifest (under the manifest lock)."""

    def __init__(
        self, store: ObjectStore, prefix: str, manifest_lock: Path, policy: Policy, status: str
    ):
        self.store = store
        self.status = status  # the command that shows the run, for fix lines
        self.prefix = prefix
        self.manifest_lock = manifest_lock
        self.policy = policy

    def _update(
        self, mutate: Callable[[RunManifest], None], stages: list[str] | None = None
    ) -> None:
        """``stages``: the only stages ``mutate`` touches (a large run's step then reads and
        writes those stages' page of the manifest, not every stage's record)."""
        update_manifest(self.store, self.prefix, self.manifest_lock, mutate, stages=stages)

    def retry_budget(self, stage_retries: int) -> int:
        return self.policy.payload_retries(stage_retries)

    # --- the job ----------------------------------------------------------------------------------
    def started(self, job_id: int, stages: list[str]) -> None:
        def mutate(m: RunManifest) -> None:
            m.job_id = job_id
            m.state = JobState.STARTING.value
            for stage in stages:
                m.stages.setdefault(stage, StageRecord())

        self._update(mutate)

    def progress(self, stage: str, *, since: float) -> StageProgress:
        manifest = read_manifest(self.store, self.prefix, stages=[stage])
        if manifest is None:
            raise StateCorrupt(
                f"the manifest of {self.store.uri}/{self.prefix} disappeared during the run",
                fix=self.status,
            )
        rec = manifest.stages.get(stage, StageRecord())
        after = datetime.fromtimestamp(since, UTC)
        spent = sum(
            1
            for a in manifest.supervisor.attempts
            if a.stage == stage
            and a.classification == Classification.PAYLOAD.value
            and a.recovery == Recovery.RETRIED.value
            and datetime.fromisoformat(a.at) >= after
        )
        return StageProgress(
            state=rec.state,
            detail=rec.detail,
            waves={w.wave: WaveProgress(state=w.state, attempts=w.attempts) for w in rec.waves},
            retries_spent=spent,
        )

    def running(self) -> None:
        self._update(lambda m: setattr(m, "state", JobState.RUNNING.value), [])

    def restore_source(self, store: ObjectStore, prefix: str, into: Path) -> None:
        """Rebuild the committed source tree from the store (the stages' working directory)."""
        from npa.runs.staging import SourceLayout, load_committed, restore_mode

        layout = SourceLayout(prefix)
        manifest = load_committed(store, layout)
        root = ensure_private_dir(into)
        if manifest is None:
            return
        for entry in manifest.files:
            target = root / entry.path
            ensure_private_dir(target.parent)
            data = store.get(layout.blob(entry.digest.removeprefix("sha256:")))
            with refusals_named("restore the source file", target):
                target.write_bytes(data)
                os.chmod(target, restore_mode(entry.mode))

    def ended(
        self, state: JobState, detail: str | None, *, infrastructure: bool, actionable: bool = False
    ) -> None:
        def final(m: RunManifest) -> None:
            m.state = state.value
            if infrastructure and m.supervisor.classification is None:
                m.supervisor.classification = (
                    Classification.ACTIONABLE_CONFIGURATION.value
                    if actionable
                    else Classification.TRANSIENT_INFRASTRUCTURE.value
                )
            for rec in m.stages.values():
                if rec.state in ("PENDING", "RUNNING") and state is JobState.CANCELLED:
                    rec.state = "CANCELLED"
                elif rec.state == "RUNNING" and state is not JobState.SUCCEEDED:
                    # The stage the job ended in ends with it, with the reason (also before a
                    # wave could record it, e.g. setup): never a RUNNING stage in a run that ended.
                    rec.state, rec.detail = state.value, detail or rec.detail
                    rec.ended_at = rec.ended_at or now_iso()
                    for wave in rec.waves:
                        wave.state = state.value if wave.state == "RUNNING" else wave.state

        self._update(final)

    # --- stages and waves -------------------------------------------------------------------------
    def stage_started(self, stage: str) -> None:
        def begin(m: RunManifest) -> None:
            rec = m.stages.setdefault(stage, StageRecord())
            # A stage taken up again (after a store outage, or by a continuing executor) keeps
            # the time it first started.
            again = rec.state == "RUNNING" and rec.started_at is not None
            rec.state, rec.started_at = "RUNNING", rec.started_at if again else now_iso()

        self._update(begin, [stage])

    def wave_started(self, stage: str, wave: int, shards: list[int], attempt: int) -> None:
        now = now_iso()  # this attempt of the wave is asked to start: its launch and start

        def mark(m: RunManifest) -> None:
            rec = m.stages.setdefault(stage, StageRecord())
            rec.waves = [w for w in rec.waves if w.wave != wave]
            rec.waves.append(
                WaveRecord(
                    wave=wave,
                    shards=shards,
                    state="RUNNING",
                    attempts=attempt,
                    launched_at=now,
                    started_at=now,
                )
            )

        self._update(mark, [stage])

    def wave_succeeded(
        self,
        stage: str,
        wave: int,
        shards: list[int],
        codes: dict[int, int],
        attempt: int,
        stored: dict[str, int],
    ) -> None:
        self._wave_done(stage, wave, shards, codes, attempt, "SUCCEEDED", stored)

    def wave_failed(
        self,
        stage: str,
        wave: int,
        shards: list[int],
        codes: dict[int, int],
        attempt: int,
        retries_left: int,
    ) -> WaveVerdict:
        shard, code = sorted((s, c) for s, c in codes.items() if c != 0)[0]
        classification, why = classify_exit(code)
        detail = f"stage {stage} wave {wave} shard {shard}: {why}"
        self._wave_done(stage, wave, shards, codes, attempt, "FAILED", None)
        state = self._supervise(
            stage,
            f"stage {stage} wave {wave}",
            f"exit:{code}",
            classification,
            detail,
            retries_left,
        )
        if state is not None:
            self._stage_end(stage, "FAILED", None, classification.value, detail)
        return WaveVerdict(
            retry=state is None,
            state=state,
            classification=classification.value,
            detail=detail,
            spends_retry=classification is Classification.PAYLOAD,
        )

    def infrastructure_fault(self, detail: str, *, stage: str | None) -> WaveVerdict:
        state = self._supervise(
            stage,
            f"stage {stage}" if stage else "job",
            "store-outage",
            Classification.TRANSIENT_INFRASTRUCTURE,
            detail,
            0,
        )
        return WaveVerdict(
            retry=state is None,
            state=state,
            classification=Classification.TRANSIENT_INFRASTRUCTURE.value,
            detail=detail,
            spends_retry=False,
        )

    def outputs_missing(self, stage: str, found: dict[str, int], missing: list[str]) -> str:
        detail = f"stage {stage} exited 0 but declared outputs are missing or empty: " + ", ".join(
            missing
        )
        self._stage_end(stage, "FAILED", found, Classification.PAYLOAD.value, detail)
        self._supervise(
            stage, f"stage {stage}", "missing-outputs", Classification.PAYLOAD, detail, 0
        )
        return detail

    def stage_succeeded(self, stage: str, outputs: dict[str, int]) -> None:
        self._stage_end(stage, "SUCCEEDED", outputs, None, None)

    # --- records ----------------------------------------------------------------------------------
    def _wave_done(
        self,
        stage: str,
        wave: int,
        shards: list[int],
        codes: dict[int, int],
        attempt: int,
        state: str,
        stored: dict[str, int] | None,
    ) -> None:
        def mutate(m: RunManifest) -> None:
            rec = m.stages.setdefault(stage, StageRecord())
            before = next((w for w in rec.waves if w.wave == wave), None)
            rec.waves = [w for w in rec.waves if w.wave != wave]
            rec.waves.append(
                WaveRecord(
                    wave=wave,
                    shards=shards,
                    state=state,
                    attempts=attempt,
                    launched_at=before.launched_at if before else None,
                    started_at=before.started_at if before else None,
                    ended_at=now_iso(),
                    exit_codes={str(k): v for k, v in sorted(codes.items())},
                )
            )
            rec.waves.sort(key=lambda w: w.wave)
            if stored is not None:
                rec.outputs = stored

        self._update(mutate, [stage])

    def _supervise(
        self,
        stage: str | None,
        what: str,
        failure: str,
        classification: Classification,
        detail: str,
        budget: int,
    ) -> JobState | None:
        result: list[JobState | None] = [None]

        def mutate(m: RunManifest) -> None:
            verdict = record(
                m.supervisor,
                what=what,
                failure=failure,
                classification=classification,
                detail=detail,
                policy=self.policy,
                payload_budget=budget,
                stage=stage,
            )
            result[0] = verdict.terminal_state

        self._update(mutate, [])  # the supervisor's record: the run's own fields
        return result[0]

    def _stage_end(
        self,
        stage: str,
        state: str,
        outputs: dict[str, int] | None,
        classification: str | None,
        detail: str | None,
    ) -> None:
        def mutate(m: RunManifest) -> None:
            rec = m.stages.setdefault(stage, StageRecord())
            rec.state, rec.ended_at = state, now_iso()
            rec.classification, rec.detail = classification, detail
            if outputs is not None:
                rec.outputs = outputs

        self._update(mutate, [stage])
