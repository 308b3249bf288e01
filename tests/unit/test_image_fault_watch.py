"""The run watcher against a backend whose pods cannot pull their image, in process: the real
:class:`npa.launch.watch.Watcher` poll (``step``), the run's manifest in a file store, and a
backend double that answers the job by id and, poll by poll, the pods that failed to start.

The registry's "not found" stops the run at the first poll that shows it (no threshold), only
the recorded job is cancelled, the verdict is actionable_configuration, and status's next
command is the image check. A failing registry keeps the threshold."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from npa.adapters.kube.pods import PodReason
from npa.adapters.storage.file import FileStore
from npa.backends.base import JobRecord, JobState, PodSource, ReportsPodReasons, TaskRecord
from npa.core.layout import run_prefix
from npa.launch.supervision import Policy
from npa.launch.watch import Watcher
from npa.runs.identity import RunEntry
from npa.runs.manifest import RunManifest, read_manifest, write_manifest
from npa.services.locate import Located
from npa.services.status import _next

pytestmark = pytest.mark.unit

RUN = "20260101-000000-abcdef"
PREFIX = run_prefix("wf", RUN)
JOB = 7
TASK = f"npa-wf-{RUN}-only"
IMAGE = "registry.example/npa/absent@sha256:" + "0" * 64
NOT_FOUND = (
    f'Failed to pull image "{IMAGE}": rpc error: code = NotFound desc = failed to pull and '
    f'unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": {IMAGE}: not found'
)
TIMEOUT = (
    f'Failed to pull image "{IMAGE}": rpc error: code = Unknown desc = failed to pull and '
    f'unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": failed to do request: '
    'Head "https://registry.example/v2/npa/absent/manifests/sha256:0": dial tcp 10.0.0.5:443: '
    "i/o timeout"
)


class PodsThatCannotStart(ReportsPodReasons):
    """The job PENDING by its id, as SkyPilot keeps a job whose pods it retries; ``failed``
    is every pod that failed so far (events outlive the pods), appended to between polls."""

    def __init__(self) -> None:
        self.failed: list[PodReason] = []
        self.cancelled: list[int] = []
        self.asked: list[int] = []

    def job(self, job_id: int) -> JobRecord:
        self.asked.append(job_id)
        state = JobState.CANCELLED if job_id in self.cancelled else JobState.PENDING
        task = TaskRecord(task_id=0, task_name=TASK, state=state)
        return JobRecord(backend="fake", job_id=job_id, job_name="n", state=state, tasks=[task])

    def jobs_named(self, names: Any) -> list[JobRecord]:
        return [self.job(JOB)]  # the run's own job only: no stray

    def stage_tasks(self, job: JobRecord, stages: Any) -> dict[str, TaskRecord]:
        return {"only": job.tasks[0]}

    def wave_tasks(self, job: JobRecord, stages: Any) -> dict[str, dict[int, TaskRecord]]:
        return {}

    def cancel(self, job_id: int) -> None:
        self.cancelled.append(job_id)

    def pods_source(self, project: str) -> PodSource:
        return PodSource(where="fake", missing=None, fix="kubectl get events")

    def pending_reasons(self, record: JobRecord, project: str) -> list[PodReason]:
        return []

    def startup_failures(self, record: JobRecord, project: str) -> list[tuple[str, PodReason]]:
        return [(TASK, p) for p in self.failed]

    def pod(self, name: str, message: str) -> None:
        self.failed.append(
            PodReason(namespace="npa-p", pod=name, phase=None, reason="ErrImagePull",
                      message=message, image=IMAGE, source="events", uid=f"uid-{name}")
        )  # fmt: skip


def manifest(threshold: int) -> RunManifest:
    now = "2026-01-01T00:00:00+00:00"
    return RunManifest(
        project="p", workflow="wf", run_id=RUN, backend="skypilot", infra="k8s/ctx",
        state="PENDING", submitted_at=now, updated_at=now, store="file:///s", prefix=PREFIX,
        spec_sha256="x", source_digest=None, plan_digest="x", tasks={"only": "x"},
        order=["only"], images={}, job_name=f"npa-wf-{RUN}", job_id=JOB,
        policy={"startup_failure_threshold": threshold},
    )  # fmt: skip


def watcher(tmp_path: Path, backend: PodsThatCannotStart, threshold: int) -> Watcher:
    """The watcher of one run, as ``python -m npa.launch.watch`` builds it, on this backend."""
    store = FileStore(tmp_path / "store")
    write_manifest(store, manifest(threshold))
    w = Watcher.__new__(Watcher)
    w.directory = tmp_path
    w.submission = SimpleNamespace(prefix=PREFIX, project="p", run_id=RUN)  # type: ignore[assignment]
    w.policy = Policy(startup_failure_threshold=threshold, max_infrastructure_recoveries=3)
    w.manifest_lock = tmp_path / "manifest.lock"
    w.backend = backend  # type: ignore[assignment]
    w.store = store
    w.episode = None
    w.waves = {}
    w.strays_due = 0.0
    return w


def recorded(w: Watcher) -> RunManifest:
    assert w.store is not None
    m = read_manifest(w.store, PREFIX)
    assert m is not None
    return m


def test_an_image_the_registry_does_not_have_stops_the_run_at_the_first_poll_that_shows_it(
    tmp_path: Path,
) -> None:
    backend = PodsThatCannotStart()
    w = watcher(tmp_path, backend, threshold=5)
    assert w.step() is False  # no pod failed yet: the job waits
    backend.pod("p-head-aaaaa", NOT_FOUND)
    assert w.step() is True  # the very next poll ends the run
    assert backend.cancelled == [JOB]  # the recorded job, by its id, and nothing else
    m = recorded(w)
    assert m.state == "FAILED_STARTUP"
    sup = m.supervisor
    assert sup.classification == "actionable_configuration" and sup.recovery == "stopped"
    assert sup.startup_failures == 1 and sup.job_ids == [JOB]
    [attempt] = sup.attempts
    assert attempt.what.startswith(f"job {JOB} pod p-head-aaaaa") and attempt.stage == "only"
    assert "[actionable_configuration: the registry has no such image" in attempt.detail
    assert f"job {JOB} cancelled" in attempt.detail
    stage = m.stages["only"]
    assert stage.state == "FAILED_STARTUP" and stage.classification == "actionable_configuration"
    # The run is over: a later poll does nothing more.
    backend.pod("p-head-bbbbb", NOT_FOUND)
    assert w.step() is True and backend.cancelled == [JOB]
    assert len(recorded(w).supervisor.attempts) == 1
    # status names the image check, with the spec the run was reserved from, and no relaunch.
    assert next_commands(m) == [
        "npa workbench workflow preflight-images /w/absent.yaml --project p --json"
    ]


def test_a_registry_that_times_out_keeps_the_threshold(tmp_path: Path) -> None:
    backend = PodsThatCannotStart()
    w = watcher(tmp_path, backend, threshold=3)
    for n, pod in enumerate(["p-head-aaaaa", "p-head-bbbbb"], start=1):
        backend.pod(pod, TIMEOUT)
        assert w.step() is False, n
        sup = recorded(w).supervisor
        assert sup.startup_failures == n and sup.recovery == "adopted"
        assert sup.classification == "transient_infrastructure"
    assert backend.cancelled == []
    backend.pod("p-head-ccccc", TIMEOUT)
    assert w.step() is True and backend.cancelled == [JOB]
    m = recorded(w)
    assert m.state == "FAILED_STARTUP"
    assert m.supervisor.classification == "transient_infrastructure"
    # The same launch may work once the registry answers: status offers it again.
    assert any("--resume-run" in n for n in next_commands(m))
    assert not any("preflight-images" in n for n in next_commands(m))


def test_not_found_after_timeouts_stops_at_its_own_poll(tmp_path: Path) -> None:
    backend = PodsThatCannotStart()
    w = watcher(tmp_path, backend, threshold=3)
    backend.pod("p-head-aaaaa", TIMEOUT)
    assert w.step() is False
    backend.pod("p-head-bbbbb", NOT_FOUND)
    assert w.step() is True and backend.cancelled == [JOB]
    sup = recorded(w).supervisor
    assert [a.classification for a in sup.attempts] == [
        "transient_infrastructure",
        "actionable_configuration",
    ]
    assert sup.classification == "actionable_configuration" and sup.startup_failures == 2


def next_commands(m: RunManifest) -> list[str]:
    from npa.services.configure import resolve_project

    entry = RunEntry(
        run_id=RUN, reserved_at=m.submitted_at, spec="/w/absent.yaml", spec_sha256="x",
        store="file:///s",
    )  # fmt: skip
    loc = Located(
        settings=resolve_project("p"), run_id=RUN, workflow="wf", store_uri="file:///s",
        store=None, receipt=None, reservation=entry, manifest=m, partial=[],
    )  # fmt: skip
    return _next(loc, m.state, [], {}, controller_fix=None)


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPA_HOME", str(tmp_path / "home"))
