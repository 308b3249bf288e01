"""Every local path comes from NpaPaths, and no name can escape its directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from npa.core.errors import InvalidInput
from npa.core.paths import NpaPaths, home_root, safe_component, tools_cache_root

pytestmark = pytest.mark.unit


def test_root_defaults_to_home_dot_npa(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NPA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert home_root() == tmp_path / ".npa"


def test_npa_home_overrides_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NPA_HOME", str(tmp_path / "elsewhere"))
    assert NpaPaths.from_env().root == tmp_path / "elsewhere"


def test_layout(tmp_path: Path) -> None:
    p = NpaPaths(tmp_path)
    assert p.submission_receipt("robotics", "run-20261129-abc") == (
        tmp_path / "workflow-submissions" / "robotics" / "run-20261129-abc.json"
    )
    assert p.cluster_kubeconfig("nebius-eu1") == tmp_path / "clusters" / "nebius-eu1" / "kubeconfig"
    assert p.legacy_first_run_id == tmp_path / "paidf-first-run-id"
    assert p.operation_journal("prov-1") == tmp_path / "operations" / "prov-1.jsonl"
    assert (
        p.run_reservation("robotics", "factory") == tmp_path / "runs" / "robotics" / "factory.json"
    )
    assert p.lock("launch.robotics.r1") == tmp_path / "locks" / "launch.robotics.r1.lock"
    assert p.cache("images") == tmp_path / "cache" / "images"
    assert p.local_store == tmp_path / "store"
    assert p.pulumi_backend == tmp_path / "pulumi"
    assert p.config_file == tmp_path / "config.json"


@pytest.mark.parametrize(
    "bad", ["", "..", "../x", "a/b", "a/../b", ".hidden", "x..y", "a\\b", "sp ace", "a" * 300]
)
def test_unsafe_components_are_refused(bad: str) -> None:
    with pytest.raises(InvalidInput) as err:
        safe_component(bad, "run id")
    assert "run id" in err.value.message
    assert err.value.exit_code == 2


def test_receipt_path_refuses_traversal(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput):
        NpaPaths(tmp_path).submission_receipt("../../etc", "r1")


def test_tools_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NPA_TOOLS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tools_cache_root() == tmp_path / "npa-tools"
    monkeypatch.setenv("NPA_TOOLS_CACHE", str(tmp_path / "t"))
    assert tools_cache_root() == tmp_path / "t"
