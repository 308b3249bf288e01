"""The nebius program's resource graph, checked with Pulumi's own mocks (no cloud here)."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.unit

GIB = 2**30
PREFIX = "urn:pulumi:demo.nebius::npa::"


class Recorder:
    """Pulumi mocks that remember every resource the program registers."""

    def __init__(self) -> None:
        self.resources: dict[str, tuple[str, dict[str, Any]]] = {}

    def new_resource(self, args: Any) -> tuple[str, dict[str, Any]]:
        self.resources[args.name] = (args.typ, dict(args.inputs))
        outputs = dict(args.inputs)
        if args.typ == "nebius:index/mk8sV1Cluster:Mk8sV1Cluster":
            outputs["status"] = {
                "controlPlane": {
                    "endpoints": {"publicEndpoint": "https://203.0.113.10"},
                    "auth": {"clusterCaCertificate": "-----BEGIN CERTIFICATE-----\nMIIB\n"},
                }
            }
        return f"{args.name}-id", outputs

    def call(self, args: Any) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        return {}, []


@pytest.fixture
def graph() -> tuple[Recorder, dict[str, Any]]:
    import pulumi

    from npa.spec.model import Infrastructure
    from npa.targets.nebius.target import nebius_config

    config = nebius_config(Infrastructure(), "demo", "project-e00abc", None)
    recorder = Recorder()

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> Any:
            return recorder.new_resource(args)

        def call(self, args: pulumi.runtime.MockCallArgs) -> Any:
            return recorder.call(args)

    pulumi.runtime.set_mocks(Mocks(), project="npa", stack="demo.nebius", preview=False)
    pulumi.runtime.set_all_config({**config, "npa:stack": "nebius"})

    from stacks import nebius

    exported: dict[str, Any] = {}
    original = pulumi.export

    def capture(name: str, value: Any) -> None:
        value.apply(lambda v: exported.__setitem__(name, v))

    @pulumi.runtime.test  # type: ignore[misc]
    def run() -> None:
        pulumi.export = capture  # type: ignore[assignment]
        try:
            nebius.program()
        finally:
            pulumi.export = original  # type: ignore[assignment]

    # The decorator waits for every registration and output before it returns.
    run()
    return recorder, exported


def test_sizes_types_and_counts(graph: tuple[Recorder, dict[str, Any]]) -> None:
    recorder, _ = graph
    res = recorder.resources
    cpu_type, cpu = res["cpu-nodes"]
    gpu_type, gpu = res["gpu-nodes"]
    assert cpu_type == gpu_type == "nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup"
    assert cpu["template"]["bootDisk"] == {"type": "NETWORK_SSD", "sizeGibibytes": 128}
    assert gpu["template"]["bootDisk"] == {"type": "NETWORK_SSD", "sizeGibibytes": 1023}
    assert cpu["fixedNodeCount"] == 1 and gpu["fixedNodeCount"] == 1
    disk_type, disk = res["agent-boot-disk"]
    assert disk_type == "nebius:index/computeV1Disk:ComputeV1Disk"
    assert (disk["type"], disk["sizeGibibytes"]) == ("NETWORK_SSD", 100)
    # The program's disks add up to exactly what the quota gate requires.
    total = (128 + 1023 + 100) * GIB
    assert total == 1251 * GIB
    assert res["bucket"][0] == "aws:s3/bucket:Bucket"
    assert {name for name in res} >= {"network", "subnet", "cluster", "agent", "object-storage"}


def test_dependencies(graph: tuple[Recorder, dict[str, Any]]) -> None:
    recorder, _ = graph
    res = recorder.resources
    assert res["subnet"][1]["networkId"] == "network-id"
    assert res["cluster"][1]["controlPlane"]["subnetId"] == "subnet-id"
    assert res["cpu-nodes"][1]["parentId"] == "cluster-id"
    assert res["gpu-nodes"][1]["parentId"] == "cluster-id"
    assert res["agent"][1]["bootDisk"]["existingDisk"]["id"] == "agent-boot-disk-id"
    assert res["agent"][1]["networkInterfaces"][0]["subnetId"] == "subnet-id"


def test_no_credentials_in_inputs_and_credential_free_kubeconfig(
    graph: tuple[Recorder, dict[str, Any]],
) -> None:
    recorder, exported = graph
    storage = recorder.resources["object-storage"][1]
    assert not {"accessKey", "secretKey", "token"} & set(storage)
    # Provider inputs reach the engine JSON-encoded.
    assert json.loads(storage["endpoints"]) == [{"s3": "https://storage.eu-north1.nebius.cloud"}]
    kubeconfig = json.loads(exported["kubeconfig"])
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://203.0.113.10"
    user = kubeconfig["users"][0]["user"]
    assert set(user) == {"exec"} and user["exec"]["command"] == "nebius"
    assert kubeconfig["current-context"] == "nebius-demo"


def test_existing_disks_from_state_are_deducted() -> None:
    from npa.targets.nebius.target import existing_disks

    state = [
        {
            "urn": PREFIX + "nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup::cpu-nodes",
            "type": "nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup",
            "id": "mk8snodegroup-1",
            "outputs": {
                "fixedNodeCount": 1,
                "template": {"bootDisk": {"type": "NETWORK_SSD", "sizeGibibytes": 128}},
            },
        },
        {
            "urn": PREFIX + "nebius:index/computeV1Disk:ComputeV1Disk::agent-boot-disk",
            "type": "nebius:index/computeV1Disk:ComputeV1Disk",
            "id": "computedisk-1",
            "outputs": {"type": "NETWORK_SSD", "sizeGibibytes": 100},
        },
    ]
    disks = existing_disks("demo.nebius", state)
    assert all(d.status == "proven" for d in disks)
    assert sorted((d.disk.role, d.disk.size_gib, d.disk.count) for d in disks) == [
        ("agent", 100, 1),
        ("cpu_node", 128, 1),
    ]
    # Each claim cites the resource that records it: the rule plan-spec --existing follows.
    cited = sorted(str(d.disk.evidence.pulumi.resource) for d in disks)  # type: ignore[union-attr]
    assert cited == sorted(r["urn"] for r in state)
    from npa.plan.infra import cluster_requirements, disk_needs
    from npa.plan.quota import QuotaReading, assess
    from npa.spec.model import Infrastructure

    class Fixed:
        name = "file:test"

        def read(self, names: Any) -> list[QuotaReading]:
            return [
                QuotaReading(source=self.name, name=n, limit=1100 * GIB, usage=77 * GIB)
                if n.startswith("compute.disk.size")
                else QuotaReading(source=self.name, name=n, limit=32, usage=3)
                for n in names
            ]

    needs = disk_needs(Infrastructure())
    verdict = assess(cluster_requirements(needs), [Fixed()], needs=needs, existing=disks)
    line = verdict.lines[0]
    assert line.required_new == 1023 * GIB  # 1,251 GiB minus the 228 GiB proven to exist
    assert verdict.verdict == "ok"
