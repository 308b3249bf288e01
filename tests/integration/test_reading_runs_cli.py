"""Reading runs back gives one answer per fact, in bounded time, about the right run: the real
CLI against the local backend, moto's S3 server, and a TCP server that never answers."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.cli import run_npa
from tests.harness.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WF = ("workbench", "workflow")
RUN = "20260101-120000-abcdef"


@pytest.fixture
def env(npa_home: Path) -> dict[str, str]:
    return {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}


def finished_run(env: dict[str, str], folder: Path, spec_doc: dict[str, Any]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_doc, sort_keys=False))
    run_id = run_npa(*WF, "prepare-run", str(spec), "--project", "demo", env=env).stdout.strip()
    sub = run_npa(*WF, "submit", str(spec), "--project", "demo", "--run-id", run_id,
                "--runtime", "process", env=env)  # fmt: skip
    assert sub.code == 0, sub.stdout + sub.stderr
    watch = run_npa(*WF, "status", run_id, "--project", "demo", "--watch", "--interval", "0.2",
                    env=env)  # fmt: skip
    assert watch.code in (0, 1), watch.stdout + watch.stderr
    return run_id


def tiny() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "tiny-local.yaml").read_text())
    return doc


# --- which run a prefix names ------------------------------------------------------------------


def test_a_prefix_names_a_run_only_when_its_manifest_says_so(
    env: dict[str, str], npa_home: Path, tmp_path: Path
) -> None:
    run_id = finished_run(env, tmp_path / "wf", tiny())
    store = npa_home / "store"
    real = store / "tiny-local" / run_id / "npa-workflow"
    assert run_npa(*WF, "status", f"file://{real}", "--project", "demo", env=env).code == 0

    # Another run's records copied under a run-shaped prefix are not that run.
    fake = store / "elsewhere" / RUN / "npa-workflow"
    shutil.copytree(real, fake)
    res = run_npa(*WF, "status", f"file://{fake}", "--project", "demo", "--json", env=env)
    assert res.code == 4, res.stdout
    body = res.json()
    assert body["state"] == "VERIFICATION_UNAVAILABLE" and body["job_id"] is None
    manifest = next(s for s in body["sources"] if s["source"] == "manifest")
    assert f"record of run {run_id}" in manifest["error"] and "not of run" in manifest["error"]
    # Every other reader reports the same mismatch, with the same message, and shows nothing.
    said = manifest["error"]
    for argv in (
        ("artifacts", f"file://{fake}"),
        ("logs", f"file://{fake}", "--stage", "square"),
        ("list",),
    ):
        res = run_npa(*WF, *argv, "--project", "demo", "--json", env=env)
        assert res.code == 4, (argv, res.stdout, res.stderr)
        if argv[0] == "list":
            [row] = [r for r in res.json()["runs"] if r["run_id"] == RUN]
            assert row["error"] == said and row["recorded_state"] == "VERIFICATION_UNAVAILABLE"
        else:
            error = res.json()["error"]
            assert f"{error['kind']}: {error['message']}" == said, (argv, error)

    # Deeper or shallower keys, or a last part that is no run id, are refused outright.
    for bad in (
        f"file://{store}/tiny-local/{run_id}/npa-workflow/stages",
        f"file://{store}/tiny-local/{run_id}/npa-workflow/stages/total/logs",
        f"file://{store}/anything/deeper/bar",
        "s3://bucket/anything/deeper/bar",
        f"file://{store}/tiny-local",
    ):
        res = run_npa(*WF, "status", bad, "--project", "demo", env=env)
        assert res.code == 2, (bad, res.stdout, res.stderr)
        assert "is not a run prefix" in res.stderr and "Traceback" not in res.stderr


# --- a store that never answers ----------------------------------------------------------------


@pytest.fixture
def silent_store() -> Iterator[int]:
    """A TCP server on loopback that accepts every connection and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)  # read nothing, answer nothing, close nothing

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()


def test_a_store_that_never_answers_is_unavailable_within_the_read_timeout(
    env: dict[str, str], silent_store: int
) -> None:
    env = {**env, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "AWS_DEFAULT_REGION": REGION}  # fmt: skip
    configure = run_npa("configure", "--project", "demo", "--store", "s3://silent/npa",
                        "--endpoint-url", f"http://127.0.0.1:{silent_store}", env=env)  # fmt: skip
    assert configure.code == 0, configure.stderr
    for argv, extra_env in (
        ((*WF, "status", RUN, "--project", "demo", "--read-timeout", "2"), {}),
        ((*WF, "status", f"s3://silent/npa/wf/{RUN}", "--project", "demo"),
         {"NPA_READ_TIMEOUT": "2"}),
        ((*WF, "list", "--project", "demo", "--read-timeout", "2"), {}),
        ((*WF, "artifacts", RUN, "--project", "demo", "--read-timeout", "2"), {}),
    ):  # fmt: skip
        started = time.monotonic()
        res = run_npa(*argv, "--json", env={**env, **extra_env})
        elapsed = time.monotonic() - started
        assert res.code == 4, (argv, res.stdout, res.stderr)
        assert "did not answer" in res.stdout and "within 2 s" in res.stdout
        # One bounded wait, not minutes of retries (it took ~181 s before).
        assert elapsed < 30, (argv, elapsed)
        if argv[2] == "status":
            assert res.json()["state"] == "VERIFICATION_UNAVAILABLE"
    bad = run_npa(*WF, "status", RUN, "--project", "demo", env={**env, "NPA_READ_TIMEOUT": "x"})
    assert bad.code == 2 and "NPA_READ_TIMEOUT" in bad.stderr


# --- a bucket that does not exist ----------------------------------------------------------------


