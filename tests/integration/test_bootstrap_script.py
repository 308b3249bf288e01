"""scripts/bootstrap-tools on a machine that has never run it.

Every test runs the script as a fresh machine sees it: an empty tools cache, an empty PULUMI_HOME
and a PATH that is a folder of links to only the base commands the script needs, so none of the
tools it installs can be found by accident. A run that loops is killed with its whole process
group and fails the test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bootstrap-tools"
BASE_COMMANDS = [
    "bash",
    "env",
    "sed",
    "head",
    "dirname",
    "date",
    "id",
    "tr",
    "cut",
    "grep",
    "cat",
    "mkdir",
    "mv",
    "rm",
    "sleep",
    "tail",
    "timeout",
    "chmod",
    "cp",
    "sort",
    "sha256sum",
    "ldd",
]
TOOLS = (
    "pulumi",
    "kubernetes-plugin",
    "etcd",
    "kube-apiserver",
    "registry",
    "skypilot-deps",
    "shellcheck",
    "chromium",
    "busybox",
    "podman",
    "docker-client",
    "cluster-packages",
    "kube-node",
    "cluster-images",
)
REPO_VENV_PYTHON = REPO / ".venv" / "bin" / "python3"


def bare_path(root: Path, *extra: str) -> Path:
    """A PATH folder holding links to the base commands and to ``extra`` (name or name=target)."""
    path = root / "bin"
    path.mkdir(parents=True)
    for spec in (*BASE_COMMANDS, *extra):
        name, _, target = spec.partition("=")
        found = target or shutil.which(name)
        assert found, f"this machine lacks the base command {name}"
        (path / name).symlink_to(found)
    return path


def run_script(
    tmp: Path, path: Path, *args: str, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {
        "HOME": str(tmp / "home"),
        "PATH": str(path),
        "NPA_TOOLS_CACHE": str(tmp / "cache"),
        "PULUMI_HOME": str(tmp / "pulumi-home"),
        "NPA_BOOTSTRAP_OFFLINE": "1",
        # Go's usual home is looked in when go is not on PATH: by default, a folder with none.
        "NPA_GO_HOME": str(tmp / "no-go"),
        **env,
    }
    proc = subprocess.Popen(
        [str(path / "bash"), str(SCRIPT), *args],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"bootstrap-tools {' '.join(args)} did not finish in {timeout}s (a loop?)")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def plan_lines(out: str) -> dict[str, str]:
    lines = {}
    for line in out.splitlines():
        m = re.match(r"^  (\S+)\s+(.*)$", line)
        if m:
            lines[m.group(1)] = m.group(2)
    return lines


def test_no_function_shares_a_name_with_a_command() -> None:
    text = SCRIPT.read_text()
    functions = set(re.findall(r"^\s*([A-Za-z_][\w-]*)\s*\(\)\s*\{", text, re.M))
    looked_up = set()
    for args in re.findall(r"find_exe ([\w .-]+)", text):
        looked_up.update(a for a in args.split() if not a.startswith("-"))
    assert functions and looked_up
    assert not functions & looked_up, "a function is named like a command it looks up"
    # A function named like a command would answer `command -v`: the script must not use it,
    # and no function may be named like any command on this machine's PATH either.
    assert "command -v" not in text
    shadowing = {f for f in functions if shutil.which(f)}
    assert not shadowing, f"functions named like commands on PATH: {sorted(shadowing)}"


def fake_py310(tmp_path: Path) -> Path:
    """A CPython 3.10 prefix as the image build reads it (only its version is asked)."""
    prefix = tmp_path / "py310"
    (prefix / "bin").mkdir(parents=True)
    exe = prefix / "bin" / "python3.10"
    exe.write_text("#!/bin/sh\necho 'Python 3.10.13'\n")
    exe.chmod(0o755)
    return prefix


def venv_python(tmp_path: Path) -> Path:
    """The venv's python3 as `make` puts it on PATH (a venv knows itself only by its own path)."""
    wrapper = tmp_path / "venv-python3"
    wrapper.write_text(f'#!/bin/sh\nexec {REPO_VENV_PYTHON} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_plan_on_a_bare_machine_names_every_tool_and_what_provides_it(tmp_path: Path) -> None:
    # Go, apt-get and the venv's python3 (make creates the venv before it bootstraps the tools).
    path = bare_path(
        tmp_path,
        "go=" + (shutil.which("go") or "/usr/local/go/bin/go"),
        "apt-get",
        f"python3={venv_python(tmp_path)}",
    )
    started = time.monotonic()
    result = run_script(
        tmp_path,
        path,
        "--plan",
        timeout=30,
        NPA_PY310=str(fake_py310(tmp_path)),
        NPA_CNI_BIN_DIR=str(tmp_path / "no-cni"),
    )
    assert time.monotonic() - started < 30
    assert result.returncode == 0, result.stdout
    lines = plan_lines(result.stdout)
    assert set(lines) == set(TOOLS), result.stdout
    for tool in ("pulumi", "kubernetes-plugin", "kube-apiserver", "kube-node", "cluster-images"):
        assert lines[tool].startswith("missing; will build: "), lines[tool]
        assert "min" in lines[tool]  # how long the build is expected to take
    assert "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi@v" in lines["pulumi"]
    assert "kubelet" in lines["kube-node"] and "kubectl" in lines["kube-node"]
    for tool, package in (
        ("etcd", "etcd-server"),
        ("registry", "docker-registry"),
        ("skypilot-deps", "socat netcat-openbsd"),
        ("shellcheck", "shellcheck"),
        ("chromium", "chromium"),
        ("busybox", "busybox-static"),
        ("podman", "podman"),
        ("docker-client", "docker.io"),
        ("cluster-packages", "containerd"),
        ("cluster-packages", "containernetworking-plugins"),
        ("cluster-packages", "busybox-static"),
    ):
        assert lines[tool].startswith("missing; will install: "), lines[tool]
        assert package in lines[tool]
    # The plan is read-only: no cache, no PULUMI_HOME, no env file.
    assert not (tmp_path / "cache").exists()
    assert not (tmp_path / "pulumi-home").exists()


def test_plan_without_go_or_apt_says_what_cannot_be_provided(tmp_path: Path) -> None:
    path = bare_path(tmp_path)
    result = run_script(tmp_path, path, "--plan", timeout=30)
    assert result.returncode == 1, result.stdout
    lines = plan_lines(result.stdout)
    assert set(lines) == set(TOOLS)
    for tool, line in lines.items():
        assert line.startswith("missing; cannot be provided here: "), (tool, line)
        assert "; fix: " in line
    assert "Go is not on PATH" in lines["pulumi"]
    assert "apt-get install -y etcd-server" in lines["etcd"]
    assert "Go is not on PATH" in lines["kube-node"]
    assert "CPython 3.10" in lines["cluster-images"]


def test_go_in_its_usual_home_but_not_on_path_is_found(tmp_path: Path) -> None:
    # A shell started with `env -i`, cron or a CI runner has Go's archive unpacked but not on PATH.
    go_home = tmp_path / "go"
    (go_home / "bin").mkdir(parents=True)
    (go_home / "bin" / "go").symlink_to(shutil.which("go") or "/usr/local/go/bin/go")
    path = bare_path(tmp_path)
    result = run_script(
        tmp_path, path, "--plan", "--profile", "demo", timeout=30, NPA_GO_HOME=str(go_home)
    )
    assert result.returncode == 0, result.stdout
    line = plan_lines(result.stdout)["pulumi"]
    assert line.startswith("missing; will build: "), line
    # A go that is not an executable file there is not taken for one.
    (go_home / "bin" / "go").unlink()
    (go_home / "bin" / "go").write_text("not a program")
    result = run_script(
        tmp_path, path, "--plan", "--profile", "demo", timeout=30, NPA_GO_HOME=str(go_home)
    )
    assert result.returncode == 1, result.stdout
    assert "NPA_GO_HOME" in plan_lines(result.stdout)["pulumi"]


def test_demo_profile_needs_only_pulumi(tmp_path: Path) -> None:
    path = bare_path(tmp_path, "go=" + (shutil.which("go") or "/usr/local/go/bin/go"))
    result = run_script(tmp_path, path, "--plan", "--profile", "demo", timeout=30)
    assert result.returncode == 0, result.stdout
    assert set(plan_lines(result.stdout)) == {"pulumi"}


def test_skip_leaves_only_the_named_tools_out_of_the_profile(tmp_path: Path) -> None:
    path = bare_path(tmp_path)
    whole = run_script(tmp_path, path, "--plan", timeout=30)
    skipped = run_script(
        tmp_path, path, "--plan", "--skip", "cluster-images", "--skip", "podman", timeout=30
    )
    assert set(plan_lines(whole.stdout)) - set(plan_lines(skipped.stdout)) == {
        "cluster-images",
        "podman",
    }
    assert set(plan_lines(skipped.stdout)) < set(plan_lines(whole.stdout))


def test_bad_arguments_fail_fast_with_the_choices(tmp_path: Path) -> None:
    path = bare_path(tmp_path)
    for args, needle in (
        (("--only", "registr"), "unknown tool: registr"),
        (("--profile", "everything"), "unknown profile: everything"),
        (("--bogus",), "unknown argument: --bogus"),
        (("--only",), "--only needs a tool name"),
        (("--skip",), "--skip needs a tool name"),
        (("--skip", "podmn"), "unknown tool: podmn"),
        (("--profile", "demo", "--skip", "pulumi"), "--skip left no tool to provide"),
    ):
        result = run_script(tmp_path, path, *args, timeout=15)
        assert result.returncode != 0
        assert needle in result.stdout


def test_a_run_started_from_inside_a_run_refuses_to_recurse(tmp_path: Path) -> None:
    path = bare_path(tmp_path)
    result = run_script(tmp_path, path, "--plan", timeout=15, NPA_BOOTSTRAP_ACTIVE="4242")
    assert result.returncode == 3
    assert "refusing to recurse" in result.stdout


FAKE_GO = """#!/bin/sh
# Stands in for the Go toolchain: logs each call, takes a few seconds like a real build.
echo "$*" >>"$FAKE_GO_LOG"
case "$1" in
  mod) [ "$2" = init ] && printf 'module %s\\n' "$3" >go.mod ;;
  get) sleep 2.5 ;;
  build)
    out=""
    while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
    sleep 2.5
    printf '#!/bin/sh\\necho "etcd Version: 3.6.8"\\n' >"$out"
    chmod +x "$out" ;;
esac
"""


def test_a_build_announces_itself_reports_progress_and_is_cached(tmp_path: Path) -> None:
    go = tmp_path / "fake-go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    calls = tmp_path / "go-calls.log"
    path = bare_path(tmp_path, f"go={go}")
    env = {"NPA_BOOTSTRAP_PROGRESS_SECONDS": "1", "FAKE_GO_LOG": str(calls)}

    first = run_script(tmp_path, path, "--only", "etcd", timeout=60, **env)
    assert first.returncode == 0, first.stdout
    out = first.stdout
    assert "expect about 3 min" in out
    assert "the result is cached in" in out
    assert re.search(r"etcd: downloading modules, \d+s in this step, \d+s in all", out), out
    assert re.search(r"etcd: compiling, \d+s in this step, \d+s in all", out), out
    assert "built in" in out
    built = tmp_path / "cache" / "etcd-v3.6.8" / "etcd"
    assert os.access(built, os.X_OK)
    env_sh = (tmp_path / "cache" / "env.sh").read_text()
    assert f'export NPA_ETCD_BIN="{built}"' in env_sh
    n_calls = len(calls.read_text().splitlines())

    started = time.monotonic()
    second = run_script(tmp_path, path, "--only", "etcd", timeout=30, **env)
    assert second.returncode == 0, second.stdout
    assert time.monotonic() - started < 5
    assert f"etcd: {built} (built earlier)" in second.stdout
    assert len(calls.read_text().splitlines()) == n_calls  # nothing was built again


def test_a_failed_build_says_which_step_and_leaves_no_binary(tmp_path: Path) -> None:
    go = tmp_path / "fake-go"
    go.write_text('#!/bin/sh\n[ "$1" = get ] && { echo "proxy said 403" >&2; exit 1; }\nexit 0\n')
    go.chmod(0o755)
    path = bare_path(tmp_path, f"go={go}")
    result = run_script(tmp_path, path, "--only", "etcd", timeout=30)
    assert result.returncode == 1
    assert "proxy said 403" in result.stdout
    assert "etcd: downloading modules failed (exit 1); full log:" in result.stdout
    assert not (tmp_path / "cache" / "etcd-v3.6.8" / "etcd").exists()
    assert not (tmp_path / "cache" / "env.sh").exists()


def test_make_demo_bootstraps_only_the_demo_profile_and_make_test_everything() -> None:
    make = shutil.which("make")
    assert make
    demo = subprocess.run([make, "-n", "-C", str(REPO), "demo"], capture_output=True, text=True)
    test = subprocess.run([make, "-n", "-C", str(REPO), "test"], capture_output=True, text=True)
    assert "bootstrap-tools --profile demo" in demo.stdout
    assert "--profile test" not in demo.stdout
    assert "bootstrap-tools --profile test" in test.stdout
    # The cluster images are built for the venv's SkyPilot: never beside the venv's install
    # (make -j2), always after it, with the venv first on PATH.
    lines = test.stdout.splitlines()
    [parallel] = [i for i, line in enumerate(lines) if "--profile test" in line]
    assert "--skip cluster-images" in lines[parallel]
    [images] = [i for i, line in enumerate(lines) if "--only cluster-images" in line]
    assert images > parallel and "/.venv/bin:" in lines[images]
    # Every script, also those in folders under scripts/ (shellcheck refuses a folder).
    [checked] = [line for line in test.stdout.splitlines() if line.startswith("shellcheck -x")]
    for script in (p for p in (REPO / "scripts").rglob("*") if p.is_file()):
        assert str(script.relative_to(REPO)) in checked.split()


def test_the_system_folders_are_on_path_for_the_script_and_in_env_sh(tmp_path: Path) -> None:
    # A PATH without the sbin folders (Debian's default for other users than root, env -i): the
    # tools found there (iptables, which podman's network helper runs; mount; ip) must still be
    # found, by the script and by whatever sources env.sh. The folders go last, never first.
    sbin = [d for d in ("/usr/local/sbin", "/usr/sbin", "/sbin") if Path(d).is_dir()]
    system_tool = next(
        (name for name in ("iptables", "ip", "mount", "ldconfig")
         if any(os.access(Path(d) / name, os.X_OK) for d in ("/usr/sbin", "/sbin"))), None,
    )  # fmt: skip
    assert system_tool, "this machine has no system tool in the sbin folders"
    path = bare_path(tmp_path, "dpkg-query")
    result = run_script(tmp_path, path, "--only", "busybox")
    assert result.returncode == 0, result.stdout
    env_sh = tmp_path / "cache" / "env.sh"
    probe = f'. "{env_sh}"; . "{env_sh}"; echo "$PATH"; command -v {system_tool}'
    sourced = subprocess.run([str(path / "bash"), "-c", probe], env={"PATH": str(path)},
                             capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert sourced.returncode == 0, sourced.stdout + sourced.stderr
    searched, found = sourced.stdout.splitlines()
    assert searched.split(":") == [str(path), *sbin]  # once each, after the user's own
    assert Path(found).parent.as_posix() in sbin
