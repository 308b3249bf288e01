"""Kube context names as kubectl accepts them, and KUBECONFIG lists merged as kubectl merges them.

The merge is checked against kubectl itself (``kubectl config view --minify``) on generated sets
of overlapping files, so the rule npa follows is kubectl's, not npa's idea of it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from npa.adapters.kube import kubeconfig
from npa.core.errors import InvalidInput
from npa.core.paths import (
    NpaPaths,
    check_context_name,
    context_folder,
    context_from_folder,
    context_problem,
)

EKS = "arn:aws:eks:us-east-1:123456789012:cluster/gpu-prod"
GKE = "gke_my-project_us-central1-a_gpu-cluster"

context_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=120
)


@given(context_names)
def test_a_context_folder_is_one_safe_component_and_reverses(name: str) -> None:
    if (
        context_problem(name) is not None
    ):  # the one rule refuses it (tests/unit/test_context_names.py)
        with pytest.raises(InvalidInput):
            context_folder(name)
        return
    folder = context_folder(name)
    assert "/" not in folder and ":" not in folder and "\0" not in folder
    assert folder not in (".", "..") and not folder.startswith(".")
    assert len(folder.encode()) <= 200
    if len(name.encode()) <= 66:  # escaped, at most 198 characters: never hashed
        assert context_from_folder(folder) == name
    else:
        assert context_from_folder(folder) in (name, None)


@given(st.text(min_size=1, max_size=400, alphabet=st.characters(codec="utf-8")))
def test_long_or_odd_names_never_escape_and_never_collide(name: str) -> None:
    if context_problem(name) is not None:
        with pytest.raises(InvalidInput):
            context_folder(name)
        return
    folder = context_folder(name)
    assert "/" not in folder and len(folder) <= 200
    back = context_from_folder(folder)
    assert back == name or (back is None and "~" in folder)
    assert context_folder(name + "x") != folder


def test_real_context_names_are_accepted() -> None:
    paths = NpaPaths(Path("/n"))
    assert check_context_name(EKS) == EKS
    placed = paths.cluster_kubeconfig(EKS)
    assert placed.parent.parent == paths.clusters_dir
    assert placed.parent.name == "arn%3Aaws%3Aeks%3Aus-east-1%3A123456789012%3Acluster%2Fgpu-prod"
    assert paths.cluster_kubeconfig(GKE).parent.name == GKE
    for bad in ("", "a\nb", "tab\there"):
        with pytest.raises(InvalidInput):
            check_context_name(bad)


def _write(path: Path, body: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", **body}))
    return path


def test_a_kubeconfig_list_merges_first_wins_and_resolves_paths_per_file(tmp_path: Path) -> None:
    first = _write(
        tmp_path / "a" / "config",
        {
            "clusters": [
                {"name": "c", "cluster": {"server": "https://a", "certificate-authority": "ca.crt"}}
            ],
            "users": [
                {"name": "u", "user": {"exec": {"command": "./bin/auth"}, "client-key": "k"}}
            ],
            "contexts": [{"name": EKS, "context": {"cluster": "c", "user": "u", "namespace": "n"}}],
        },
    )
    second = _write(
        tmp_path / "b" / "config",
        {
            "current-context": EKS,
            "clusters": [
                {"name": "c", "cluster": {"server": "https://b"}},
                {"name": "d", "cluster": {"server": "https://d", "certificate-authority": "d.crt"}},
            ],
            "users": [{"name": "v", "user": {"exec": {"command": "aws"}}}],
            "contexts": [
                {"name": EKS, "context": {"cluster": "d", "user": "v"}},
                {"name": GKE, "context": {"cluster": "d", "user": "v"}},
            ],
        },
    )
    listed = f"{tmp_path / 'missing'}{os.pathsep}{first}{os.pathsep}{os.pathsep}{second}"
    merged = kubeconfig.merge(kubeconfig.split_list(listed))
    assert merged.files == [first, second]
    assert merged.current_context == EKS
    placed = yaml.safe_load(kubeconfig.minimal(merged, EKS))
    assert placed["current-context"] == EKS
    assert placed["contexts"][0]["context"]["namespace"] == "n"
    [cluster] = placed["clusters"]
    assert cluster["cluster"] == {
        "server": "https://a",
        "certificate-authority": str(tmp_path / "a" / "ca.crt"),
    }
    [user] = placed["users"]
    assert user["user"]["exec"]["command"] == str(tmp_path / "a" / "bin" / "auth")
    assert user["user"]["client-key"] == str(tmp_path / "a" / "k")
    other = yaml.safe_load(kubeconfig.minimal(merged, GKE))
    assert other["clusters"][0]["cluster"]["certificate-authority"] == str(tmp_path / "b" / "d.crt")
    assert other["users"][0]["user"]["exec"]["command"] == "aws"  # looked up on PATH, as kubectl
    with pytest.raises(kubeconfig.KubeconfigError, match="no context 'nope'"):
        kubeconfig.minimal(merged, "nope")
    # One named file (--kubeconfig) must exist; in a list a missing file is skipped.
    with pytest.raises(kubeconfig.KubeconfigError, match="does not exist"):
        kubeconfig.minimal_from(str(tmp_path / "missing"), EKS)


def test_read_only_commands_resolve_kubeconfig_like_kubectl(tmp_path: Path) -> None:
    paths = NpaPaths(tmp_path / ".npa")
    home = tmp_path / "home"
    mine = _write(
        tmp_path / "mine",
        {
            "clusters": [{"name": "c", "cluster": {"server": "https://x"}}],
            "contexts": [{"name": EKS, "context": {"cluster": "c"}}],
        },
    )
    env = {"KUBECONFIG": f"{tmp_path / 'none'}{os.pathsep}{mine}", "HOME": str(home)}
    chosen = kubeconfig.for_context(paths, EKS, env)
    assert (
        chosen.origin == "$KUBECONFIG" and chosen.value == f"{tmp_path / 'none'}{os.pathsep}{mine}"
    )
    placed = paths.cluster_kubeconfig(EKS)
    placed.parent.mkdir(parents=True)
    placed.write_text(mine.read_text())
    assert kubeconfig.for_context(paths, EKS, {"KUBECONFIG": str(tmp_path / "none")}).origin == (
        "placed by npa"
    )


# --- against kubectl ---------------------------------------------------------------------------


# Any YAML value where a kubeconfig has a section: what merge and minimal say is a
# KubeconfigError naming the file, never a TypeError or AttributeError (a `contexts: 5` did).
_yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def _entries(section: str) -> st.SearchStrategy[Any]:
    """A section's list as a kubeconfig has it, with any value where a field goes."""
    body = st.dictionaries(st.sampled_from(["cluster", "user", "server", "token"]), _yaml_values)
    entry = st.fixed_dictionaries({"name": st.sampled_from(["a", "b"]), section: body})
    return st.lists(entry | _yaml_values, max_size=3) | _yaml_values


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "contexts": _entries("context"),
            "clusters": _entries("cluster"),
            "users": _entries("user"),
            "current-context": st.sampled_from(["a", "b"]) | _yaml_values,
        },
    )
)
def test_a_malformed_kubeconfig_is_reported_never_raised_as_a_crash(doc: dict[str, Any]) -> None:
    import tempfile

    import yaml

    from npa.adapters.kube import kubeconfig as kube

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config"
        path.write_text(yaml.safe_dump(doc))
        try:
            merged = kube.merge([path])
            if merged.current_context is not None:
                kube.minimal(merged, merged.current_context)
        except kube.KubeconfigError as exc:
            assert str(path) in str(exc) or "context" in str(exc)


