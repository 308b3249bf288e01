"""Every flag that shapes a task reaches it on every path (issue 33, point 3): for each
combination of the image choice (the spec's, --image, --image-override, both), image preflight
(on, against the real registry; off) and --digests (none; a file), what submit launches on the
SkyPilot path (read back from the managed-jobs double) is byte for byte what render shows for
the same flags, and a combination that cannot be launched is refused by both alike.

The tool's images are tags in a real registry (Debian's docker-registry on 127.0.0.1), each
tag moved once: its old digest is what the --digests file pins, its current one what preflight
resolves, so each case shows which of the two reached the task. render never asks a registry:
for a submit that preflights without --digests, the review is the documented one, render
--digests with preflight-images --json output for the same image flags (docs/images.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from npa.backends.skypilot.tasks import documents
from tests.harness.kube import KubeCluster
from tests.harness.registry import Registry
from tests.harness.s3 import S3Server
from tests.integration import supervisors
from tests.integration.flagmatrix import Moved, cells, chosen, image_flags
from tests.integration.imagespec import ATTESTED, unique_repo
from tests.integration.skypilot_world import make_world, run_npa
from tests.integration.test_submit_skypilot import argv, jobs

pytestmark = pytest.mark.integration

SPEC_IMAGE = "docker.io/library/busybox@sha256:2919d0172f7524b2d8df9e50066a682669e6d170ac0f6a49676d54358fe970b5"  # noqa: E501


@pytest.fixture(scope="module")
def moved(registry_server: Registry) -> dict[str, Moved]:
    """One moved tag each for the spec's image, --image and --image-override."""
    out = {}
    for role in ("spec", "image", "override"):
        repo = unique_repo(f"flags-{role}")
        pushed = [
            registry_server.push_image(
                repo, "v1", labels=ATTESTED, user="1000", payload=f"{role} {age}\n".encode()
            )
            for age in ("old", "current")
        ]
        out[role] = Moved(f"{registry_server.host}/{repo}", pushed[0].digest, pushed[1].digest)
    return out


@pytest.fixture
def world(
    s3: S3Server,
    kube: KubeCluster,
    npa_home: Path,
    tmp_path: Path,
    registry: Registry,
    moved: dict[str, Moved],
) -> Iterator[dict[str, Any]]:
    env = {"NPA_SKYPILOT_POLL_SECONDS": "0.2", "REG_AUTH": ":".join(registry.auth)}
    yield make_world(
        s3, kube, npa_home, tmp_path, bucket="npa-runs", env=env,
        edit_spec=lambda text: text.replace(SPEC_IMAGE, moved["spec"].tag),
    )  # fmt: skip
    supervisors.stop_all(npa_home)


CASES = [pytest.param(c, f, d, id=f"{c}-{f}-{d}") for c, f, d in cells()]


def test_the_default_cells_meet_every_pair() -> None:
    found = cells()
    for a, b in ((0, 1), (0, 2), (1, 2)):
        pairs = {(c[a], c[b]) for c in found}
        assert len(pairs) == len({c[a] for c in found}) * len({c[b] for c in found}), (a, b)


def rendered(out: Path) -> dict[str, str]:
    """A render's wave tasks by name, each as its own YAML document."""
    return {
        yaml.safe_load(doc)["name"]: doc
        for path in sorted(out.glob("*.yaml"))
        for doc in documents(path.read_text())
    }


