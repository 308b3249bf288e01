"""A stage's declared secrets on the SkyPilot path, without the cluster: the run's Secret
written by ``submit`` from the submitting shell into the kube fixture's real API server, kept
through a relaunch, deleted at the run's end and by ``cancel``; and the pod's run script giving
each value to the command under its declared name alone (the library run by /bin/sh). The
managed-jobs double stands in for SkyPilot, as in test_supervise_skypilot.py; the cluster test
(test_cluster_skypilot.py) runs the same in real pods."""

from __future__ import annotations

import base64
import contextlib
import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.adapters.kube.secrets import (
    GENERATION_ANNOTATION,
    STORE_KEY_PREFIX,
    delete_run_secret,
    run_secret_name,
    write_run_secret,
)
from npa.adapters.storage.stage_scope import SCOPED_VARIABLES
from npa.backends import contract
from npa.backends.base import RunTasks, StageTask
from npa.backends.skypilot import tasks as sky_tasks
from npa.core.templates import templates_dir
from npa.spec.model import BASE_NAMES, ENV_NAME
from tests.fakes.managed_jobs import locked_state, read_state
from tests.harness import moto_iam
from tests.harness.kube import KubeCluster
from tests.harness.s3 import S3Server
from tests.integration import supervisors
from tests.integration import test_stage_scope as stage_scope_test
from tests.integration.skypilot_world import make_world, run_npa, wait_for
from tests.integration.test_supervise_skypilot import set_status
from tests.tiers import examples
from tests.unit.specdata import one_stage_task

pytestmark = pytest.mark.integration

BUCKET = "npa-secrets"
CANARY = "canary-7f3a9c-do-not-store"
NAMESPACE = "npa-team"
FAST = {
    "NPA_READYZ_WINDOW_SECONDS": "0.2",
    "NPA_READYZ_INTERVAL_SECONDS": "0.1",
    "NPA_SKYPILOT_POLL_SECONDS": "0.1",
}


def with_secret(text: str) -> str:
    """The tiny example with stage square declaring TOKEN from the shell's NPA_TEST_CANARY."""
    stage = "  - name: square\n    tool: shell\n"
    assert stage in text
    return text.replace(stage, stage + "    secrets:\n      TOKEN: env:NPA_TEST_CANARY\n")


