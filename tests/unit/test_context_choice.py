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
