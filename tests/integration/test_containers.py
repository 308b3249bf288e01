"""The container-engine adapter against real podman and the harness registry.

The image is a real runnable root file system (static busybox) pushed over the registry's HTTP
API with htpasswd auth, pulled by digest the way the local backend pulls a stage's image.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from npa.adapters.containers import (
    RUN_LABEL,
    ContainerEngine,
    ContainerEngineError,
    Mount,
    RegistryLogin,
    find_engine,
    start_failure,
)
from npa.core.errors import InvalidInput, ToolMissing
from tests.harness.images import busybox_rootfs
from tests.harness.registry import PASSWORD, USER, Registry
from tests.harness.tools import require_tool

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine() -> ContainerEngine:
    podman = require_tool("NPA_PODMAN_BIN", "podman")
    found = find_engine("podman", path=str(podman.parent))
    assert found is not None and found.name == "podman"
    return found


@pytest.fixture
def busybox_image(registry: Registry) -> str:
    pushed = registry.push_image(
        f"npa-tests/busybox-{uuid.uuid4().hex[:8]}", "1", layer=busybox_rootfs()
    )
    return f"{registry.host}/{pushed.repository}@{pushed.digest}"


def login(image: str) -> RegistryLogin:
    return RegistryLogin(
        registry=image.split("/")[0],
        source="env:TEST_REGISTRY_AUTH",
        username=USER,
        secret=PASSWORD,
    )


def test_pull_by_digest_with_credentials_from_stdin_and_run_a_stage(
    engine: ContainerEngine, busybox_image: str, tmp_path: Path
) -> None:
    engine.pull(busybox_image, plain_http=True, login=login(busybox_image))
    source = tmp_path / "source"
    source.mkdir()
    (source / "numbers.txt").write_text("1\n2\n3\n")
    out = tmp_path / "out"
    out.mkdir()
    name = f"npa-test-{uuid.uuid4().hex[:8]}"
    env = {"NPA_STAGE": "square", "NPA_SHARD": "1", "TRICKY": "a b $HOME 'q' \"d\"\nline2"}
    argv = engine.run_argv(
        image=busybox_image,
        command=[
            "/bin/sh",
            "-c",
            "awk '{print $1*$1}' numbers.txt > /npa/outputs/squares/out.txt; "
            'printf "%s|%s|%s" "$NPA_STAGE" "$NPA_SHARD" "$TRICKY" > /npa/outputs/squares/env.txt; '
            "pwd > /npa/outputs/squares/pwd.txt; touch ro.txt 2> /npa/outputs/squares/ro.err; true",
        ],
        name=name,
        env=env,
        mounts=[
            Mount(source, "/npa/source", read_only=True),
            Mount(out, "/npa/outputs/squares"),
        ],
        workdir="/npa/source",
        labels={RUN_LABEL: "run-1"},
    )
    # No value of the environment is on the command line (it can hold secrets).
    assert not any("a b $HOME" in part for part in argv)
    done = subprocess.run(
        argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (out / "out.txt").read_text() == "1\n4\n9\n"
    assert (out / "env.txt").read_text() == f"square|1|{env['TRICKY']}"
    assert (out / "pwd.txt").read_text().strip() == "/npa/source"
    assert "Read-only file system" in (out / "ro.err").read_text()
    assert not (source / "ro.txt").exists()


def test_pull_without_credentials_or_unpinned_is_refused(
    engine: ContainerEngine, busybox_image: str
) -> None:
    with pytest.raises(ContainerEngineError) as denied:
        engine.pull(busybox_image, plain_http=True)
    assert "could not pull" in denied.value.message
    assert denied.value.exit_code == 4
    with pytest.raises(InvalidInput) as unpinned:
        engine.pull(busybox_image.split("@")[0] + ":1", plain_http=True, login=login(busybox_image))
    assert "not pinned by digest" in unpinned.value.message


def test_an_image_the_registry_or_the_engine_does_not_have_reads_as_configuration(
    engine: ContainerEngine, busybox_image: str, tmp_path: Path
) -> None:
    """The registry's answer for a digest it does not have, and podman's for an image it does
    not hold under --pull=never, read as the run watcher reads a pod's ErrImagePull."""
    absent = busybox_image.split("@")[0] + "@sha256:" + "0" * 64
    with pytest.raises(ContainerEngineError) as missing:
        engine.pull(absent, plain_http=True, login=login(absent))
    assert "[actionable_configuration: the registry has no such image" in (missing.value.message), (
        missing.value.message
    )
    argv = engine.run_argv(
        image=absent, command=["/bin/true"], name=f"npa-test-{uuid.uuid4().hex[:8]}", env={},
        mounts=[], workdir="/", labels={RUN_LABEL: "run-absent"},
    )  # fmt: skip
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 125, ran.stderr  # the engine's own failure: nothing ran
    error = start_failure(engine, ran.stderr, absent)
    assert error is not None, ran.stderr
    assert "[actionable_configuration: " in error.message
    assert error.fix == f"{engine.binary} pull {absent}"


