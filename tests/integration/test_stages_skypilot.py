"""Per-stage states and logs on the SkyPilot path: a run is one managed job whose pipeline has
one task per launched stage. The real CLI, moto's S3, the kube fixture, the detached supervisor,
and the managed-jobs double (SkyPilot's own ManagedJobRecord per task, SkyPilot's own task
naming rule, and its log stream's per-task selection) at the SDK boundary."""

from __future__ import annotations

import base64
import inspect
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from npa.core.layout import wave_task_name
from tests.fakes.managed_jobs import (
    STATE_ENV,
    FakeManagedJobs,
    job_tasks,
    locked_state,
    read_state,
    set_tasks,
    write_state,
)
from tests.harness.kube import KubeCluster
from tests.harness.s3 import S3Server
from tests.integration import supervisors
from tests.integration.skypilot_world import make_world, manifest, run_npa, wait_for

pytestmark = [pytest.mark.integration]

BUCKET = "npa-stages"
WF = ("workbench", "workflow")


@pytest.fixture
def world(
    s3: S3Server, kube: KubeCluster, npa_home: Path, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    fast = {"NPA_SKYPILOT_POLL_SECONDS": "0.1"}
    yield make_world(s3, kube, npa_home, tmp_path, bucket=BUCKET, env=fast)
    supervisors.stop_all(npa_home)


def submit(w: dict[str, Any], *extra: str) -> Any:
    r = run_npa(*WF, "submit", str(w["spec"]), "--project", "team", "--run-id", w["run_id"],
                "--infra", f"k8s/{w['context']}", "--no-preflight-images", *extra, "--json",
                env=w["env"])  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    return r.json()


def status(w: dict[str, Any], *extra: str) -> Any:
    return run_npa(*WF, "status", w["run_id"], "--project", "team", "--json", *extra,
                   env=w["env"])  # fmt: skip


def logs(w: dict[str, Any], stage: str) -> Any:
    return run_npa(*WF, "logs", w["run_id"], "--project", "team", "--stage", stage, "--json",
                   env=w["env"])  # fmt: skip


def states(body: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(stage, state, source) in the order status lists them."""
    return [(name, v["state"], v["source"]) for name, v in body["stages"].items()]


def task(w: dict[str, Any], stage: str) -> str:
    """The name npa renders for the task of a stage's (only) wave."""
    return wave_task_name(w["run_id"], stage, 0)


def tail_calls(w: dict[str, Any]) -> list[dict[str, Any]]:
    return list(read_state(w["state"]).get("tail_calls", []))


def put(w: dict[str, Any], key: str, body: bytes) -> None:
    prefix = w["key"].removesuffix("/manifest.json")
    w["s3"].client().put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=body)


def stage_state(stage: str, state: str) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m["stages"].get(stage, {}).get("state") == state


def test_status_reports_each_stage_from_its_own_task(world: dict[str, Any]) -> None:
    out = submit(world)
    job = out["job_id"]
    set_tasks(world["state"], job, **{task(world, "generate"): "SUCCEEDED",
                                      task(world, "square"): "RUNNING"})  # fmt: skip
    r = status(world)
    assert r.code == 0, r.stdout + r.stderr
    body = r.json()
    assert body["state"] == "RUNNING" and body["job_state"] == "RUNNING"  # the job's own state
    assert states(body) == [
        ("generate", "SUCCEEDED", "backend"),
        ("square", "RUNNING", "backend"),
        ("total", "PENDING", "backend"),
    ]
    square = body["stages"]["square"]
    assert square["task"] == f"skypilot job {job} task 1 {task(world, 'square')}"
    text = run_npa(*WF, "status", world["run_id"], "--project", "team", env=world["env"]).stdout
    # The wave counts depend on whether the run's watcher has recorded the waves yet.
    waves = r"(no waves recorded|0/1 waves succeeded)"
    line = rf"stage square: RUNNING \({waves}; skypilot job {job} task 1 "
    assert re.search(line, text), text

    # The supervisor mirrors each stage into the manifest, so --cached has them too.
    wait_for(world, lambda m: stage_state("square", "RUNNING")(m)
             and stage_state("generate", "SUCCEEDED")(m))  # fmt: skip
    cached = status(world, "--cached").json()
    assert cached["state"] == "CACHED"
    assert [(n, s) for n, s, _ in states(cached)][:2] == [
        ("generate", "SUCCEEDED"), ("square", "RUNNING")
    ]  # fmt: skip

    # The queue cannot answer: a stage recorded as live is unknown, not its stale record.
    state = read_state(world["state"])
    state["queue_error"] = "ClusterNotUpError"
    write_state(world["state"], state)
    r = status(world)
    assert r.code == 4, r.stdout
    body = r.json()
    assert body["state"] == "VERIFICATION_UNAVAILABLE"
    views = body["stages"]
    assert views["generate"]["state"] == "SUCCEEDED"  # a final record never changes
    assert views["square"]["state"] == "VERIFICATION_UNAVAILABLE"
    assert views["square"]["recorded_state"] == "RUNNING"
    assert views["total"]["state"] == "VERIFICATION_UNAVAILABLE"


def test_logs_of_a_stage_read_only_that_stages_task(world: dict[str, Any]) -> None:
    out = submit(world)
    job = out["job_id"]
    set_tasks(world["state"], job, **{task(world, "generate"): "SUCCEEDED",
                                      task(world, "square"): "RUNNING"})  # fmt: skip
    r = logs(world, "square")
    assert r.code == 0, r.stdout + r.stderr
    body = r.json()
    assert body["answered_by"] == "backend-live"
    live = body["sources"][0]
    assert live["scope"] == "stage" and live["outcome"] == "read"
    assert body["lines"] == [
        f"=== Task {task(world, 'square')}(1) ===",
        f"log of job {job} task 1 {task(world, 'square')}",
    ]
    assert tail_calls(world) == [{"job_id": job, "task": task(world, "square"), "follow": False}]

    # A stage whose task has not started has no log yet; SkyPilot is not asked to wait for it.
    r = logs(world, "total")
    assert r.code == 0, r.stdout
    body = r.json()
    assert body["sources"][0]["outcome"] == "absent" and "PENDING" in body["sources"][0]["error"]
    assert body["empty_means"].startswith("none written yet")
    # A finished task of a live job: SkyPilot serves it only once the job ends, so the live
    # source is unavailable (never "empty") and the store is asked instead.
    put(world, "stages/generate/logs/wave-0-shard-0.log", b"generated 100 numbers\n")
    r = logs(world, "generate")
    assert r.code == 0, r.stdout
    body = r.json()
    assert body["sources"][0]["outcome"] == "unavailable" and body["answered_by"] == "store"
    assert body["lines"] == ["[generate/wave-0-shard-0.log] generated 100 numbers"]
    assert len(tail_calls(world)) == 1  # neither tail was sent to SkyPilot

    # Once the job has ended, every stage's log is served, each on its own.
    set_tasks(world["state"], job, **{task(world, "square"): "SUCCEEDED",
                                      task(world, "total"): "SUCCEEDED"})  # fmt: skip
    body = logs(world, "generate").json()
    assert body["answered_by"] == "backend-live" and body["sources"][0]["scope"] == "stage"
    assert body["lines"][-1] == f"log of job {job} task 0 {task(world, 'generate')}"
    assert not any("square" in line or "total" in line for line in body["lines"])
    assert tail_calls(world)[-1]["task"] == task(world, "generate")


def test_a_resumed_run_maps_each_task_to_its_own_stage(world: dict[str, Any]) -> None:
    first = submit(world)
    # generate succeeds with its output in the store, square fails, total never runs.
    put(world, "stages/generate/outputs/numbers/numbers.txt", b"1\n2\n3\n")
    put(world, "stages/generate/logs/wave-0-shard-0.log", b"generated\n")
    set_tasks(world["state"], first["job_id"], **{task(world, "generate"): "SUCCEEDED",
              task(world, "square"): "FAILED", task(world, "total"): "CANCELLED"})  # fmt: skip
    m = wait_for(world, lambda m: m["state"] == "FAILED")
    assert m["stages"]["generate"]["state"] == "SUCCEEDED"
    assert [w["state"] for w in m["stages"]["generate"]["waves"]] == ["SUCCEEDED"]
    assert m["stages"]["square"]["state"] == "FAILED"
    # Each wave's launch is the time SkyPilot's controller took its task up (the task's
    # submitted_at), never later than the wave's start.
    [generated] = m["stages"]["generate"]["waves"]
    [job] = [j for j in read_state(world["state"])["jobs"] if j["job_id"] == first["job_id"]]
    submitted = datetime.fromtimestamp(job["submitted_at"], UTC)
    assert datetime.fromisoformat(generated["launched_at"]) == submitted.replace(
        microsecond=submitted.microsecond // 1000 * 1000
    ), generated
    assert generated["launched_at"] <= generated["started_at"], generated

    resumed = submit(world, "--resume-run", world["run_id"])
    assert resumed["outcome"] == "launched" and resumed["resume"]["adopted_stages"] == ["generate"]
    second = resumed["job_id"]
    jobs = {j["job_id"]: j for j in read_state(world["state"])["jobs"]}
    # Task 0 of the new job is square: a plan index would name generate.
    assert [t["name"] for t in jobs[second]["tasks"]] == [task(world, "square"),
                                                          task(world, "total")]  # fmt: skip
    set_tasks(world["state"], second, **{task(world, "square"): "RUNNING"})
    body = status(world).json()
    assert body["job_id"] == second and body["state"] == "RUNNING"
    assert states(body) == [
        ("generate", "SUCCEEDED", "adopted"),
        ("square", "RUNNING", "backend"),
        ("total", "PENDING", "backend"),
    ]
    assert body["stages"]["square"]["task"].endswith(f"task 0 {task(world, 'square')}")
    r = logs(world, "square").json()
    assert r["lines"][-1] == f"log of job {second} task 0 {task(world, 'square')}"
    assert tail_calls(world)[-1] == {"job_id": second, "task": task(world, "square"),
                                     "follow": False}  # fmt: skip
    # The adopted stage did not run in this job: its log is the store's.
    r = logs(world, "generate").json()
    assert r["sources"][0]["outcome"] == "absent" and "adopted" in r["sources"][0]["error"]
    assert r["answered_by"] == "store" and r["lines"] == ["[generate/wave-0-shard-0.log] generated"]

    # Resume again with only total left: SkyPilot names a one-task job's task after the job.
    put(world, "stages/square/outputs/squares/squares.txt", b"1\n4\n9\n")
    set_tasks(world["state"], second, **{task(world, "square"): "SUCCEEDED",
                                         task(world, "total"): "FAILED"})  # fmt: skip
    wait_for(world, lambda m: m["state"] == "FAILED" and m["job_id"] == second)
    again = submit(world, "--resume-run", world["run_id"])
    assert again["resume"]["adopted_stages"] == ["generate", "square"]
    third, name = again["job_id"], again["job_name"]
    # The adopted stage's wave keeps the launch its own job had.
    m = manifest(world)
    assert m["stages"]["generate"]["waves"][0]["launched_at"] == generated["launched_at"]
    jobs = {j["job_id"]: j for j in read_state(world["state"])["jobs"]}
    assert [t["name"] for t in jobs[third]["tasks"]] == [name]
    set_tasks(world["state"], third, **{name: "RUNNING"})
    body = status(world).json()
    assert states(body) == [
        ("generate", "SUCCEEDED", "adopted"),
        ("square", "SUCCEEDED", "adopted"),
        ("total", "RUNNING", "backend"),
    ]
    r = logs(world, "total").json()
    assert r["lines"][-1] == f"log of job {third} task 0 {name}"
    assert tail_calls(world)[-1]["task"] == name


def test_skypilot_not_found_answers_in_the_log_stream_are_not_log_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SkyPilot streams "not found" as text (its exit code never reaches a streamed tail): the
    double says it with SkyPilot's words, and the backend reads it as absence."""
    import sky.jobs.utils

    from npa.backends.skypilot.backend import SkyPilotBackend
    from npa.core.errors import NotFound
    from npa.core.paths import NpaPaths

    source = inspect.getsource(sky.jobs.utils.stream_logs_by_id)
    assert "f'Job {job_id} not found.'" in source
    assert "f'No task found matching {task!r} in job {job_id}. '" in source
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "jobs.json"))
    fake = FakeManagedJobs(kubeconfig=None)
    state = read_state(fake.path)
    state["jobs"] = [{"job_id": 4, "job_name": "npa-x", "status": "SUCCEEDED",
                      "tasks": [{"name": "a", "logs": ["a says hi"]}, {"name": "b"}],
                      "submitted_at": 1.0}]  # fmt: skip
    write_state(fake.path, state)
    assert list(fake.tail_logs(4, False, 0)) == ["=== Task a(0) ===", "a says hi"]
    (message,) = fake.tail_logs(4, False, "c")
    assert message == "No task found matching 'c' in job 4. Valid task IDs are 0-1."
    backend = SkyPilotBackend(NpaPaths(tmp_path), context=None, service=fake)
    with pytest.raises(NotFound, match="No task found matching 'c' in job 4"):
        backend._refuse_not_found(4, message)
    with pytest.raises(NotFound, match="Job 9 not found"):
        list(backend.logs(9))
    assert "a says hi" in list(backend.logs(4))  # a real line is never taken for absence


