"""Read-only commands write nothing outside the cache the docs name, and every helper process
npa starts ends with npa.

Each read-only command runs under a HOME of its own (NPA_HOME inside it) and a TMPDIR of its
own; the trees are listed before and after, and only ``$NPA_HOME/cache`` may differ.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.harness.cli import run_npa
from tests.harness.procs import free_port, wait_until
from tests.harness.registry import Registry
from tests.integration.imagespec import push_attested, write_spec

pytestmark = pytest.mark.integration


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and modification time (directories too)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            found[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return found


def changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> set[str]:
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def outside_cache(paths: set[str], npa_home: Path, home: Path) -> set[str]:
    """``paths`` but the cache, its contents and the folders made to hold it."""
    cache = str((npa_home / "cache").relative_to(home))
    return {
        p
        for p in paths
        if p != cache and not p.startswith(cache + os.sep) and not cache.startswith(p + os.sep)
    }


@pytest.fixture
def sky_user_files(npa_home: Path) -> dict[str, str]:
    """A user's own ~/.sky as `sky api login` leaves it: an endpoint and a user id."""
    home = npa_home.parent
    port = free_port()  # nothing listens: the server is down, which status must say
    sky = home / ".sky"
    sky.mkdir()
    (sky / "config.yaml").write_text(
        yaml.safe_dump({"api_server": {"endpoint": f"http://127.0.0.1:{port}"}})
    )
    (sky / "user_hash").write_text("a1b2c3d4\n")
    return {"endpoint": f"http://127.0.0.1:{port}"}


def test_skypilot_status_and_verify_write_nothing_in_the_users_home(
    npa_home: Path, tmp_path: Path, sky_user_files: dict[str, str]
) -> None:
    """Importing SkyPilot creates ~/.sky/{user_hash,serve,locks}; status and verify import it
    (and start a probe that does), yet leave HOME and TMPDIR as they were, while still reading
    the user's SkyPilot configuration (the endpoint status reports is the configured one)."""
    home = npa_home.parent
    # A placed kubeconfig for a cluster that does not answer: verify runs every check,
    # SkyPilot's own included, and each fails fast.
    kubeconfig = npa_home / "clusters" / "gone" / "kubeconfig"
    kubeconfig.parent.mkdir(parents=True)
    kubeconfig.write_text(
        yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "gone",
            "clusters": [{"name": "gone", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                                      "insecure-skip-tls-verify": True}}],
            "users": [{"name": "u", "user": {"token": "t0ken-for-nothing"}}],
            "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}],
        })
    )  # fmt: skip
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    env = {"NPA_HOME": str(npa_home), "HOME": str(home), "TMPDIR": str(scratch),
           "KUBECONFIG": str(kubeconfig)}  # fmt: skip
    for name in ("SKYPILOT_API_SERVER_ENDPOINT", "SKYPILOT_GLOBAL_CONFIG", "SKYPILOT_USER_ID"):
        assert name not in os.environ  # the user's ~/.sky decides, as it would for them
    before = tree(home)

    status = run_npa("skypilot", "status", "--project", "demo", "--context", "gone", "--json",
                     env=env, timeout=240)  # fmt: skip
    checks = {c["name"]: c for c in status.json()["checks"]}
    assert checks["api server"]["answer"] in ("not running", "unreachable"), checks["api server"]
    assert checks["api server"]["facts"]["url"] == sky_user_files["endpoint"]
    verify = run_npa("skypilot", "verify", "--cluster", "gone", "--output-format", "json",
                     env=env, timeout=240)  # fmt: skip
    names = [c["name"] for c in verify.json()["checks"]]
    assert "sky check" in names, verify.stdout  # SkyPilot's own code ran

    assert changed(before, tree(home)) == set()
    assert list(scratch.iterdir()) == []  # SkyPilot's private home is gone too


