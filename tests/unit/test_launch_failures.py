"""Reading a jobs controller's log for the launches it failed: what SkyPilot 0.14.1 writes
(sky/jobs/recovery_strategy.py and controller.py), whatever the error says and whatever
surrounds it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from npa.backends.skypilot.backend import in_backoff, launch_failures_in

# Copied from a real controller log on the test cluster (job 3, a GPU stage, no internet).
REAL = [
    "Starting job 3",
    "\x1b[2m├── \x1b[0mSkyPilot API server and dashboard: http://127.0.0.1:46580",
    "API server started.",
    "Failed to launch a cluster with error: sky.exceptions.CloudError: requests error "
    "(ConnectionError): HTTPSConnectionPool(host='raw.githubusercontent.com', port=443): Max "
    "retries exceeded with url: /catalogs/v8/common/accelerators.csv (Caused by "
    "NameResolutionError(\"Failed to resolve 'raw.githubusercontent.com'\")))",
    "  Traceback: Traceback (most recent call last):",
    '  File "/root/skypilot-runtime/lib/python3.10/site-packages/sky/jobs/recovery_strategy.py"',
    "sky.exceptions.CloudError: requests error (ConnectionError): ...",
    "",
    "Retrying to launch the cluster in 263.6 seconds.",
]


def test_the_real_controller_log_has_one_failed_launch_without_the_stray_parenthesis() -> None:
    [failure] = launch_failures_in(REAL)
    assert failure.attempt == 1 and failure.task is None
    assert failure.error.startswith("sky.exceptions.CloudError: requests error (ConnectionError)")
    assert failure.error.endswith("(\"Failed to resolve 'raw.githubusercontent.com'\"))")


def test_failures_are_attributed_to_the_task_the_controller_started_last() -> None:
    log = [
        "Starting task 0 (npa-r-generate-w0) for job 7",
        "Managed job cluster launched.",
        "\x1b[1mStarting task 1 (npa-r-square-w0) for job 7\x1b[0m",
        "Failed to launch a cluster with error: ResourcesUnavailableError: no room)",
        "Retrying to launch the cluster in 61.2 seconds.",
        "Failed to launch a cluster with error: ResourcesUnavailableError: no room)",
    ]
    found = launch_failures_in(log)
    assert [(f.attempt, f.task, f.error) for f in found] == [
        (1, "npa-r-square-w0", "ResourcesUnavailableError: no room"),
        (2, "npa-r-square-w0", "ResourcesUnavailableError: no room"),
    ]


_TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=80)


@given(errors=st.lists(_TEXT.filter(lambda e: e.strip()), max_size=6), noise=st.lists(_TEXT))
def test_every_failed_launch_is_found_once_in_order_and_noise_never_is(
    errors: list[str], noise: list[str]
) -> None:
    noise = [n for n in noise if "Failed to launch a cluster with error:" not in n]
    noise = [n for n in noise if "Starting task" not in n]
    lines: list[str] = []
    for i, error in enumerate(errors):
        lines += noise[i : i + 2]
        lines.append(f"Failed to launch a cluster with error: {error})")
    lines += noise
    found = launch_failures_in(lines)
    assert [f.attempt for f in found] == list(range(1, len(errors) + 1))
    for failure, error in zip(found, errors, strict=True):
        # SkyPilot's stray parenthesis goes, unless the error itself leaves one open.
        assert failure.error in (error.strip(), error.lstrip() + ")")
        if error.count("(") <= error.count(")"):
            assert failure.error == error.strip()


def test_backoff_is_read_from_the_schedule_state_or_the_details() -> None:
    assert in_backoff("ALIVE_BACKOFF", None)
    assert in_backoff("LAUNCHING", "Job is in backoff")  # what the real queue answered
    assert in_backoff(None, "In backoff, waiting for resources - no room")
    assert not in_backoff("LAUNCHING", None)
    assert not in_backoff("ALIVE_WAITING", "Waiting for other jobs to launch")
    assert not in_backoff(None, None)
