"""insights end to end: runs made by the real local backend, ingested from file:// and s3://."""

from __future__ import annotations

import json
import shlex
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import run_npa
from tests.harness.s3 import S3Server

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_STARTUP", "FAILED_CONTROLLER"}


def _run(npa_home: Path, spec_text: str, folder: Path, *extra: str) -> tuple[str, Path]:
    env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
    folder.mkdir(parents=True)
    spec = folder / "tiny-local.yaml"
    spec.write_text(spec_text)
    prep = run_npa("workbench", "workflow", "prepare-run", str(spec), "--project", "demo", env=env)
    assert prep.code == 0, prep.stderr
    run_id = prep.stdout.strip()
    sub = run_npa(
        "workbench", "workflow", "submit", str(spec), "--project", "demo",
        "--run-id", run_id, "--runtime", "process", "--json", *extra, env=env,
    )  # fmt: skip
    assert sub.code == 0, sub.stdout + sub.stderr
    prefix = npa_home / "store" / "tiny-local" / run_id / "npa-workflow"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        state = json.loads((prefix / "manifest.json").read_text())["state"]
        if state in TERMINAL:
            return run_id, prefix
        time.sleep(0.1)
    raise AssertionError("run did not finish")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One good and one failed run of the tiny example, produced by the local backend."""
    home = tmp_path_factory.mktemp("insights") / "home"
    home.mkdir()
    npa_home = home / ".npa"
    text = (EXAMPLES / "tiny-local.yaml").read_text()
    good, good_prefix = _run(npa_home, text, home / "good")
    failed_text = text.replace(
        "awk '{ s += $1 } END { print s }'", "echo boom >&2; exit 3; awk '{ s += $1 }'"
    )
    bad, bad_prefix = _run(npa_home, failed_text, home / "bad", "--retries", "1")
    # A metrics.json in the schema tools emit, beside each run's square outputs.
    (good_prefix / "stages/square/outputs/metrics.json").write_text(
        '{"rows": 100, "loss": {"l2": 0.5}}'
    )
    (bad_prefix / "stages/square/outputs/metrics.json").write_text(
        '{"rows": 100, "loss": {"l2": 0.7}}'
    )
    return {"home": home, "good": good, "bad": bad, "good_prefix": good_prefix,
            "bad_prefix": bad_prefix}  # fmt: skip


def ingest(prefix: str, db: Path, env: dict[str, str] | None = None) -> Any:
    r = run_npa(
        "workbench", "insights", "ingest-run", "--input-path", prefix, "--output-path", str(db),
        "--json", env=env,
    )  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    return r.json()


def test_file_prefixes_ingest_idempotently_and_compare_names_the_failure_first(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    db = tmp_path / "insights.db"
    first = ingest(runs["good_prefix"].as_uri(), db)
    assert first["change"] == "added" and first["state"] == "SUCCEEDED"
    assert first["metrics"] == 2 and first["stages"] == 3
    ingest(runs["bad_prefix"].as_uri(), db)
    rows = sqlite3.connect(db).execute("SELECT COUNT(*) FROM stages").fetchone()[0]
    again = ingest(runs["bad_prefix"].as_uri(), db)  # re-ingest: nothing changes
    assert again["change"] == "unchanged"
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM stages").fetchone()[0] == rows == 6
    # The run prefix without its npa-workflow component is accepted too.
    assert ingest(str(runs["good_prefix"].parent), db)["change"] == "unchanged"

    r = run_npa(
        "workbench", "insights", "compare", "--input-path", str(db),
        "--base-run", runs["good"], "--candidate-run", runs["bad"], "--json",
    )  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    out = r.json()
    first_div = out["first_divergence"]
    assert first_div["stage"] == "total" and first_div["facet"] == "state"
    assert first_div["candidate"] == "FAILED (payload)"
    total = next(s for s in out["stages"] if s["stage"] == "total")
    assert total["candidate"]["retries"] == 1 and total["base"]["retries"] == 0
    assert total["candidate"]["last_log_line"] == "boom"
    square = next(s for s in out["stages"] if s["stage"] == "square")
    assert square["differs"] == ["metrics"]
    assert square["candidate"]["metrics"] == {"rows": 100.0, "loss.l2": 0.7}
    assert out["candidate"]["classification"] == "payload"

    text = run_npa(
        "workbench", "insights", "compare", "--input-path", str(db),
        "--base-run", runs["good"], "--candidate-run", runs["bad"],
        "--plot", str(tmp_path / "durations.png"),
    )  # fmt: skip
    assert text.code == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("first divergence: stage total FAILED (payload)")
    assert any("SUCCEEDED → FAILED (payload)" in line for line in lines)
    png = tmp_path / "durations.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (660, 400)  # 1.2 in per stage + 3 in, 100 dpi and len(data) > 5000


def test_s3_prefixes_ingest_and_compare(runs: dict[str, Any], tmp_path: Path, s3: S3Server) -> None:
    client = s3.client()
    client.create_bucket(Bucket="runs")
    for name in ("good_prefix", "bad_prefix"):
        prefix: Path = runs[name]
        for file in prefix.rglob("*"):
            if file.is_file() and "/source/blobs/" not in file.as_posix():
                key = (
                    f"team/tiny-local/{prefix.parent.name}/npa-workflow/"
                    + file.relative_to(prefix).as_posix()
                )
                client.put_object(Bucket="runs", Key=key, Body=file.read_bytes())
    db = tmp_path / "store"
    db.mkdir()
    for run in (runs["good"], runs["bad"]):
        out = ingest(f"s3://runs/team/tiny-local/{run}/npa-workflow", db, env=s3.env)
        assert out["output_path"] == str(db / "insights.sqlite")
        assert out["input_path"].startswith("s3://runs/")
    r = run_npa(
        "workbench", "insights", "compare", "--input-path", str(db),
        "--base-run", f"tiny-local/{runs['good']}", "--candidate-run", runs["bad"], "--json",
    )  # fmt: skip
    assert r.code == 0, r.stderr
    assert r.json()["first_divergence"]["stage"] == "total"

    absent = run_npa(
        "workbench", "insights", "ingest-run", "--input-path", "s3://runs/team/nothing-here",
        "--output-path", str(db), "--json", env=s3.env,
    )  # fmt: skip
    assert absent.code == 3, absent.stdout
    assert absent.json()["error"]["kind"] == "not_found"
    unknown_run = run_npa(
        "workbench", "insights", "compare", "--input-path", str(db),
        "--base-run", "nope", "--candidate-run", runs["bad"], "--json",
    )  # fmt: skip
    assert unknown_run.code == 3


def test_an_unreachable_store_is_unavailable_not_absent(tmp_path: Path) -> None:
    env = {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9",
    }
    r = run_npa(
        "workbench", "insights", "ingest-run", "--input-path", "s3://runs/x/npa-workflow",
        "--output-path", str(tmp_path / "db"), "--json", env=env,
    )  # fmt: skip
    assert r.code == 4, r.stdout + r.stderr
    assert not (tmp_path / "db").exists()


def test_credentials_the_ingesting_machine_never_held_are_not_stored(
    npa_home: Path, tmp_path: Path
) -> None:
    """The stage prints a registry password, a bearer token, a docker auth string, an AWS key
    pair and a URL with a password; the machine that ingests holds none of them (its HOME has
    no Docker, AWS or kube config, its environment no such variable). Their shapes alone keep
    every one of them out of the SQLite file; the digest the stage printed is kept."""
    import base64

    import yaml

    password, bearer = "hunter2-Registry-pw", "ya29.a0AfB_byC9Ex4mpleT0ken"
    basic = base64.b64encode(f"robot:{password}".encode()).decode()
    key_id, aws_secret = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    url_password = "pat-9f3a1c77"
    digest = "sha256:" + "0123456789abcdef" * 4
    printed = (
        f"export REG_PASSWORD='{password}'",
        f"Authorization: Bearer {bearer}",
        '{"auths": {"registry.example.com": {"auth": "' + basic + '"}}}',
        f"aws_access_key_id={key_id}",
        f"secret {aws_secret}",
        f"pushing to https://robot:{url_password}@registry.example.com/v2/",
        f"pushed ghcr.io/o/i@{digest}",
    )
    spec = yaml.safe_load((EXAMPLES / "tiny-local.yaml").read_text())
    spec["stages"][2]["command"] = (
        "; ".join(f"echo {shlex.quote(line)}" for line in printed) + "; exit 3"
    )
    run_id, prefix = _run(npa_home, yaml.safe_dump(spec), tmp_path / "leaky")
    logged = "".join(p.read_text() for p in prefix.glob("stages/total/logs/*.log"))
    # The run really printed them; the executor's copy in the store is already redacted.
    assert "REG_PASSWORD='[REDACTED:" in logged and "[REDACTED:aws-access-key-id]" in logged

    bare_home = tmp_path / "ingesting-home"
    bare_home.mkdir()
    env = {"NPA_HOME": str(npa_home), "HOME": str(bare_home), "KUBECONFIG": "",
           "DOCKER_CONFIG": str(bare_home / "docker")}  # fmt: skip
    out = tmp_path / "reports" / "insights.db"
    ingest(str(prefix), out, env=env)
    stored = b"".join(p.read_bytes() for p in out.parent.iterdir())
    for secret in (password, bearer, basic, key_id, aws_secret, url_password):
        assert secret.encode() not in stored, secret
    with sqlite3.connect(out) as conn:
        tails = " ".join(row[0] for row in conn.execute("SELECT tail FROM logs"))
    assert "REG_PASSWORD='[REDACTED:secret-assignment]'" in tails
    assert f"ghcr.io/o/i@{digest}" in tails

    # The run's HTML report (a file others may read) quotes the failed stage's log tail through
    # the same redaction.
    page = tmp_path / "page.html"
    report = run_npa("workbench", "workflow", "report", run_id, "--project", "demo",
                     "--out", str(page), "--cached", env=env)  # fmt: skip
    assert page.is_file(), report.stdout + report.stderr
    html = page.read_text()
    assert "REDACTED:secret-assignment" in html, html[-2000:]
    for secret in (password, bearer, basic, key_id, aws_secret, url_password):
        assert secret not in html, secret


def test_a_stage_that_echoes_credentials_leaves_none_in_the_store(
    npa_home: Path, tmp_path: Path
) -> None:
    """The stage prints a registry password (from the Docker config), an AWS secret key (from
    the shared credentials file) and a secret-named variable's value, bare; the ingesting
    machine holds them, and the SQLite file, created owner-only, keeps only where each came
    from."""
    import base64
    import os
    import stat

    password, aws_secret, env_token = "hunter2-Registry-pw", "wJalrXUtnFEMI/K7MDENG", "tok-9f3a1c"
    basic = base64.b64encode(f"robot:{password}".encode()).decode()
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / "config.json").write_text(
        json.dumps({"auths": {"registry.example.com": {"auth": basic}}})
    )
    (tmp_path / "aws-credentials").write_text(
        f"[default]\naws_access_key_id = AKIAEXAMPLE0001\naws_secret_access_key = {aws_secret}\n"
    )
    import yaml

    spec = yaml.safe_load((EXAMPLES / "tiny-local.yaml").read_text())
    # Printed bare, in no credential's shape: only a machine holding the values finds them
    # (the run's executor did not hold them, so the store's copy of the log still has them).
    spec["stages"][2]["command"] = (
        f"echo 'logged in with {password}'; "
        f"echo 'aws secret {aws_secret} then {env_token}' >&2; exit 3"
    )
    _, prefix = _run(npa_home, yaml.safe_dump(spec), tmp_path / "leaky")
    logged = "".join(p.read_text() for p in prefix.glob("stages/total/logs/*.log"))
    assert password in logged and aws_secret in logged  # the run really printed them

    env = {
        "NPA_HOME": str(npa_home),
        "HOME": str(npa_home.parent),
        "DOCKER_CONFIG": str(docker),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-credentials"),
        "CI_DEPLOY_TOKEN": env_token,
    }
    out = tmp_path / "reports" / "insights.db"
    old_umask = os.umask(0o022)  # what made the file 0644 before
    try:
        ingest(str(prefix), out, env=env)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.parent.stat().st_mode) == 0o700
    stored = b"".join(p.read_bytes() for p in out.parent.iterdir())
    for secret in (password, basic, aws_secret, env_token):
        assert secret.encode() not in stored, secret
    with sqlite3.connect(out) as conn:
        tails = " ".join(row[0] for row in conn.execute("SELECT tail FROM logs"))
    assert f"[REDACTED:docker-config:{docker / 'config.json'}]" in tails
    assert "[REDACTED:env:CI_DEPLOY_TOKEN]" in tails

    # A store an earlier npa created readable by others is made owner-only on the next ingest.
    out.chmod(0o644)
    ingest(str(prefix), out, env=env)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    # What is not a regular file is refused as a store, without waiting on a FIFO's reader.
    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/zero")):
        r = run_npa("workbench", "insights", "ingest-run", "--input-path", str(prefix),
                    "--output-path", str(target), env=env, timeout=60)  # fmt: skip
        assert r.code == 2 and "not a regular file" in r.stderr, r.stderr


def test_compare_writes_a_page_with_its_chart_that_a_browser_opens(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    from tests.harness.browser import chromium_binary, luminance_spread, open_page

    db = tmp_path / "insights.db"
    for prefix in (runs["good_prefix"], runs["bad_prefix"]):
        ingest(prefix.as_uri(), db)
    page = tmp_path / "compare.html"
    r = run_npa(
        "workbench", "insights", "compare", "--input-path", str(db),
        "--base-run", runs["good"], "--candidate-run", runs["bad"], "--html", str(page), "--json",
    )  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    assert r.json()["html"] == str(page) and r.json()["html_bytes"] == page.stat().st_size
    binary = chromium_binary()
    script = """JSON.stringify({
      first: document.querySelector('#first-divergence').textContent,
      rows: [...document.querySelectorAll('#stages tr[data-stage]')].map(r =>
        [r.dataset.stage, r.dataset.differs]),
      base: document.querySelectorAll('svg.durations rect.bar-base').length,
      candidate: document.querySelectorAll('svg.durations rect.bar-candidate').length,
      labels: [...document.querySelectorAll('svg.durations text')].map(t => t.textContent),
      scripts: document.scripts.length,
    })"""
    loaded = open_page(binary, page, script, tmp_path / "chromium")
    (tmp_path / "compare.png").write_bytes(loaded.screenshot)
    variance, colours = luminance_spread(loaded.screenshot)
    assert variance > 100 and colours > 10
    assert loaded.requests == [page.resolve().as_uri()], loaded.requests
    dom = loaded.value
    assert dom["first"].startswith("First divergence: stage total FAILED (payload)")
    assert dict(dom["rows"]) == {
        "generate": "",
        "square": "metrics",
        "total": "state retries outputs",
    }
    assert dom["base"] == dom["candidate"] == 3
    assert "FAILED" in dom["labels"] and dom["scripts"] == 0


def test_a_full_disk_is_a_full_disk_and_leaves_no_half_made_store(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    from tests.harness.disks import fill, tmpfs

    prefix = str(runs["good_prefix"])
    with tmpfs(tmp_path / "small", "1m") as disk:
        filler = fill(disk)
        db = disk / "insights.db"
        r = run_npa("workbench", "insights", "ingest-run", "--input-path", prefix,
                    "--output-path", str(db), "--json")  # fmt: skip
        # It was "not an npa insights store: database or disk is full", exit 2, and an empty
        # insights.db was left behind.
        assert r.code == 4, r.stdout + r.stderr
        error = r.json()["error"]
        assert "not an npa insights store" not in error["message"], error
        assert str(db) in error["message"] and "No space left" in error["message"], error
        assert error["fix"].startswith(f"df -h {disk} && npa "), error
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]
        # A store that was there is kept whole when the disk fills during an ingest.
        filler.unlink()
        ingest(prefix, db)
        before = sqlite3.connect(db).execute("SELECT COUNT(*) FROM stages").fetchone()
        filler = fill(disk)
        r = run_npa("workbench", "insights", "ingest-run", "--input-path",
                    str(runs["bad_prefix"]), "--output-path", str(db), "--json")  # fmt: skip
        assert r.code == 4 and "No space left" in r.json()["error"]["message"], r.stdout
        filler.unlink()
        after = sqlite3.connect(db).execute("SELECT COUNT(*) FROM stages").fetchone()
        assert after == before