@pytest.mark.parametrize(("choice", "preflight", "digests"), CASES)
def test_submit_launches_what_render_shows_for_the_same_flags(
    world: dict[str, Any],
    tmp_path: Path,
    registry: Registry,
    moved: dict[str, Moved],
    choice: str,
    preflight: str,
    digests: str,
) -> None:
    target = moved[chosen(choice)]
    flags = image_flags(choice, moved)
    if digests == "digests":
        pins = tmp_path / "digests.yaml"
        pins.write_text(f"shell: {target.old}\n")  # the tag's old digest: pinned as it says
        flags += ("--digests", str(pins))
    auth = (f"--registry-auth={registry.host}=env:REG_AUTH",)
    submit_argv = [a for a in argv(world) if a != "--no-preflight-images"]
    submit_argv += [*flags, *auth] + (["--no-preflight-images"] if preflight != "preflight" else [])
    launched_by = run_npa(*submit_argv, env=world["env"])

    review = list(flags)
    if preflight == "preflight" and digests == "no-digests":
        # render asks no registry: what a preflighting submit launches is reviewed with
        # preflight-images' own output for the same image flags.
        pre = run_npa("workbench", "workflow", "preflight-images", str(world["spec"]),
                      "--project", "team", *flags, *auth, "--json", env=world["env"])  # fmt: skip
        assert pre.code == 0, pre.stdout + pre.stderr
        verified = tmp_path / "preflight.json"
        verified.write_text(pre.stdout)
        review += ["--digests", str(verified)]
    out = tmp_path / "review"
    shown_by = run_npa(
        "workbench", "workflow", "render", str(world["spec"]), "--run-id", world["run_id"],
        "--project", "team", "--context", world["context"], "--out", str(out), *review,
        env=world["env"],
    )  # fmt: skip

    if preflight == "no-preflight" and digests == "no-digests":
        # Nothing resolves the tag and nothing pins it: both refuse, alike, launching nothing.
        both = launched_by.stdout + launched_by.stderr + shown_by.stderr
        assert (launched_by.code, shown_by.code) == (2, 2), both
        assert "pinned by digest" in launched_by.stdout + launched_by.stderr, both
        assert "pinned by digest" in shown_by.stderr, both
        assert f"{target.tag} is not pinned" in shown_by.stderr, both
        assert jobs(world) == [] and not out.exists()
        return
    assert launched_by.code == 0, launched_by.stdout + launched_by.stderr
    assert shown_by.code == 0, shown_by.stdout + shown_by.stderr
    (job,) = jobs(world)
    launched = {task["name"]: task["yaml"] for task in job["tasks"]}
    assert launched == rendered(out)
    # --digests pins its digest even where the tag has moved on; preflight alone resolves the
    # tag as it is now.
    digest = target.old if digests == "digests" else target.current
    image_id = f"docker:{target.name}@{digest}"
    assert all(
        yaml.safe_load(text)["resources"]["image_id"] == image_id for text in launched.values()
    )


def test_submit_given_preflight_output_launches_it_as_render_shows_it(
    world: dict[str, Any], tmp_path: Path, registry: Registry, moved: dict[str, Moved]
) -> None:
    """--digests with preflight-images --json output (the other form of the file): submit pins
    exactly what preflight verified, as render does, with or without the image flags again."""
    flags = image_flags("both", moved)
    auth = f"--registry-auth={registry.host}=env:REG_AUTH"
    pre = run_npa("workbench", "workflow", "preflight-images", str(world["spec"]), "--project",
                  "team", *flags, auth, "--json", env=world["env"])  # fmt: skip
    assert pre.code == 0, pre.stdout + pre.stderr
    verified = tmp_path / "preflight.json"
    verified.write_text(pre.stdout)
    submit_argv = [a for a in argv(world) if a != "--no-preflight-images"]
    launched_by = run_npa(*submit_argv, "--digests", str(verified), auth, env=world["env"])
    assert launched_by.code == 0, launched_by.stdout + launched_by.stderr
    out = tmp_path / "review"
    shown_by = run_npa(
        "workbench", "workflow", "render", str(world["spec"]), "--run-id", world["run_id"],
        "--project", "team", "--context", world["context"], "--out", str(out), *flags,
        "--digests", str(verified), env=world["env"],
    )  # fmt: skip
    assert shown_by.code == 0, shown_by.stdout + shown_by.stderr
    (job,) = jobs(world)
    launched = {task["name"]: task["yaml"] for task in job["tasks"]}
    assert launched == rendered(out)
    image_id = f"docker:{moved['override'].name}@{moved['override'].current}"
    assert all(yaml.safe_load(t)["resources"]["image_id"] == image_id for t in launched.values())
