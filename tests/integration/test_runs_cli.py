"""The run commands end to end: the real CLI in a subprocess against moto's S3 server."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from npa.adapters.storage import S3_CLIENT_ENV, S3_CLIENTS
from npa.core.paths import NpaPaths
from npa.runs.receipts import Receipt, write_receipt
from npa.runs.staging import restore_list, scan_tree, timestamp_granularity_ns
from tests.harness.cli import run_npa
from tests.harness.procs import free_port
from tests.harness.s3 import ACCESS_KEY, SECRET_KEY, S3Server
from tests.integration.store_proxy import store_proxy

pytestmark = pytest.mark.integration

BUCKET = "npa-runs"
SPEC = "apiVersion: npa/v1\nkind: Workflow\nmetadata:\n  name: curate-video\n"
RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")


def make_tree(root: Path, files: int, size: int, seed: int = 7) -> Path:
    rng = random.Random(seed)
    for i in range(files):
        p = root / f"pkg{i % 9}" / f"mod{i % 4}" / f"f{i:04d}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(size) if i % 10 else b"shared content\n")
    (root / "spec.yaml").write_text(SPEC)
    return root


@pytest.fixture
def env(s3: S3Server, npa_home: Path) -> dict[str, str]:
    s3.client().create_bucket(Bucket=BUCKET)
    e = {**s3.env, "NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    r = run_npa("configure", "--project", "team", "--store", f"s3://{BUCKET}/npa", env=e)
    assert r.code == 0, r.stderr
    return e


def prepare(spec: Path, env: dict[str, str]) -> str:
    r = run_npa("workbench", "workflow", "prepare-run", str(spec), "--project", "team", env=env)
    assert r.code == 0, r.stderr
    assert RUN_ID.fullmatch(r.stdout.strip()) and r.stdout == r.stdout.strip() + "\n"
    assert "reserved run" in r.stderr
    return r.stdout.strip()


def stage(
    spec: Path, run_id: str | None, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    args = ["workbench", "workflow", "stage-source", str(spec), "--project", "team", "--json"]
    if run_id:
        args += ["--run-id", run_id]
    r = run_npa(*args, *extra, env=env)
    return subprocess.CompletedProcess(args, r.code, r.stdout, r.stderr)


SHARED = "npa/curate-video/npa-source/"


def source_objects(s3: S3Server, run_id: str) -> dict[str, bytes]:
    """The run's committed manifest (``manifest.json``) and the workflow's shared source
    (``blobs/<sha256>``, ``trees/<digest>.json``), by those short names."""
    client = s3.client()
    out: dict[str, bytes] = {}
    run_source = f"npa/curate-video/{run_id}/npa-workflow/source/"
    for prefix in (run_source, SHARED):
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            for o in page.get("Contents", []):
                body = client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
                out[o["Key"][len(prefix) :]] = body
    return out


def assert_consistent(s3: S3Server, run_id: str, tree: Path | None) -> bool:
    """The commit-last invariant: a stored tree, its restore list or a committed manifest names
    only blobs that are there and correct; a tree's list is its rows (written just before it);
    the run's source holds nothing but its manifest, which is a stored tree. Returns whether
    the run's source is committed."""
    objs = source_objects(s3, run_id)
    for key, body in objs.items():
        if key.startswith("blobs/"):
            assert hashlib.sha256(body).hexdigest() == key.removeprefix("blobs/"), key
        elif key.startswith("trees/") and key.endswith(".list"):
            listed = [line.split(" ", 2) for line in body.decode().splitlines()]
            assert {f"blobs/{sha}" for sha, _mode, _path in listed} <= set(objs), key
            listed_tree = objs.get(key.removesuffix(".list") + ".json")
            if listed_tree is not None:
                rows = [(e["path"], e["digest"], e["size"], e["mode"])
                        for e in json.loads(listed_tree)["files"]]  # fmt: skip
                assert restore_list(rows) == body, key
        elif key.startswith("trees/"):
            assert hashlib.sha256(body).hexdigest() + ".json" == key.removeprefix("trees/")
            named = {e["digest"][7:] for e in json.loads(body)["files"]}
            assert {f"blobs/{d}" for d in named} <= set(objs), key
        else:
            assert key == "manifest.json", key
    if "manifest.json" not in objs:
        return False
    body = objs["manifest.json"]
    assert objs.get(f"trees/{hashlib.sha256(body).hexdigest()}.json") == body
    assert f"trees/{hashlib.sha256(body).hexdigest()}.list" in objs
    if tree is not None:
        for e in json.loads(body)["files"]:
            assert (tree / e["path"]).read_bytes() == objs["blobs/" + e["digest"][7:]]
    return True


