"""``status --watch`` events: per-stage transitions and a heartbeat, from successive answers."""

from __future__ import annotations

from npa.services.status import StageView, StatusResult
from npa.services.watching import Follower


def _result(
    state: str, stages: dict[str, tuple[str, str]], at: str, job: str | None
) -> StatusResult:
    return StatusResult(
        project="p", run_id="r1", workflow="w", state=state, trustworthy=True,
        last_known_state=state, reason=f"backend says {state}", backend="local", job_id=7,
        job_name="npa-r1", job_state=job, run_prefix=None, sources=[], checked_at=at,
        stages={n: StageView(state=s, waves=w) for n, (s, w) in stages.items()},
    )  # fmt: skip


def test_transitions_per_stage_then_heartbeats_then_the_final_change() -> None:
    now = [0.0]
    follower = Follower(heartbeat=30, clock=lambda: now[0])
    first = follower.see(_result("RUNNING", {"a": ("RUNNING", "0/2 waves succeeded"),
                                             "b": ("PENDING", "0/1 waves succeeded")},
                                 "t0", "RUNNING"))  # fmt: skip
    assert [(e.event, e.stage, e.before, e.after) for e in first] == [
        ("state", None, None, "RUNNING"),
        ("job", None, None, "RUNNING"),
        ("stage", "a", None, "RUNNING"),
        ("stage", "b", None, "PENDING"),
    ]
    now[0] = 10
    quiet = {"a": ("RUNNING", "0/2 waves succeeded"), "b": ("PENDING", "0/1 waves succeeded")}
    same = _result("RUNNING", quiet, "t1", "RUNNING")
    assert follower.see(same) == []  # quiet, and not yet time for a heartbeat
    now[0] = 31
    [beat] = follower.see(same)
    assert beat.event == "heartbeat" and beat.seconds_in_state == 31
    # The watch found the run RUNNING: it has been so for at least the watch's time.
    assert beat.text() == "t1 run still RUNNING (at least 31s in this state)"
    now[0] = 40
    wave = follower.see(_result("RUNNING", {"a": ("RUNNING", "1/2 waves succeeded"),
                                            "b": ("PENDING", "0/1 waves succeeded")},
                                "t2", "RUNNING"))  # fmt: skip
    assert [(e.stage, e.detail) for e in wave] == [("a", "1/2 waves succeeded")]
    assert wave[0].text() == "t2 stage a: RUNNING (1/2 waves succeeded)"  # never "X -> X"
    done = follower.see(_result("SUCCEEDED", {"a": ("SUCCEEDED", "2/2 waves succeeded"),
                                              "b": ("SUCCEEDED", "1/1 waves succeeded")},
                                "t3", "SUCCEEDED"))  # fmt: skip
    assert [(e.event, e.stage, e.before, e.after) for e in done] == [
        ("state", None, "RUNNING", "SUCCEEDED"),
        ("job", None, "RUNNING", "SUCCEEDED"),
        ("stage", "a", "RUNNING", "SUCCEEDED"),
        ("stage", "b", "PENDING", "SUCCEEDED"),
    ]
    assert done[2].text() == "t3 stage a: RUNNING -> SUCCEEDED (2/2 waves succeeded)"
    assert all("\\n" not in e.model_dump_json() for e in done)


def test_why_a_run_waits_is_said_each_time_it_changes_and_only_then() -> None:
    from npa.adapters.kube.pods import PodReason

    follower = Follower(heartbeat=30, clock=lambda: 0.0)

    def pending(at: str, *reasons: tuple[str, str]) -> StatusResult:
        result = _result("PENDING", {}, at, "PENDING")
        result.pending = [
            PodReason(namespace="ns", pod="p-0", phase="Pending", reason=r, message=m)
            for r, m in reasons
        ]
        return result

    first = follower.see(pending("t0", ("ErrImagePull", "manifest unknown")))
    assert [e.event for e in first] == ["state", "job", "waiting"]
    assert first[-1].text() == "t0 run PENDING, waiting: pod p-0: ErrImagePull: manifest unknown"
    assert follower.see(pending("t1", ("ErrImagePull", "manifest unknown"))) == []
    [backoff] = follower.see(pending("t2", ("ImagePullBackOff", "Back-off pulling image")))
    assert (backoff.event, backoff.detail) == (
        "waiting",
        "pod p-0: ImagePullBackOff: Back-off pulling image",
    )


