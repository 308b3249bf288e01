"""The cluster side of the fault policy: the stage library (npa/templates/skypilot-stage.sh) that
every SkyPilot task node runs reaches the store through the real AWS CLI, and rides out an
outage as npa's own executor does, here against moto behind the fault proxy.

The outage ends on an event (the proxy refused a number of requests), never after a time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from npa.backends.phases import ShardPhases
from npa.core.templates import templates_dir
from tests.harness.procs import wait_until
from tests.harness.s3 import S3Server
from tests.integration.store_proxy import ProxyState, store_proxy

pytestmark = pytest.mark.integration

LIBRARY = templates_dir() / "skypilot-stage.sh"
BUCKET = "npa-library"


class Node:
    """A task node's shell with the stage library, its store through the fault proxy."""

    def __init__(self, s3: S3Server, endpoint: str, proxy: ProxyState, tmp: Path) -> None:
        self.s3 = s3
        self.proxy = proxy
        self.env = {**os.environ, **s3.env, "AWS_ENDPOINT_URL_S3": endpoint,
                    "AWS_ENDPOINT_URL": endpoint, "TMPDIR": str(tmp)}  # fmt: skip
        self.tmp = tmp

    def start(self, call: str, **env: str) -> subprocess.Popen[str]:
        script = f". {LIBRARY}\n{call}"
        pipe = subprocess.PIPE
        return subprocess.Popen(["/bin/sh", "-c", script], env={**self.env, **env},
                                stdout=pipe, stderr=pipe, text=True)  # fmt: skip

    def put_writes(self, key: str) -> int:
        return self.proxy.writes.count(f"PUT /{BUCKET}/{key}")


@pytest.fixture
def node(tmp_path: Path, s3: S3Server) -> Iterator[Node]:
    # A dev dependency (awscli in pyproject.toml): make test's venv puts it on PATH.
    assert shutil.which("aws"), "the AWS CLI is missing from PATH; run: make prepare-test"
    s3.client().create_bucket(Bucket=BUCKET)
    with store_proxy(s3.endpoint_url) as (endpoint, proxy):
        yield Node(s3, endpoint, proxy, tmp_path)
        proxy.fail_everything = proxy.drop_connections = proxy.refuse_writes = False
        proxy.clear()


def outage(proxy: ProxyState, kind: str) -> None:
    if kind == "error":
        proxy.fail_everything = True
    else:
        proxy.drop_connections = True


@pytest.mark.parametrize("kind", ["error", "reset"])
def test_an_upload_rides_out_an_outage_and_writes_once(node: Node, kind: str) -> None:
    out = node.tmp / "total.txt"
    out.write_text("338350\n")
    outage(node.proxy, kind)
    asked = sum(node.proxy.counts.values())
    proc = node.start(f"npa_upload file {out} s3://{BUCKET}/run/total.txt")
    # The library asked again after at least one pause: then the store answers again.
    wait_until(lambda: sum(node.proxy.counts.values()) >= asked + 6, "the library asked again")
    node.proxy.fail_everything = node.proxy.drop_connections = False
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert "asking again" in stderr, stderr
    body = node.s3.client().get_object(Bucket=BUCKET, Key="run/total.txt")["Body"].read()
    assert body == b"338350\n"
    assert node.put_writes("run/total.txt") == 1  # written once


def test_a_read_rides_out_an_outage_and_a_missing_key_is_final(node: Node) -> None:
    # What npa_shard reads to count a start: an earlier count must not be taken for "none".
    node.s3.client().put_object(Bucket=BUCKET, Key="run/attempts/wave-0-shard-0", Body=b"2\n")
    node.proxy.fail_everything = True
    asked = sum(node.proxy.counts.values())
    proc = node.start(f"npa_aws s3 cp s3://{BUCKET}/run/attempts/wave-0-shard-0 -")
    wait_until(lambda: sum(node.proxy.counts.values()) >= asked + 6, "the library asked again")
    node.proxy.fail_everything = False
    stdout, stderr = proc.communicate(timeout=300)
    assert (proc.returncode, stdout) == (0, "2\n"), stderr
    # A key that is not there is an answer, not an outage: no pause.
    missing = node.start(f"npa_aws s3 cp s3://{BUCKET}/run/attempts/wave-0-shard-9 -")
    _, stderr = missing.communicate(timeout=300)
    assert missing.returncode != 0 and "asking again" not in stderr, stderr


def test_a_refusal_is_final_at_once(node: Node) -> None:
    out = node.tmp / "x"
    out.write_text("x")
    node.proxy.refuse_writes = True  # 403 AccessDenied, as for wrong credentials
    started = time.monotonic()
    proc = node.start(f"npa_upload file {out} s3://{BUCKET}/run/x")
    _, stderr = proc.communicate(timeout=300)
    # A refusal is a person's to fix: exit 1, never the temporary failure npa launches again.
    assert proc.returncode == 1, stderr
    assert "AccessDenied" in stderr and "asking again" not in stderr, stderr
    assert "cannot upload output" in stderr, stderr
    assert time.monotonic() - started < 60  # a bound: no pause was taken


def test_an_outage_past_the_patience_fails_the_upload_with_its_reason(node: Node) -> None:
    out = node.tmp / "x"
    out.write_text("x")
    node.proxy.fail_everything = True
    proc = node.start(f"npa_upload file {out} s3://{BUCKET}/run/x",
                      NPA_STORE_OUTAGE_SECONDS="3")  # fmt: skip
    _, stderr = proc.communicate(timeout=300)
    # 75 (EX_TEMPFAIL): npa classifies it as transient infrastructure and launches again.
    assert proc.returncode == 75, stderr
    assert stderr.count("asking again") >= 2, stderr
    assert "a temporary failure (exit 75)" in stderr and "cannot upload output" in stderr, stderr
    assert node.put_writes("run/x") == 0


