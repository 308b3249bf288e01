"""Project configuration: recording an alias and resolving values with their sources."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from npa.core.errors import InvalidInput
from npa.core.paths import NpaPaths
from npa.services.configure import record_project, resolve_project, show

pytestmark = pytest.mark.unit

CLEAR = ("NPA_STORE", "NPA_REGISTRY", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION",
         "AWS_DEFAULT_REGION", "AWS_PROFILE", "NPA_CONTEXT", "AWS_ACCESS_KEY_ID",
         "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")  # fmt: skip


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, npa_home: Path) -> None:
    for name in CLEAR:
        monkeypatch.delenv(name, raising=False)


def test_nothing_configured_means_the_local_store(npa_home: Path) -> None:
    s = resolve_project("p1")
    assert s.value("store") == "local" and s.settings["store"].source == "default"
    assert not s.configured and s.identity == "unconfigured:p1"


def test_record_is_owner_only_and_keeps_its_identity(npa_home: Path) -> None:
    first = record_project("p1", {"store": "s3://bucket-a/pre/", "region": "eu-north1"})
    cfg = NpaPaths.from_env().config_file
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    assert stat.S_IMODE(cfg.parent.stat().st_mode) == 0o700
    second = record_project("p1", {"registry": "cr.example.com/team"})
    assert second.project_id == first.project_id
    assert second.changed == ["registry"]
    data = json.loads(cfg.read_text())
    assert data["projects"]["p1"]["store"] == "s3://bucket-a/pre"
    again = record_project("p1", {"registry": "cr.example.com/team"})
    assert again.changed == []


def test_precedence_flag_env_file_default(npa_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record_project("p1", {"store": "s3://from-file", "region": "file-region"})
    monkeypatch.setenv("AWS_REGION", "env-region")
    s = resolve_project("p1", {"store": "s3://from-flag"})
    assert (s.value("store"), s.settings["store"].source) == ("s3://from-flag", "flag")
    assert (s.value("region"), s.settings["region"].source) == ("env-region", "env")
    assert s.settings["region"].origin == "AWS_REGION"
    monkeypatch.delenv("AWS_REGION")
    s = resolve_project("p1")
    assert (s.value("store"), s.settings["store"].source) == ("s3://from-file", "file")
    assert (s.value("region"), s.settings["region"].source) == ("file-region", "file")
    assert s.settings["profile"].source == "default"


def test_credentials_are_named_never_shown(npa_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAVALUE123456")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://user:pw-secret@minio.example:9000")
    view = show("p1")
    dumped = view.model_dump_json() + "\n".join(view.text_lines())
    assert "AWS_SECRET_ACCESS_KEY" in dumped
    for secret in ("AKIAVALUE123456", "very-secret-value", "pw-secret"):
        assert secret not in dumped


def test_credentials_in_urls_are_refused(npa_home: Path) -> None:
    with pytest.raises(InvalidInput):
        record_project("p1", {"endpoint_url": "https://key:secret@s3.example"})
    with pytest.raises(InvalidInput):
        record_project("p1", {"store": "s3://key:secret@bucket/x"})
    assert not NpaPaths.from_env().config_file.exists()


@pytest.mark.parametrize(
    ("name", "value"),
    [("store", "ftp://x"), ("endpoint_url", "not a url"), ("registry", "bad registry!"),
     ("context", "bad\ncontext")],
)  # fmt: skip
def test_bad_values_are_refused(npa_home: Path, name: str, value: str) -> None:
    with pytest.raises(InvalidInput):
        record_project("p1", {name: value})


def test_show_lists_every_configured_project(npa_home: Path) -> None:
    record_project("b", {})
    record_project("a", {})
    assert [p.project for p in show(None).projects] == ["a", "b"]


def test_show_writes_nothing(npa_home: Path) -> None:
    record_project("p1", {"store": "s3://bucket-a"})

    def snapshot() -> dict[str, int]:
        return {str(p): p.stat().st_mtime_ns for p in npa_home.rglob("*")}

    before = snapshot()
    show(None)
    show("p1")
    show("never-configured")
    assert snapshot() == before


def test_show_names_the_region_and_endpoint_the_aws_config_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The S3 client takes them from the profile (s3_settings); --show must not call them unset.
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text(
        "[default]\nregion = eu-north1\nendpoint_url = http://minio.test:9000\n"
        "[profile team]\nregion = ap-south-1\n"
    )
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AWS_CONFIG_FILE", raising=False)
    [p] = show("p1").projects
    assert p.settings["region"].value == "eu-north1"
    assert (p.settings["region"].source, p.settings["region"].origin) == (
        "aws-config",
        "profile default",
    )
    assert p.settings["endpoint_url"].value == "http://minio.test:9000"
    record_project("p2", {"profile": "team"})
    [q] = show("p2").projects
    assert q.settings["region"].value == "ap-south-1" and q.settings["endpoint_url"].value is None
    monkeypatch.setenv("AWS_REGION", "sa-east-1")  # npa's own sources still come first
    [r] = show("p1").projects
    assert (r.settings["region"].value, r.settings["region"].source) == ("sa-east-1", "env")


def test_a_stage_role_is_an_iam_role_arn_and_an_empty_one_unsets_it(npa_home: Path) -> None:
    role = "arn:aws:iam::123456789012:role/team/npa-stage"
    assert resolve_project("p1").value("stage_role_arn") is None  # the store Secret's, unscoped
    record_project("p1", {"stage_role_arn": role})
    assert resolve_project("p1").settings["stage_role_arn"].value == role
    with pytest.raises(InvalidInput) as bad:
        record_project("p1", {"stage_role_arn": "npa-stage"})
    assert bad.value.fix is not None
    assert "--stage-role-arn arn:aws:iam::123456789012:role/npa-stage" in bad.value.fix
    assert resolve_project("p1").value("stage_role_arn") == role  # nothing half-recorded
    unset = record_project("p1", {"stage_role_arn": ""})
    assert unset.changed == ["stage_role_arn"] and unset.recorded["stage_role_arn"] is None
    assert resolve_project("p1").settings["stage_role_arn"].source == "default"