@pytest.fixture
def world(
    s3: S3Server, kube: KubeCluster, npa_home: Path, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    env = {**FAST, "NPA_TEST_CANARY": CANARY}
    w = make_world(
        s3, kube, npa_home, tmp_path, bucket=BUCKET, env=env, edit_spec=with_secret
    )  # fmt: skip
    w["secret"] = run_secret_name("tiny-local", w["run_id"])
    yield w
    supervisors.stop_all(npa_home)


def submit(w: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    return run_npa(
        *("workbench", "workflow", "submit", str(w["spec"]), "--project", "team"),
        *("--run-id", w["run_id"], "--infra", f"k8s/{w['context']}", "--no-preflight-images"),
        "--json",
        env=env or w["env"],
    )


def held(w: dict[str, Any]) -> dict[str, str] | None:
    """The run's Secret's data as the API server holds it, decoded; None when there is none."""
    from kubernetes.client.rest import ApiException

    try:
        secret = w["kube"].core().read_namespaced_secret(w["secret"], NAMESPACE)
    except ApiException as exc:
        assert exc.status == 404, exc
        return None
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def assert_no_canary_kept(w: dict[str, Any], also: tuple[str, ...] = ()) -> None:
    """Neither the canary nor any value of ``also`` is in any object of the run's store (its
    manifest, journal, task files) or any file under the npa home (receipts, journals, the
    supervisor's log, an insights database put there)."""
    kept = [v.encode() for v in (CANARY, *also)]
    client = w["s3"].client()
    listed = client.list_objects_v2(Bucket=w["bucket"]).get("Contents", [])
    assert listed
    for obj in listed:
        body = client.get_object(Bucket=w["bucket"], Key=obj["Key"])["Body"].read()
        assert not any(v in body for v in kept), obj["Key"]
    for path in Path(w["home"]).rglob("*"):
        if path.is_file():
            assert not any(v in path.read_bytes() for v in kept), path


@pytest.mark.parametrize("stage_role", [False, True], ids=["store-secret", "stage-role"])
def test_submit_writes_the_runs_secret_a_relaunch_keeps_it_and_the_end_deletes_it(
    world: dict[str, Any], request: pytest.FixtureRequest, stage_role: bool
) -> None:
    """With a stage role the Secret also holds the run's role session (launched_session)."""
    if stage_role:
        world = request.getfixturevalue("scoped_world")
    with locked_state(world["state"]) as state:
        state["outcomes"] = ["FAILED_CONTROLLER", "RUNNING"]
    r = submit(world)
    assert r.code == 0, r.stdout + r.stderr
    # The relaunch (job 2) runs with the Secret the submit wrote: the watcher has no shell.
    wait_for(world, lambda m: m.get("job_id") == 2 and m["state"] == "RUNNING")
    session = launched_session(world, 0) if stage_role else {}
    scoped = {f"{STORE_KEY_PREFIX}{name}": value for name, value in session.items()}
    assert held(world) == {"NPA_TEST_CANARY": CANARY, **scoped}
    set_status(world, 2, "SUCCEEDED")
    wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    assert supervisors.wait_gone(world["home"], "team", world["run_id"])
    assert held(world) is None
    log = next(Path(world["home"]).rglob("supervisor.log")).read_text()
    assert f"released secret/{world['secret']}" in log
    assert_no_canary_kept(world, tuple(session.values()))


def test_a_missing_source_is_refused_before_anything_is_written(world: dict[str, Any]) -> None:
    env = {k: v for k, v in world["env"].items() if k != "NPA_TEST_CANARY"}
    r = submit(world, env)
    assert r.code != 0
    out = r.stdout + r.stderr
    assert "NPA_TEST_CANARY" in out and "TOKEN" in out
    assert "read -rs NPA_TEST_CANARY && export NPA_TEST_CANARY" in out
    assert held(world) is None
    assert read_state(world["state"]).get("launch_calls", 0) == 0
    # With the variable set, the same submit goes through.
    again = submit(world)
    assert again.code == 0, again.stdout + again.stderr
    assert held(world) == {"NPA_TEST_CANARY": CANARY}


def test_a_submit_that_launches_nothing_takes_its_secret_back(world: dict[str, Any]) -> None:
    """The Secret is written before the launch transaction; when that stops before any request
    (here: the queue cannot tell whether the job exists), the run's records are put back and
    so is the Secret, as the run had never launched."""
    with locked_state(world["state"]) as state:
        state["queue_error"] = "ClusterNotUpError"
    r = submit(world)
    assert r.code == 4, r.stdout + r.stderr
    assert r.json()["error"]["kind"] == "ambiguous_existence"
    assert read_state(world["state"])["launch_calls"] == 0
    assert held(world) is None


def test_cancel_deletes_the_runs_secret_and_a_second_cancel_finds_none(
    world: dict[str, Any],
) -> None:
    with locked_state(world["state"]) as state:
        state["outcomes"] = ["RUNNING"]
    # No watcher: it would see the cancelled job and delete the Secret first.
    assert submit(world, {**world["env"], "NPA_SKYPILOT_SUPERVISOR": "off"}).code == 0
    assert held(world) == {"NPA_TEST_CANARY": CANARY}
    cancel = ("workbench", "workflow", "cancel", world["run_id"], "--project", "team", "--json")
    first = run_npa(*cancel, env={**world["env"], "NPA_CANCEL_SETTLE_SECONDS": "2"})
    assert first.code in (0, 1), first.stdout + first.stderr
    assert first.json()["released"] == [f"secret/{world['secret']}"]
    assert held(world) is None
    second = run_npa(*cancel, env={**world["env"], "NPA_CANCEL_SETTLE_SECONDS": "2"})
    assert second.code in (0, 1) and second.json()["released"] == []
    assert_no_canary_kept(world)


def test_the_run_secret_is_written_whole_and_deleted_once(kube: KubeCluster) -> None:
    from tests.integration.skypilot_world import ensure_namespace

    ensure_namespace(kube, "npa-secret-adapter")
    args = (kube.kubeconfig, kube.context, "npa-secret-adapter")
    name = run_secret_name("wf", "20260101-000000-abcdef")
    first = write_run_secret(*args, name, {"A": "1", "B": "2"}, run_id="r", workflow="wf",
                             generation=0)  # fmt: skip
    assert first == "created"
    # A resumed run's submit writes it again: it holds exactly the new values.
    again = write_run_secret(*args, name, {"B": "3"}, run_id="r", workflow="wf", generation=1)
    assert again == "updated"
    secret = kube.core().read_namespaced_secret(name, "npa-secret-adapter")
    assert {k: base64.b64decode(v).decode() for k, v in secret.data.items()} == {"B": "3"}
    assert secret.metadata.labels["app.kubernetes.io/managed-by"] == "npa"
    assert delete_run_secret(*args, name, 1) is True
    assert delete_run_secret(*args, name, 1) is False


# --- a release racing a resume ------------------------------------------------------------------
# A ``status`` that read the run final (launch 0) releases its Secret while a ``submit
# --resume-run`` (launch 1) writes it. Each order of their requests is planted by running the
# other side's real request against the API server at the planted point, no sleeps.

RACE_NS = "npa-secret-race"
RESUMED = {"TOKEN": "resumed-value"}


class Planted:
    """The real API client, with ``action`` run (once) just before its first ``method`` call:
    the other npa's request landing between this one's."""

    def __init__(self, api: Any, method: str, action: Any) -> None:
        self._api, self._method, self._action = api, method, action

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._api, name)
        if name != self._method or self._action is None:
            return real
        action, self._action = self._action, None

        def call(*args: Any, **kwargs: Any) -> Any:
            action()
            return real(*args, **kwargs)

        return call


def plant(monkeypatch: pytest.MonkeyPatch, method: str, action: Any) -> None:
    """The next npa request to the API server gets a :class:`Planted` client; the planted
    action's own requests get plain ones."""
    import npa.adapters.kube.secrets as secrets

    real = secrets.core_api
    calls = iter([lambda *a: Planted(real(*a), method, action)])
    monkeypatch.setattr(secrets, "core_api", lambda *a: next(calls, real)(*a))


def held_in(kube: KubeCluster, name: str) -> tuple[dict[str, str], str] | None:
    """The Secret's values and the launch it was written for; None when there is none."""
    from kubernetes.client.rest import ApiException

    try:
        secret = kube.core().read_namespaced_secret(name, RACE_NS)
    except ApiException as exc:
        assert exc.status == 404
        return None
    values = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
    return values, secret.metadata.annotations["npa.io/launch-generation"]


@pytest.mark.parametrize("order", ["resume_first", "resume_between", "release_between",
                                   "release_first"])  # fmt: skip
def test_a_release_decided_on_an_ended_launch_never_removes_a_resumes_secret(
    kube: KubeCluster, monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """Launch 0's Secret is there and the run is final; a release decided on launch 0 and the
    resume's write (launch 1) meet in each order their requests can take. Whatever the order,
    the resume's Secret is there at the end, holding its values."""
    from tests.integration.skypilot_world import ensure_namespace

    ensure_namespace(kube, RACE_NS)
    args = (kube.kubeconfig, kube.context, RACE_NS)
    name = run_secret_name("wf", f"20260101-000000-{order[:6].replace('_', '0')}")
    write_run_secret(*args, name, {"TOKEN": "ended"}, run_id="r", workflow="wf", generation=0)

    def resume() -> str:
        return write_run_secret(*args, name, RESUMED, run_id="r", workflow="wf", generation=1)

    def release() -> bool:
        return delete_run_secret(*args, name, 0)

    if order == "resume_first":  # the resume wrote before the release read the Secret
        assert resume() == "updated"
        assert release() is False
    elif order == "resume_between":  # ... after the release read it, before its delete
        plant(monkeypatch, "delete_namespaced_secret", resume)
        assert release() is False  # the delete was refused (409) and decided again: kept
    elif order == "release_between":  # the release deleted between the resume's two writes
        plant(monkeypatch, "replace_namespaced_secret", lambda: release() or pytest.fail("kept"))
        assert resume() == "created"  # its replace found none (404): created again
    else:  # the release deleted before the resume wrote
        assert release() is True
        assert resume() == "created"
    assert held_in(kube, name) == (RESUMED, "1")
    # The resumed launch's own end removes it.
    assert delete_run_secret(*args, name, 1) is True
    assert held_in(kube, name) is None


def test_a_status_that_saw_the_ended_launch_keeps_the_resumes_secret(
    world: dict[str, Any],
) -> None:
    """Through the real submit: launch 0 fails and its watcher releases its Secret; a status
    read the run final then (its manifest); a ``--resume-run`` writes the Secret for launch 1;
    the release that status decided on what it read removes nothing, and the resumed launch's
    own end removes it."""
    from npa.backends.base import release_ended_run
    from npa.backends.skypilot.backend import SkyPilotBackend
    from npa.core.paths import NpaPaths
    from npa.runs.manifest import RunManifest, launch_generation
    from tests.integration.skypilot_world import manifest

    with locked_state(world["state"]) as state:
        state["outcomes"] = ["RUNNING", "RUNNING"]
    first = submit_run(world, world["run_id"])
    wait_for(world, lambda m: m["state"] == "RUNNING")
    set_status(world, first, "FAILED")
    wait_for(world, lambda m: m["state"] == "FAILED")
    assert supervisors.wait_gone(world["home"], "team", world["run_id"])
    assert held(world) is None
    seen = RunManifest.model_validate(manifest(world))  # what the racing status read: final
    assert launch_generation(seen) == 0

    resumed = run_npa(
        *("workbench", "workflow", "submit", str(world["spec"]), "--project", "team"),
        *("--resume-run", world["run_id"], "--infra", f"k8s/{world['context']}"),
        "--no-preflight-images", "--json", env=world["env"],
    )  # fmt: skip
    assert resumed.code == 0, resumed.stdout + resumed.stderr
    secret = world["kube"].core().read_namespaced_secret(world["secret"], NAMESPACE)
    assert secret.metadata.annotations["npa.io/launch-generation"] == "1"

    backend = SkyPilotBackend(NpaPaths(world["home"]), context=world["context"])
    stale = release_ended_run(backend, "team", "tiny-local", world["run_id"],
                              launch_generation(seen))  # fmt: skip
    assert stale.released == [] and stale.error is None
    assert held(world) == {"NPA_TEST_CANARY": CANARY}

    second = wait_for(world, lambda m: m.get("job_id") not in (None, first))["job_id"]
    set_status(world, second, "SUCCEEDED")
    wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    assert supervisors.wait_gone(world["home"], "team", world["run_id"])
    assert held(world) is None


# --- the pod's run script -----------------------------------------------------------------------


def _run_command(task: StageTask, run: RunTasks, pod_env: dict[str, str], source: Path) -> str:
    """The run script's ``npa_command`` line, run by /bin/sh with the stage library (its
    working directory moved from /npa/source to ``source``, its phase notes to a file beside
    it) in a pod's environment; the command is ``env -0``."""
    library = (templates_dir() / sky_tasks.LIBRARY).read_text()
    library = library.replace("cd /npa/source", f"cd {shlex.quote(str(source))}")
    (line,) = [x for x in sky_tasks.run_script(task, run).splitlines() if "npa_command " in x]
    phases = source.parent / f"{source.name}.phases"
    done = subprocess.run(
        ["/bin/sh", "-c", f"{library}\n{line.removesuffix(' || exit')}"],
        env={"PATH": contract.HOST_PATH, "NPA_PHASES": str(phases), **pod_env},
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert not done.stderr, done.stderr.decode()
    assert "exit_code=0" in phases.read_text().splitlines()
    return done.stdout.decode()


spec_names = st.from_regex(ENV_NAME, fullmatch=True).filter(
    lambda n: not n.upper().startswith("NPA_") and n not in BASE_NAMES
)
values = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), min_size=1)


@settings(max_examples=examples(30), deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["AWS_SESSION_TOKEN", "_npa_cmd"]) | spec_names, values, max_size=4
    )
)
def test_the_command_sees_each_secret_under_its_name_and_no_store_credential(
    tmp_path_factory: pytest.TempPathFactory, secrets: dict[str, str]
) -> None:
    """Any spec name (also one of the store's variables, or one the library uses itself) and
    any value (quotes, ``$``, newlines) reach the command as given; the carriers and the
    store's credentials do not."""
    task, run = one_stage_task("env -0", secrets={name: f"env:SRC_{name}" for name in secrets})
    pod_env = {f"{sky_tasks.SECRET_PREFIX}{n}": v for n, v in secrets.items()}
    store = {"AWS_ACCESS_KEY_ID": "store-key-id", "AWS_SESSION_TOKEN": "store-token"}
    out = _run_command(task, run, {**store, **pod_env}, tmp_path_factory.mktemp("source"))
    seen = dict(entry.split("=", 1) for entry in out.split("\0") if entry)
    for name, value in secrets.items():
        assert seen.get(name) == value
    assert not any(k.startswith(sky_tasks.SECRET_PREFIX) for k in seen)
    for name in store.keys() - secrets.keys():
        assert name not in seen


