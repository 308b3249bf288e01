"""One order for choosing a kube context (npa.services.configure.choose_context): --context,
then the spec's infrastructure.context, then the project's configured context (NPA_CONTEXT,
then npa configure --context), then the kubeconfig's current-context. The commands that act on
a cluster (gpus, skypilot verify, skypilot status) take it as --context (--cluster is an alias)
and all go through it."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from npa.core.errors import InvalidInput
from npa.core.paths import NpaPaths
from npa.services.configure import choose_context
from tests.harness.cli import invoke_npa

SOURCES = ("flag", "spec", "env", "file", "current")
NAMES = {
    "flag": "arn:aws:eks:us-east-1:1:cluster/flagged",
    "spec": "spec-ctx",
    "env": "env-ctx",
    "file": "user@team/configured",
    "current": "kind-current",
}


def _kubeconfig(path: Path, current: str | None) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t" * 12}}],
        "contexts": [{"name": n, "context": {"cluster": "c", "user": "u"}} for n in NAMES.values()],
    }
    if current is not None:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


def _configure(home: Path, context: str) -> None:
    env = {"NPA_HOME": str(home), "NPA_CONTEXT": None}
    res = invoke_npa("configure", "--project", "p", "--context", context, env=env)
    assert res.code == 0, res.stdout + res.stderr


@pytest.mark.parametrize(
    "present",
    [c for n in range(len(SOURCES) + 1) for c in itertools.combinations(SOURCES, n)],
    ids=lambda c: "+".join(c) or "none",
)
def test_the_first_source_present_in_the_one_order_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, present: tuple[str, ...]
) -> None:
    home = tmp_path / "npa"
    if "file" in present:
        _configure(home, NAMES["file"])
    monkeypatch.delenv("NPA_CONTEXT", raising=False)
    if "env" in present:
        monkeypatch.setenv("NPA_CONTEXT", NAMES["env"])
    cfg = _kubeconfig(tmp_path / "kc", NAMES["current"] if "current" in present else None)
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    chosen = choose_context(
        NAMES["flag"] if "flag" in present else None,
        project="p",
        spec_context=NAMES["spec"] if "spec" in present else None,
        paths=NpaPaths(home),
    )
    if not present:
        assert chosen is None
        return
    first = next(s for s in SOURCES if s in present)
    assert chosen is not None and chosen.name == NAMES[first]
    expected_source = {
        "flag": "--context",
        "spec": "spec",
        "env": "NPA_CONTEXT",
        "file": "project p",
        "current": "current-context",
    }[first]
    assert chosen.source == expected_source


def test_a_chosen_name_is_held_to_the_one_name_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("NPA_CONTEXT", raising=False)
    with pytest.raises(InvalidInput, match="has '//'"):
        choose_context("a//b", paths=NpaPaths(tmp_path))


@pytest.mark.parametrize(
    "argv",
    [
        ("workbench", "workflow", "gpus"),
        ("skypilot", "verify"),
        ("skypilot", "status", "--project", "p"),
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_cluster_commands_without_a_context_say_how_to_name_one(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    env = {
        "NPA_HOME": str(tmp_path / "npa"),
        "NPA_CONTEXT": None,
        "KUBECONFIG": str(_kubeconfig(tmp_path / "kc", None)),
    }
    res = invoke_npa(*argv, "--json", env=env)
    assert res.code == 2, res.stdout + res.stderr
    body = res.json()["error"]
    assert body["message"].startswith("no kube context")
    assert body["fix"].startswith("kubectl config get-contexts -o name")
    assert "npa " + " ".join(a for a in argv if not a.startswith("--") and a != "p") in body["fix"]


@pytest.mark.parametrize("flag", ["--context", "--cluster"])
def test_gpus_takes_the_context_by_its_one_name_and_the_alias(tmp_path: Path, flag: str) -> None:
    # The context is named but no kubeconfig defines it: the error names the flag's value,
    # so the value reached the command whichever spelling carried it.
    env = {"NPA_HOME": str(tmp_path / "npa"), "KUBECONFIG": str(tmp_path / "absent")}
    res = invoke_npa("workbench", "workflow", "gpus", flag, "named-ctx", "--json", env=env)
    assert res.code != 0
    assert "named-ctx" in res.stdout


# The corpus every caller is held to: --context given or not, a configured context or not,
# and the kubeconfig's current-context present, absent or a name npa cannot use.
BAD_CURRENT = "kind//bad"  # kubectl accepts it; SkyPilot's k8s/<context> cannot hold '//'
CORPUS = list(itertools.product((True, False), (True, False), ("present", "absent", "invalid")))


def _corpus_id(case: tuple[bool, bool, str]) -> str:
    flag, configured, current = case
    return f"{'flag' if flag else 'noflag'}-{'conf' if configured else 'noconf'}-{current}"


def _corpus_inputs(
    tmp_path: Path, case: tuple[bool, bool, str]
) -> tuple[str | None, dict[str, str | None]]:
    """The --context value (or None) and the environment for one corpus case. Every context is
    named in the kubeconfig but none is defined, so each command stops at the one it chose and
    says which (no cluster is asked)."""
    flag, configured, current = case
    doc: dict[str, object] = {"apiVersion": "v1", "kind": "Config", "contexts": []}
    doc["clusters"], doc["users"] = [], []
    if current != "absent":
        doc["current-context"] = NAMES["current"] if current == "present" else BAD_CURRENT
    kc = tmp_path / "kc"
    kc.write_text(yaml.safe_dump(doc))
    env: dict[str, str | None] = {
        "NPA_HOME": str(tmp_path / "npa"),
        "KUBECONFIG": str(kc),
        "NPA_CONTEXT": NAMES["env"] if configured else None,
    }
    return (NAMES["flag"] if flag else None), env


def _in_corpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[bool, bool, str]
) -> tuple[str | None, NpaPaths]:
    """One corpus case's environment in this process, as invoke_npa sets it for the CLI: the
    --context value (or None) and npa's paths."""
    flag, env = _corpus_inputs(tmp_path, case)
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    return flag, NpaPaths(tmp_path / "npa")


