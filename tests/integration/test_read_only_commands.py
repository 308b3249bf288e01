"""Read-only commands write nothing outside the cache the docs name, and every helper process
npa starts ends with npa.

Each read-only command runs under a HOME of its own (NPA_HOME inside it) and a TMPDIR of its
own; the trees are listed before and after, and only ``$NPA_HOME/cache`` may differ.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import stat
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


Entry = tuple[int, int, int, str]


def tree(root: Path) -> dict[str, Entry]:
    """Every path under ``root`` (directories too) with its mode, size, modification time and,
    for a file, the sha256 of its bytes (a symlink: its target)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                digest = os.readlink(path) if path.is_symlink() else ""
            found[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return found


def changed(before: dict[str, Entry], after: dict[str, Entry]) -> set[str]:
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


def test_skypilot_status_in_a_home_without_sky_creates_none(npa_home: Path, tmp_path: Path) -> None:
    """A user who never ran SkyPilot here: no ~/.sky before, none after (importing SkyPilot
    would create ~/.sky/{user_hash,serve,locks}); no server answers."""
    home = npa_home.parent
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    kubeconfig = tmp_path / "kubeconfig"  # a cluster that does not answer
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"https://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}]}))  # fmt: skip
    env = {"NPA_HOME": str(npa_home), "HOME": str(home), "TMPDIR": str(scratch),
           "KUBECONFIG": str(kubeconfig),
           "SKYPILOT_API_SERVER_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # fmt: skip
    before = tree(home)
    r = run_npa("skypilot", "status", "--project", "demo", "--context", "gone", "--json",
                env=env, timeout=240)  # fmt: skip
    assert r.json()["checks"], r.stdout + r.stderr
    assert not (home / ".sky").exists()
    assert changed(before, tree(home)) == set()
    assert list(scratch.iterdir()) == []


SDK_READ = """
import sys
from npa.backends.skypilot import jobs
service = jobs.SkyManagedJobs(kubeconfig=None)
service._server = __import__("contextlib").nullcontext  # no server: only the import is looked at
with service._sdk():
    import sky  # what queue, logs and the controller log import first
    import sky.jobs.utils
print("imported", sky.__name__)
"""


def test_the_managed_jobs_reads_import_skypilot_with_its_own_home(tmp_path: Path) -> None:
    """status, logs and list of a SkyPilot run read through the managed-jobs client; its
    reads import SkyPilot with SkyPilot's home moved, so the user's home is left as it was."""
    home = tmp_path / "home"
    home.mkdir()
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    env = {**os.environ, "HOME": str(home), "NPA_HOME": str(home / ".npa"),
           "TMPDIR": str(scratch)}  # fmt: skip
    before = tree(home)
    proc = subprocess.run([sys.executable, "-c", SDK_READ], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert "imported sky" in proc.stdout, proc.stdout + proc.stderr
    assert changed(before, tree(home)) == set()
    assert list(scratch.iterdir()) == []  # the private home went with the process


TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_STARTUP", "FAILED_CONTROLLER"}


def _quiet(root: Path, timeout: float = 60) -> dict[str, Entry]:
    """The tree of ``root`` once it stopped changing (a run's executor ends after its record)."""
    import time

    deadline = time.monotonic() + timeout
    last = tree(root)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = tree(root)
        if now == last:
            return now
        last = now
    raise AssertionError(f"{root} kept changing")


def test_the_read_commands_of_a_local_run_write_nothing(npa_home: Path, tmp_path: Path) -> None:
    """status, logs, list, artifacts and gpus of a finished local run: HOME (NPA_HOME and the
    store inside it) and TMPDIR are byte for byte what they were."""
    import json
    import time

    home = npa_home.parent
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    env = {"NPA_HOME": str(npa_home), "HOME": str(home), "TMPDIR": str(scratch)}
    spec = str(EXAMPLES / "tiny-local.yaml")
    prep = run_npa("workbench", "workflow", "prepare-run", spec, "--project", "demo", env=env)
    run_id = prep.stdout.strip()
    sub = run_npa("workbench", "workflow", "submit", spec, "--project", "demo", "--run-id",
                  run_id, "--runtime", "process", "--json", env=env)  # fmt: skip
    assert sub.code == 0, sub.stdout + sub.stderr
    manifest = npa_home / "store" / "tiny-local" / run_id / "npa-workflow" / "manifest.json"
    deadline = time.monotonic() + 300
    while json.loads(manifest.read_text())["state"] not in TERMINAL:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    kubeconfig = tmp_path / "kubeconfig"  # a cluster that does not answer, for gpus
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"https://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}]}))  # fmt: skip
    for entry in scratch.iterdir():
        raise AssertionError(f"the run left {entry} in TMPDIR")
    wf = ("workbench", "workflow")
    # The store's run index is completed once, by the first list that finds it incomplete
    # (docs/storage-layout.md, "The run index"); reads after that write nothing.
    first = run_npa(*wf, "list", "--project", "demo", "--json", env=env)
    assert first.code == 0 and "index_note" in first.stdout, first.stdout + first.stderr
    before = _quiet(home)
    for args in (
        (*wf, "status", run_id, "--project", "demo", "--json"),
        (*wf, "status", run_id, "--project", "demo", "--cached"),
        (*wf, "logs", run_id, "--project", "demo", "--stage", "total"),
        (*wf, "list", "--project", "demo", "--json"),
        (*wf, "artifacts", run_id, "--project", "demo", "--json"),
        (*wf, "gpus", "--context", "gone", "--json"),
    ):
        r = run_npa(*args, env={**env, "KUBECONFIG": str(kubeconfig)}, cwd=str(tmp_path))
        assert r.code in (0, 1, 4), (args, r.stdout, r.stderr)  # gpus: the cluster is down
        assert changed(before, tree(home)) == set(), args
        assert list(scratch.iterdir()) == [], args


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


def _pip_processes(venv: Path) -> list[int]:
    """Live (not zombie) processes running ``venv``'s pip."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and str(venv).encode() in b" ".join(cmdline) and b"pip" in cmdline:
            found.append(int(entry.name))
    return found


def test_bootstraps_real_pip_against_a_silent_index_ends_with_npa(tmp_path: Path) -> None:
    """npa skypilot bootstrap creates a venv and runs its real pip against an index that
    accepts the connection and never answers (pip waits on it); SIGTERM to npa leaves no pip
    process behind."""
    import socket

    from tests.harness.procs import wait_until

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepted by the kernel, never read or answered
    port = silent.getsockname()[1]
    venv = tmp_path / "venv"
    env = {**os.environ, "HOME": str(tmp_path), "NPA_HOME": str(tmp_path / ".npa"),
           "PIP_INDEX_URL": f"http://127.0.0.1:{port}/simple", "PIP_TIMEOUT": "600",
           "PIP_RETRIES": "0", "PIP_CONFIG_FILE": os.devnull}  # fmt: skip
    env.pop("PIP_FIND_LINKS", None)
    npa = subprocess.Popen(
        [sys.executable, "-m", "npa", "skypilot", "bootstrap", "--venv", str(venv)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: bool(_pip_processes(venv)), "pip started", timeout=240)
        pips = _pip_processes(venv)
        npa.send_signal(signal.SIGTERM)
        npa.communicate(timeout=120)
        assert npa.returncode == 128 + signal.SIGTERM, npa.returncode
        wait_until(lambda: not _pip_processes(venv), "pip is gone", timeout=30)
        for pid in pips:
            assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid
    finally:
        if npa.poll() is None:
            os.killpg(npa.pid, signal.SIGKILL)
            npa.communicate()
        for pid in _pip_processes(venv):  # never leave one behind, whatever failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        silent.close()


LIBRARY_CHILDREN = """
import signal, subprocess, sys
from npa.core.ending import end_children_on_signals
end_children_on_signals()
# As a library starts its helper (the Pulumi Automation API's pulumi): npa's own group.
plain = subprocess.Popen(["sh", "-c", "sleep 600 & wait"])
# Meant to outlive npa (a run's watcher): a session of its own.
detached = subprocess.Popen(["sleep", "602"], start_new_session=True)
print(plain.pid, detached.pid, flush=True)
signal.pause()
"""


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] != "Z":
                    found.append(int(entry.name))
    return found


def test_children_a_library_started_end_with_npa_and_detached_ones_do_not(
    tmp_path: Path,
) -> None:
    """A helper npa did not start through run_child (a library's own subprocess, with a
    grandchild) is ended when npa gets SIGTERM; a process started in a session of its own is
    left running, as a run's watcher must be."""
    from tests.harness.procs import wait_until

    proc = subprocess.Popen([sys.executable, "-c", LIBRARY_CHILDREN], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    detached = 0
    try:
        assert proc.stdout is not None
        plain, detached = (int(x) for x in proc.stdout.readline().split())
        wait_until(lambda: bool(_children_of(plain)), "the grandchild started", timeout=30)
        grandchild = _children_of(plain)[0]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM
        for pid in (plain, grandchild):
            wait_until(lambda p=pid: not Path(f"/proc/{p}").exists() or _zombie(p),
                       f"{pid} is gone", timeout=30)  # fmt: skip
        assert Path(f"/proc/{detached}").exists() and not _zombie(detached)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if detached:
            with contextlib.suppress(ProcessLookupError):
                os.kill(detached, signal.SIGKILL)
