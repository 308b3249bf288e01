"""How a failed image pull is classified (npa.core.faults.classify_pull_failure), from messages
in the shapes the runtimes print them: the kubelet's ErrImagePull event over containerd, over
CRI-O and over dockershim, docker's and podman's own pull and run errors. The rule (the module
says it): the registry's not-found or forbidden answer is actionable configuration, a failing
registry or network is transient, and where both appear the registry's answer wins."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.core.faults import Classification, classify_pull_failure
from npa.launch import supervision
from npa.launch.supervision import (
    POD_START,
    Policy,
    Recovery,
    count_startup_failure,
    failure_signature,
    image_fault,
)
from npa.runs.manifest import SupervisorRecord
from tests.tiers import examples

pytestmark = pytest.mark.unit

CONFIG = Classification.ACTIONABLE_CONFIGURATION
TRANSIENT = Classification.TRANSIENT_INFRASTRUCTURE

ABSENT = "registry.example:5000/npa/absent@sha256:" + "0" * 64
HUB = "docker.io/library/nginx:does-not-exist"


def kubelet(image: str, runtime_error: str) -> str:
    """The message of the kubelet's "Failed" event (and of ErrImagePull's waiting state)."""
    return f'Failed to pull image "{image}": {runtime_error}'


# (runtime, image, message): the registry answered that the image is not there.
NOT_FOUND = [
    ("containerd digest", ABSENT, kubelet(ABSENT,
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{ABSENT}": '
        f'failed to resolve reference "{ABSENT}": {ABSENT}: not found')),
    ("containerd tag", HUB, kubelet(HUB,
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{HUB}": '
        f'failed to resolve reference "{HUB}": {HUB}: not found')),
    ("containerd HEAD 404", "ghcr.io/team/tool:v1", kubelet("ghcr.io/team/tool:v1",
        'failed to resolve reference "ghcr.io/team/tool:v1": unexpected status from HEAD '
        "request to https://ghcr.io/v2/team/tool/manifests/v1: 404 Not Found")),
    ("dockershim", "team/kubectl:v1.18.20", kubelet("team/kubectl:v1.18.20",
        "rpc error: code = Unknown desc = Error response from daemon: manifest for "
        "team/kubectl:v1.18.20 not found: manifest unknown: manifest unknown")),
    ("cri-o digest", ABSENT, kubelet(ABSENT,
        "rpc error: code = Unknown desc = reading manifest sha256:" + "0" * 64
        + " in registry.example:5000/npa/absent: manifest unknown")),
    ("cri-o name", "registry.example/team/gone:1", kubelet("registry.example/team/gone:1",
        "rpc error: code = Unknown desc = initializing source docker://registry.example/team/"
        "gone:1: reading manifest 1 in registry.example/team/gone: name unknown: repository "
        "name not known to registry")),
    ("docker pull", "team/tool:15", "Error response from daemon: manifest for team/tool:15 "
        "not found: manifest unknown: manifest unknown"),
    ("podman pull", "quay.io/team/tool:v9", "Error: initializing source docker://quay.io/team/"
        "tool:v9: reading manifest v9 in quay.io/team/tool: manifest unknown"),
    ("podman run --pull=never", ABSENT, f"Error: {ABSENT}: image not known"),
    ("docker run --pull=never", ABSENT, f"docker: Error response from daemon: No such image: "
        f"{ABSENT}."),
]  # fmt: skip

# The registry answered that this puller may not have the image.
FORBIDDEN = [
    ("containerd insufficient_scope", "docker.io/image/doesnotexist:latest", kubelet(
        "docker.io/image/doesnotexist:latest",
        'rpc error: code = Unknown desc = failed to pull and unpack image "docker.io/image/'
        'doesnotexist:latest": failed to resolve reference "docker.io/image/doesnotexist:'
        'latest": pull access denied, repository does not exist or may require '
        "authorization: server message: insufficient_scope: authorization failed")),
    ("containerd 401 token", "registry.example/team/private:1", kubelet(
        "registry.example/team/private:1",
        'failed to pull and unpack image "registry.example/team/private:1": failed to resolve '
        'reference "registry.example/team/private:1": failed to authorize: failed to fetch '
        "anonymous token: unexpected status: 401 Unauthorized")),
    ("containerd 403 HEAD", "someacr.azurecr.io/image:tag", kubelet(
        "someacr.azurecr.io/image:tag",
        'rpc error: code = Unknown desc = failed to pull and unpack image "someacr.azurecr.io/'
        'image:tag": failed to resolve reference "someacr.azurecr.io/image:tag": unexpected '
        "status from HEAD request to https://someacr.azurecr.io/v2/image/manifests/tag: "
        "403 Forbidden")),
    ("containerd no credentials", "harbor.example/lan/app:1", kubelet(
        "harbor.example/lan/app:1", "pull access denied, repository does not exist or may "
        "require authorization: authorization failed: no basic auth credentials")),
    ("buildkit status", "team/app:1", "pull access denied, repository does not exist or may "
        "require authorization: authorization status: 401: authorization failed"),
    ("dockershim denied", "npa/private:1", kubelet("npa/private:1",
        "rpc error: code = Unknown desc = Error response from daemon: pull access denied for "
        "npa/private, repository does not exist or may require 'docker login': denied: "
        "requested access to the resource is denied")),
    ("cri-o denied", "docker.io/crio/busybox", kubelet("docker.io/crio/busybox",
        "rpc error: code = Unknown desc = Error reading manifest latest in docker.io/crio/"
        "busybox: errors:\ndenied: requested access to the resource is denied\n"
        "unauthorized: authentication required")),
    ("quay", "quay.io/team/private:2", "Error: initializing source docker://quay.io/team/"
        "private:2: reading manifest 2 in quay.io/team/private: unauthorized: access to the "
        "requested resource is not authorized"),
    ("podman denied", "team/nexus3:latest", "Error: initializing source docker://team/nexus3:"
        "latest: reading manifest latest in docker.io/team/nexus3: errors:\ndenied: requested "
        "access to the resource is denied\nunauthorized: authentication required"),
]  # fmt: skip

# The registry, or the way to it, failed: asking again may work.
TRANSIENT_SHAPES = [
    ("containerd i/o timeout", ABSENT, kubelet(ABSENT,
        f'rpc error: code = Unknown desc = failed to pull and unpack image "{ABSENT}": failed '
        f'to resolve reference "{ABSENT}": failed to do request: Head "https://registry.'
        'example:5000/v2/npa/absent/manifests/sha256:' + "0" * 64 + '": dial tcp '
        "10.0.0.5:5000: i/o timeout")),
    ("containerd refused", ABSENT, kubelet(ABSENT,
        f'failed to resolve reference "{ABSENT}": failed to do request: Head "https://'
        'registry.example:5000/v2/npa/absent/manifests/x": dial tcp 127.0.0.1:5000: connect: '
        "connection refused")),
    ("dockershim client timeout", "docker.io/bitnami/nginx:1.22.0", kubelet(
        "docker.io/bitnami/nginx:1.22.0", "rpc error: code = Unknown desc = Error response "
        "from daemon: Get https://registry-1.docker.io/v2/: net/http: request canceled while "
        "waiting for connection (Client.Timeout exceeded while awaiting headers)")),
    ("dockershim DNS", "nginx:v1.1", kubelet("nginx:v1.1", "rpc error: code = Unknown desc = "
        "Error response from daemon: Get https://registry-1.docker.io/v2/: dial tcp: lookup "
        "registry-1.docker.io: no such host")),
    ("cri-o DNS", "docker.io/library/nginx", kubelet("docker.io/library/nginx",
        "rpc error: code = Unknown desc = error pinging docker registry registry-1.docker.io: "
        'Get "https://registry-1.docker.io/v2/": proxyconnect tcp: dial tcp: lookup http: '
        "Temporary failure in name resolution")),
    ("containerd 503", "ghcr.io/team/tool:v1", kubelet("ghcr.io/team/tool:v1",
        'failed to resolve reference "ghcr.io/team/tool:v1": unexpected status from HEAD '
        "request to https://ghcr.io/v2/team/tool/manifests/v1: 503 Service Unavailable")),
    ("docker 500", "team/tool:1", "Error response from daemon: received unexpected HTTP "
        "status: 500 Internal Server Error"),
    ("containerd 502", "team/tool:1", "failed to copy: httpReadSeeker: failed open: unexpected "
        "status code https://reg.example/v2/team/tool/blobs/sha256:ab: 502 Bad Gateway"),
    ("containerd 429", "python:3.13-slim", kubelet("python:3.13-slim",
        "unexpected status from HEAD request to https://registry-1.docker.io/v2/library/"
        "python/manifests/3.13-slim: 429 Too Many Requests")),
    ("docker hub rate limit", "python:3.13-slim", "toomanyrequests: You have reached your "
        "pull rate limit. You may increase the limit by authenticating and upgrading: "
        "https://www.docker.com/increase-rate-limit"),
    ("token server timeout", HUB, kubelet(HUB, "failed to authorize: failed to fetch anonymous "
        'token: Get "https://auth.docker.io/token?scope=repository%3Alibrary%2Fnginx%3Apull": '
        "dial tcp: i/o timeout")),
    ("TLS handshake", "reg.example/team/tool:1", "Error response from daemon: Get "
        "https://reg.example/v2/: net/http: TLS handshake timeout"),
    ("EOF", "reg.example/team/tool:1", 'failed to copy: httpReadSeeker: failed open: failed to '
        'do request: Get "https://reg.example/v2/team/tool/blobs/sha256:ab": EOF'),
    ("deadline", ABSENT, "rpc error: code = DeadlineExceeded desc = context deadline exceeded"),
]  # fmt: skip


@pytest.mark.parametrize(("runtime", "image", "message"), NOT_FOUND + FORBIDDEN)
def test_the_registrys_not_found_or_forbidden_answer_is_configuration(
    runtime: str, image: str, message: str
) -> None:
    fault = classify_pull_failure(message, image=image, reason="ErrImagePull")
    assert fault.classification is CONFIG, (runtime, fault)
    assert fault.actionable
    # The same evidence without the kubelet's reason (the local engine has none) reads the same.
    assert classify_pull_failure(message, image=image).classification is CONFIG


def test_not_found_and_forbidden_say_which() -> None:
    for _, image, message in NOT_FOUND:
        assert "no such image" in classify_pull_failure(message, image=image).why
    for _, image, message in FORBIDDEN:
        assert "refuses" in classify_pull_failure(message, image=image).why


@pytest.mark.parametrize(("runtime", "image", "message"), TRANSIENT_SHAPES)
def test_a_failing_registry_or_network_is_transient(runtime: str, image: str, message: str) -> None:
    fault = classify_pull_failure(message, image=image, reason="ErrImagePull")
    assert fault.classification is TRANSIENT, (runtime, fault)
    assert "failed (" in fault.why, fault  # a marker decided it, not the fallback


def test_reasons_that_say_the_reference_cannot_be_pulled_decide_alone() -> None:
    invalid = 'Failed to apply default image tag "Bad Image": couldn\'t parse image reference'
    assert classify_pull_failure(invalid, reason="InvalidImageName").classification is CONFIG
    never = 'Container image "x" is not present with pull policy of Never'
    assert classify_pull_failure(never, reason="ErrImageNeverPull").classification is CONFIG


def test_a_back_off_without_the_registrys_answer_is_counted_as_transient() -> None:
    # What a pod's ImagePullBackOff says on older kubelets: no answer, the threshold decides.
    fault = classify_pull_failure(f'Back-off pulling image "{ABSENT}"', image=ABSENT)
    assert fault.classification is TRANSIENT and "threshold" in fault.why


def test_names_are_not_markers() -> None:
    # A repository named like a marker, and a digest whose hex spells a status code.
    svc = "registry.example/team/timeout-svc:1"
    missing = kubelet(svc, f'failed to resolve reference "{svc}": {svc}: not found')
    assert classify_pull_failure(missing, image=svc).classification is CONFIG
    fruit = "registry.example/team/forbidden-fruit:2"
    slow = kubelet(fruit, f'failed to resolve reference "{fruit}": dial tcp 10.0.0.1:443: '
                   "i/o timeout")  # fmt: skip
    assert classify_pull_failure(slow, image=fruit).classification is TRANSIENT
    digest = "reg.example/x@sha256:" + "404" * 21 + "4"
    assert classify_pull_failure(f"{digest}: i/o timeout", image=digest).classification is (
        TRANSIENT
    )
    # Without the image given, a quoted name is still not read.
    assert classify_pull_failure(f'image "{fruit}": connection refused').classification is (
        TRANSIENT
    )


# --- properties ---------------------------------------------------------------------------------

# Words of runtime messages that are no marker of either kind, alone or next to each other.
NEUTRAL = ["rpc", "error:", "code", "=", "Unknown", "desc", "failed", "to", "pull", "and",
           "unpack", "image", "resolve", "reference", "while", "fetching", "layer", "copy",
           "request", "HEAD", "from", "registry", "Error", "response", "daemon:", "the", "a",
           "initializing", "source", "reading", "in", "of", ":", ",", "(", ")"]  # fmt: skip
CONFIG_MARKERS = ["manifest unknown", "name unknown", "not found", "NotFound", "404 Not Found",
                  "pull access denied", "denied: requested access to the resource is denied",
                  "unauthorized: authentication required", "403 Forbidden", "401 Unauthorized",
                  "insufficient_scope", "no basic auth credentials", "image not known",
                  "No such image"]  # fmt: skip
TRANSIENT_MARKERS = ["i/o timeout", "connection refused", "connection reset by peer",
                     "no such host", "Temporary failure in name resolution", "503 Service "
                     "Unavailable", "500 Internal Server Error", "502 Bad Gateway",
                     "429 Too Many Requests", "toomanyrequests", "TLS handshake timeout",
                     "context deadline exceeded", "EOF", "server misbehaving"]  # fmt: skip

filler = st.lists(st.sampled_from(NEUTRAL), max_size=12)
# Repository paths, also made of words that are markers elsewhere.
MARKER_WORDS = ["found", "not-found", "timeout", "timeout-svc", "eof", "denied", "unauthorized",
                "forbidden", "404", "503", "unknown", "refused"]  # fmt: skip
component = st.one_of(
    st.from_regex(r"[a-z0-9]+([._-][a-z0-9]+)*", fullmatch=True), st.sampled_from(MARKER_WORDS)
)
repository = st.lists(component, min_size=1, max_size=3).map("/".join)


def sentence(parts: list[str], markers: list[str], positions: list[int]) -> str:
    words = list(parts)
    for marker, at in zip(markers, positions, strict=False):
        words.insert(at % (len(words) + 1), marker)
    return " ".join(words)


@settings(max_examples=examples(300), deadline=None)
@given(
    filler,
    st.lists(st.sampled_from(TRANSIENT_MARKERS), min_size=1, max_size=3),
    st.lists(st.integers(0, 40), min_size=3, max_size=3),
)
def test_any_transient_marker_without_a_configuration_one_is_transient(
    parts: list[str], markers: list[str], positions: list[int]
) -> None:
    message = sentence(parts, markers, positions)
    assert classify_pull_failure(message).classification is TRANSIENT, message


@settings(max_examples=examples(300), deadline=None)
@given(
    filler,
    st.sampled_from(CONFIG_MARKERS),
    st.lists(st.sampled_from(TRANSIENT_MARKERS), max_size=3),
    st.lists(st.integers(0, 40), min_size=4, max_size=4),
)
def test_a_configuration_marker_wins_wherever_it_stands(
    parts: list[str], marker: str, transients: list[str], positions: list[int]
) -> None:
    message = sentence(parts, [marker, *transients], positions)
    assert classify_pull_failure(message).classification is CONFIG, message


@settings(max_examples=examples(300), deadline=None)
@given(
    repository,
    st.sampled_from(["latest", "v1", "1.2.3"]),
    st.sampled_from([m for _, _, m in NOT_FOUND + FORBIDDEN + TRANSIENT_SHAPES]),
)
def test_the_images_own_name_never_changes_the_class(repo: str, tag: str, shape: str) -> None:
    """Whatever the repository is called (timeout-svc, denied, eof...), the class is the one
    the same message has for a plain name."""
    plain = "registry.example/team/tool:1"

    def message(image: str) -> str:
        return kubelet(image, f'failed to resolve reference "{image}": {image}: ') + shape

    named = f"registry.example/{repo}:{tag}"
    assert classify_pull_failure(message(named), image=named).classification is (
        classify_pull_failure(message(plain), image=plain).classification
    )


# --- the supervision rule ------------------------------------------------------------------------


def test_an_actionable_pull_failure_stops_at_its_first_sight() -> None:
    sup = SupervisorRecord()
    policy = Policy(startup_failure_threshold=5, max_infrastructure_recoveries=0)
    reason = f"ErrImagePull: {NOT_FOUND[0][2]}"
    verdict = count_startup_failure(
        sup,
        what="job 1 pod p-head (abcd)",
        failure=failure_signature(POD_START, reason),
        detail="d",
        policy=policy,
        classification=CONFIG,
    )
    assert verdict.recovery is Recovery.STOPPED
    assert verdict.classification is CONFIG
    assert sup.classification == CONFIG.value and sup.startup_failures == 1
    assert image_fault(sup)
    # A transient one of the same pod is counted (adopted) and names no image fix.
    other = SupervisorRecord()
    counted = count_startup_failure(
        other,
        what="p",
        failure=failure_signature(POD_START, f"ErrImagePull: {TRANSIENT_SHAPES[0][2]}"),
        detail="d",
        policy=policy,
    )
    assert counted.recovery is Recovery.ADOPTED and counted.terminal_state is None
    assert not image_fault(other)


def test_supervision_re_exports_the_one_classifier() -> None:
    assert supervision.classify_pull_failure is classify_pull_failure
    assert supervision.Classification is Classification


# --- the local backend's engine reads the same evidence the same way ----------------------------


def test_the_local_engine_names_an_image_it_cannot_have_as_configuration() -> None:
    from npa.adapters.containers import ContainerEngine, image_refusal, start_failure

    podman = ContainerEngine(name="podman", binary="/usr/bin/podman")
    docker = ContainerEngine(name="docker", binary="/usr/bin/docker")
    # What each engine prints for a run with --pull=never of an image it does not hold.
    for engine, tail in (
        (podman, f"Error: {ABSENT}: image not known"),
        (docker, f"docker: Error response from daemon: No such image: {ABSENT}."),
    ):
        error = start_failure(engine, f"npa: shard 0 starting\n{tail}\n", ABSENT)
        assert error is not None, tail
        assert "[actionable_configuration: the registry has no such image" in error.message
        assert error.fix == f"{engine.binary} pull {ABSENT}"
    # The stage's own "not found" (exit 125 of its own) is not an image fault.
    assert start_failure(podman, "sh: missing: not found", ABSENT) is None
    # A pull at submit: the registry's answer is configuration, a timeout says nothing more.
    for _, image, message in NOT_FOUND + FORBIDDEN:
        assert image_refusal(message, image).startswith(" [actionable_configuration: "), message
    for _, image, message in TRANSIENT_SHAPES:
        assert image_refusal(message, image) == "", message
