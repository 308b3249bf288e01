"""Launch rules in isolation: the readiness streak, supervision verdicts, accelerator names."""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import pytest

from npa.adapters.kube.nodes import cluster_names
from npa.backends.base import JobState
from npa.backends.skypilot.backend import exit_codes_in, job_state
from npa.launch.accelerators import resolve
from npa.launch.readiness import NotStable, ReadinessCheck
from npa.launch.supervision import (
    Classification,
    Policy,
    Recovery,
    classify_exit,
    classify_failed_job,
    count_startup_failure,
    failure_signature,
    record,
)
from npa.runs.manifest import SupervisorRecord

pytestmark = pytest.mark.unit


def probe(answers: list[int | None], **kw: float) -> ReadinessCheck:
    it = iter(answers)
    clock = itertools.count(0.0, 1.0)
    return ReadinessCheck(
        context="ctx",
        kubeconfig=Path("/k"),
        ask=lambda: (next(it), "x"),
        window=kw.get("window", 2.0),
        interval=0,
        clock=lambda: next(clock),
        sleep=lambda s: None,
        deadline=kw.get("deadline", 100.0),
    )


def test_the_default_window_really_spans_ten_seconds() -> None:
    # A fake clock that only the check's own sleeps move: the default window and interval,
    # measured as the check measures them, without waiting ten real seconds.
    now = [1000.0]
    calls: list[float] = []

    def ask() -> tuple[int | None, str]:
        calls.append(now[0])
        return 200, "ok"

    def sleep(seconds: float) -> None:
        now[0] += seconds

    record_ = ReadinessCheck(
        context="ctx", kubeconfig=Path("/k"), ask=ask, clock=lambda: now[0], sleep=sleep
    ).establish()
    assert record_.stable and len(record_.probes) == 3
    assert calls[-1] - calls[0] >= 10.0
    assert record_.spanned_seconds >= 10.0


def test_a_failure_restarts_the_streak() -> None:
    r = probe([200, 200, 500, 200, 200, 200]).establish()
    assert [p.ok for p in r.probes] == [True, True, False, True, True, True]


def test_an_unstable_api_never_passes() -> None:
    with pytest.raises(NotStable) as info:
        probe([200, None] * 20, deadline=10).establish()
    assert "readyz" in (info.value.fix or "")


def test_exit_classification() -> None:
    assert classify_exit(3)[0] is Classification.PAYLOAD
    assert classify_exit(127)[0] is Classification.ACTIONABLE_CONFIGURATION
    assert classify_exit(-signal.SIGKILL)[0] is Classification.TRANSIENT_INFRASTRUCTURE
    assert classify_exit(-signal.SIGSEGV)[0] is Classification.PAYLOAD
    # 75, a temporary failure (the stage library's store outage), on every backend.
    assert classify_exit(75)[0] is Classification.TRANSIENT_INFRASTRUCTURE


# What SkyPilot's controller writes as a failed task's reason (sky/jobs/controller.py), and
# the class npa reads from it with the job's status.
FAILED_JOBS = [
    ("FAILED", "Job exited with exit code 75 (user program failure). See logs.",
     [75], Classification.TRANSIENT_INFRASTRUCTURE),
    ("FAILED", "Job exited with exit codes [0, 75] (user program failure). ",
     [0, 75], Classification.TRANSIENT_INFRASTRUCTURE),
    ("FAILED", "Job exited with exit codes [75, 1] (user program failure). ",
     [75, 1], Classification.PAYLOAD),
    ("FAILED", "Job exited with exit code 1 (user program failure). ", [1], Classification.PAYLOAD),
    ("FAILED", "Job failed (FAILED) (user program failure). ", [], Classification.PAYLOAD),
    ("FAILED", None, [], Classification.PAYLOAD),
    ("FAILED_SETUP", "Job exited with exit code 75 (user program failure). ",
     [75], Classification.TRANSIENT_INFRASTRUCTURE),
    ("FAILED_SETUP", "Job exited with exit code 1 (user program failure). ",
     [1], Classification.ACTIONABLE_CONFIGURATION),
    ("FAILED_CONTROLLER", "Controller process 4100 exited abnormally (exit code 137)",
     [], Classification.TRANSIENT_INFRASTRUCTURE),
    ("FAILED_PRECHECKS", None, [], Classification.ACTIONABLE_CONFIGURATION),
    ("FAILED", "Job exited with exit code 175 (user program failure). ", [175],
     Classification.PAYLOAD),
]  # fmt: skip


