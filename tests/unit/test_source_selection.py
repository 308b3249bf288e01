"""Which files a source tree stages: ignore files, npa's own state, and credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from npa.core.errors import InvalidInput
from npa.runs.ignore import IgnoreRules, looks_like_credential
from npa.runs.staging import scan_tree

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "path",
    [
        ".env", "app/.env", ".env.production", "prod.env", "certs/server.pem", "tls.key",
        "store.p12", "id_rsa", "keys/id_ed25519", "id_rsa_deploy", ".aws/credentials",
        "credentials", "gcp/credentials.json", "service-account-prod.json", ".netrc",
        ".git-credentials", ".docker/config.json", ".kube/config", "kubeconfig",
        "clusters/prod.kubeconfig", "kubeconfig.yaml", ".pypirc", "auth/htpasswd",
    ],
)  # fmt: skip
def test_credential_names_are_recognised(path: str) -> None:
    assert looks_like_credential(path)


@pytest.mark.parametrize(
    "path",
    [
        ".env.example", "env.sample", ".env.template", "id_rsa.pub", "keys/id_ed25519.pub",
        "main.py", "environment.yml", "config.json", "docs/credentials.md", "kube/config.py",
        "keyboard.txt", "pemfile.txt", "README.md",
    ],
)  # fmt: skip
def test_ordinary_files_are_not_credentials(path: str) -> None:
    assert not looks_like_credential(path)


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def staged(root: Path, rules: IgnoreRules | None = None) -> list[str]:
    return sorted(f.path for f in scan_tree(root, rules))


def test_credentials_refuse_the_whole_tree_naming_each_and_the_fix(tmp_path: Path) -> None:
    root = write(
        tmp_path / "src",
        {"main.py": "x", ".env": "TOKEN=1", "keys/id_rsa": "k", "deep/er/prod.kubeconfig": "c"},
    )
    with pytest.raises(InvalidInput) as caught:
        scan_tree(root)
    error = caught.value
    assert error.details["credentials"] == [".env", "deep/er/prod.kubeconfig", "keys/id_rsa"]
    assert "look like credentials" in error.message and "'!'" in error.message
    assert str(root / ".npaignore") in (error.fix or "")
    assert "'.env'" in (error.fix or "")


def test_ignored_credentials_are_left_out_without_a_refusal(tmp_path: Path) -> None:
    root = write(tmp_path / "src", {"main.py": "x", ".env": "T=1", "sub/tls.key": "k"})
    (root / ".gitignore").write_text(".env\n")
    (root / "sub" / ".npaignore").write_text("*.key\n")
    assert staged(root) == [".gitignore", "main.py", "sub/.npaignore"]


def test_a_credential_is_staged_only_when_a_npaignore_names_it_with_a_bang(
    tmp_path: Path,
) -> None:
    root = write(tmp_path / "src", {"main.py": "x", ".env": "T=1", "sub/id_rsa": "k"})
    (root / ".npaignore").write_text("!.env\nsub/id_rsa\n")
    assert staged(root) == [".env", ".npaignore", "main.py"]


def test_a_gitignore_negation_is_not_a_choice_to_upload_a_credential(tmp_path: Path) -> None:
    root = write(tmp_path / "src", {"main.py": "x", ".env": "T=1"})
    (root / ".gitignore").write_text("*\n!.env\n!main.py\n!.gitignore\n")
    with pytest.raises(InvalidInput):
        scan_tree(root)


def test_npa_state_and_git_inside_the_tree_are_never_staged(tmp_path: Path) -> None:
    root = write(
        tmp_path / "home",
        {
            "spec.yaml": "x",
            ".npa/operations/op.jsonl": "{}",
            ".npa/store/wf/run/npa-workflow/manifest.json": "{}",
            "elsewhere-store/wf/obj": "data",
            ".git/HEAD": "ref",
            "sub/.git/config": "c",
        },
    )
    # Even an ignore file that asks for them cannot bring them back.
    (root / ".npaignore").write_text("!.npa/\n!elsewhere-store/\n")
    rules = IgnoreRules.for_tree(root, [root / ".npa", root / "elsewhere-store", tmp_path / "x"])
    assert staged(root, rules) == [".npaignore", "spec.yaml"]
    assert sorted(rules.found.left_out) == [".npa", "elsewhere-store"]


def test_state_outside_the_tree_or_the_tree_itself_is_not_excluded(tmp_path: Path) -> None:
    root = write(tmp_path / "src", {"main.py": "x"})
    rules = IgnoreRules.for_tree(root, [tmp_path, root, tmp_path / "srcx"])
    assert rules.excluded == frozenset()
    assert staged(root, rules) == ["main.py"]
