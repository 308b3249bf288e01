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
from tests.harness.stackstate import nebius_stack, node_group, write_checkpoint

pytestmark = pytest.mark.integration

WF = ("workbench", "workflow")
PHYSAI = "examples/physical-ai.yaml"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GIB = 2**30


def agent_stack(backend: PulumiBackend, name: str = "npa-physai-nebius") -> None:
    """A stack in npa's Pulumi project whose ``agent_disk`` output records the agent disk (its
    ``agent_boot_disk_id`` is an id no resource of its state has)."""

    def program() -> None:
        import pulumi

        pulumi.export("agent_boot_disk_id", "computedisk-e00proof")
        disk = {"id": "computedisk-e00proof", "role": "agent", "size_gib": 100}
        pulumi.export("agent_disk", {**disk, "disk_type": "NETWORK_SSD"})
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
                               f"agent_disk, backend: '{url}'}}}}")  # fmt: skip
    res = plan("--existing", proof, "--json", env=env)
    assert res.code == 0, res.stdout + res.stderr
    quota = res.json()["quota"]
    (check,) = quota["existing"]
    assert check["status"] == "proven"
    assert "output agent_disk: agent: 1 x 100 GiB NETWORK_SSD" in check["detail"], check
    assert (quota["lines"][0]["existing_gib"], quota["lines"][0]["required_new_gib"]) == (100, 1151)

    words = existing(tmp_path, "'pulumi stack npa-physai-nebius, trust me'")
    res = plan("--existing", words, env=env)
    assert res.code == 0, res.stdout + res.stderr
    assert "existing agent: 1 x 100 GiB NETWORK_SSD: unproven: claimed, unproven" in res.stdout
    assert "not deducted" in res.stdout and "existing 0 GiB" in res.stdout

    for evidence, why in (
        (f"{{pulumi: {{stack: npa-physai-nebius, output: agent_id, backend: '{url}'}}}}",
         "has no output agent_id (it has: agent_boot_disk_id, agent_disk, empty)"),
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

    # An id that no resource of the stack's state has says nothing of a size or count.
    bare = f"{{pulumi: {{stack: npa-physai-nebius, output: agent_boot_disk_id, backend: '{url}'}}}}"
    res = plan("--existing", existing(tmp_path, bare), "--json", env=env)
    assert res.code == 2, res.stdout + res.stderr
    error = res.json()["error"]
    assert "no resource with that id" in error["message"], error
    assert "existing[0]: cite output agent_disk" in error["fix"], error


def test_npa_s_own_backend_is_where_a_proof_is_read_by_default(
    pulumi_backend: PulumiBackend, npa_home: Path, tmp_path: Path
) -> None:
    own = file_backend(npa_home / "pulumi", pulumi_backend.pulumi_bin)
    agent_stack(own)
    env = {**pulumi_backend.env, "NPA_HOME": str(npa_home)}
    proof = existing(tmp_path, "{pulumi: {stack: npa-physai-nebius, output: agent_disk}}")
    res = plan("--existing", proof, "--json", env=env)
    assert res.code == 0, res.stdout + res.stderr
    assert res.json()["quota"]["existing"][0]["status"] == "proven"


def test_the_checkpoint_npa_reads_is_what_pulumi_exports(pulumi_backend: PulumiBackend) -> None:
    # A file:// backend's state is read as a file; any other backend through pulumi stack
    # export. On a stack pulumi wrote, both give the same outputs and resources.
    from npa.adapters.infra.runner import Backend, InfraRunner, read_stack_state
    from npa.plan.evidence import SECRET, state_from_deployment

    def program() -> None:
        import pulumi

        pulumi.export("agent_disk", {"id": "d1", "role": "agent", "size_gib": 100})
        pulumi.export("pw", pulumi.Output.secret("hunter2"))

    pulumi_backend.stack("npa-read", program, project="npa").up(on_output=lambda _line: None)
    backend = Backend(pulumi_backend.url)
    direct = read_stack_state(backend, "npa-read")
    runner = InfraRunner(backend, pulumi_bin=pulumi_backend.pulumi_bin)
    exported = runner.stack_export("npa-read")
    assert direct is not None and exported is not None
    mine, theirs = state_from_deployment(direct), state_from_deployment(exported)
    assert mine.outputs == theirs.outputs
    assert mine.outputs["pw"] == SECRET and "hunter2" not in str(direct)
    assert [r["urn"] for r in mine.resources] == [r["urn"] for r in theirs.resources]
    assert read_stack_state(backend, "npa-none") is None
    assert runner.stack_export("npa-none") is None


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


# --- one proof, one claim (issue 28) -----------------------------------------------------------


def quota_with(tmp_path: Path, available_gib: int) -> str:
    """A quota file for eu-north1 with ``available_gib`` of NETWORK_SSD left, and disks to spare."""
    path = tmp_path / "quota.yaml"
    limit, usage = 4096 * GIB, (4096 - available_gib) * GIB
    path.write_text(
        "region: eu-north1\nquotas:\n"
        f"  compute.disk.size.network-ssd: {{limit: {limit}, usage: {usage}}}\n"
        "  compute.disk.count: {limit: 32, usage: 0}\n"
    )
    return str(path)


def claims(tmp_path: Path, *items: tuple[str, int, int, str]) -> str:
    """An --existing file: (role, size_gib, count, output of npa-physai-nebius) per claim."""
    path = tmp_path / "existing.yaml"
    path.write_text(
        "existing:\n"
        + "".join(
            f"  - {{role: {role}, size_gib: {size}, count: {count}, evidence: "
            f"{{pulumi: {{stack: npa-physai-nebius, output: {output}}}}}}}\n"
            for role, size, count, output in items
        )
    )
    return str(path)


def plan_physai(tmp_path: Path, spec: str, quota: str, existing_file: str, npa_home: Path) -> Any:
    return run_npa(*WF, "plan-spec", spec, "--run-id", "proof-1", "--quota-file", quota,
                   "--existing", existing_file, "--json",
                   env={"NPA_HOME": str(npa_home)})  # fmt: skip


def test_an_agent_disk_id_does_not_prove_two_gpu_node_disks(npa_home: Path, tmp_path: Path) -> None:
    # The case found in testing: two GPU nodes (2 x 1,023 GiB) and 228 GiB available; the
    # agent disk's id offered as proof of both GPU node disks made the plan OK.
    spec = tmp_path / "physai-2gpu.yaml"
    text = (EXAMPLES / "physical-ai.yaml").read_text()
    spec.write_text(text.replace("  gpu_nodes:\n    count: 1\n", "  gpu_nodes:\n    count: 2\n"))
    nebius_stack(npa_home / "pulumi", gpu=(2, 1023))
    quota = quota_with(tmp_path, 228)
    wrong = claims(tmp_path, ("gpu_node", 1023, 2, "agent_boot_disk_id"))
    res = plan_physai(tmp_path, str(spec), quota, wrong, npa_home)
    assert res.code == 2, res.stdout + res.stderr
    error = res.json()["error"]
    assert error["kind"] == "invalid_input"
    message = error["message"]
    assert "existing[0] (gpu_node: 2 x 1,023 GiB NETWORK_SSD)" in message, message
    assert "agent: 1 x 100 GiB NETWORK_SSD" in message, message  # what the state records
    # The fix names the output of the same stack that records exactly these disks.
    assert error["fix"].startswith(
        f"${{EDITOR:-vi}} {wrong}  # existing[0]: cite output gpu_node_group_id"
    )

    # The output that records the GPU node group proves them, and only then are they deducted.
    right = claims(tmp_path, ("gpu_node", 1023, 2, "gpu_node_group_id"))
    res = plan_physai(tmp_path, str(spec), quota, right, npa_home)
    assert res.code == 0, res.stdout + res.stderr
    quota_result = res.json()["quota"]
    assert quota_result["verdict"] == "ok"
    assert quota_result["lines"][0]["existing_gib"] == 2046
    # A count the state does not record is refused too: the group has two nodes, not one.
    one = claims(tmp_path, ("gpu_node", 1023, 1, "gpu_node_group_id"))
    res = plan_physai(tmp_path, str(spec), quota, one, npa_home)
    assert res.code == 2, res.stdout + res.stderr
    error = res.json()["error"]
    assert "records gpu_node: 2 x 1,023 GiB NETWORK_SSD" in error["message"], error
    assert "role: gpu_node, disk_type: NETWORK_SSD, size_gib: 1023, count: 2" in error["fix"]


def test_one_output_does_not_prove_two_claims(npa_home: Path, tmp_path: Path) -> None:
    # The agent disk's id offered for the agent disk and the CPU node disk at once.
    nebius_stack(npa_home / "pulumi")
    quota = quota_with(tmp_path, 1023)  # enough only once both 228 GiB are deducted
    twice = claims(
        tmp_path,
        ("agent", 100, 1, "agent_boot_disk_id"),
        ("cpu_node", 128, 1, "agent_boot_disk_id"),
    )
    res = plan_physai(tmp_path, PHYSAI, quota, twice, npa_home)
    assert res.code == 2, res.stdout + res.stderr
    message = res.json()["error"]["message"]
    assert "existing[1] (cpu_node: 1 x 128 GiB NETWORK_SSD)" in message, message
    assert "already proves existing[0]" in message, message
    assert "existing[1]: cite output cpu_node_group_id" in res.json()["error"]["fix"]

    # Each claim with the output that records it: both proven, both deducted.
    apart = claims(
        tmp_path, ("agent", 100, 1, "agent_boot_disk_id"), ("cpu_node", 128, 1, "cpu_node_group_id")
    )
    res = plan_physai(tmp_path, PHYSAI, quota, apart, npa_home)
    assert res.code == 0, res.stdout + res.stderr
    result = res.json()["quota"]
    assert [c["status"] for c in result["existing"]] == ["proven", "proven"]
    assert (result["verdict"], result["lines"][0]["existing_gib"]) == ("ok", 228)


def test_a_node_group_marked_for_deletion_proves_nothing(npa_home: Path, tmp_path: Path) -> None:
    # A replace of the GPU node group stopped before the stack wrote its outputs: the old group
    # stays in the checkpoint marked for deletion and gpu_node_group_id still names it.
    spec = tmp_path / "physai-2gpu.yaml"
    text = (EXAMPLES / "physical-ai.yaml").read_text()
    spec.write_text(text.replace("  gpu_nodes:\n    count: 1\n", "  gpu_nodes:\n    count: 2\n"))
    stack = "npa-physai-nebius"
    old = {**node_group(stack, "gpu", "mk8snodegroup-e00old", 2, 1023), "delete": True}
    new = node_group(stack, "gpu", "mk8snodegroup-e00new", 2, 1023)
    write_checkpoint(
        npa_home / "pulumi", stack, {"gpu_node_group_id": "mk8snodegroup-e00old"}, [old, new]
    )
    quota = quota_with(tmp_path, 228)
    stale = claims(tmp_path, ("gpu_node", 1023, 2, "gpu_node_group_id"))
    res = plan_physai(tmp_path, str(spec), quota, stale, npa_home)
    result = res.json()["quota"]
    (check,) = result["existing"]
    assert check["status"] == "refuted" and "gpu-nodes for deletion" in check["detail"], check
    assert result["lines"][0]["existing"] == 0 and result["verdict"] != "ok", result

    # Cited by name, the group that replaced it (same name and URN) proves the two disks.
    by_name = tmp_path / "by-name.yaml"
    by_name.write_text(
        "existing:\n  - {role: gpu_node, size_gib: 1023, count: 2, evidence: "
        f"{{pulumi: {{stack: {stack}, resource: gpu-nodes}}}}}}\n"
    )
    res = plan_physai(tmp_path, str(spec), quota, str(by_name), npa_home)
    assert res.code == 0, res.stdout + res.stderr
    result = res.json()["quota"]
    assert "mk8snodegroup-e00new" in result["existing"][0]["detail"], result["existing"]
    assert (result["verdict"], result["lines"][0]["existing_gib"]) == ("ok", 2046)


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