# A KUBECONFIG that is not a kubeconfig at all was read as one that defines no context: gpus
# said "no kubeconfig defines context", skypilot verify "no kubeconfig", and without --context
# "the kubeconfig has no current-context". It is that file's error, as kubectl reports it.
# A text with a NUL may be UTF-16 or UTF-32 by YAML's rule for the first bytes, refused as such
# (test_a_kubeconfig_in_utf16_is_refused_with_a_conversion_as_its_other_readers_would).
_NOT_KUBECONFIG = st.sampled_from(
    ["a: [1, 2\n", "key: 'open\n", "\tx: 1\n", "hello world\n", "- a\n- b\n", "42\n", "{a: }}"]
) | st.text(max_size=40).filter(
    lambda t: "\x00" not in t and not isinstance(_parsed(t), dict | None)
)


def _parsed(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return "not yaml"


@given(_NOT_KUBECONFIG, st.booleans())
def test_a_kubeconfig_that_is_not_one_is_its_files_error(text: str, in_env: bool) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", tmp)
        path = Path(tmp) / "kc" if in_env else Path(tmp) / ".kube" / "config"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        env = {"KUBECONFIG": str(path)} if in_env else {}
        with pytest.raises(kubeconfig.KubeconfigError) as exc:
            kubeconfig.for_context(NpaPaths(Path(tmp) / ".npa"), "ctx1", env)
        assert isinstance(exc.value, InvalidInput)
        message = exc.value.message
        assert message.startswith(f"{path} is not ") and "\n" not in message, message
        assert "not valid YAML" in message or "not a kubeconfig" in message, message
        assert exc.value.fix == f"kubectl config view --kubeconfig {path}  # kubectl's reading"


@pytest.mark.parametrize("argv", [["--context", "ctx1"], []])
def test_gpus_with_a_kubeconfig_that_is_not_yaml_names_the_file(
    tmp_path: Path, argv: list[str]
) -> None:
    from tests.harness.cli import invoke_npa

    bad = tmp_path / "kc"
    bad.write_text("apiVersion: v1\nclusters: [\n  - name: a\n")
    env = {"KUBECONFIG": str(bad), "NPA_HOME": str(tmp_path / "n"), "HOME": str(tmp_path)}
    r = invoke_npa("workbench", "workflow", "gpus", *argv, "--json", env=env)
    assert r.code == 2, r.stdout + r.stderr
    error = r.json()["error"]
    assert error["message"].startswith(f"{bad} is not valid YAML at line 3, column 3:"), error
    assert "defines" not in error["message"] and "current-context" not in error["message"]
    r = invoke_npa("skypilot", "verify", "--context", "ctx1", "--json", env=env)
    check = next(c for c in r.json()["checks"] if c["name"] == "kube context")
    assert check["answer"] == "unreadable kubeconfig" and str(bad) in check["detail"], check


def test_provision_with_a_kubeconfig_that_is_not_yaml_names_the_file(tmp_path: Path) -> None:
    # It said "needs a kube context: ... (FILE has none)", as if the file listed no context.
    from tests.harness.cli import invoke_npa

    bad = tmp_path / "kc"
    bad.write_text("apiVersion: v1\ncontexts: [\n")
    env = {"KUBECONFIG": str(bad), "NPA_HOME": str(tmp_path / "n"), "HOME": str(tmp_path)}
    r = invoke_npa(
        "provision-if-absent", "--project", "p", "--target", "kubernetes", "--json", env=env
    )
    assert r.code == 2, r.stdout + r.stderr
    error = r.json()["error"]
    assert error["message"].startswith(f"{bad} is not valid YAML at line 3, column 1:"), error
    assert error["fix"] == f"kubectl config view --kubeconfig {bad}  # kubectl's reading"


@pytest.mark.parametrize("codec", ["utf-16", "utf-32"])
def test_a_kubeconfig_in_utf16_is_refused_with_a_conversion_as_its_other_readers_would(
    tmp_path: Path, codec: str
) -> None:
    """SkyPilot's Kubernetes client reads a kubeconfig as UTF-8 only: npa refuses what it
    would refuse (specs, read by npa alone, take UTF-16 and UTF-32 as YAML does), and says how
    to convert it."""
    from tests.harness.cli import invoke_npa

    path = tmp_path / "kc"
    path.write_bytes("apiVersion: v1\ncurrent-context: ctx1\n".encode(codec))
    env = {"KUBECONFIG": str(path), "NPA_HOME": str(tmp_path / "n"), "HOME": str(tmp_path)}
    r = invoke_npa("workbench", "workflow", "gpus", "--context", "ctx1", "--json", env=env)
    assert r.code == 2, r.stdout + r.stderr
    error = r.json()["error"]
    assert f"kubeconfig {path} is UTF-{codec[-2:]}LE text" in error["message"], error
    assert error["fix"].startswith(f"iconv -f UTF-{codec[-2:]}LE -t UTF-8 -o "), error
