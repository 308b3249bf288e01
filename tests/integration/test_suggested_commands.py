"""Every command npa suggests runs as printed (issue 29): a corpus of real failures and
successes goes through the real CLI, and every ``fix:`` and ``next:`` line it prints (in text,
and the ``fix``/``next`` fields under ``--json``) is held to what a user pastes:

- one command, never prose or "X or Y" (a ``# comment`` after it may explain);
- a shell line; an ``npa`` line is parsed by npa's own CLI (tests/unit/test_docs_commands'
  ``problems``, the one parser of command lines): every command, flag and argument exists and
  click accepts the values;
- no placeholder npa could have filled (test_fix_lines' list; the one allowed is a secret);
- an assignment or ``export`` names a variable bash accepts;
- another tool's line has that tool's shape, and an ``aws`` line carries the endpoint and
  profile npa itself used.

test_fix_lines checks the source of every ``fix=``; this checks what the values make of it.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import CliResult, run_npa
from tests.harness.registry import Registry
from tests.harness.s3 import S3Server
from tests.integration.imagespec import unique_repo, write_spec
from tests.unit.test_docs_commands import problems as npa_line_problems
from tests.unit.test_fix_lines import PLACEHOLDER, _command_part

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WF = ("workbench", "workflow")
UNKNOWN_RUN = "20260101-120000-abcdef"
# A line npa prints: ``  fix: COMMAND`` / ``  next: COMMAND`` (a gate's fix is indented deeper).
_PRINTED = re.compile(r"^\s*(?:fix|next):\s+(?P<line>\S.*)$")
# The fields of --json output that hold a command to run.
_FIELDS = ("fix", "next", "resume_command")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"(?P<name>[^=\s-][^=\s]*)=(?P<value>.*)", re.S)
# An upper-case word standing alone as an argument is a placeholder (RUN_ID, STAGE, P).
_UPPER_WORD = re.compile(r"[A-Z][A-Z0-9_]*")
# Subcommands of other tools a suggestion may use.
_TOOL_VERBS = {
    "pulumi": {"plugin", "stack", "login", "cancel", "whoami", "version", "refresh", "config"},
    "docker": {"login", "pull", "push", "manifest", "buildx", "image"},
    "aws": {"s3", "s3api", "sts", "configure"},
    "kubectl": None,
    "curl": None,
    "df": None,
    "ls": None,
    "cat": None,
    "sky": None,
    "nebius": None,
    "printf": None,  # lines appended to an ignore file
    "${EDITOR:-vi}": None,  # opens a file npa names (a quota file, an --existing file)
}


# --- the checks --------------------------------------------------------------------------------


def line_problems(line: str, aws: tuple[str, ...] = ()) -> list[str]:
    """What keeps ``line`` (one suggestion as printed) from running as it is. ``aws`` holds the
    flags (with values) npa used to reach the store, which an ``aws`` line must carry."""
    command = _command_part(line).strip()
    found = []
    placeholder = PLACEHOLDER.search(command)
    if placeholder:
        found.append(f"placeholder {placeholder.group(0)!r}")
    try:
        words = shlex.split(command)
    except ValueError as exc:
        return [*found, f"not a shell line ({exc})"]
    if "or" in words:
        found.append("two commands joined by 'or' (a suggestion is one command)")
    parts: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            parts.append([])
        else:
            parts[-1].append(word)
    for part in parts:
        found += _command_problems(part, aws)
    return found


def _command_problems(words: list[str], aws: tuple[str, ...]) -> list[str]:
    found = []
    while words and (assign := _ASSIGNMENT.fullmatch(words[0])):
        found += _variable_problems(assign["name"])
        value = assign["value"]
        if value.startswith("$(") and value.endswith(")"):
            found += line_problems(value[2:-1], aws)
        words = words[1:]
    if not words:
        return found  # a plain assignment: RUN_ID="$(npa ... prepare-run ...)"
    tool, args = words[0], words[1:]
    if tool == "export":
        for arg in args:
            assign = _ASSIGNMENT.fullmatch(arg)
            found += _variable_problems(assign["name"] if assign else arg)
        return found
    if tool == "read":
        return found + _variable_problems(args[-1] if args else "")
    found += [f"placeholder {w!r}" for w in args if _UPPER_WORD.fullmatch(w)]
    if tool == "npa":
        return found + npa_line_problems(shlex.join(words), strict=True)
    if Path(tool).is_absolute():
        path = Path(tool)
        return found + ([] if path.is_file() else [f"{tool} does not exist"])
    if tool not in _TOOL_VERBS:
        return [*found, f"{tool!r} is no command (prose?)"]
    verbs = _TOOL_VERBS[tool]
    if verbs is not None and (not args or args[0] not in verbs):
        found.append(f"{tool} has no command {args[0] if args else ''!r} npa means")
    if tool == "kubectl" and args[:1] != ["config"] and "--context" not in args:
        found.append("kubectl without --context (the current context may be another cluster)")
    if tool == "aws":
        found += [
            f"aws without {flag} {value} (npa used it)"
            for flag, value in zip(aws[::2], aws[1::2], strict=True)
            if (flag, value) not in set(itertools.pairwise(args))
        ]
    return found


def _variable_problems(name: str) -> list[str]:
    if _VARIABLE.fullmatch(name):
        return []
    return [f"{name!r} is not a shell variable name"]


def suggestions(res: CliResult) -> list[str]:
    """Every fix and next line of one answer: its JSON fields, or its printed lines."""
    try:
        body = json.loads(res.stdout)
    except ValueError:
        body = None
    if body is None:
        return [m["line"] for m in map(_PRINTED.match, (res.stdout + res.stderr).splitlines()) if m]
    return list(_fields(body))


def _fields(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in _FIELDS and isinstance(item, str):
                yield item
            elif key in _FIELDS and isinstance(item, list):
                yield from (i for i in item if isinstance(i, str))
            else:
                yield from _fields(item)
    elif isinstance(value, list):
        for item in value:
            yield from _fields(item)


class Corpus:
    """The scenarios one test runs, and every suggestion they printed."""

    def __init__(self, env: dict[str, str], aws: tuple[str, ...] = ()) -> None:
        self.env = env
        self.aws = aws
        self.seen: dict[str, list[str]] = {}
        self.silent: list[str] = []

    def run(
        self, scenario: str, *argv: str, modes: tuple[str, ...] = ("text", "json"), **kw: Any
    ) -> CliResult:
        """Run ``argv`` as each of ``modes`` (text, json) and keep what it suggested; the last
        answer is returned."""
        assert scenario not in self.seen, f"scenario {scenario!r} twice"
        self.seen[scenario] = []
        res = CliResult(0, "", "")
        env = {**self.env, **kw.pop("env", {})}
        for mode in modes:
            extra = ("--json",) if mode == "json" else ()
            res = run_npa(*argv, *extra, env=env, **kw)
            lines = suggestions(res)
            if not lines:  # a scenario is chosen for what it suggests: none tests nothing
                self.silent.append(f"{scenario} ({mode}): {res.stdout[-300:]}{res.stderr[-300:]}")
            self.seen[scenario] += [f"{mode}: {line}" for line in lines]
        return res

    def check(self) -> None:
        bad = [
            f"{scenario}: {line}\n    " + "; ".join(found)
            for scenario, lines in self.seen.items()
            for line in lines
            if (found := line_problems(line.split(": ", 1)[1], self.aws))
        ]
        assert not self.silent, "suggested nothing: " + "\n".join(self.silent)
        assert not bad, f"{len(bad)} suggestion(s) would not run as printed:\n" + "\n".join(bad)


# --- the checker can fail ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("npa workbench workflow status RUN_ID --project demo", "placeholder"),
        ("npa workbench workflow logs 20260101-120000-abcdef --project P --stage x", "placeholder"),
        ("npa workbench workflow logs 20260101-120000-abcdef --project d", "Missing option"),
        ("npa workbench workflow status r1 --project d --no-such", "has no flag"),
        ("npa workbench workflow status r1 r2 --project d", "argument"),
        ("rerun with --context x", "no command"),
        ("npa configure --project d --context c or npa gpus", "'or'"),
        ("export 127_0_0_1_5000_AUTH=USER:PASSWORD  # the password", "not a shell variable"),
        ('RUN_ID="$(npa workbench workflow prepare-run s.yaml --project P)"', "placeholder"),
        ("aws s3 ls s3://b/p/ --recursive", "aws without --profile"),
        ("kubectl get pods", "without --context"),
        ("npa workbench workflow gpus --spec SPEC", "placeholder"),
    ],
)
def test_the_checker_finds_what_does_not_run(line: str, expected: str) -> None:
    found = line_problems(line, aws=("--profile", "store"))
    assert any(expected in f for f in found), found


@pytest.mark.parametrize(
    "line",
    [
        "npa workbench workflow status 20260101-120000-abcdef --project demo --watch",
        'RUN_ID="$(npa workbench workflow prepare-run /tmp/s.yaml --project demo)"',
        "export REGISTRY_EXAMPLE_COM_AUTH=USER:PASSWORD  # the user and password",
        "aws s3 ls s3://b/p/ --recursive --profile store  # or look in the console",
        "read -rs HF_TOKEN && export HF_TOKEN  # then submit again from here",
    ],
)
def test_the_checker_passes_runnable_lines(line: str) -> None:
    assert line_problems(line, aws=("--profile", "store")) == []


# --- the corpus --------------------------------------------------------------------------------


@pytest.fixture
def env(npa_home: Path) -> dict[str, str]:
    return {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}


def _spec(folder: Path, edit: str = "", replace: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "tiny-local.yaml"
    text = (EXAMPLES / "tiny-local.yaml").read_text()
    spec.write_text(text.replace(edit, replace, 1) if edit else text)
    return spec


def _prepare(spec: Path, corpus: Corpus, project: str = "demo") -> str:
    res = run_npa(*WF, "prepare-run", str(spec), "--project", project, env=corpus.env)
    assert res.code == 0, res.stderr
    return res.stdout.strip()


def _finished(spec: Path, corpus: Corpus, scenario: str) -> str:
    """A run of ``spec`` submitted (the scenario: its next lines) and watched to its end."""
    run_id = _prepare(spec, corpus)
    corpus.run(
        scenario,
        *WF,
        "submit",
        str(spec),
        "--project",
        "demo",
        "--run-id",
        run_id,
        "--runtime",
        "process",
        modes=("text",),
    )
    watch = run_npa(
        *WF, "status", run_id, "--project", "demo", "--watch", "--interval", "0.2", env=corpus.env
    )
    assert watch.code in (0, 1), watch.stdout + watch.stderr
    return run_id


def test_local_runs_suggest_only_commands_that_run(env: dict[str, str], tmp_path: Path) -> None:
    corpus = Corpus(env)
    ok = _spec(tmp_path / "ok")
    st = (*WF, "status")
    corpus.run("status of an unknown run", *st, UNKNOWN_RUN, "--project", "demo")
    corpus.run(
        "logs of an unknown run", *WF, "logs", UNKNOWN_RUN, "--project", "demo", "--stage", "total"
    )
    reserved = _prepare(ok, corpus)
    corpus.run("status of a reserved run", *st, reserved, "--project", "demo")
    corpus.run(
        "logs of a reserved run", *WF, "logs", reserved, "--project", "demo", "--stage", "total"
    )
    corpus.run("artifacts of a reserved run", *WF, "artifacts", reserved, "--project", "demo")
    corpus.run(
        "submit with no run", *WF, "submit", str(ok), "--project", "demo", "--runtime", "process"
    )
    corpus.run(
        "submit of an unknown --resume-run",
        *WF,
        "submit",
        str(ok),
        "--project",
        "demo",
        "--resume-run",
        UNKNOWN_RUN,
        "--runtime",
        "process",
    )
    huge = _spec(tmp_path / "huge", "disk_gib: 1", "disk_gib: 1000000")
    corpus.run(
        "submit over the disk quota",
        *WF,
        "submit",
        str(huge),
        "--project",
        "demo",
        "--run-id",
        _prepare(huge, corpus),
        "--runtime",
        "process",
    )
    corpus.run(
        "plan-spec over the disk quota",
        *WF,
        "plan-spec",
        str(huge),
        "--project",
        "demo",
        "--target",
        "local",
        "--run-id",
        "preview",
    )
    broken = _spec(tmp_path / "broken", "disk_gib: 1", "disk_gib: -1")
    corpus.run(
        "submit of an invalid spec",
        *WF,
        "submit",
        str(broken),
        "--project",
        "demo",
        "--run-id",
        _prepare(ok, corpus),
        "--runtime",
        "process",
        "--image-override",
        "ghost=registry.example.com/x:1",
    )

    done = _finished(ok, corpus, "submit that launches")
    corpus.run("status of a succeeded run", *st, done, "--project", "demo")
    corpus.run(
        "submit of a run that ended",
        *WF,
        "submit",
        str(ok),
        "--project",
        "demo",
        "--run-id",
        done,
        "--runtime",
        "process",
        modes=("json",),
    )

    failing = _spec(
        tmp_path / "failing",
        "awk '{ s += $1 } END { print s }'",
        "echo boom >&2; exit 3; awk '{ s += $1 }'",
    )
    failed = _finished(failing, corpus, "submit of a run that will fail")
    corpus.run("status of a failed run", *st, failed, "--project", "demo")
    corpus.run("artifacts of a failed run", *WF, "artifacts", failed, "--project", "demo")
    corpus.run(
        "load-artifact of a failed run",
        *WF,
        "load-artifact",
        failed,
        "--project",
        "demo",
        "--destination",
        str(tmp_path / "out"),
    )
    corpus.run("diff with an unknown run", *WF, "diff", failed, UNKNOWN_RUN, "--project", "demo")

    stopped = _spec(tmp_path / "stopped", "mkdir -p", "no-such-npa-command")
    never = _finished(stopped, corpus, "submit of a run whose first stage cannot start")
    corpus.run("status of a run stopped at its first stage", *st, never, "--project", "demo")
    corpus.run("artifacts of stages that never ran", *WF, "artifacts", never, "--project", "demo")

    elsewhere = {**env, "NPA_HOME": str(tmp_path / "elsewhere")}
    store = Path(env["NPA_HOME"]) / "store"
    assert (
        run_npa("configure", "--project", "demo", "--store", store.as_uri(), env=elsewhere).code
        == 0
    )
    for run, what in ((failed, "failed"), (never, "stopped at its first stage")):
        corpus.run(
            f"status of a run {what}, from a machine that did not submit it",
            *st,
            run,
            "--project",
            "demo",
            env=elsewhere,
        )
        corpus.run(
            f"artifacts of a run {what}, from a machine that did not submit it",
            *WF,
            "artifacts",
            run,
            "--project",
            "demo",
            env=elsewhere,
        )
    corpus.run(
        "status with a read timeout that is no number",
        *st,
        done,
        "--project",
        "demo",
        env={"NPA_READ_TIMEOUT": "x"},
    )
    corpus.check()


def test_mistakes_in_names_and_targets_suggest_commands_that_run(
    env: dict[str, str], tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: nowhere, context: {cluster: c, user: u}}]\nusers: [{name: u}]\n"
    )
    # npa looks for the pulumi binary, then for its plugins, before it runs pulumi: any
    # executable gets this scenario to the plugin check (PULUMI_HOME holds none).
    plugins = {"PULUMI_HOME": str(tmp_path / "no-plugins"), "NPA_PULUMI_BIN": "/bin/true"}
    corpus = Corpus({**env, "KUBECONFIG": str(kubeconfig)})
    assert run_npa("configure", "--project", "robotics", "--store", "local", env=env).code == 0
    corpus.run("list of a mistyped project", *WF, "list", "--project", "robotcs")
    corpus.run(
        "a mistyped target", "provision-if-absent", "--project", "p", "--target", "kubrnetes"
    )
    corpus.run("a store of no scheme npa has", "configure", "--project", "p", "--store", "ftp://x")
    corpus.run("a store without its scheme", "configure", "--project", "p", "--store", "b/npa")
    corpus.run("a run id that is no run id", *WF, "status", "no-such-run", "--project", "robotics")
    corpus.run(
        "prepare-run of a spec that is not there",
        *WF,
        "prepare-run",
        str(tmp_path / "absent.yaml"),
        "--project",
        "robotics",
    )
    corpus.run(
        "submit to a context never provisioned",
        *WF,
        "submit",
        str(_spec(tmp_path)),
        "--project",
        "robotics",
        "--infra",
        "k8s/nowhere",
    )
    corpus.run(
        "provision without pulumi",
        "provision-if-absent",
        "--project",
        "robotics",
        "--target",
        "kubernetes",
        "--context",
        "nowhere",
        env={"NPA_PULUMI_BIN": str(tmp_path / "no-pulumi"), "PATH": "/usr/bin:/bin"},
    )
    corpus.run(
        "provision without the kubernetes plugin",
        "provision-if-absent",
        "--project",
        "robotics",
        "--target",
        "kubernetes",
        "--context",
        "nowhere",
        env=plugins,
    )
    plan = (*WF, "plan-spec", str(_spec(tmp_path)), "--run-id", "preview", "--target", "nebius")
    corpus.run("plan-spec on nebius with no quota evidence and no Nebius profile", *plan)
    nebius = tmp_path / "nebius-home" / ".nebius"
    nebius.mkdir(parents=True)
    (nebius / "config.yaml").write_text(
        "default: dev\nprofiles:\n  dev:\n    parent-id: project-e00npatest\n"
    )
    corpus.run(
        "plan-spec on nebius with no quota evidence and a Nebius profile",
        *plan,
        env={"HOME": str(nebius.parent)},
    )
    corpus.run(
        "provision on nebius without quota evidence",
        "provision-if-absent",
        "--project",
        "robotics",
        "--target",
        "nebius",
        env=plugins,
    )
    corpus.run(
        "submit with an override of a mistyped tool",
        *WF,
        "submit",
        str(_spec(tmp_path)),
        "--project",
        "robotics",
        "--run-id",
        _prepare(_spec(tmp_path), corpus, "robotics"),
        "--runtime",
        "process",
        "--image-override",
        "shel=registry.example.com/x:1",
    )
    flags = (*WF, "submit", str(_spec(tmp_path)), "--project", "robotics", "--run-id", "r")
    corpus.run("a --runtime npa does not have", *flags, "--runtime", "bogus")
    corpus.run("an --infra that is no backend", *flags, "--infra", "kubrnetes")
    corpus.run("--runtime process on a cluster", *flags, "--infra", "k8s/x", "--runtime", "process")
    # Fixes that once were sentences (issue 29): each is now the command again, changed.
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    render = (*WF, "render", str(_spec(tmp_path)), "--infra", "local")
    corpus.run(
        "render into a folder that holds something else",
        *render,
        "--run-id",
        "r",
        "--out",
        str(busy),
    )
    reserved = _prepare(_spec(tmp_path), corpus, "robotics")
    corpus.run(
        "render of a reserved run with another --store-uri",
        *render,
        "--run-id",
        reserved,
        "--project",
        "robotics",
        "--store-uri",
        (tmp_path / "other-store").as_uri(),
        "--out",
        str(tmp_path / "out"),
    )
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "dangling").symlink_to(tmp_path / "no-such-file")
    corpus.run(
        "submit of a source with a symlink that leaves the tree",
        *WF,
        "submit",
        str(_spec(linked)),
        "--project",
        "robotics",
        "--run-id",
        _prepare(_spec(linked), corpus, "robotics"),
        "--runtime",
        "process",
    )
    corpus.check()


def test_an_s3_store_suggests_aws_lines_with_its_endpoint_and_profile(
    env: dict[str, str], s3: S3Server, tmp_path: Path
) -> None:
    aws = tmp_path / "aws-config"
    creds = s3.env
    aws.write_text(
        f"[profile npa-store]\naws_access_key_id = {creds['AWS_ACCESS_KEY_ID']}\n"
        f"aws_secret_access_key = {creds['AWS_SECRET_ACCESS_KEY']}\nregion = us-east-1\n"
    )
    env = {**env, "AWS_CONFIG_FILE": str(aws), "AWS_SHARED_CREDENTIALS_FILE": str(aws)}
    corpus = Corpus(env, aws=("--endpoint-url", s3.endpoint_url, "--profile", "npa-store"))
    store = ("--endpoint-url", s3.endpoint_url, "--profile", "npa-store")
    configured = run_npa(
        "configure", "--project", "demo", "--store", "s3://no-such-bucket/npa", *store, env=env
    )
    assert configured.code == 0, configured.stderr
    corpus.run(
        "status in a bucket that does not exist", *WF, "status", UNKNOWN_RUN, "--project", "demo"
    )
    corpus.run("list of a bucket that does not exist", *WF, "list", "--project", "demo")
    spec = _spec(tmp_path / "wf")
    corpus.run(
        "submit to a bucket that does not exist",
        *WF,
        "submit",
        str(spec),
        "--project",
        "demo",
        "--run-id",
        _prepare(spec, corpus),
        "--runtime",
        "process",
    )
    corpus.run(
        "a store client npa does not have",
        *WF,
        "list",
        "--project",
        "demo",
        env={"NPA_S3_CLIENT": "curl"},
    )
    nokeys = run_npa("configure", "--project", "nokeys", "--store", "s3://b/npa",
                     "--endpoint-url", s3.endpoint_url, env=env)  # fmt: skip
    assert nokeys.code == 0, nokeys.stderr
    corpus.run(
        "submit to a store with no credentials",
        *WF,
        "submit",
        str(spec),
        "--project",
        "nokeys",
        "--run-id",
        _prepare(spec, corpus, "nokeys"),
        "--runtime",
        "process",
    )
    # The profile this machine has is the one named, not a placeholder for it.
    assert any(
        "npa configure --project nokeys --profile npa-store" in line
        for line in corpus.seen["submit to a store with no credentials"]
    ), corpus.seen["submit to a store with no credentials"]
    dead = run_npa(
        "configure",
        "--project",
        "dead",
        "--store",
        "s3://b/npa",
        "--endpoint-url",
        "http://127.0.0.1:9",
        "--profile",
        "npa-store",
        env=env,
    )
    assert dead.code == 0, dead.stderr
    unreachable = Corpus(
        env, aws=("--endpoint-url", "http://127.0.0.1:9", "--profile", "npa-store")
    )
    unreachable.run(
        "submit to a store that does not answer",
        *WF,
        "submit",
        str(spec),
        "--project",
        "dead",
        "--run-id",
        _prepare(spec, unreachable, "dead"),
        "--runtime",
        "process",
        env={"NPA_STORE_TIMEOUT_SECONDS": "2"},
    )
    corpus.check()
    unreachable.check()


def test_image_checks_suggest_commands_that_run(env: dict[str, str], tmp_path: Path) -> None:
    """A registry named by its address (127.0.0.1:PORT): the variable npa names for its
    credentials must still be one bash accepts."""
    corpus = Corpus(env)
    spec = write_spec(tmp_path / "spec.yaml", {"one": {"image": "127.0.0.1:9/npa/x:v1"}})
    pf = (*WF, "preflight-images", str(spec))
    corpus.run("a --registry-auth with no variable", *pf, "--registry-auth", "127.0.0.1:9=env:")
    corpus.run("a --registry-auth naming an unset variable", *pf, "--registry-auth",
               "127.0.0.1:9=env:NPA_TEST_UNSET")  # fmt: skip
    ov = "--image-override"
    corpus.run("an override given twice", *pf, ov, "one=a.io/x:1", f"{ov}=one=b.io/y:1")
    corpus.run("an override of a tool the spec lacks", *pf, ov, "ghost=a.io/x:1")
    corpus.run("render with an override of a mistyped tool", *WF, "render", str(spec),
               "--run-id", "r1", "--out", str(tmp_path / "tasks"), ov, "onw=a.io/x:1")  # fmt: skip
    corpus.run("a --registry with a scheme and a tag", *pf, "--registry", "https://r.io/x:1")
    corpus.run("validate-spec of a folder", *WF, "validate-spec", str(tmp_path))
    corpus.run("a registry that does not answer", *pf)
    corpus.check()


def test_a_registry_suggests_commands_that_run(
    registry: Registry, env: dict[str, str], tmp_path: Path
) -> None:
    corpus = Corpus({**env, "KUBECONFIG": str(tmp_path / "none")})
    plain = registry.push_image(unique_repo("plain"), "v1")
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "plain": {"image": f"{registry.host}/{plain.repository}:v1"},
            "gone": {"image": f"{registry.host}/{unique_repo('gone')}:v1"},
        },
    )
    pf = (*WF, "preflight-images", str(spec))
    corpus.run("images in a registry that asks for credentials", *pf)
    corpus.run("an unattested image and one never pushed, with no context", *pf,
               f"--registry-auth={registry.host}=env:REG_AUTH",
               env={"REG_AUTH": ":".join(registry.auth)})  # fmt: skip
    corpus.check()