def test_preflight_images_writes_only_its_documented_cache(
    registry: Registry, npa_home: Path, tmp_path: Path
) -> None:
    good = push_attested(registry, "ro", index=True)
    work = tmp_path / "work"
    work.mkdir()
    image = f"{registry.host}/{good.repository}:v1"
    spec = write_spec(work / "spec.yaml", {"good": {"image": image}})
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    env = {"REG_AUTH": f"{registry.auth[0]}:{registry.auth[1]}", "NPA_HOME": str(npa_home),
           "HOME": str(npa_home.parent), "TMPDIR": str(scratch)}  # fmt: skip
    home = npa_home.parent
    before, work_before = tree(home), tree(work)
    auth = f"--registry-auth={registry.host}=env:REG_AUTH"
    r = run_npa("workbench", "workflow", "preflight-images", str(spec), auth, "--json",
                env=env, cwd=work)  # fmt: skip
    assert r.code == 0, r.stdout + r.stderr
    written = changed(before, tree(home))
    assert written, "the verification cache was written"  # what the docs say it keeps
    assert outside_cache(written, npa_home, home) == set(), written
    assert changed(work_before, tree(work)) == set()
    assert list(scratch.iterdir()) == []


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    "args",
    [
        ("workbench", "workflow", "validate-spec", str(EXAMPLES / "tiny-local.yaml")),
        ("workbench", "workflow", "plan-spec", str(EXAMPLES / "physical-ai.yaml"),
         "--run-id", "20261203-000000-abcdef", "--quota-file", str(EXAMPLES / "quota-ample.yaml")),
        ("configure", "--show"),
    ],
    ids=["validate-spec", "plan-spec", "configure-show"],
)  # fmt: skip
def test_the_other_read_only_gates_write_nothing(
    args: tuple[str, ...], npa_home: Path, tmp_path: Path
) -> None:
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    home = npa_home.parent
    env = {"NPA_HOME": str(npa_home), "HOME": str(home), "TMPDIR": str(scratch)}
    before = tree(home)
    r = run_npa(*args, env=env, cwd=str(tmp_path))
    assert r.code == 0, r.stdout + r.stderr
    assert changed(before, tree(home)) == set()
    assert list(scratch.iterdir()) == []


STUB_PYTHON = """#!/bin/sh
# A venv's python: answers npa's probe with a SkyPilot npa must repair, and as pip it starts a
# grandchild and waits for ever (a slow install), recording its process group first.
if [ "$1" = "-c" ]; then
  echo 'NPA-PROBE {"python": "3.11.0", "skypilot": "0.0.1", "kubernetes": "35.0.0", "declared": []}'
  exit 0
fi
sleep 600 &
echo "$$ $(ps -o pgid= -p $$ | tr -d ' ') $!" > "$STUB_MARK.tmp"
mv "$STUB_MARK.tmp" "$STUB_MARK"
wait
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_bootstraps_pip_ends_with_npa(tmp_path: Path, sig: signal.Signals) -> None:
    """npa skypilot bootstrap --repair runs pip; npa is told to stop while pip works: pip and
    the process it started are gone with npa, not left running under PID 1."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(STUB_PYTHON)
    python.chmod(0o755)
    mark = tmp_path / "pip-started"
    env = {**os.environ, "STUB_MARK": str(mark), "HOME": str(tmp_path),
           "NPA_HOME": str(tmp_path / ".npa")}  # fmt: skip
    npa = subprocess.Popen(
        [sys.executable, "-m", "npa", "skypilot", "bootstrap", "--venv", str(venv), "--repair"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(mark.exists, "pip started", timeout=120)
        pid, pgid, grandchild = (int(x) for x in mark.read_text().split())
        own_group = pgid != npa.pid  # npa leads its own session's group
        npa.send_signal(sig)
        npa.communicate(timeout=120)
        assert npa.returncode != 0

        def group_gone() -> bool:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_until(group_gone, "pip's process group is gone", timeout=30)
        for member in (pid, grandchild):
            assert not Path(f"/proc/{member}").exists() or _zombie(member), member
        assert own_group  # pip ran in a process group of its own (Ctrl-C never reached it)
    finally:
        if npa.poll() is None:
            os.killpg(npa.pid, signal.SIGKILL)
            npa.communicate()
        if mark.exists():  # never leave the stub's processes behind, whatever failed
            pgid = int(mark.read_text().split()[1])
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