def test_remove_labelled_stops_what_a_dead_executor_left(
    engine: ContainerEngine, busybox_image: str, tmp_path: Path
) -> None:
    engine.pull(busybox_image, plain_http=True, login=login(busybox_image))
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    name = f"npa-test-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "out"
    marker.mkdir()
    argv = engine.run_argv(
        image=busybox_image,
        command=["/bin/sh", "-c", "touch /out/started; sleep 300"],
        name=name,
        env={},
        mounts=[Mount(marker, "/out")],
        workdir="/",
        labels={RUN_LABEL: run_id},
    )
    client = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (marker / "started").exists():
            assert client.poll() is None, "the container ended before it started"
            assert time.monotonic() < deadline, "the container never started"
            time.sleep(0.1)
        # The client dies as a killed executor's child would; the container lives on.
        client.kill()
        client.wait(timeout=30)
        assert engine.remove_labelled(run_id) == [name]
        assert engine.remove_labelled(run_id) == []
    finally:
        if client.poll() is None:
            client.kill()
        engine.remove_labelled(run_id)


def test_find_engine_never_takes_a_client_without_an_engine(tmp_path: Path) -> None:
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert find_engine("auto", path=str(tmp_path)) is None
    with pytest.raises(ToolMissing) as err:
        find_engine("docker", path=str(tmp_path))
    assert "does not answer" in err.value.message
    with pytest.raises(ToolMissing) as err:
        find_engine("podman", path=str(tmp_path))
    assert err.value.fix == "apt-get install -y podman"
    with pytest.raises(InvalidInput):
        find_engine("containerd", path=str(tmp_path))


@pytest.mark.parametrize(
    "tail",
    [
        "Error: runc: runc create failed: unable to start container process: error during "
        "container init: error setting rlimits for ready process: error setting rlimit type 7: "
        "operation not permitted: OCI permission denied",
        "Error: crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI permission denied",
    ],
    ids=["runc", "crun"],
)
def test_rlimit_failure_is_named_with_its_fix(engine: ContainerEngine, tail: str) -> None:
    error = start_failure(engine, tail)
    assert error is not None and error.fix and "default_ulimits = []" in error.fix
    assert start_failure(engine, "sh: missing: not found") is None
    assert start_failure(engine, "setrlimit: invalid argument to ulimit in the stage") is None


def test_crun_on_hybrid_cgroups_is_named_with_runc_as_its_fix(engine: ContainerEngine) -> None:
    tail = (
        "Error: OCI runtime error: crun: cgroups in hybrid mode not supported, drop all "
        "controllers from cgroupv2"
    )
    error = start_failure(engine, tail)
    assert error is not None and error.fix and 'runtime = "runc"' in error.fix