def test_configure_show_names_sources_and_redacts(env: dict[str, str], npa_home: Path) -> None:
    r = run_npa("configure", "--show", "--project", "team", "--json", env=env)
    assert r.code == 0, r.stderr
    shown = r.json()["projects"][0]
    assert shown["settings"]["store"] == {
        "value": f"s3://{BUCKET}/npa",
        "source": "file",
        "origin": None,
    }
    assert shown["settings"]["endpoint_url"]["source"] == "env"
    assert shown["settings"]["endpoint_url"]["origin"] == "AWS_ENDPOINT_URL_S3"
    assert "AWS_SECRET_ACCESS_KEY" in shown["credentials"]
    text = run_npa("configure", "--show", "--project", "team", env=env)
    for out in (r.stdout, text.stdout, text.stderr):
        assert ACCESS_KEY not in out and SECRET_KEY not in out
    assert "[file]" in text.stdout
    assert stat.S_IMODE((npa_home / "config.json").stat().st_mode) == 0o600
    bad = run_npa("configure", "--project", "team", "--store", "ftp://x", "--json", env=env)
    assert bad.code == 2 and bad.json()["error"]["fix"].startswith("npa configure")


def test_prepare_run_prints_only_the_run_id(env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    a, b = prepare(spec, env), prepare(spec, env)
    assert a != b
    r = run_npa(
        "workbench", "workflow", "prepare-run", str(spec), "--project", "team", "--json", env=env
    )
    body = r.json()
    assert body["workflow"] == "curate-video" and body["workflow_prefix"].startswith(
        f"s3://{BUCKET}/npa/curate-video/"
    )


def _wait_past_racy_window(tree: Path) -> None:
    """Wait until the clock passes every file's last change by the stat index's granularity
    (an event, whatever the machine's speed), so the index may trust what it records."""
    files = scan_tree(tree)
    newest = max(max(f.mtime_ns, f.ctime_ns) for f in files)
    while time.time_ns() <= newest + timestamp_granularity_ns(files):
        time.sleep(0.005)


def test_stage_rerun_repair_and_refusal_on_s3(
    env: dict[str, str], s3: S3Server, tmp_path: Path
) -> None:
    tree = make_tree(tmp_path / "src", files=60, size=3000)
    spec = tree / "spec.yaml"
    run_id = prepare(spec, env)
    first = stage(spec, run_id, env)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert summary["files"] == 61 and summary["uploaded"] == summary["blobs"] == 56
    assert first.stderr == ""  # no progress bar, no noise on a pipe
    assert assert_consistent(s3, run_id, tree)

    with store_proxy(s3.endpoint_url) as (endpoint, proxy):
        counted = {**env, "AWS_ENDPOINT_URL_S3": endpoint}
        again = json.loads(stage(spec, run_id, counted).stdout)
        # The unchanged re-run: one request confirms the commit, then it stops.
        assert dict(proxy.counts) == {"HEAD": 1}
    assert again["uploaded"] == 0 and again["already_committed"] is True
    assert again["listed"] is False
    assert again["source_digest"] == summary["source_digest"]

    # Damage one blob in place (same size, other bytes) and delete another. A plain re-run
    # trusts the commit; --verify lists the blobs and repairs both.
    client = s3.client()
    blobs = sorted(k for k in source_objects(s3, run_id) if k.startswith("blobs/"))
    size = len(client.get_object(Bucket=BUCKET, Key=SHARED + blobs[0])["Body"].read())
    client.put_object(Bucket=BUCKET, Key=SHARED + blobs[0], Body=b"\0" * size)
    client.delete_object(Bucket=BUCKET, Key=SHARED + blobs[1])
    trusted = json.loads(stage(spec, run_id, env).stdout)
    assert (trusted["uploaded"], trusted["listed"]) == (0, False)
    repaired = json.loads(stage(spec, run_id, env, "--verify").stdout)
    assert (repaired["uploaded"], repaired["repaired"], repaired["listed"]) == (2, 1, True)
    assert assert_consistent(s3, run_id, tree)

    (tree / "pkg1" / "mod1" / "f0001.py").write_bytes(b"edited")
    refused = stage(spec, run_id, env)
    assert refused.returncode == 2
    err = json.loads(refused.stdout)["error"]
    assert "pkg1/mod1/f0001.py (content differs)" in err["message"]
    assert "prepare-run" in err["fix"]


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_a_fault_on_the_single_request_is_verification_unavailable(
    env: dict[str, str], s3: S3Server, tmp_path: Path, client: str
) -> None:
    tree = make_tree(tmp_path / "src", files=20, size=500)
    spec = tree / "spec.yaml"
    run_id = prepare(spec, env)
    assert stage(spec, run_id, env).returncode == 0
    for fault in ("fail_everything", "drop_connections"):
        with store_proxy(s3.endpoint_url) as (endpoint, proxy):
            setattr(proxy, fault, True)
            faulty = {**env, "AWS_ENDPOINT_URL_S3": endpoint, S3_CLIENT_ENV: client}
            r = stage(spec, run_id, faulty)
            assert set(proxy.counts) == {"HEAD"} and not proxy.writes, fault
        assert r.returncode == 4, r.stdout + r.stderr
        err = json.loads(r.stdout)["error"]
        assert err["kind"] == "verification_unavailable", err
        assert "differs" not in err["message"] and "nothing was changed" in err["message"]
        assert err["fix"].startswith("npa workbench workflow stage-source ")
        assert run_id in err["fix"]
    assert assert_consistent(s3, run_id, tree)


AUDITED_NPA = """
import os, sys
opened = open(os.environ["NPA_TEST_OPENED"], "a")
root = os.environ["NPA_TEST_TREE"]
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].startswith(root):
        opened.write(args[0][len(root) + 1:] + "\\n")
        opened.flush()
sys.addaudithook(hook)
from npa.cli.main import run
sys.argv[0] = "npa"
run()
"""


def _staged_reading(
    spec: Path, run_id: str, env: dict[str, str], tree: Path, log: Path
) -> tuple[dict[str, Any], dict[str, int]]:
    """Stage through the real CLI with an audit hook that records every file of the tree the
    process opens (but the spec, which every command reads); returns the summary and the
    requests the store saw, by method."""
    log.write_text("")
    argv = [sys.executable, "-c", AUDITED_NPA, "workbench", "workflow", "stage-source",
            str(spec), "--project", "team", "--run-id", run_id, "--json"]  # fmt: skip
    with store_proxy(env["AWS_ENDPOINT_URL_S3"]) as (endpoint, proxy):
        full = {**os.environ, **env, "AWS_ENDPOINT_URL_S3": endpoint,
                "NPA_TEST_OPENED": str(log), "NPA_TEST_TREE": str(tree)}  # fmt: skip
        proc = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        counts = dict(proxy.counts)
    opened = [line for line in log.read_text().split() if line != spec.name]
    log.write_text("".join(f"{line}\n" for line in opened))
    return json.loads(proc.stdout), counts


def test_stat_index_reads_only_changed_and_racy_files(
    env: dict[str, str], s3: S3Server, tmp_path: Path
) -> None:
    tree = make_tree(tmp_path / "src", files=50, size=400)
    spec = tree / "spec.yaml"
    log = tmp_path / "opened.txt"
    _wait_past_racy_window(tree)
    run_id = prepare(spec, env)
    first, _ = _staged_reading(spec, run_id, env, tree, log)
    every = {f.path for f in scan_tree(tree)} - {spec.name}
    assert first["hashed"] == 51 and set(log.read_text().split()) == every

    # Unchanged: no file of the tree is opened, and one request confirms the commit.
    again, counts = _staged_reading(spec, run_id, env, tree, log)
    assert again["hashed"] == 0 and log.read_text() == "" and counts == {"HEAD": 1}

    # One file changed, staged as a new run: that file is read (hashed, then uploaded) and
    # nothing else; one blob PUT plus the three tree writes (its restore list, the tree, the
    # run's commit) and the run's marker in its project's run index, before the commit.
    edited = "pkg3/mod3/f0003.py"
    (tree / edited).write_bytes(b"edited, same run of the workflow, new run id")
    _wait_past_racy_window(tree)
    run2 = prepare(spec, env)
    changed, counts = _staged_reading(spec, run2, env, tree, log)
    assert set(log.read_text().split()) == {edited}
    assert changed["hashed"] == 1 and changed["uploaded"] == 1
    assert counts["PUT"] == 5 and "DELETE" not in counts and "POST" not in counts
    assert assert_consistent(s3, run2, tree)

    # Racy-clean: a file whose mtime is not yet past the index's confirmation (here, stamped
    # in the future, as a skewed clock would) is re-read every time although its stat is
    # unchanged; the others are not.
    racy = "pkg5/mod1/f0005.py"
    future = time.time_ns() + 3_600_000_000_000
    os.utime(tree / racy, ns=(future, future))
    run3 = prepare(spec, env)
    _staged_reading(spec, run3, env, tree, log)
    for _ in range(2):
        confirmed, counts = _staged_reading(spec, run3, env, tree, log)
        assert confirmed["hashed"] == 1 and set(log.read_text().split()) == {racy}
        assert counts == {"HEAD": 1}


def test_run_is_never_picked_silently(env: dict[str, str], tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "src", files=3, size=10)
    prepare(tree / "spec.yaml", env)
    r = stage(tree / "spec.yaml", None, env)
    assert r.returncode == 2
    assert "--resume-run" in json.loads(r.stdout)["error"]["message"]
    unknown = stage(tree / "spec.yaml", "20200101-000000-000000", env)
    assert unknown.returncode == 3


def test_unreachable_store_is_unavailable_with_the_resume_command(
    env: dict[str, str], tmp_path: Path
) -> None:
    tree = make_tree(tmp_path / "src", files=3, size=10)
    run_id = prepare(tree / "spec.yaml", env)
    down = {**env, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{free_port()}"}
    r = stage(tree / "spec.yaml", run_id, down)
    assert r.returncode == 4, r.stdout + r.stderr
    err = json.loads(r.stdout)["error"]
    # The first thing staging asks is whether the run's source is committed: unanswered.
    assert err["kind"] == "verification_unavailable"
    assert err["fix"].startswith("npa workbench workflow stage-source ") and run_id in err["fix"]


def test_sigkill_at_random_points_then_rerun(
    env: dict[str, str], s3: S3Server, tmp_path: Path
) -> None:
    """Kill staging at chosen points of its work, each reached as an event (the store proxy
    holds the matching request, so the process is provably there when the kill lands): after
    a few blobs, at a random later blob, while the tree and while the commit are written."""
    tree = make_tree(tmp_path / "src", files=400, size=20_000)
    spec = tree / "spec.yaml"
    run_id = prepare(spec, env)
    rng = random.Random(int(os.environ.get("NPA_KILL_SEED", "1225")))
    later = [("/blobs/", rng.randrange(10, 60)) for _ in range(2)]
    points = [("/blobs/", 0), ("/blobs/", 3), *later, ("/trees/", 0), ("/manifest.json", 0)]
    argv = [sys.executable, "-m", "npa", "workbench", "workflow", "stage-source", str(spec),
            "--project", "team", "--run-id", run_id, "--jobs", "8", "--json"]  # fmt: skip
    stored = []  # the objects each kill left: some blobs but no manifest is the interesting case
    with store_proxy(s3.endpoint_url) as (endpoint, proxy):
        full_env = {**os.environ, **env, "AWS_ENDPOINT_URL_S3": endpoint}
        for contains, skip in points:
            rule = proxy.rule("PUT", contains, "hold", skip=skip)
            proc = subprocess.Popen(
                argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            while not rule.hit.wait(0.05):
                assert proc.poll() is None, f"staging ended before a PUT of {contains}"
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
            proxy.clear()
            # After every kill, whatever point it hit, the prefix is consistent.
            committed = assert_consistent(s3, run_id, tree)
            assert not committed, (contains, skip)
            stored.append(len(source_objects(s3, run_id)))
    # Every kill after the first lands with some objects stored and the commit absent.
    assert all(stored[1:]), stored
    final = stage(spec, run_id, env)
    assert final.returncode == 0, final.stdout + final.stderr
    assert assert_consistent(s3, run_id, tree)
    objs = source_objects(s3, run_id)
    manifest = json.loads(objs["manifest.json"])
    assert len(manifest["files"]) == 401
    distinct = {e["digest"] for e in manifest["files"]}
    # Every blob once, one stored tree and its restore list, the run's commit, and nothing else.
    assert sum(k.startswith("blobs/") for k in objs) == len(distinct)
    assert sum(k.startswith("trees/") for k in objs) == 2 and len(objs) == len(distinct) + 3
    assert json.loads(stage(spec, run_id, env).stdout)["uploaded"] == 0


def test_no_credential_in_anything_npa_wrote(
    env: dict[str, str],
    s3: S3Server,
    tmp_path: Path,
    npa_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = make_tree(tmp_path / "src", files=5, size=100)
    run_id = prepare(tree / "spec.yaml", env)
    assert stage(tree / "spec.yaml", run_id, env).returncode == 0
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    receipt = write_receipt(
        NpaPaths.from_env(),
        Receipt(
            project="team", project_identity="x", workflow="curate-video", run_id=run_id,
            submitted_at="2026-01-01T00:00:00+00:00", store=f"s3://{BUCKET}/npa",
            workflow_prefix=f"s3://{BUCKET}/npa/curate-video/{run_id}/npa-workflow",
            endpoint_url=s3.endpoint_url, credentials_source="environment (AWS_ACCESS_KEY_ID)",
        ),
    )  # fmt: skip
    journals = list((npa_home / "operations").glob("*.jsonl"))
    assert journals
    for path in [receipt, *journals]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    written = [p for p in npa_home.rglob("*") if p.is_file()]
    assert len(written) >= 5
    for path in written:
        data = path.read_bytes()
        assert ACCESS_KEY.encode() not in data and SECRET_KEY.encode() not in data, path
    for body in source_objects(s3, run_id).values():
        assert SECRET_KEY.encode() not in body


def _run_on_tty(argv: list[str], env: dict[str, str], answer: bytes = b"") -> tuple[int, str, str]:
    """Run with stdin and stderr on a pseudo-terminal (stdout stays a pipe, as in $(...))."""
    import pty
    import select

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv, env={**os.environ, **env, "COLUMNS": "100"}, stdin=slave, stderr=slave,
        stdout=subprocess.PIPE,
    )  # fmt: skip
    os.close(slave)
    if answer:
        os.write(master, answer)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    out = proc.stdout.read().decode() if proc.stdout else ""
    code = proc.wait(timeout=60)
    os.close(master)
    return code, out, seen.decode(errors="replace")


def test_progress_bar_on_a_terminal_only(env: dict[str, str], tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "src", files=200, size=20_000)
    run_id = prepare(tree / "spec.yaml", env)
    argv = [sys.executable, "-m", "npa", "workbench", "workflow", "stage-source",
            str(tree / "spec.yaml"), "--project", "team", "--run-id", run_id]  # fmt: skip
    code, out, terminal = _run_on_tty(argv, env)
    assert code == 0, out + terminal
    assert "uploading" in terminal or "hashing" in terminal  # rich drew a bar on the terminal
    assert "/201 files" in terminal  # with the total known from the start
    assert "committed for run" in out
    quiet = prepare(tree / "spec.yaml", env)
    code, out, terminal = _run_on_tty([*argv[:-1], quiet, "--no-progress"], env)
    assert code == 0 and "hashing" not in terminal and "uploading" not in terminal


def test_progress_when_asked_goes_to_stderr_with_totals(
    env: dict[str, str], tmp_path: Path
) -> None:
    tree = make_tree(tmp_path / "src", files=40, size=5000)
    run_id = prepare(tree / "spec.yaml", env)
    r = stage(tree / "spec.yaml", run_id, env, "--progress")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)  # stdout is nothing but the JSON result
    lines = r.stderr.splitlines()
    mb = f"{summary['bytes'] / 1e6:.1f} MB"
    assert lines[0] == f"hashing: 41 files, {mb}"
    assert any(line.startswith(f"hashing: 41/41 files, {mb[:-3]}/{mb}") for line in lines)
    upload = f"{summary['uploaded_bytes'] / 1e6:.1f} MB"
    assert f"uploading: {summary['uploaded']} files, {upload}" in lines
    assert any(f"uploading: {summary['uploaded']}/{summary['uploaded']} files" in x for x in lines)
    assert all("ETA" in line for line in lines if "/" in line.split(",")[0])
    # Without --progress, a pipe gets nothing; --no-progress wins on a terminal too.
    again = stage(tree / "spec.yaml", run_id, env)
    assert again.returncode == 0 and again.stderr == ""


def test_interactive_shell_is_asked_which_run(env: dict[str, str], tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "src", files=3, size=10)
    older = prepare(tree / "spec.yaml", env)
    newer = prepare(tree / "spec.yaml", env)
    argv = [sys.executable, "-m", "npa", "workbench", "workflow", "stage-source",
            str(tree / "spec.yaml"), "--project", "team", "--json"]  # fmt: skip
    code, out, terminal = _run_on_tty(argv, env, answer=b"2\n")
    assert code == 0, out + terminal
    assert "which run?" in terminal and newer in terminal
    assert json.loads(out)["run_id"] == older  # the list is newest first; "2" is the older
    code, out, terminal = _run_on_tty(argv, env, answer=b"\n")
    assert code == 2 and "no run chosen" in out


def test_ctrl_c_stops_cleanly_with_the_resume_command(
    env: dict[str, str], s3: S3Server, tmp_path: Path
) -> None:
    tree = make_tree(tmp_path / "src", files=400, size=20_000)
    run_id = prepare(tree / "spec.yaml", env)
    argv = [sys.executable, "-m", "npa", "workbench", "workflow", "stage-source",
            str(tree / "spec.yaml"), "--project", "team", "--run-id", run_id,
            "--jobs", "4"]  # fmt: skip
    with store_proxy(s3.endpoint_url) as (endpoint, proxy):
        # Interrupt while the fourth blob is on its way (held there: provably mid-upload).
        rule = proxy.rule("PUT", "/blobs/", "hold", skip=3)
        full = {**os.environ, **env, "AWS_ENDPOINT_URL_S3": endpoint}
        proc = subprocess.Popen(argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        while not rule.hit.wait(0.05):
            assert proc.poll() is None, "staging ended before its fourth blob"
        proc.send_signal(signal.SIGINT)
        proxy.clear()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "interrupted" in err and f"--run-id {run_id}" in err
    assert "Traceback" not in err
    assert not assert_consistent(s3, run_id, tree)  # stopped before committing
    assert stage(tree / "spec.yaml", run_id, env).returncode == 0
    assert assert_consistent(s3, run_id, tree)