# Credentials as SkyPilot's logs and records can carry them (a pod's echo, a launch error that
# quotes a URL or a header): held-out forms, none a value this machine holds, and one that is.
KEY_ID = "AKIAQ7CANARYZ4K9W2XB"
AWS_SECRET = "q7Canary9wJalrXUtnFEMIK7MDENGbPxRfiCYzZ4k"
BEARER = "c4n4ryB34r3rT0k3n-9f2e1d"
TOKEN = "tok-canary-7e1b9c3a5d"
PASSWORD = "pw-canary-2b8f6e4d"
DOCKER_AUTH = base64.b64encode(b"robot:dock-canary-8c1e5a").decode()
HELD = "held-canary-5e9a1c7b3f"  # a value the reading shell holds
SKY_CANARIES = (KEY_ID, AWS_SECRET, BEARER, TOKEN, PASSWORD, DOCKER_AUTH, "dock-canary-8c1e5a",
                HELD)  # fmt: skip
SKY_SAYS = [
    f"aws configure set aws_access_key_id {KEY_ID}",
    f"found credentials: {AWS_SECRET}",
    f"curl -H 'Authorization: Bearer {BEARER}' https://api.example.com",
    f"export HF_TOKEN={TOKEN}",
    f"DB_PASSWORD={PASSWORD} psql -h db",
    f'{{"auths": {{"registry.example.com": {{"auth": "{DOCKER_AUTH}"}}}}}}',
    f"registry login with {HELD}",
    "pulled ghcr.io/o/i@sha256:" + "0123456789abcdef" * 4,
]


