"""The registry client against the real distribution registry (and a token front for it)."""

from __future__ import annotations

import uuid

import pytest

from npa.images.contract import read_attestation
from npa.images.credentials import CredentialStore, load_store
from npa.images.reference import parse_reference
from npa.images.registry import RegistryClient, Status
from tests.harness.procs import free_port
from tests.harness.registry import Registry
from tests.integration.imagespec import ATTESTED
from tests.integration.registry_proxy import PROXY_PASSWORD, PROXY_USER, SERVICE, token_proxy

pytestmark = pytest.mark.integration


def _repo(prefix: str) -> str:
    return f"npa-images/{prefix}-{uuid.uuid4().hex[:8]}"


def _basic_client(registry: Registry, password: str | None = None) -> RegistryClient:
    env = {"REG": f"{registry.auth[0]}:{password or registry.auth[1]}"}
    store = load_store([f"{registry.host}=env:REG"], env=env, use_docker_config=False)
    return RegistryClient(store, timeout=10)


def _token_client(proxy_host: str, password: str = PROXY_PASSWORD) -> RegistryClient:
    env = {"TOK": f"{PROXY_USER}:{password}"}
    store = load_store([f"{proxy_host}=env:TOK"], env=env, use_docker_config=False)
    return RegistryClient(store, timeout=10)


def test_basic_auth_single_manifest_digest_equals_pushed(registry: Registry) -> None:
    repo = _repo("single")
    pushed = registry.push_image(repo, "v1")
    answer = _basic_client(registry).check_manifest(parse_reference(f"{registry.host}/{repo}:v1"))
    assert answer.status is Status.OK, answer.detail
    assert answer.digest == pushed.digest
    assert answer.credential_source == "env:REG"


def test_index_resolves_to_index_digest_and_config_through_it(registry: Registry) -> None:
    repo = _repo("index")
    labels = dict(ATTESTED)
    pushed = registry.push_image(repo, "multi", labels=labels, user="1000", index=True)
    client = _basic_client(registry)
    ref = parse_reference(f"{registry.host}/{repo}:multi")
    answer = client.check_manifest(ref)
    assert answer.status is Status.OK, answer.detail
    assert answer.digest == pushed.digest != pushed.manifest_digest
    assert answer.media_type == "application/vnd.oci.image.index.v1+json"
    config = client.image_config(ref, pushed.digest)
    attestation = read_attestation(config)
    assert attestation is not None and attestation.uid == 1000


def test_pinned_digest_reference(registry: Registry) -> None:
    repo = _repo("pinned")
    pushed = registry.push_image(repo, "v1")
    client = _basic_client(registry)
    ok = client.check_manifest(parse_reference(f"{registry.host}/{repo}@{pushed.digest}"))
    assert ok.status is Status.OK and ok.digest == pushed.digest
    missing = client.check_manifest(parse_reference(f"{registry.host}/{repo}@sha256:{'0' * 64}"))
    assert missing.status is Status.NOT_FOUND


def test_not_found_tag_and_repository(registry: Registry) -> None:
    repo = _repo("nf")
    registry.push_image(repo, "v1")
    client = _basic_client(registry)
    tag = client.check_manifest(parse_reference(f"{registry.host}/{repo}:nope"))
    assert tag.status is Status.NOT_FOUND
    assert tag.error_code == "MANIFEST_UNKNOWN"
    name = client.check_manifest(parse_reference(f"{registry.host}/{repo}-absent:v1"))
    # This registry says MANIFEST_UNKNOWN for a missing repository too; others say NAME_UNKNOWN.
    assert name.status is Status.NOT_FOUND
    assert name.error_code in ("NAME_UNKNOWN", "MANIFEST_UNKNOWN")