def test_a_missing_bucket_is_one_answer_not_found_by_id_prefix_and_list(
    env: dict[str, str], s3: S3Server
) -> None:
    env = {**env, **s3.env}
    assert run_npa("configure", "--project", "demo", "--store", "s3://no-such-bucket/npa",
                   env=env).code == 0  # fmt: skip
    by_prefix = f"s3://no-such-bucket/npa/wf/{RUN}"
    answers = {
        "id": run_npa(*WF, "status", RUN, "--project", "demo", "--json", env=env),
        "prefix": run_npa(*WF, "status", by_prefix, "--project", "demo", "--json", env=env),
        "list": run_npa(*WF, "list", "--project", "demo", "--json", env=env),
    }
    for how, res in answers.items():
        assert res.code == 3, (how, res.stdout, res.stderr)
        assert "no-such-bucket" in res.stdout and "does not exist" in res.stdout, how
    for how in ("id", "prefix"):
        body = answers[how].json()
        assert body["state"] == "NOT_FOUND"
        assert any("create-bucket --bucket no-such-bucket" in n for n in body["next"]), body
    assert answers["list"].json()["error"]["kind"] == "bucket_absent"


# --- artifacts and stage order -----------------------------------------------------------------


def reordered() -> dict[str, Any]:
    """The tiny example with stage names whose alphabetical order is not the plan's."""
    doc = tiny()
    names = {"generate": "make", "square": "double", "total": "add"}
    for stage in doc["stages"]:
        stage["name"] = names[stage["name"]]
        for inp in stage.get("inputs", []):
            upstream, _, output = inp["from"].partition(".")
            inp["from"] = f"{names[upstream]}.{output}"
    return doc


def test_status_lists_stages_in_plan_order_even_for_old_manifests(
    env: dict[str, str], npa_home: Path, tmp_path: Path
) -> None:
    run_id = finished_run(env, tmp_path / "wf", reordered())
    res = run_npa(*WF, "status", run_id, "--project", "demo", "--json", env=env)
    assert list(res.json()["stages"]) == ["make", "double", "add"]
    text = run_npa(*WF, "status", run_id, "--project", "demo", env=env).stdout
    lines = [line.split()[1] for line in text.splitlines() if line.startswith("  stage ")]
    assert lines == ["make:", "double:", "add:"]
    # A manifest written before the order was recorded: plan.json gives it.
    path = npa_home / "store" / "tiny-local" / run_id / "npa-workflow" / "manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest.pop("order") == ["make", "double", "add"]
    path.write_text(json.dumps(manifest, sort_keys=True))
    res = run_npa(*WF, "status", run_id, "--project", "demo", "--json", env=env)
    assert list(res.json()["stages"]) == ["make", "double", "add"]


@pytest.mark.parametrize("status", ["missing", "empty"])
def test_artifacts_fails_when_a_failed_stage_left_its_outputs_missing_or_empty(
    env: dict[str, str], npa_home: Path, tmp_path: Path, status: str
) -> None:
    doc = tiny()
    doc["stages"][1]["command"] = "echo no squares today >&2; exit 4"
    run_id = finished_run(env, tmp_path / "wf", doc)
    if status == "empty":
        # What a backend writing straight into the store (a mounted bucket) leaves behind
        # when the stage dies after creating its file.
        outputs = npa_home / "store" / "tiny-local" / run_id / "npa-workflow" / "stages"
        planted = outputs / "square" / "outputs" / "squares" / "squares.txt"
        planted.parent.mkdir(parents=True)
        planted.write_bytes(b"")
    res = run_npa(*WF, "artifacts", run_id, "--project", "demo", "--json", env=env)
    assert res.code == 1, res.stdout + res.stderr
    body = res.json()
    wanted = f"square is FAILED and output squares is {status}"
    assert any(wanted in f for f in body["failures"]), body["failures"]
    text = run_npa(*WF, "artifacts", run_id, "--project", "demo", env=env)
    assert text.code == 1 and wanted in text.stdout + text.stderr
    # total never ran: it is not judged on outputs it was never asked to write.
    assert not any("total" in f for f in body["failures"])


# --- load-artifact to S3 ---------------------------------------------------------------------


def test_load_artifact_writes_through_the_project_endpoint_and_profile(
    env: dict[str, str], s3: S3Server, npa_home: Path, tmp_path: Path
) -> None:
    run_id = finished_run(env, tmp_path / "wf", tiny())
    aws = tmp_path / "aws-config"
    aws.write_text(
        f"[profile npa-dest]\naws_access_key_id = {ACCESS_KEY}\n"
        f"aws_secret_access_key = {SECRET_KEY}\nregion = {REGION}\n"
    )
    s3.client().create_bucket(Bucket="artifacts")
    # Credentials only in the profile, the endpoint only in the project: nothing in the
    # environment points at this store.
    env = {**env, "AWS_CONFIG_FILE": str(aws), "AWS_SHARED_CREDENTIALS_FILE": str(aws)}
    configured = run_npa("configure", "--project", "demo", "--endpoint-url", s3.endpoint_url,
                         "--profile", "npa-dest", env=env)  # fmt: skip
    assert configured.code == 0, configured.stderr
    res = run_npa(*WF, "load-artifact", run_id, "--project", "demo", "--destination",
                  "s3://artifacts/run-out", "--json", env=env)  # fmt: skip
    assert res.code == 0, res.stdout + res.stderr
    assert res.json()["destination"] == "s3://artifacts/run-out"
    listed = s3.client().list_objects_v2(Bucket="artifacts", Prefix="run-out/")
    keys = sorted(o["Key"] for o in listed.get("Contents", []))
    assert keys == ["run-out/total/total.txt"]
    body = s3.client().get_object(Bucket="artifacts", Key="run-out/total/total.txt")["Body"]
    assert body.read().strip() == b"338350"
