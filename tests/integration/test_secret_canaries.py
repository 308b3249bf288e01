"""No credential a stage printed is kept by npa, whoever ingests, reports or reads back the run.

A local run (process runtime) whose stage is given a registry password as a declared secret
prints it bare and prints a second credential the stage derives at run time (so no
environment, spec or config holds it) in the forms programs print credentials in. The run is
then read back (logs, status, report), ingested into insights by a shell that holds neither
value, and compared. Every file npa wrote (HOME with NPA_HOME and the store inside it, the
insights database, the report pages, TMPDIR) is scanned byte by byte for the canaries.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
import yaml

from tests.harness.cli import run_npa

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_STARTUP", "FAILED_CONTROLLER"}
# The registry password the submitting shell holds (under a name that does not say "secret").
PASSWORD = "Canary7regPw-q4Zt9xK"
# What the stage derives at run time: the password reversed, found by its shape only.
DERIVED = PASSWORD[::-1]
# The stage prints the bare password (a known value: the stage's declared secret), then the
# derived one as an assignment, an export, a JSON and a YAML field, a bearer token, a URL's
# password and a docker auth string.
PRINTS = r"""
echo "password is $REG_PASSWORD"
echo "$REG_PASSWORD"
D=$(printf %s "$REG_PASSWORD" | rev)
echo "DB_PASSWORD=$D"
echo "export API_TOKEN=$D"
printf '{"password": "%s"}\n' "$D"
printf 'client_secret: %s\n' "$D"
echo "Authorization: Bearer $D"
echo "pushing to https://robot:$D@registry.example.com/v2/"
printf '{"auths": {"r.example": {"auth": "%s"}}}\n' "$(printf 'robot:%s' "$D" | base64)"
echo "pushed ghcr.io/o/i@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
exit 3
"""


def canaries() -> list[bytes]:
    found = []
    for value in (PASSWORD, DERIVED):
        found += [value.encode(), base64.b64encode(f"robot:{value}".encode())]
    return found


def files_under(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


def test_no_file_npa_writes_keeps_a_credential_a_stage_printed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    npa_home = home / ".npa"
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    spec = yaml.safe_load((EXAMPLES / "tiny-local.yaml").read_text())
    spec["stages"][2]["command"] = PRINTS.strip().replace("\n", "; ")
    spec["stages"][2]["secrets"] = {"REG_PASSWORD": "env:SUBMITTER_REGISTRY_CRED"}
    spec_file = tmp_path / "work" / "spec.yaml"
    spec_file.parent.mkdir()
    spec_file.write_text(yaml.safe_dump(spec))
    base = {"HOME": str(home), "NPA_HOME": str(npa_home), "TMPDIR": str(scratch),
            "KUBECONFIG": "", "DOCKER_CONFIG": str(home / ".docker")}  # fmt: skip
    submitter = {**base, "SUBMITTER_REGISTRY_CRED": PASSWORD}
    for name in os.environ:  # the test's own environment holds neither canary
        assert PASSWORD not in os.environ[name] and DERIVED not in os.environ[name]

    prep = run_npa("workbench", "workflow", "prepare-run", str(spec_file), "--project", "demo",
                   env=submitter, cwd=str(spec_file.parent))  # fmt: skip
    assert prep.code == 0, prep.stderr
    run_id = prep.stdout.strip()
    sub = run_npa("workbench", "workflow", "submit", str(spec_file), "--project", "demo",
                  "--run-id", run_id, "--runtime", "process", "--retries", "0", "--json",
                  env=submitter, cwd=str(spec_file.parent))  # fmt: skip
    assert sub.code == 0, sub.stdout + sub.stderr
    prefix = npa_home / "store" / "tiny-local" / run_id / "npa-workflow"
    deadline = time.monotonic() + 300
    while json.loads((prefix / "manifest.json").read_text())["state"] not in TERMINAL:
        assert time.monotonic() < deadline, "the run did not finish"
        time.sleep(0.2)

    # The stage really printed them: each line is there, with its credential taken out.
    stored = "".join(p.read_text() for p in prefix.glob("stages/total/logs/*.log"))
    assert "[REDACTED:secret:REG_PASSWORD]" in stored, stored
    assert "DB_PASSWORD=[REDACTED:secret-assignment]" in stored, stored
    assert "https://robot:[REDACTED:url-password]@registry.example.com" in stored, stored
    assert "ghcr.io/o/i@sha256:0123456789abcdef" in stored  # ordinary text kept

    # Read back, ingested and reported from a shell that holds neither value.
    reader = dict(base)
    for args in (
        ("workbench", "workflow", "logs", run_id, "--project", "demo", "--stage", "total"),
        ("workbench", "workflow", "status", run_id, "--project", "demo", "--json"),
        ("workbench", "workflow", "report", run_id, "--project", "demo",
         "--out", str(tmp_path / "out" / "report.html")),
    ):  # fmt: skip
        r = run_npa(*args, env=reader, cwd=str(tmp_path))
        for canary in canaries():
            assert canary.decode() not in r.stdout + r.stderr, (args, canary)
    db = tmp_path / "out" / "insights.db"
    r = run_npa("workbench", "insights", "ingest-run", "--input-path", str(prefix),
                "--output-path", str(db), "--json", env=reader)  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    r = run_npa("workbench", "insights", "compare", "--input-path", str(db), "--base-run",
                run_id, "--candidate-run", run_id, "--html", str(tmp_path / "out" / "cmp.html"),
                env=reader)  # fmt: skip
    with sqlite3.connect(db) as conn:
        tails = " ".join(row[0] for row in conn.execute("SELECT tail FROM logs"))
    assert "[REDACTED:" in tails, tails  # the printed lines reached the database

    scanned = files_under(home, tmp_path / "out", scratch, spec_file.parent)
    assert db in scanned and any(p.suffix == ".log" for p in scanned)
    for path in scanned:
        data = path.read_bytes()
        for canary in canaries():
            assert canary not in data, f"{canary!r} in {path}"
