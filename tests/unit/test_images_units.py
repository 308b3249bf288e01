"""Pure parts of npa.images: references, credentials, contract labels, overrides, cache."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from npa.backends.base import pod_security_context
from npa.core.errors import InvalidInput
from npa.core.paths import NpaPaths
from npa.images import cache as cache_mod
from npa.images.cache import VerificationCache
from npa.images.contract import (
    ContractViolation,
    enforce_declared_user,
    read_attestation,
)
from npa.images.credentials import load_store, normalize_host
from npa.images.overrides import choose_images, parse_overrides
from npa.images.probe import LIMITS, PROBE_SCRIPT, parse_result, probe_pod
from npa.images.reference import parse_reference, parse_registry
from npa.images.registry import parse_challenge
from npa.spec.imageref import parse_image_ref

pytestmark = pytest.mark.unit

D = "sha256:" + "a" * 64


# --- references ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "domain", "path", "tag", "digest"),
    [
        ("ubuntu", "docker.io", "library/ubuntu", "latest", None),
        ("ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", None),
        ("docker.io/ubuntu", "docker.io", "library/ubuntu", "latest", None),
        ("index.docker.io/team/app:1", "docker.io", "team/app", "1", None),
        ("team/app", "docker.io", "team/app", "latest", None),
        ("localhost/app", "localhost", "app", "latest", None),
        ("localhost:5000/a/b/c:v1", "localhost:5000", "a/b/c", "v1", None),
        ("127.0.0.1:5000/a@" + D, "127.0.0.1:5000", "a", None, D),
        ("ghcr.io/o/r:1.0@" + D, "ghcr.io", "o/r", "1.0", D),
        ("[::1]:5000/x:y", "[::1]:5000", "x", "y", None),
    ],
)
def test_reference_normalisation(
    text: str, domain: str, path: str, tag: str | None, digest: str | None
) -> None:
    ref = parse_reference(text)
    assert (ref.domain, ref.path, ref.tag, ref.digest) == (domain, path, tag, digest)
    assert ref.reference == (digest or tag)


def test_docker_hub_api_host_differs_from_its_name() -> None:
    ref = parse_reference("busybox")
    assert ref.api_host == "registry-1.docker.io" and ref.credential_host == "docker.io"
    assert ref.pinned(D) == f"docker.io/library/busybox@{D}"


def test_default_registry_applies_only_without_a_host() -> None:
    assert (
        str(parse_reference("tool:1", default_registry="r.io:5000/team")) == "r.io:5000/team/tool:1"
    )
    assert str(parse_reference("q.io/x:1", default_registry="r.io/team")) == "q.io/x:1"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("a b", "whitespace"),
        ("https://ghcr.io/x", "scheme"),
        ("x@sha256:abc", "digest"),
        ("x@md5:" + "a" * 32, "digest"),
        ("x:", "tag"),
        ("x:.bad", "tag"),
        ("reg.io/Team/x", "lowercase"),
        ("a//b", "empty path component"),
        ("a/", "empty path component"),
        ("reg.io:99999999/x", "HOST[:PORT]"),
        ("x" * 600, "longer"),
    ],
)
def test_malformed_references_say_why(text: str, reason: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_reference(text)
    assert reason in err.value.message
    # The form is said; no command could write the reference the user meant, so none is given.
    assert "the form is [registry[:port]/]repository" in err.value.message
    assert err.value.fix is None


def test_registry_flag_shape() -> None:
    assert parse_registry("r.io:5000/team/") == "r.io:5000/team"
    for bad in ("https://r.io", "r.io/Team", ""):
        with pytest.raises(InvalidInput):
            parse_registry(bad)


_component = st.from_regex(r"[a-z0-9]{1,6}(?:[._-][a-z0-9]{1,4}){0,2}", fullmatch=True)


@given(
    host=st.sampled_from(["", "r.io/", "127.0.0.1:5000/", "localhost/"]),
    parts=st.lists(_component, min_size=1, max_size=3),
    tag=st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,10}", fullmatch=True)),
    digest=st.one_of(st.none(), st.just(D)),
)
def test_parser_agrees_with_the_spec_grammar_and_round_trips(
    host: str, parts: list[str], tag: str | None, digest: str | None
) -> None:
    # A first component with a dot is read as a registry host (the runtime rule); one that is
    # not a valid host is refused with its own message, which the spec grammar cannot give.
    assume(not (host == "" and len(parts) > 1 and "." in parts[0] and "_" in parts[0]))
    text = host + "/".join(parts) + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
    assert parse_image_ref(text) is not None
    ref = parse_reference(text)
    again = parse_reference(str(ref))
    assert again == ref


# --- credentials -----------------------------------------------------------------------------
def test_docker_config_auth_forms(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    b64 = base64.b64encode(b"u1:p1-secret").decode()
    config.write_text(
        json.dumps(
            {
                "auths": {
                    "https://index.docker.io/v1/": {"auth": b64},
                    "http://127.0.0.1:5000": {"username": "u2", "password": "p2-secret"},
                    "ghcr.io": {"identitytoken": "tok-secret"},
                },
                "credHelpers": {"123.dkr.ecr.us-east-1.amazonaws.com": "ecr-login"},
            }
        )
    )
    store = load_store([str(config)], env={}, use_docker_config=False)
    hub = store.lookup("docker.io")
    assert hub is not None and hub.username == "u1" and hub.source == f"file:{config}"
    assert store.lookup("127.0.0.1:5000") is not None
    # An identity token is kept as one, for the token service to exchange.
    token = store.lookup("ghcr.io")
    assert token is not None and token.identity_token and "tok-secret" not in repr(token)
    assert "ecr-login" in (store.why_none("123.dkr.ecr.us-east-1.amazonaws.com") or "")
    # Neither repr nor str of a credential shows its secret.
    assert "p1-secret" not in repr(hub) and "p1-secret" not in str(hub)


def test_env_credentials_precede_docker_config(tmp_path: Path) -> None:
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / "config.json").write_text(
        json.dumps({"auths": {"r.io": {"username": "d", "password": "dp"}}})
    )
    env = {"DOCKER_CONFIG": str(docker), "CRED": "e:ep"}
    store = load_store(["r.io=env:CRED"], env=env)
    assert store.lookup("r.io").source == "env:CRED"  # type: ignore[union-attr]
    assert load_store([], env=env).lookup("r.io").source.startswith("docker-config:")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("spec", "env", "message"),
    [
        ("r.io=env:UNSET", {}, "not set"),
        ("r.io=env:BAD", {"BAD": "no-colon"}, "USER:PASSWORD"),
        ("r.io=user:hunter2", {}, "never goes on the command line"),
        ("/does/not/exist.json", {}, "does not exist"),
    ],
)
def test_bad_registry_auth_values(spec: str, env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_store([spec], env=env, use_docker_config=False)
    assert message in err.value.message
    assert "hunter2" not in err.value.message and "no-colon" not in err.value.message


def test_normalize_host() -> None:
    assert normalize_host("https://index.docker.io/v1/") == "docker.io"
    assert normalize_host("http://R.io:5000/path") == "r.io:5000"


# --- registry protocol details ---------------------------------------------------------------
def test_parse_bearer_challenge() -> None:
    c = parse_challenge(
        'Bearer realm="https://auth.example/token",service="reg",scope="repository:a/b:pull"'
    )
    assert c is not None and c.scheme == "bearer"
    assert c.params == {
        "realm": "https://auth.example/token",
        "service": "reg",
        "scope": "repository:a/b:pull",
    }
    basic = parse_challenge('Basic realm="x"')
    assert basic is not None and basic.scheme == "basic"
    assert parse_challenge("") is None


# --- contract --------------------------------------------------------------------------------
def _config(labels: dict[str, str], user: str | None = None) -> dict[str, object]:
    return {"config": {"Labels": labels, **({"User": user} if user else {})}}


GOOD = {
    "io.npa.contract.version": "2",
    "io.npa.contract.user": "1000:1001",
    "io.npa.contract.capabilities": (
        "posix-shell, writable-tmp, bash, passwd-user, writable-home, sudo, aws-cli, extra"
    ),
}


def test_attested_image() -> None:
    att = read_attestation(_config(GOOD, user="1000"))
    assert att is not None and (att.version, att.uid, att.gid) == (2, 1000, 1001)


def test_unattested_image() -> None:
    assert read_attestation(_config({"org.opencontainers.image.title": "x"})) is None
    assert read_attestation({}) is None


def test_an_older_contract_promises_too_little_and_is_probed_instead() -> None:
    # Contract 1 promised no passwd entry, home or sudo, which SkyPilot's pod set-up needs.
    older = {**GOOD, "io.npa.contract.version": "1"}
    older["io.npa.contract.capabilities"] = "posix-shell,writable-tmp"
    assert read_attestation(_config(older, user="1000")) is None


@pytest.mark.parametrize(
    ("change", "user", "message"),
    [
        ({"io.npa.contract.version": "3"}, None, "upgrade npa"),
        ({"io.npa.contract.version": "one"}, None, "whole number"),
        ({"io.npa.contract.user": "root"}, None, "numeric"),
        ({"io.npa.contract.user": "0"}, None, "root"),
        ({"io.npa.contract.capabilities": "posix-shell"}, None, "writable-tmp"),
        ({"io.npa.contract.capabilities": "posix-shell,writable-tmp"}, None, "sudo"),
        ({}, "1001", "User"),
    ],
)
def test_contract_violations(change: dict[str, str], user: str | None, message: str) -> None:
    with pytest.raises(ContractViolation) as err:
        read_attestation(_config({**GOOD, **change}, user=user))
    assert message in str(err.value)


def test_run_as_root_cannot_replace_declared_user() -> None:
    enforce_declared_user("curator", "r.io/c@" + D, 1000, 1000)
    with pytest.raises(InvalidInput) as err:
        enforce_declared_user("curator", "r.io/c@" + D, 1000, 0)
    assert "'curator'" in err.value.message and "r.io/c@" in err.value.message
    assert "runAsUser: 0" in err.value.message


# --- overrides -------------------------------------------------------------------------------
def test_override_precedence() -> None:
    spec = {"a": "r.io/a:1", "b": "r.io/b:1", "c": "r.io/c:1"}
    over = parse_overrides(["a=r.io/a:2"], spec)
    chosen = {c.tool: (c.image, c.source) for c in choose_images(spec, over, "r.io/all:9")}
    assert chosen == {
        "a": ("r.io/a:2", "override"),
        "b": ("r.io/all:9", "image"),
        "c": ("r.io/all:9", "image"),
    }
    plain = {c.tool: c.source for c in choose_images(spec, {}, None)}
    assert set(plain.values()) == {"spec"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["x=r.io/x:1"], "unknown tool 'x'; the spec declares: a, b"),
        (["a=r.io/a:1", "a=r.io/a:2"], "twice"),
        (["a"], "TOOL_REF=IMAGE"),
        (["a=BAD REF"], "malformed"),
    ],
)
def test_override_errors(values: list[str], message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_overrides(values, ["a", "b"])
    assert message in err.value.message


def test_an_override_of_a_mistyped_tool_suggests_the_real_one() -> None:
    with pytest.raises(InvalidInput) as err:
        parse_overrides(["curatr=r.io/c:1"], ["curator", "augment"])
    assert "did you mean 'curator'?" in err.value.message
    # The overrides to run with; the CLI writes them into the command (or submit's own rerun).
    assert err.value.details["rerun_with"] == {"--image-override": ["curator=r.io/c:1"]}
    with pytest.raises(InvalidInput) as again:
        parse_overrides(["a=r.io/a:1", "curatr=r.io/c:1"], ["curator", "a"], rerun=" ".join)
    assert again.value.fix == "a=r.io/a:1 curator=r.io/c:1"


def test_the_cli_writes_the_overrides_into_the_command() -> None:
    from npa.core.commands import with_values

    argv = ["x", "s.yaml", "--image-override", "a=1", "--json", "--image-override=b=2"]
    assert with_values(argv, {"--image-override": ["b=2"]}) == (
        "npa x s.yaml --image-override b=2 --json"
    )
    assert with_values(["x"], {"--image-override": ["c=3"]}) == "npa x --image-override c=3"


# --- cache -----------------------------------------------------------------------------------
def test_cache_keys_on_contract_version_and_probe_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = VerificationCache(NpaPaths(tmp_path / "npa"))
    assert cache.store(D, "probe", 1000, 1000)
    assert cache.lookup(D, 1000) is not None
    assert cache.lookup(D, 1001) is None  # probed as another user
    monkeypatch.setattr(cache_mod, "CONTRACT_VERSION", cache_mod.CONTRACT_VERSION + 1)
    assert cache.lookup(D, 1000) is None  # a new contract version invalidates
    monkeypatch.undo()
    file = next((tmp_path / "npa" / "cache" / "images").iterdir())
    file.write_text("{not json")
    assert cache.lookup(D, 1000) is None  # damaged entries are misses


def test_a_deferring_cache_writes_only_on_commit(tmp_path: Path) -> None:
    root = tmp_path / "npa"
    cache = VerificationCache(NpaPaths(root), defer=True)
    assert cache.store(D, "contract", 1000, None)
    assert cache.lookup(D, 1000) is not None  # what this check verified counts already
    assert not root.exists()  # but nothing is written
    cache.commit()
    assert VerificationCache(NpaPaths(root)).lookup(D, 1000) is not None
    assert not cache.pending


def test_cache_write_failure_is_not_fatal(tmp_path: Path) -> None:
    # A file where the cache directory belongs: unwritable even for root.
    root = tmp_path / "npa"
    root.mkdir()
    (root / "cache").write_text("not a directory")
    cache = VerificationCache(NpaPaths(root))
    assert cache.store(D, "contract", 1000, None) is False
    assert cache.lookup(D, 1000) is None


# --- probe pieces ----------------------------------------------------------------------------
def test_probe_pod_is_bounded_and_runs_as_the_task_does() -> None:
    pod = probe_pod("npa-probe-x", "r.io/a@" + D, 1000, 1001, 60, 1002)
    spec = pod.spec
    assert spec.active_deadline_seconds == 60 and spec.restart_policy == "Never"
    assert spec.automount_service_account_token is False
    c = spec.containers[0]
    assert c.image.endswith(D) and c.command[:2] == ["/bin/sh", "-c"]
    assert c.resources.limits == LIMITS and c.resources.requests == LIMITS
    # Exactly the pod security context render writes into the task, nothing stricter.
    rendered = pod_security_context(1000, 1001, 1002)
    ctx = spec.security_context
    assert (ctx.run_as_non_root, ctx.run_as_user, ctx.run_as_group, ctx.fs_group) == (
        rendered["runAsNonRoot"],
        rendered["runAsUser"],
        rendered["runAsGroup"],
        rendered["fsGroup"],
    )
    assert c.security_context is None


def test_probe_result_line() -> None:
    line = (
        "noise\nnpa-probe/2 uid=1000 posix-shell=yes writable-tmp=no bash=yes passwd-user=no "
        "writable-home=no sudo=no aws-cli=no\n"
    )
    fields = parse_result(line)
    assert fields == {
        "version": "2",
        "uid": "1000",
        "posix-shell": "yes",
        "writable-tmp": "no",
        "bash": "yes",
        "passwd-user": "no",
        "writable-home": "no",
        "sudo": "no",
        "aws-cli": "no",
    }
    assert parse_result("garbage") is None
    assert "/dev/termination-log" in PROBE_SCRIPT