def test_the_heartbeat_counts_from_the_state_change_not_from_the_last_line() -> None:
    # A stage's wave or a waiting reason printed after the run turned RUNNING reset the count:
    # "still RUNNING (30s in this state)" of a run RUNNING for 100 s. A printed line does put
    # the next heartbeat off (the watch was not silent), but the time is the state's.
    now = [0.0]
    follower = Follower(heartbeat=30, clock=lambda: now[0])
    quiet = {"a": ("PENDING", "0/2 waves succeeded")}
    follower.see(_result("PENDING", quiet, "t0", "PENDING"))
    now[0] = 5
    running = {"a": ("RUNNING", "0/2 waves succeeded")}
    [state, _, _] = follower.see(_result("RUNNING", running, "t5", "RUNNING"))
    assert (state.event, state.before, state.after) == ("state", "PENDING", "RUNNING")
    for t in (20, 35, 50, 65):  # a wave every 15 s: never silent for 30 s, so no heartbeat
        now[0] = t
        waves = {"a": ("RUNNING", f"{(t - 5) // 15}/9 waves succeeded")}
        assert [e.event for e in follower.see(_result("RUNNING", waves, f"t{t}", "RUNNING"))] == [
            "stage"
        ]
    now[0] = 80
    assert follower.see(_result("RUNNING", waves, "t80", "RUNNING")) == []  # 15 s of silence
    now[0] = 95
    [beat] = follower.see(_result("RUNNING", waves, "t95", "RUNNING"))
    assert beat.seconds_in_state == 90 and not beat.at_least  # since t5, not since t65
    assert beat.text() == "t95 run still RUNNING (90s in this state)"
    now[0] = 125
    [beat] = follower.see(_result("RUNNING", waves, "t125", "RUNNING"))
    assert beat.seconds_in_state == 120  # a heartbeat is no state change either
    now[0] = 130
    [done, _, _] = follower.see(_result("SUCCEEDED", {"a": ("SUCCEEDED", "9/9")}, "t130", "OK"))
    assert done.event == "state"
    now[0] = 160
    [beat] = follower.see(_result("SUCCEEDED", {"a": ("SUCCEEDED", "9/9")}, "t160", "OK"))
    assert (beat.after, beat.seconds_in_state) == ("SUCCEEDED", 30)


def test_a_relaunch_is_a_new_job_even_in_the_state_the_old_one_ended_in() -> None:
    """The watch names each job: a relaunch's job that is first seen FAILED (it failed between
    two polls) after the old job's FAILED is a line of its own, not silence."""
    follower = Follower(heartbeat=300, clock=lambda: 0.0)

    def seen(at: str, job_id: int | None, job: str | None) -> list[tuple[object, ...]]:
        result = _result("RUNNING", {}, at, job)
        result.job_id = job_id
        return [(e.job_id, e.before, e.after, e.detail) for e in follower.see(result)
                if e.event == "job"]  # fmt: skip

    assert seen("t0", 7, "RUNNING") == [(7, None, "RUNNING", "")]
    assert seen("t1", 7, "FAILED") == [(7, "RUNNING", "FAILED", "")]
    assert seen("t2", 7, "FAILED") == []
    assert seen("t3", None, None) == []  # between jobs: the relaunch has no job yet
    assert seen("t4", 8, "FAILED") == [(8, None, "FAILED", "")]
    assert seen("t5", 9, "PENDING") == [(9, None, "PENDING", "replaces job 8, last seen FAILED")]
    result = _result("RUNNING", {}, "t6", "RUNNING")
    result.job_id = 9
    [line] = [e.text() for e in follower.see(result) if e.event == "job"]
    assert line == "t6 job 9: PENDING -> RUNNING"
