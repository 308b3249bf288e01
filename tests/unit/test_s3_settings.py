"""One S3 configuration, one store: both clients (obstore, the default, and botocore) are built
from npa.adapters.storage.s3.s3_settings, and for every configuration in the matrix below they
go to the endpoint and region a real botocore client picks from the same configuration, with
credentials from the same source. Nothing here connects anywhere: building a client does not."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npa.adapters.storage.s3 import S3Store as BotocoreS3Store
from npa.adapters.storage.s3 import s3_settings
from npa.adapters.storage.s3_obstore import ObstoreS3Store
from tests.tiers import examples

ENV_NAMES = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)  # fmt: skip
CONFIGS = {
    "none": None,
    "default-endpoint": "[default]\nendpoint_url = http://profile.test:9000\nregion = eu-north1\n",
    "default-services": (
        "[default]\nservices = objects\nregion = eu-west-2\n"
        "[services objects]\ns3 =\n  endpoint_url = http://service.test:9000\n"
    ),
    "named": "[profile team]\nendpoint_url = http://team.test:9000\nregion = ap-south-1\n",
    "region-only": "[default]\nregion = us-west-2\n",
}
CREDENTIALS = "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n"
CREDENTIALS += "[team]\naws_access_key_id = TEAMKEY\naws_secret_access_key = teamsecret\n"


@dataclass(frozen=True)
class Case:
    config: str
    env_keys: bool
    env_endpoint: str | None  # "s3", "global" or None
    env_region: str | None  # the variable set, if any
    ignore: bool
    profile: str | None  # "arg", "env" or None
    flag_endpoint: bool


CASES = [
    Case(*values)
    for values in itertools.product(
        CONFIGS, (True, False), ("s3", "global", None), ("AWS_DEFAULT_REGION", "AWS_REGION", None),
        (True, False),
        ("arg", "env", None), (True, False),
    )
    # A named profile must exist for botocore to start at all.
    if not (values[5] is not None and values[0] != "named")
]  # fmt: skip


def _setup(case: Case, home: Path, monkeypatch: pytest.MonkeyPatch) -> str | None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    aws = home / ".aws"
    aws.mkdir(parents=True, exist_ok=True)
    (aws / "credentials").write_text(CREDENTIALS)
    text = CONFIGS[case.config]
    if text is not None:
        (aws / "config").write_text(text)
    if case.env_keys:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    if case.env_endpoint == "s3":
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://env-s3.test:9000")
    elif case.env_endpoint == "global":
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env-global.test:9000")
    if case.env_region:
        monkeypatch.setenv(case.env_region, "sa-east-1")
    if case.ignore:
        monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    if case.profile == "env":
        monkeypatch.setenv("AWS_PROFILE", "team")
    return "team" if case.profile == "arg" else None


def _botocore_truth(profile: str | None, endpoint: str | None) -> tuple[str, str, str]:
    """What a plain botocore client, made from the same configuration, uses."""
    import botocore.session

    session = botocore.session.Session(profile=profile)
    client = session.create_client("s3", endpoint_url=endpoint)
    creds = session.get_credentials()
    return client.meta.endpoint_url, client.meta.region_name, creds.method if creds else "none"


@settings(max_examples=examples(120), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES))
def test_both_clients_go_where_botocore_goes(
    case: Case, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = _setup(case, tmp_path_factory.mktemp("home"), monkeypatch)
    flag = "http://flag.test:9000" if case.flag_endpoint else None
    resolved = s3_settings(endpoint_url=flag, profile=profile)
    endpoint, region, method = _botocore_truth(profile, flag)
    if resolved.endpoint_url is None:
        assert "amazonaws.com" in endpoint  # botocore too configured none: AWS itself
    else:
        assert resolved.endpoint_url == endpoint
    assert (resolved.region or "us-east-1") == region
    assert resolved.credential_source == method

    obstore = ObstoreS3Store("bucket", "p", endpoint_url=flag, profile=profile)
    boto = BotocoreS3Store("bucket", "p", endpoint_url=flag, profile=profile)
    assert obstore.endpoint_url == boto.endpoint_url == resolved.endpoint_url
    assert boto.client.meta.endpoint_url == endpoint
    config = obstore.store.config
    assert config.get("endpoint") == resolved.endpoint_url  # obstore read nothing else
    assert config.get("region") == region
    assert obstore.credential_source == boto.credential_source == method


def test_the_matrix_covers_every_source() -> None:
    assert len(CASES) >= 500
    assert {c.config for c in CASES} == set(CONFIGS)
