"""The configuration npa starts docker's client with for a stage's container
(npa.adapters.containers.docker_client_config): the user's, without the proxies the client
would pass on and without credentials; tests/integration/test_docker_client.py shows the real
client's side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npa.adapters.containers import docker_client_config
from npa.core.errors import Unavailable
from npa.core.paths import docker_config_path

pytestmark = pytest.mark.unit

SECRET = "c2VjcmV0LXVzZXI6c2VjcmV0LXBhc3N3b3Jk"


def folder_with(tmp_path: Path, config: object | str) -> Path:
    folder = tmp_path / "docker"
    folder.mkdir()
    text = config if isinstance(config, str) else json.dumps(config)
    (folder / "config.json").write_text(text)
    return folder


def test_the_copy_drops_proxies_and_credentials_and_links_the_rest(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, {
        "proxies": {"default": {"httpProxy": "http://p:3128"}},
        "auths": {"r.example": {"auth": SECRET}},
        "credsStore": "pass",
        "credHelpers": {"gcr.io": "gcloud"},
        "currentContext": "remote",
        "detachKeys": "ctrl-e,e",
    })  # fmt: skip
    (folder / "contexts" / "meta").mkdir(parents=True)
    (folder / "cli-plugins").mkdir()
    into = tmp_path / "work" / "docker-client"
    made = docker_client_config({"DOCKER_CONFIG": str(folder)}, into)
    assert made == into
    assert json.loads((into / "config.json").read_text()) == {
        "currentContext": "remote",
        "detachKeys": "ctrl-e,e",
    }
    assert SECRET not in (into / "config.json").read_text()
    assert {p.name for p in into.iterdir()} == {"config.json", "contexts", "cli-plugins"}
    assert (into / "contexts").is_symlink() and (into / "contexts").resolve() == folder / "contexts"
    assert into.stat().st_mode & 0o777 == 0o700
    # Asked again (a continuing executor), the same folder, the links kept.
    assert docker_client_config({"DOCKER_CONFIG": str(folder)}, into) == into


@pytest.mark.parametrize(
    "config",
    [{"auths": {"r.example": {"auth": SECRET}}}, {}, "not json {", "[1, 2]", "null"],
    ids=["no-proxies", "empty", "broken", "a-list", "null"],
)
def test_without_proxies_the_client_keeps_its_users_own_folder(
    tmp_path: Path, config: object
) -> None:
    folder = folder_with(tmp_path, config)
    into = tmp_path / "docker-client"
    assert docker_client_config({"DOCKER_CONFIG": str(folder)}, into) is None
    assert not into.exists()


def test_no_config_at_all_is_nothing_to_copy(tmp_path: Path) -> None:
    assert docker_client_config({"HOME": str(tmp_path)}, tmp_path / "docker-client") is None


def test_the_home_folder_is_where_docker_looks_without_docker_config(tmp_path: Path) -> None:
    (tmp_path / ".docker").mkdir()
    (tmp_path / ".docker" / "config.json").write_text(json.dumps({"proxies": {}}))
    assert docker_config_path({"HOME": str(tmp_path)}) == tmp_path / ".docker" / "config.json"
    made = docker_client_config({"HOME": str(tmp_path)}, tmp_path / "out")
    assert made is not None and json.loads((made / "config.json").read_text()) == {}


def test_a_folder_it_cannot_write_is_unavailable_with_a_fix(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, {"proxies": {"default": {"httpProxy": "http://p"}}})
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # no folder can be made under a file, even by root
    with pytest.raises(Unavailable) as caught:
        docker_client_config({"DOCKER_CONFIG": str(folder)}, blocked / "docker-client")
    assert "docker's client configuration" in caught.value.message
    assert caught.value.fix and caught.value.fix.startswith("df -h")


KEY = st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=12)


@given(st.dictionaries(KEY, st.one_of(st.text(max_size=8), st.integers()), max_size=6))
def test_every_key_but_the_dropped_ones_is_kept_as_it_was(other: dict[str, object]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dropped = {"proxies": {"default": {}}, "auths": {"h": {"auth": SECRET}}}
        folder = folder_with(root, {**other, **dropped})
        made = docker_client_config({"DOCKER_CONFIG": str(folder)}, root / "out")
        assert made is not None
        kept = json.loads((made / "config.json").read_text())
        never = ("proxies", "auths", "credsStore", "credHelpers")
        assert kept == {k: v for k, v in other.items() if k not in never}