@pytest.mark.parametrize(("status", "reason", "codes", "expected"), FAILED_JOBS)
def test_a_failed_job_is_classified_by_its_status_and_the_exits_its_reason_names(
    status: str, reason: str | None, codes: list[int], expected: Classification
) -> None:
    assert exit_codes_in(reason) == codes
    assert classify_failed_job(status, codes) is expected


def test_identical_startup_failures_reach_failed_startup() -> None:
    sup = SupervisorRecord()
    policy = Policy(startup_failure_threshold=3, max_infrastructure_recoveries=10)
    kw = {"what": "launch", "failure": "X", "detail": "d", "policy": policy, "startup": True}
    verdicts = [
        record(sup, classification=Classification.TRANSIENT_INFRASTRUCTURE, **kw)  # type: ignore[arg-type]
        for _ in range(3)
    ]
    assert [v.terminal_state for v in verdicts] == [None, None, JobState.FAILED_STARTUP]


def test_pods_that_cannot_start_count_toward_the_threshold_without_a_relaunch() -> None:
    sup = SupervisorRecord()
    policy = Policy(startup_failure_threshold=3, max_infrastructure_recoveries=0)
    # The kubelet's message for a missing image names the pod's own image, not its number.
    pull = failure_signature("STARTING", "ErrImagePull: Failed to pull image r:5000/x@sha256:1")
    verdicts = [
        count_startup_failure(sup, what=f"pod {i}", failure=pull, detail="d", policy=policy)
        for i in range(3)
    ]
    assert [v.recovery for v in verdicts] == [Recovery.ADOPTED, Recovery.ADOPTED, Recovery.STOPPED]
    assert verdicts[-1].terminal_state is JobState.FAILED_STARTUP
    # Counted as startup failures, never as recoveries npa spent (SkyPilot did the retrying).
    assert sup.startup_failures == 3 and sup.infrastructure_recoveries == 0
    assert all(a.startup for a in sup.attempts)
    # A different failure in between restarts the run of identical ones.
    other = SupervisorRecord()
    for failure in (pull, "STARTING: other", pull, pull):
        last = count_startup_failure(other, what="p", failure=failure, detail="", policy=policy)
    assert last.terminal_state is None


def test_infrastructure_recoveries_are_finite_and_payload_uses_only_retries() -> None:
    sup = SupervisorRecord()
    policy = Policy(startup_failure_threshold=99, max_infrastructure_recoveries=1)
    infra = Classification.TRANSIENT_INFRASTRUCTURE
    first = record(sup, what="w", failure="a", classification=infra, detail="", policy=policy)
    second = record(sup, what="w", failure="b", classification=infra, detail="", policy=policy)
    assert first.recovery is Recovery.RETRIED
    assert second.terminal_state is JobState.INFRASTRUCTURE_RECOVERY_EXHAUSTED
    payload = record(
        sup,
        what="w",
        failure="c",
        classification=Classification.PAYLOAD,
        detail="",
        policy=policy,
        payload_budget=0,
    )
    assert payload.terminal_state is JobState.FAILED and sup.infrastructure_recoveries == 1
    unknown = record(
        sup, what="w", failure="d", classification=Classification.UNKNOWN, detail="", policy=policy
    )
    assert unknown.recovery is Recovery.BLOCKED


def test_accelerator_names_follow_node_labels() -> None:
    names = cluster_names(
        [{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, {"skypilot.co/accelerator": "l4"}]
    )
    assert resolve("H100", names).resolved == "NVIDIA-H100-80GB-HBM3"
    assert resolve("L4", names).resolved == "l4"
    assert resolve("A100", names).resolved is None


def test_skypilot_statuses_map_one_to_one() -> None:
    from sky.jobs import ManagedJobStatus

    for status in ManagedJobStatus:
        state = job_state(status)
        assert state.terminal == status.is_terminal(), status


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("short line", 100),
        ("line one\nline two\n\n  indented", 100),
        ("word " * 400, 500),
        ("x" * 5000, 200),
        ("job 7 " + "task:\n  run: echo hi\n" * 20000, 2000),
    ],
)
def test_a_supervisor_line_is_one_bounded_line_that_says_what_it_left_out(
    text: str, limit: int
) -> None:
    from npa.launch.watch import brief

    out = brief(text, limit)
    assert "\n" not in out
    folded = " ".join(text.split())
    if len(folded) <= limit:
        assert out == folded
    else:
        kept, tail = out.split(" ... (")
        assert folded.startswith(kept) and len(kept) <= limit
        assert tail == f"{len(folded) - len(kept)} more characters)"
