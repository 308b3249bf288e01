"""What render writes stays byte for byte what it wrote: a speed-up of the renderer (issue 34)
must not change a task file.

Each case renders a spec through ``render_spec`` into a fresh ``--out`` and hashes every task
file (name and bytes, in name order; ``render.json`` is left out: it names npa's version). The
hashes are of the renders main wrote before the renderer was sped up; a change that alters a
task file on purpose (the template, the stage library, the contract) updates them, and says so
in its commit.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from npa.services.render import INDEX, render_spec
from tests.unit.specdata import DIGEST_A, base_spec, dump

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def varied_spec(stages: int) -> dict[str, Any]:
    """Stages that take every branch of the task template and both forms of a script: GPUs or
    none, cpus and memory as floats and integers, one wave or several, secrets or none, a
    checkpoint, an external input, a command a literal block holds and one it cannot (a tab,
    a trailing space), hostile text in env values."""
    spec = base_spec()
    spec["tools"]["cur"]["image"] = f"registry.example.com/cur@{DIGEST_A}"
    spec["stages"] = []
    for i in range(stages):
        stage: dict[str, Any] = {
            "name": f"s{i}",
            "tool": "gpu" if i % 3 == 1 else "cur",
            "command": [
                f"run-step {i}",
                f"echo 'a: b'\n# not a comment\necho {{{{ x }}}} &a *a {i}\n\n",
                f"\tindented {i} \n",
            ][i % 3],
            "env": {"STEP": str(i), "HOSTILE": "a\nb: c # d \u2028 \U0001f600", "EMPTY": ""},
            "outputs": [{"name": "out", "path": "out/"}, {"name": "f", "path": f"f{i}.json"}],
            "inputs": (
                [{"name": "up", "from": f"s{i - 1}.out"}]
                if i
                else [{"name": "raw", "uri": "s3://raw/data/"}]
            ),
            "resources": (
                {"accelerators": "H100:2", "cpus": 7.5, "memory_gib": 30, "disk_gib": 100}
                if i % 3 == 1
                else {"cpus": 2, "memory_gib": 4.25}
            ),
            "waves": {"shards": 1 + i % 5, "parallel": 1 + i % 2 if i % 5 else 1},
            "retries": i % 4,
        }
        if i > 1:
            stage["depends_on"] = [f"s{i // 2}"]
        if i % 4 == 2:
            stage["secrets"] = {"TOKEN": "env:NPA_TOKEN", "OTHER": "env:OTHER_SOURCE"}
        if i % 5 == 3:
            stage["checkpoint"] = {"path": f"ck/{i}/", "loader": f"resume --from ck {i}"}
        spec["stages"].append(stage)
    return spec


def tree_hash(out: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(out.iterdir()):
        if path.name != INDEX:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def render(tmp_path: Path, case: str) -> Path:
    out = tmp_path / "out"
    if case == "varied":
        spec = tmp_path / "varied.yaml"
        spec.write_text(dump(varied_spec(24)))
        render_spec(spec, "golden-1", out, kube_context="golden-ctx")
    elif case == "physical-ai":
        render_spec(
            EXAMPLES / "physical-ai.yaml",
            "golden-1",
            out,
            digests_file=EXAMPLES / "physical-ai.digests.yaml",
        )
    else:
        # The local backend as host processes: no container engine is asked (a unit test).
        infra = {"tiny-k8s": "k8s/kind-npa", "tiny-local": "local"}[case]
        store = "s3://npa-test/workflows"
        render_spec(
            EXAMPLES / "tiny-local.yaml",
            "golden-1",
            out,
            infra=infra,
            runtime="process" if infra == "local" else "auto",
            store_uri=store,
        )
    return out


GOLDEN = {
    "varied": "b95d6c2846feccd87848013b29df14e000533bdae86184e217ffea0eeed41a69",
    "physical-ai": "35294942b4c7af05c5848428d46b45938e982a80c49cbf936971039084acf9b2",
    "tiny-k8s": "e4aec247cc5f91a5e93ba2799278d68d8c4960294f1228bc4afdc688f8e796c0",
    "tiny-local": "7936118e2571b46cbb49eac9079677385d51c3737a08e1baf26cc2eaa6c59e01",
}


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_render_writes_the_same_bytes_as_before(
    case: str, tmp_path: Path, npa_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPA_HOME", str(npa_home))
    got = tree_hash(render(tmp_path, case))
    assert got == GOLDEN[case], (
        f"{case}: the rendered task files changed (sha256 {got}). If the change is meant (the "
        "template, the stage library or the contract changed), put this hash in GOLDEN and "
        "say why in the commit; a speed-up must leave it as it is."
    )
