"""The quota gate's evidence end to end: the real CLI, the real pulumi CLI and a file://
backend for stack-output proofs, and a store on another filesystem for the local gate."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from npa.plan.quota_sources import LocalStoreSource
from tests.harness.cli import run_npa
from tests.harness.disks import tmpfs
from tests.harness.pulumi import PulumiBackend, file_backend

pytestmark = pytest.mark.integration

WF = ("workbench", "workflow")
PHYSAI = "examples/physical-ai.yaml"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GIB = 2**30


def agent_stack(backend: PulumiBackend, name: str = "npa-physai-nebius") -> None:
    """A stack in npa's Pulumi project whose outputs prove the agent disk exists."""

    def program() -> None:
        import pulumi

        pulumi.export("agent_boot_disk_id", "computedisk-e00proof")
        pulumi.export("empty", "")

    backend.stack(name, program, project="npa").up(on_output=lambda _line: None)


def plan(*extra: str, env: dict[str, str]) -> Any:
    return run_npa(*WF, "plan-spec", PHYSAI, "--run-id", "demo-1", "--quota-file",
                   "examples/quota-ample.yaml", *extra, env=env)  # fmt: skip


def test_plan_spec_with_an_unproven_example_claim_deducts_nothing(npa_home: Path) -> None:
    js = plan("--existing", "examples/existing-agent.yaml", "--json", env={})
    # The example's proof names a stack output; this NPA_HOME has no such stack, so the claim
    # is checked (the pulumi CLI asked), found unproven, and deducts nothing (the tests below
    # deduct it against a real stack).
    assert js.code == 0, js.stdout
    quota = js.json()["quota"]
    ssd = quota["lines"][0]
    assert (ssd["required_new"], ssd["existing"], ssd["verdict"]) == (1343251021824, 0, "ok")
    (check,) = quota["existing"]
    assert check["status"] in ("refuted", "unavailable") and "not deducted" in check["detail"]


def existing(tmp_path: Path, evidence: str) -> str:
    path = tmp_path / "existing.yaml"
    path.write_text(f"existing:\n  - role: agent\n    size_gib: 100\n    evidence: {evidence}\n")
    return str(path)


def test_a_stack_output_npa_reads_back_is_deducted_and_words_are_not(
    pulumi_backend: PulumiBackend, npa_home: Path, tmp_path: Path
) -> None:
    agent_stack(pulumi_backend)
    env = {**pulumi_backend.env, "NPA_HOME": str(npa_home)}
    url = pulumi_backend.url

    proof = existing(tmp_path, f"{{pulumi: {{stack: npa-physai-nebius, output: "
                               f"agent_boot_disk_id, backend: '{url}'}}}}")  # fmt: skip
    res = plan("--existing", proof, "--json", env=env)
    assert res.code == 0, res.stdout + res.stderr
    quota = res.json()["quota"]
    (check,) = quota["existing"]
    assert check["status"] == "proven"
    assert "agent_boot_disk_id = computedisk-e00proof" in check["detail"]
    assert (quota["lines"][0]["existing_gib"], quota["lines"][0]["required_new_gib"]) == (100, 1151)

    words = existing(tmp_path, "'pulumi stack npa-physai-nebius, trust me'")
    res = plan("--existing", words, env=env)
    assert res.code == 0, res.stdout + res.stderr
    assert "existing agent: 1 x 100 GiB NETWORK_SSD: unproven: claimed, unproven" in res.stdout
    assert "not deducted" in res.stdout and "existing 0 GiB" in res.stdout

    for evidence, why in (
        (f"{{pulumi: {{stack: npa-physai-nebius, output: agent_id, backend: '{url}'}}}}",
         "has no output agent_id (it has: agent_boot_disk_id, empty)"),
        (f"{{pulumi: {{stack: npa-physai-nebius, output: empty, backend: '{url}'}}}}",
         "is empty"),
        (f"{{pulumi: {{stack: npa-other, output: agent_boot_disk_id, backend: '{url}'}}}}",
         "no stack npa-other"),
        (f"{{pulumi: {{stack: npa-physai-nebius, output: agent_boot_disk_id, "
         f"value: computedisk-e00else, backend: '{url}'}}}}", "not 'computedisk-e00else'"),
    ):  # fmt: skip
        res = plan("--existing", existing(tmp_path, evidence), "--json", env=env)
        assert res.code == 0, res.stdout + res.stderr
        (check,) = res.json()["quota"]["existing"]
        assert check["status"] == "refuted" and why in check["detail"], check
        assert res.json()["quota"]["lines"][0]["existing"] == 0