def test_a_secret_the_pod_lacks_stops_the_command(tmp_path: Path) -> None:
    task, run = one_stage_task("env -0", secrets={"TOKEN": "env:SRC"})
    with pytest.raises(AssertionError, match="the pod was not given secret TOKEN"):
        _run_command(task, run, {}, tmp_path)


def test_the_task_files_submit_stored_name_the_secret_and_hold_no_value(
    world: dict[str, Any],
) -> None:
    assert submit(world).code == 0
    client = world["s3"].client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=world["bucket"])["Contents"]]
    (key,) = [k for k in keys if k.endswith("tasks/square.yaml")]
    text = client.get_object(Bucket=world["bucket"], Key=key)["Body"].read().decode()
    assert sky_tasks.declared_secrets(text) == {"TOKEN": "env:NPA_TEST_CANARY"}
    assert world["secret"] in text and CANARY not in text
    assert json.dumps(held(world)) == json.dumps({"NPA_TEST_CANARY": CANARY})


# --- a run that ended with no watcher left to release its Secret -------------------------------

OFF = {"NPA_SKYPILOT_SUPERVISOR": "off"}


def another_run(w: dict[str, Any]) -> str:
    """A second run of the same spec, reserved as the first."""
    r = run_npa(
        "workbench", "workflow", "prepare-run", str(w["spec"]), "--project", "team", env=w["env"]
    )
    assert r.code == 0, r.stderr
    return r.stdout.strip()