def test_what_skypilot_says_is_redacted_before_npa_shows_or_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's task logs, its failure reasons and details, and the jobs controller's log, with
    credentials in them as the double serves them: every text the backend hands on has them
    taken out by the one redaction rule, and ordinary text (an image digest) kept."""
    from npa.backends.skypilot.backend import SkyPilotBackend
    from npa.core.paths import NpaPaths

    monkeypatch.setenv(STATE_ENV, str(tmp_path / "jobs.json"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SUBMITTER_REGISTRY_SECRET", HELD)
    fake = FakeManagedJobs(kubeconfig=None)
    state = read_state(fake.path)
    reason = "; ".join(SKY_SAYS)
    state["jobs"] = [{"job_id": 5, "job_name": "npa-x", "status": "FAILED",
                      "tasks": [{"name": "a", "logs": SKY_SAYS, "status": "FAILED",
                                 "failure_reason": reason}],
                      "submitted_at": 1.0, "launch_failures": SKY_SAYS}]  # fmt: skip
    write_state(fake.path, state)
    assert any(KEY_ID in line for line in fake.tail_logs(5, False, 0))  # the double says them

    backend = SkyPilotBackend(NpaPaths(tmp_path / ".npa"), context=None, service=fake)
    lines = list(backend.logs(5))
    record = backend.job(5)
    failures = backend.launch_failures(record)
    said = [*lines, record.failure_reason or "", *(t.failure_reason or "" for t in record.tasks),
            *(f.error for f in failures)]  # fmt: skip
    assert len(failures) == len(SKY_SAYS) and record.failure_reason
    for text in said:
        for canary in SKY_CANARIES:
            assert canary not in text, (canary, text)
    shown = "\n".join(lines)
    assert "[REDACTED:env:SUBMITTER_REGISTRY_SECRET]" in shown, shown
    assert "export HF_TOKEN=[REDACTED:" in shown and "DB_PASSWORD=[REDACTED:" in shown, shown
    assert "sha256:" + "0123456789abcdef" * 4 in shown  # ordinary text kept


def test_no_command_shows_or_keeps_a_credential_skypilot_said(
    world: dict[str, Any], tmp_path: Path
) -> None:
    """The whole read-back of a SkyPilot run whose failed task logged credentials and whose
    failure reason quotes them: ``logs``, ``status``, what the watcher keeps in the run's
    prefix, and an insights database ingested from it hold none of them."""
    out = submit(world)
    job = out["job_id"]
    with locked_state(world["state"]) as state:
        record = next(j for j in state["jobs"] if j["job_id"] == job)
        tasks = job_tasks(record)
        tasks[0] |= {"status": "FAILED", "logs": SKY_SAYS, "failure_reason": "; ".join(SKY_SAYS)}
        for later in tasks[1:]:  # as SkyPilot ends a pipeline whose task failed
            later["status"] = "CANCELLED"
        record["tasks"] = tasks
    wait_for(world, stage_state("generate", "FAILED"))
    shown = [logs(world, "generate"), status(world)]
    assert "[REDACTED:" in shown[0].stdout and "[REDACTED:" in shown[1].stdout, shown
    db = tmp_path / "insights.db"
    prefix = world["key"].removesuffix("/manifest.json")
    ingest = run_npa("workbench", "insights", "ingest-run", "--input-path",
                     f"s3://{BUCKET}/{prefix}", "--output-path", str(db), "--json",
                     env=world["env"])  # fmt: skip
    assert ingest.code == 0, ingest.stdout + ingest.stderr
    client = world["s3"].client()
    kept = [client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read().decode(errors="replace")
            for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]]  # fmt: skip
    assert any("[REDACTED:" in text for text in kept)  # the failure reason was kept, redacted
    texts = [r.stdout + r.stderr for r in (*shown, ingest)] + kept + [db.read_bytes().decode(
        errors="replace")]  # fmt: skip
    for text in texts:
        for canary in SKY_CANARIES[:-1]:  # the held value is not in this shell
            assert canary not in text, canary


def test_a_relaunch_after_a_rerun_submit_runs_only_what_the_resume_left(
    world: dict[str, Any],
) -> None:
    """A submit that adopts a live resumed job hands its supervisor the resume's adopted stages,
    so a relaunch of that job runs the same stages, not the whole run again."""
    first = submit(world)
    put(world, "stages/generate/outputs/numbers/numbers.txt", b"1\n2\n3\n")
    set_tasks(world["state"], first["job_id"], **{task(world, "generate"): "SUCCEEDED",
              task(world, "square"): "FAILED", task(world, "total"): "CANCELLED"})  # fmt: skip
    wait_for(world, lambda m: m["state"] == "FAILED")
    resumed = submit(world, "--resume-run", world["run_id"])
    second = resumed["job_id"]
    # The supervisor dies; a rerun of the plain submit adopts the live job and starts another.
    supervisors.stop_all(world["home"])
    again = submit(world)
    assert again["outcome"] == "adopted" and again["job_id"] == second
    state = read_state(world["state"])
    next(j for j in state["jobs"] if j["job_id"] == second)["status"] = "FAILED_CONTROLLER"
    write_state(world["state"], state)
    m = wait_for(world, lambda m: m["job_id"] not in (None, second) and m["state"] == "PENDING")
    jobs = {j["job_id"]: j for j in read_state(world["state"])["jobs"]}
    assert [t["name"] for t in jobs[m["job_id"]]["tasks"]] == [task(world, "square"),
                                                               task(world, "total")]  # fmt: skip