def _expected(case: tuple[bool, bool, str]) -> str | None:
    """What the one order picks: a name, None for no context, or "invalid"."""
    flag, configured, current = case
    if flag:
        return NAMES["flag"]
    if configured:
        return NAMES["env"]
    return {"present": NAMES["current"], "absent": None, "invalid": "invalid"}[current]


@pytest.mark.parametrize("case", CORPUS, ids=_corpus_id)
def test_the_corpus_of_flag_configured_and_current_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[bool, bool, str]
) -> None:
    flag, paths = _in_corpus(tmp_path, monkeypatch, case)
    expected = _expected(case)
    if expected == "invalid":
        with pytest.raises(InvalidInput, match="is not a context name npa can use") as bad:
            choose_context(flag, project="p", paths=paths)
        assert bad.value.fix == "kubectl config get-contexts -o name"
        return
    chosen = choose_context(flag, project="p", paths=paths)
    assert (chosen.name if chosen else None) == expected
    # Teardown stops before the current-context: it destroys only what someone named.
    named = choose_context(flag, project="p", paths=paths, use_current=False)
    assert (named.name if named else None) == (expected if flag or case[1] else None)


def _acted_on(argv: tuple[str, ...], stdout: str, code: int) -> str | None:
    """The context a command acted on, read from what it printed: render's infra, else the
    context its error names; None when it found none, "invalid" when it refused the name."""
    import json
    import re

    body = json.loads(stdout)
    if code == 0:
        assert "render" in argv, stdout
        return str(body["infra"]).removeprefix("k8s/")
    message = body["error"]["message"]
    if "is not a context name npa can use" in message:
        return "invalid"
    if "no kube context" in message or "needs a kube context" in message:
        return None
    found = re.search(r"context '([^']+)'", message)
    assert found, message
    return found.group(1)


def _callers(tmp_path: Path) -> dict[str, tuple[str, ...]]:
    from tests.unit.specdata import DIGEST_A, base_spec, dump

    spec = base_spec()
    del spec["infrastructure"]["context"]  # the spec's own context is choose_context's 2nd
    (tmp_path / "spec.yaml").write_text(dump(spec))
    (tmp_path / "d.yaml").write_text(f"cur: {DIGEST_A}\n")
    render = ("workbench", "workflow", "render", str(tmp_path / "spec.yaml"), "--run-id", "r1")
    return {
        "gpus": ("workbench", "workflow", "gpus"),
        "render": (*render, "--out", str(tmp_path / "out"), "--digests", str(tmp_path / "d.yaml")),
        "provision": ("provision-if-absent", "--project", "p", "--target", "kubernetes"),
    }


@pytest.mark.parametrize("caller", ["gpus", "render", "provision"])
@pytest.mark.parametrize("case", CORPUS, ids=_corpus_id)
def test_every_caller_acts_on_the_context_the_one_order_picks(
    tmp_path: Path, caller: str, case: tuple[bool, bool, str]
) -> None:
    flag, env = _corpus_inputs(tmp_path, case)
    argv = _callers(tmp_path)[caller]
    res = invoke_npa(*argv, *(["--context", flag] if flag else []), "--json", env=env)
    assert res.code in (0, 2, 3), res.stdout + res.stderr
    assert _acted_on(argv, res.stdout, res.code) == _expected(case), res.stdout


def test_teardown_never_falls_back_to_the_current_context(tmp_path: Path) -> None:
    _, env = _corpus_inputs(tmp_path, (False, False, "present"))
    res = invoke_npa("teardown", "--project", "p", "--target", "kubernetes", "--json", env=env)
    assert res.code == 2, res.stdout + res.stderr
    assert "needs --context" in res.json()["error"]["message"]


@pytest.mark.parametrize("case", CORPUS, ids=_corpus_id)
def test_preflight_images_probes_in_a_named_context_in_the_one_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[bool, bool, str]
) -> None:
    # A probe starts a pod: it runs on the context the one order names before current-context.
    from npa.services.images import _probe_context

    flag, paths = _in_corpus(tmp_path, monkeypatch, case)
    expected = _expected(case) if flag or case[1] else None
    assert _probe_context(flag, "p", None, paths) == expected
    assert _probe_context(flag, "p", "spec-ctx", paths) == (flag or "spec-ctx")


@pytest.mark.parametrize("case", CORPUS, ids=_corpus_id)
def test_render_workflow_renders_for_the_context_the_one_order_picks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[bool, bool, str]
) -> None:
    # The pure builder the tests and bench/ use: before, it read only its argument and the
    # spec's context, so a configured context or a current-context rendered nothing.
    from npa.services.render import render_workflow
    from npa.spec.model import Workflow
    from tests.unit.specdata import DIGEST_A, base_spec

    flag, paths = _in_corpus(tmp_path, monkeypatch, case)
    spec = base_spec()
    del spec["infrastructure"]["context"]
    workflow = Workflow.model_validate(spec)

    def render() -> str:
        tasks = render_workflow(
            workflow, "r1", kube_context=flag, digests={"cur": DIGEST_A}, project="p", paths=paths
        )
        return tasks[0].text

    expected = _expected(case)
    if expected is None or expected == "invalid":
        with pytest.raises(InvalidInput) as refused:
            render()
        wanted = "no kube context" if expected is None else "is not a context name npa can use"
        assert wanted in refused.value.message
        return
    assert f'infra: "k8s/{expected}"' in render()