def test_a_start_count_the_store_does_not_answer_for_is_not_taken_for_none(node: Node) -> None:
    """A node reads its shard's start count before it counts its own start: an outage past
    the patience ends the node 75 and writes no count (a count of 1 would be a second first
    attempt), where a missing count is 0 (the first start)."""
    key = f"s3://{BUCKET}/run/attempts/wave-0-shard-0"
    node.proxy.fail_everything = True
    proc = node.start(f"npa_count_start {key}", NPA_STORE_OUTAGE_SECONDS="3")
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stderr
    assert "cannot read the start count" in stderr, stderr
    assert node.put_writes("run/attempts/wave-0-shard-0") == 0
    node.proxy.fail_everything = False
    for attempt in ("1", "2"):
        counted = node.start(f'npa_count_start {key}; echo "$NPA_ATTEMPT"')
        stdout, stderr = counted.communicate(timeout=300)
        assert (counted.returncode, stdout.strip()) == (0, attempt), stderr


# --- the record of a shard attempt's phases ---------------------------------------------------


def _library_json(phases: str, *args: str) -> str:
    script = f'NPA_PHASES="$1"; . {LIBRARY}; shift; npa_phases_json "$@"'
    done = subprocess.run(["/bin/sh", "-c", script, "sh", phases, *args], capture_output=True,
                          text=True, check=True, timeout=30)  # fmt: skip
    return done.stdout


def test_the_stage_librarys_record_is_this_model(tmp_path: Path) -> None:
    """The SkyPilot pod writes its record from the shell: what the library's function builds
    from its notes parses as a record, field for field (the model refuses any other field)."""
    notes = tmp_path / "phases"
    notes.write_text(
        "started_at=2026-12-04T15:00:00Z\ninputs_at=2026-12-04T15:00:40Z\n"
        "command_started_at=2026-12-04T15:00:45Z\ncommand_ended_at=2026-12-04T15:01:45Z\n"
        "exit_code=0\nuploaded_at=2026-12-04T15:01:50Z\nended_at=2026-12-04T15:01:51Z\n"
    )
    r = ShardPhases.model_validate_json(_library_json(str(notes), "square", "1", "3", "2"))
    assert r.model_dump(mode="json") == {
        "stage": "square", "wave": 1, "shard": 3, "attempt": 2, "backend": "skypilot",
        "started_at": "2026-12-04T15:00:00Z", "inputs_at": "2026-12-04T15:00:40Z",
        "command_started_at": "2026-12-04T15:00:45Z", "command_ended_at": "2026-12-04T15:01:45Z",
        "exit_code": 0, "uploaded_at": "2026-12-04T15:01:50Z", "ended_at": "2026-12-04T15:01:51Z",
        "note": "",
    }  # fmt: skip
    assert r.outcome == "succeeded"
    # A failed command, its upload never reached: null, and the outcome says so.
    notes.write_text(
        "started_at=2026-12-04T15:00:00Z\ncommand_started_at=2026-12-04T15:00:45Z\n"
        "command_ended_at=2026-12-04T15:01:45Z\nexit_code=3\nended_at=2026-12-04T15:01:46Z\n"
    )
    r = ShardPhases.model_validate_json(_library_json(str(notes), "square", "0", "1", "1"))
    assert r.outcome == "failed (exit 3)" and r.inputs_at is None and r.uploaded_at is None


def _exit_through_the_trap(node: Node, notes: Path, key: str, code: int) -> subprocess.Popen[str]:
    """A run script's end as the library leaves it: counted, the command ended with ``code``,
    the record written by the EXIT trap that npa_shard sets."""
    lines = [
        "npa_mark started_at", "npa_mark inputs_at", "npa_mark command_started_at",
        "npa_mark command_ended_at", f"npa_mark exit_code {code}",
        f"_npa_stage=square _npa_record=s3://{BUCKET}/{key}",
        "trap 'npa_record $?' EXIT", f"exit {code}",
    ]  # fmt: skip
    return node.start("\n".join(lines), NPA_PHASES=str(notes), NPA_WAVE="0", NPA_SHARD="1",
                      NPA_ATTEMPT="1")  # fmt: skip


def test_the_record_is_stored_as_the_run_exits_and_its_exit_stays_the_commands(
    node: Node,
) -> None:
    key = "run/stages/square/attempts/wave-0-shard-1.attempt-1.json"
    proc = _exit_through_the_trap(node, node.tmp / "phases", key, 3)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 3, stderr
    body = node.s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
    r = ShardPhases.model_validate_json(body)
    assert (r.stage, r.wave, r.shard, r.attempt, r.backend) == ("square", 0, 1, 1, "skypilot")
    assert r.outcome == "failed (exit 3)" and r.ended_at >= r.command_ended_at  # type: ignore[operator]


def test_a_record_the_store_refuses_changes_nothing_of_the_shard(node: Node) -> None:
    key = "run/stages/square/attempts/wave-0-shard-1.attempt-1.json"
    node.proxy.refuse_writes = True
    started = time.monotonic()
    proc = _exit_through_the_trap(node, node.tmp / "phases", key, 0)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr  # the shard succeeded: its evidence is not its result
    assert "the phase record was not stored" in stderr and "asking again" not in stderr, stderr
    assert time.monotonic() - started < 60  # one try, no outage patience for evidence
