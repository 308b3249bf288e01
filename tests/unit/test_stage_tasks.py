"""Which task of a SkyPilot pipeline job runs which stage: by the task name npa rendered, never
by position; the lone task SkyPilot renames after its job only when nothing else can be it."""

from __future__ import annotations

from pathlib import Path

from npa.backends.base import JobRecord, JobStages, JobState, TaskRecord
from npa.backends.skypilot.backend import SkyPilotBackend
from npa.core.layout import wave_task_name
from npa.core.paths import NpaPaths

RUN = "20250101-000000-abcdef"
ALL = ["curate", "augment", "evaluate"]


def job(*names: str | None, job_name: str = "npa-wf-run") -> JobRecord:
    return JobRecord(
        backend="skypilot",
        job_id=7,
        job_name=job_name,
        state=JobState.RUNNING,
        tasks=[
            TaskRecord(task_id=i, task_name=n, state=JobState.PENDING) for i, n in enumerate(names)
        ],
    )


def mapped(record: JobRecord, stages: JobStages) -> dict[str, int]:
    backend = SkyPilotBackend(NpaPaths(Path("/nonexistent")), context=None)
    found = backend.stage_tasks(record, stages)
    return {stage: task.task_id for stage, task in found.items()}


def test_tasks_are_matched_by_name_not_position() -> None:
    stages = JobStages(run_id=RUN, stages=ALL, adopted=["curate"])
    record = job(wave_task_name(RUN, "augment", 0), wave_task_name(RUN, "evaluate", 0))
    assert mapped(record, stages) == {"augment": 0, "evaluate": 1}
    # A task named for an adopted stage is not taken for it: that stage is not in this job.
    record = job(wave_task_name(RUN, "curate", 0), wave_task_name(RUN, "evaluate", 0))
    assert mapped(record, stages) == {"evaluate": 1}


def test_the_lone_task_named_after_its_job_is_the_one_launched_stage() -> None:
    stages = JobStages(run_id=RUN, stages=ALL, adopted=["curate", "augment"])
    assert mapped(job("npa-wf-run-r2", job_name="npa-wf-run-r2"), stages) == {"evaluate": 0}
    # Any other name, or more than one launched stage, is not guessed at.
    assert mapped(job("something-else", job_name="npa-wf-run-r2"), stages) == {}
    two = JobStages(run_id=RUN, stages=ALL, adopted=["curate"])
    assert mapped(job("npa-wf-run-r2", job_name="npa-wf-run-r2"), two) == {}


def test_without_the_runs_stages_nothing_is_matched() -> None:
    stages = JobStages(run_id=RUN, stages=None)
    assert stages.launched is None
    assert mapped(job(wave_task_name(RUN, "curate", 0)), stages) == {}


def test_a_stage_of_several_waves_is_every_wave_task_and_reads_as_one_state() -> None:
    backend = SkyPilotBackend(NpaPaths(Path("/nonexistent")), context=None)
    stages = JobStages(run_id=RUN, stages=["augment-w1", "eval"], adopted_waves={"eval": [0]})
    # A stage whose own name ends like a wave suffix is still told apart from its waves.
    record = job(
        wave_task_name(RUN, "augment-w1", 0),
        wave_task_name(RUN, "augment-w1", 1),
        wave_task_name(RUN, "eval", 1),
    )
    record.tasks[0].state = JobState.SUCCEEDED
    record.tasks[1].state = JobState.RUNNING
    waves = backend.wave_tasks(record, stages)
    assert {s: sorted(w) for s, w in waves.items()} == {"augment-w1": [0, 1], "eval": [1]}
    states = {s: t.state for s, t in backend.stage_tasks(record, stages).items()}
    assert states == {"augment-w1": JobState.RUNNING, "eval": JobState.PENDING}
    record.tasks[1].state = JobState.FAILED
    assert backend.stage_tasks(record, stages)["augment-w1"].state is JobState.FAILED
    record.tasks[1].state = record.tasks[2].state = JobState.SUCCEEDED
    assert {t.state for t in backend.stage_tasks(record, stages).values()} == {JobState.SUCCEEDED}
    # A one-task job named after the job runs the first wave the resume did not adopt.
    lone = job("npa-wf-run-r1", job_name="npa-wf-run-r1")
    only = JobStages(run_id=RUN, stages=["eval"], adopted_waves={"eval": [0, 1]})
    assert list(backend.wave_tasks(lone, only)["eval"]) == [2]