def test_wrong_basic_credentials_are_forbidden(registry: Registry) -> None:
    repo = _repo("wrong")
    registry.push_image(repo, "v1")
    answer = _basic_client(registry, password="not-the-password").check_manifest(
        parse_reference(f"{registry.host}/{repo}:v1")
    )
    assert answer.status is Status.FORBIDDEN
    assert answer.credential_source == "env:REG"
    assert registry.host in answer.detail
    assert "not-the-password" not in answer.detail


def test_no_credentials_is_forbidden_naming_the_host(registry: Registry) -> None:
    repo = _repo("anon")
    registry.push_image(repo, "v1")
    answer = RegistryClient(CredentialStore({})).check_manifest(
        parse_reference(f"{registry.host}/{repo}:v1")
    )
    assert answer.status is Status.FORBIDDEN
    assert answer.credential_source is None
    assert f"{registry.host} refused" in answer.detail
    assert "needs credentials" in answer.detail


def test_closed_port_is_unreachable_not_absent() -> None:
    host = f"127.0.0.1:{free_port()}"
    answer = RegistryClient(CredentialStore({}), timeout=3).check_manifest(
        parse_reference(f"{host}/some/image:v1")
    )
    assert answer.status is Status.UNREACHABLE
    assert "connection refused" in answer.detail


def test_token_flow_with_credentials(registry: Registry) -> None:
    repo = _repo("tok")
    pushed = registry.push_image(repo, "v1", index=True)
    with token_proxy(registry) as proxy:
        client = _token_client(proxy.host)
        ref = parse_reference(f"{proxy.host}/{repo}:v1")
        answer = client.check_manifest(ref)
        assert answer.status is Status.OK, answer.detail
        assert answer.digest == pushed.digest
        assert answer.credential_source == "env:TOK"
        assert proxy.token_requests[0] == {
            "scope": f"repository:{repo}:pull",
            "service": SERVICE,
        }
        assert set(proxy.tokens.values()) == {"user"}
        # The token is reused: reading the config through the index asks for no new one.
        client.image_config(ref, pushed.digest)
        assert len(proxy.token_requests) == 1


def test_token_flow_anonymous_public_and_private(registry: Registry) -> None:
    public, private = _repo("pub"), _repo("priv")
    pushed = registry.push_image(public, "v1")
    registry.push_image(private, "v1")
    with token_proxy(registry, public={public}) as proxy:
        client = RegistryClient(CredentialStore({}))
        ok = client.check_manifest(parse_reference(f"{proxy.host}/{public}:v1"))
        assert ok.status is Status.OK and ok.digest == pushed.digest
        assert ok.credential_source is None
        denied = client.check_manifest(parse_reference(f"{proxy.host}/{private}:v1"))
        assert denied.status is Status.FORBIDDEN
        assert "anonymous pulls are refused" in denied.detail


def test_token_service_refuses_wrong_credentials(registry: Registry) -> None:
    repo = _repo("badtok")
    registry.push_image(repo, "v1")
    with token_proxy(registry) as proxy:
        answer = _token_client(proxy.host, password="wrong").check_manifest(
            parse_reference(f"{proxy.host}/{repo}:v1")
        )
    assert answer.status is Status.FORBIDDEN
    assert "token service" in answer.detail and "env:TOK" in answer.detail


def test_403_denied_is_forbidden(registry: Registry) -> None:
    repo = _repo("denied")
    registry.push_image(repo, "v1")
    with token_proxy(registry, denied={repo}) as proxy:
        answer = _token_client(proxy.host).check_manifest(
            parse_reference(f"{proxy.host}/{repo}:v1")
        )
    assert answer.status is Status.FORBIDDEN
    assert answer.http_status == 403 and answer.error_code == "DENIED"


def test_500_is_unreachable(registry: Registry) -> None:
    repo = _repo("broken")
    registry.push_image(repo, "v1")
    with token_proxy(registry, broken={repo}) as proxy:
        answer = _token_client(proxy.host).check_manifest(
            parse_reference(f"{proxy.host}/{repo}:v1")
        )
    assert answer.status is Status.UNREACHABLE
    assert answer.http_status == 500