def test_npa_s_own_backend_is_where_a_proof_is_read_by_default(
    pulumi_backend: PulumiBackend, npa_home: Path, tmp_path: Path
) -> None:
    own = file_backend(npa_home / "pulumi", pulumi_backend.pulumi_bin)
    agent_stack(own)
    env = {**pulumi_backend.env, "NPA_HOME": str(npa_home)}
    proof = existing(tmp_path, "{pulumi: {stack: npa-physai-nebius, output: agent_boot_disk_id}}")
    res = plan("--existing", proof, "--json", env=env)
    assert res.code == 0, res.stdout + res.stderr
    assert res.json()["quota"]["existing"][0]["status"] == "proven"


def test_an_unreadable_backend_is_unavailable_not_proof(npa_home: Path, tmp_path: Path) -> None:
    broken = tmp_path / "not-a-backend"
    broken.write_text("a file, not a directory")
    proof = existing(
        tmp_path,
        f"{{pulumi: {{stack: s, output: o, backend: 'file://{broken}'}}}}",
    )
    res = plan("--existing", proof, "--json", env={"NPA_HOME": str(npa_home)})
    assert res.code == 0, res.stdout + res.stderr
    (check,) = res.json()["quota"]["existing"]
    assert check["status"] in ("unavailable", "refuted") and "not deducted" in check["detail"]


def _free(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def test_the_local_gate_measures_the_configured_store(npa_home: Path, tmp_path: Path) -> None:
    # The project's store on a small disk of its own (a 64 MiB tmpfs): the quota is measured
    # there, not on NPA_HOME's disk, which has the room.
    with tmpfs(tmp_path / "small", "64m") as disk:
        spec = tmp_path / "tiny-local.yaml"
        text = (EXAMPLES / "tiny-local.yaml").read_text()
        # Only the last stage needs disk, more than the store's filesystem has free.
        text = text.replace("      disk_gib: 1\n", "", 2)
        spec.write_text(text.replace("disk_gib: 1", "disk_gib: 2"))
        env = {"NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}
        store = disk / "store"
        assert (
            run_npa("configure", "--project", "small", "--store", store.as_uri(), env=env).code == 0
        )
        args = (*WF, "plan-spec", str(spec), "--run-id", "r1", "--target", "local", "--json")
        res = run_npa(*args, "--project", "small", env=env)
        assert res.code == 1, res.stdout + res.stderr
        line = res.json()["quota"]["lines"][0]
        assert line["verdict"] == "blocked"
        assert abs(line["available"] - _free(disk)) < 8 << 20
        assert res.json()["store"] == store.as_uri()
        # The default project's store is under NPA_HOME, whose disk has the room.
        assert run_npa(*args, env=env).code == 0

        run_id = run_npa(*WF, "prepare-run", str(spec), "--project", "small", env=env)
        refused = run_npa(*WF, "submit", str(spec), "--project", "small", "--run-id",
                          run_id.stdout.strip(), "--json", env=env)  # fmt: skip
        assert refused.code == 1, refused.stdout + refused.stderr
        gates = {g["name"]: g for g in refused.json()["error"]["details"]["gates"]}
        assert gates["quota"]["status"] == "failed"
        assert "--project small" in gates["quota"]["fix"]


def test_the_local_gate_measures_the_store_where_it_is_not_npa_home(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "64m") as small:
        home = tmp_path / "home"
        home.mkdir()
        store_only = LocalStoreSource(small / "npa-store-that-does-not-exist")
        (reading,) = store_only.read(["local.store.size"])
        assert reading.limit is not None and reading.usage is not None
        assert abs((reading.limit - reading.usage) - _free(small)) < 8 << 20
        # With the executor's work directory elsewhere, the tighter of the two disks counts.
        both = LocalStoreSource(small / "store", home / "local-jobs")
        (reading,) = both.read(["local.store.size"])
        assert reading.limit is not None and reading.usage is not None
        assert abs((reading.limit - reading.usage) - min(_free(small), _free(home))) < 8 << 20
        assert not (small / "npa-store-that-does-not-exist").exists()