def submit_run(w: dict[str, Any], run_id: str, env: dict[str, str] | None = None) -> int:
    """Submit ``run_id``; its job id (from its manifest)."""
    r = run_npa(
        *("workbench", "workflow", "submit", str(w["spec"]), "--project", "team"),
        *("--run-id", run_id, "--infra", f"k8s/{w['context']}", "--no-preflight-images"),
        "--json",
        env={**w["env"], **(env or {})},
    )
    assert r.code == 0, r.stdout + r.stderr
    job_id = wait_for(run_of(w, run_id), lambda m: m.get("job_id") is not None)["job_id"]
    assert isinstance(job_id, int)
    return job_id


def run_of(w: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The world seen through another of its runs (wait_for and manifest read that run's)."""
    return {**w, "key": f"npa/tiny-local/{run_id}/npa-workflow/manifest.json"}


def secret_of(w: dict[str, Any], run_id: str) -> dict[str, str] | None:
    return held({**w, "secret": run_secret_name("tiny-local", run_id)})


def ended_unreleased(w: dict[str, Any], run_id: str) -> None:
    """``run_id`` ended SUCCEEDED under its watcher, and its Secret is there again: what a
    watcher killed between recording its verdict and releasing leaves (or one whose three asks
    the API refused)."""
    job_id = submit_run(w, run_id)
    wait_for(run_of(w, run_id), lambda m: m["state"] == "RUNNING")
    set_status(w, job_id, "SUCCEEDED")
    wait_for(run_of(w, run_id), lambda m: m["state"] == "SUCCEEDED")
    assert supervisors.wait_gone(w["home"], "team", run_id)
    assert secret_of(w, run_id) is None  # the watcher released it
    name = run_secret_name("tiny-local", run_id)
    write_run_secret(
        w["kubeconfig"], w["context"], NAMESPACE, name, {"NPA_TEST_CANARY": CANARY},
        run_id=run_id, workflow="tiny-local", generation=0,
    )  # fmt: skip
    assert secret_of(w, run_id) == {"NPA_TEST_CANARY": CANARY}


def running_unwatched(w: dict[str, Any]) -> int:
    """The world's run submitted with no watcher, its job RUNNING; the job's id."""
    with locked_state(w["state"]) as state:
        state["outcomes"] = ["RUNNING"]
    return submit_run(w, w["run_id"], OFF)


def status_of(w: dict[str, Any], run_id: str) -> Any:
    return run_npa("workbench", "workflow", "status", run_id, "--project", "team", "--json",
                   env=w["env"])  # fmt: skip


def test_status_of_a_final_run_removes_its_secret_and_says_so_once(
    world: dict[str, Any],
) -> None:
    with locked_state(world["state"]) as state:
        state["outcomes"] = ["RUNNING"]
    ended_unreleased(world, world["run_id"])
    first = status_of(world, world["run_id"])
    assert first.code == 0, first.stdout + first.stderr
    body = first.json()
    assert body["state"] == "SUCCEEDED"
    assert body["release"] == {"released": [f"secret/{world['secret']}"], "error": None,
                               "fix": None}  # fmt: skip
    assert held(world) is None
    # Repeat-safe: the next status finds nothing to remove and reports the same state.
    second = status_of(world, world["run_id"])
    assert second.code == 0 and second.json()["state"] == "SUCCEEDED"
    assert second.json()["release"]["released"] == []
    text = run_npa("workbench", "workflow", "status", world["run_id"], "--project", "team",
                   env=world["env"])  # fmt: skip
    assert "removed secret/" not in text.stdout


def test_status_keeps_the_secret_of_a_run_still_going_and_of_one_it_cannot_tell(
    world: dict[str, Any],
) -> None:
    running_unwatched(world)
    running = status_of(world, world["run_id"])
    assert running.code == 0 and running.json()["state"] == "RUNNING"
    assert running.json()["release"]["released"] == []
    assert held(world) == {"NPA_TEST_CANARY": CANARY}
    # The queue cannot be asked: the state is unknown, said so, and unknown is never ended.
    with locked_state(world["state"]) as state:
        state["queue_error"] = "ClusterNotUpError"
    unknown = status_of(world, world["run_id"])
    assert unknown.code == 4, unknown.stdout + unknown.stderr
    assert unknown.json()["state"] == "VERIFICATION_UNAVAILABLE"
    assert unknown.json()["release"]["released"] == []
    assert held(world) == {"NPA_TEST_CANARY": CANARY}


def test_a_job_that_ended_with_no_watcher_keeps_its_secret_until_its_verdict_is_recorded(
    world: dict[str, Any],
) -> None:
    """The job ended, but npa's verdict (outputs checked, a retry decided) is not recorded: the
    supervisor the same submit starts may relaunch, and a relaunch reads the Secret. That
    submit records the verdict and removes it."""
    job_id = running_unwatched(world)
    set_status(world, job_id, "SUCCEEDED")
    pending = status_of(world, world["run_id"])
    assert pending.json()["verdict_pending"] is True, pending.stdout
    assert pending.json()["supervised"] is None or pending.json()["supervised"] is False
    assert held(world) == {"NPA_TEST_CANARY": CANARY}
    assert submit(world).code == 0
    wait_for(world, lambda m: m["state"] == "SUCCEEDED")
    assert supervisors.wait_gone(world["home"], "team", world["run_id"])
    assert held(world) is None


def unanswered(w: dict[str, Any]) -> str:
    """Point the placed kubeconfig at a port nothing listens on; its text before, to put back."""
    import yaml

    from tests.harness.procs import free_port

    placed = Path(w["kubeconfig"])
    good = placed.read_text()
    config = yaml.safe_load(good)
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    placed.write_text(yaml.safe_dump(config))
    return good


def test_a_refused_removal_is_reported_beside_the_runs_state(world: dict[str, Any]) -> None:
    with locked_state(world["state"]) as state:
        state["outcomes"] = ["RUNNING"]
    ended_unreleased(world, world["run_id"])
    placed = Path(world["kubeconfig"])
    good = unanswered(world)
    refused = status_of(world, world["run_id"])
    body = refused.json()
    assert refused.code == 0, refused.stdout + refused.stderr  # the state's exit code
    assert body["state"] == "SUCCEEDED" and body["trustworthy"] is True
    assert body["release"]["released"] == []
    assert world["secret"] in body["release"]["error"]
    assert "auth can-i delete secrets" in body["release"]["fix"]
    assert body["release"]["fix"] in body["next"]
    text = run_npa("workbench", "workflow", "status", world["run_id"], "--project", "team",
                   env=world["env"])  # fmt: skip
    assert f"not removed: cannot delete the run's Secret {world['secret']}" in text.stdout
    assert held(world) == {"NPA_TEST_CANARY": CANARY}
    placed.write_text(good)  # the API answers again: the same status finishes it
    assert status_of(world, world["run_id"]).json()["release"]["released"] == [
        f"secret/{world['secret']}"
    ]
    assert held(world) is None


def test_the_project_sweep_removes_only_the_secrets_of_final_runs(world: dict[str, Any]) -> None:
    with locked_state(world["state"]) as state:
        state["outcomes"] = ["RUNNING", "RUNNING", "RUNNING"]
    final, running, unknown = world["run_id"], another_run(world), another_run(world)
    ended_unreleased(world, final)
    submit_run(world, running, OFF)
    lost = submit_run(world, unknown, OFF)
    with locked_state(world["state"]) as state:  # the queue no longer knows its job
        state["jobs"] = [j for j in state["jobs"] if j["job_id"] != lost]
    # A run's Secret from before npa recorded its run on it: no run to ask, so kept.
    legacy = f"npa-secrets-legacy-{final}"
    world["kube"].core().create_namespaced_secret(NAMESPACE, {
        "metadata": {"name": legacy, "labels": {"app.kubernetes.io/managed-by": "npa"}},
        "data": {},
    })  # fmt: skip
    try:
        sweep_mixed(world, final, running, unknown, legacy)
    finally:
        world["kube"].core().delete_namespaced_secret(legacy, NAMESPACE)


def sweep_mixed(w: dict[str, Any], final: str, running: str, unknown: str, legacy: str) -> None:
    sweep = ("workbench", "workflow", "release", "--project", "team", "--context",
             w["context"], "--json")  # fmt: skip
    r = run_npa(*sweep, env=w["env"])
    assert r.code == 0, r.stdout + r.stderr
    seen = {s["name"]: s for s in r.json()["secrets"]}
    assert "npa-store" not in seen  # the project's store Secret is no run's
    name = {run: run_secret_name("tiny-local", run) for run in (final, running, unknown)}
    assert seen[name[final]]["action"] == "removed"
    assert seen[name[final]]["run_state"] == "SUCCEEDED"
    assert seen[name[running]]["action"] == "kept"
    assert seen[name[running]]["run_state"] == "RUNNING"
    assert seen[name[unknown]]["action"] == "kept"
    assert seen[name[unknown]]["run_state"] == "VERIFICATION_UNAVAILABLE"
    assert "unknown is never ended" in seen[name[unknown]]["reason"]
    assert seen[legacy]["action"] == "kept" and seen[legacy]["run_id"] is None
    assert secret_of(w, final) is None
    assert secret_of(w, running) == {"NPA_TEST_CANARY": CANARY}
    assert secret_of(w, unknown) == {"NPA_TEST_CANARY": CANARY}
    text = run_npa(*sweep[:-1], env=w["env"]).stdout
    assert f"kept secret/{name[running]} (run {running} RUNNING)" in text
    # Repeat-safe: the next sweep keeps the same ones and finds nothing more to remove.
    again = run_npa(*sweep, env=w["env"])
    assert again.code == 0
    ours = {s["name"]: s["action"] for s in again.json()["secrets"] if s["name"] in
            (*name.values(), legacy)}  # fmt: skip
    assert ours == {name[running]: "kept", name[unknown]: "kept", legacy: "kept"}


def test_cancel_reports_its_outcome_and_a_refused_removal_then_finishes_it(
    world: dict[str, Any],
) -> None:
    running_unwatched(world)
    good = unanswered(world)
    cancel = ("workbench", "workflow", "cancel", world["run_id"], "--project", "team", "--json")
    env = {**world["env"], "NPA_CANCEL_SETTLE_SECONDS": "2"}
    first = run_npa(*cancel, env=env)
    body = first.json()
    assert first.code == 4, first.stdout + first.stderr
    assert body["outcome"] == "cancelled" and body["released"] == []
    assert world["secret"] in body["release_error"]
    assert any("auth can-i delete secrets" in n for n in body["next"])
    assert held(world) == {"NPA_TEST_CANARY": CANARY}
    Path(world["kubeconfig"]).write_text(good)
    second = run_npa(*cancel, env=env)
    assert second.code == 0, second.stdout + second.stderr
    assert second.json()["outcome"] == "already_final"
    assert second.json()["released"] == [f"secret/{world['secret']}"]
    assert held(world) is None


# --- run-scoped store credentials (a stage role) ------------------------------------------------

ROLE = stage_scope_test.ROLE


@pytest.fixture(scope="module")
def iam() -> Iterator[tuple[S3Server, dict[str, str]]]:
    """moto with IAM enforced and session policies applied (tests.harness.moto_iam), seeded as
    test_stage_scope.py seeds it: the stage role, and a submitter who may assume it."""
    with moto_iam.moto_iam_server() as server:
        users = stage_scope_test.seed(server)
        moto_iam.enforce(server)
        yield server, users


@pytest.fixture
def scoped_world(world: dict[str, Any], iam: tuple[S3Server, dict[str, str]]) -> dict[str, Any]:
    """The world's project with a stage role: the submitting shell holds the submitter's keys
    (the world's moto takes any), STS and IAM are moto_iam's, and moto_iam has the store's
    bucket, so a session's reach can be tried there."""
    server, users = iam
    submitter = {k.split(":", 1)[1]: v for k, v in users.items() if k.startswith("submitter:")}
    world["env"] = {**world["env"], **submitter, "AWS_ENDPOINT_URL_STS": server.endpoint_url,
                    "AWS_ENDPOINT_URL_IAM": server.endpoint_url}  # fmt: skip
    world["submitter"], world["iam"] = submitter, server
    with contextlib.suppress(Exception):  # the module's server: an earlier test made it
        moto_iam.client(server, "s3", submitter).create_bucket(Bucket=world["bucket"])
    r = run_npa("configure", "--project", "team", "--stage-role-arn", ROLE, env=world["env"])
    assert r.code == 0, r.stdout + r.stderr
    return world


def launched_session(w: dict[str, Any], generation: int) -> dict[str, str]:
    """The role session the run's Secret holds beside the declared secret, written for launch
    ``generation``: the stage role's, scoped to this run, never the submitter's keys."""
    values = held(w)
    assert values is not None
    assert set(values) == {"NPA_TEST_CANARY"} | {
        f"{STORE_KEY_PREFIX}{n}" for n in SCOPED_VARIABLES}  # fmt: skip
    assert values["NPA_TEST_CANARY"] == CANARY
    secret = w["kube"].core().read_namespaced_secret(w["secret"], NAMESPACE)
    assert secret.metadata.annotations[GENERATION_ANNOTATION] == str(generation)
    session = stage_scope_test.session_of(values)
    assert not set(session.values()) & set(w["submitter"].values())
    store = f"s3://{w['bucket']}/npa"
    other = another_run(w)
    stage_scope_test.scoped_to_the_run(w["iam"], session, store, "tiny-local", w["run_id"], other)
    return session


def test_a_stage_roles_session_is_the_runs_until_cancel_and_a_resume_gets_a_fresh_one(
    scoped_world: dict[str, Any],
) -> None:
    """Through the CLI: submit writes the run's Secret with the run's role session beside its
    declared secret; cancel deletes it; ``--resume-run`` writes a fresh session for launch 1,
    and its cancel deletes that. No session value is in any file npa wrote, nor in the
    insights database the run is ingested into."""
    w = scoped_world
    with locked_state(w["state"]) as state:
        state["outcomes"] = ["RUNNING", "RUNNING"]
    env = {**w["env"], **OFF}  # no watcher: cancel is what ends each launch
    cancel = ("workbench", "workflow", "cancel", w["run_id"], "--project", "team", "--json")
    sessions = []
    for generation, how in enumerate(("--run-id", "--resume-run")):
        r = run_npa(
            *("workbench", "workflow", "submit", str(w["spec"]), "--project", "team"),
            *(how, w["run_id"], "--infra", f"k8s/{w['context']}", "--no-preflight-images"),
            "--json", env=env,
        )  # fmt: skip
        assert r.code == 0, r.stdout + r.stderr
        session = launched_session(w, generation)
        for earlier in sessions:
            assert all(earlier[n] != session[n] for n in SCOPED_VARIABLES), session
        sessions.append(session)
        ended = run_npa(*cancel, env={**env, "NPA_CANCEL_SETTLE_SECONDS": "2"})
        assert ended.code in (0, 1), ended.stdout + ended.stderr
        assert ended.json()["released"] == [f"secret/{w['secret']}"]
        assert held(w) is None
    prefix = f"s3://{w['bucket']}/npa/tiny-local/{w['run_id']}/npa-workflow"
    ingested = run_npa("workbench", "insights", "ingest-run", "--input-path", prefix,
                       "--output-path", str(Path(w["home"]) / "insights.sqlite"),
                       env=w["env"])  # fmt: skip
    assert ingested.code == 0, ingested.stdout + ingested.stderr
    assert (Path(w["home"]) / "insights.sqlite").is_file()
    assert_no_canary_kept(w, tuple(v for s in sessions for v in s.values()))
