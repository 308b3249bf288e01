"""The ``nebius`` target: network, managed Kubernetes, node groups, agent VM and bucket.

Built on ``pulumi-nebius`` (a community SDK bridged from the official Nebius Terraform
provider) and ``pulumi-aws`` for the bucket, which works against any S3-compatible endpoint.
Sizes come from the workflow's infrastructure (or npa's defaults): a 128 GiB NETWORK_SSD boot
disk per CPU node, 1,023 GiB per GPU node and a 100 GiB root disk for the agent VM, the same
figures the quota gate adds up. The kubeconfig it exports carries no credential: it
authenticates through the ``nebius`` CLI's exec plugin.

No cloud is reachable where npa is tested: this program is checked with Pulumi's mocks.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws
import pulumi_nebius as nebius

GIB = 2**30


def kubeconfig_document(name: str, endpoint: str, ca_certificate: str, cluster_id: str) -> str:
    """A kubeconfig for the new cluster whose user runs ``nebius mk8s ... get-token``."""
    import base64

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": endpoint,
                    "certificate-authority-data": base64.b64encode(
                        ca_certificate.encode()
                    ).decode(),
                },
            }
        ],
        "users": [
            {
                "name": name,
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": "nebius",
                        "args": ["mk8s", "v1", "cluster", "get-token", "--format", "json"],
                        "env": [{"name": "NEBIUS_MK8S_CLUSTER_ID", "value": cluster_id}],
                    }
                },
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    return json.dumps(doc, sort_keys=True)


def program() -> None:
    config = pulumi.Config("npa")
    project = config.require("project")
    parent_id = config.require("parentId")
    region = config.require("region")
    prefix = f"npa-{project}"

    network = nebius.VpcV1Network("network", parent_id=parent_id, name=f"{prefix}-network")
    subnet = nebius.VpcV1Subnet(
        "subnet", parent_id=parent_id, name=f"{prefix}-subnet", network_id=network.id
    )
    cluster = nebius.Mk8sV1Cluster(
        "cluster",
        parent_id=parent_id,
        name=f"{prefix}-cluster",
        control_plane={"subnet_id": subnet.id, "endpoints": {"public_endpoint": {}}},
    )

    def node_group(role: str, platform: str, preset: str) -> nebius.Mk8sV1NodeGroup:
        return nebius.Mk8sV1NodeGroup(
            f"{role}-nodes",
            parent_id=cluster.id,
            name=f"{prefix}-{role}",
            fixed_node_count=config.require_int(f"{role}NodeCount"),
            template={
                "resources": {"platform": platform, "preset": preset},
                "boot_disk": {
                    "type": config.require(f"{role}DiskType"),
                    "size_gibibytes": config.require_int(f"{role}DiskGib"),
                },
                "network_interfaces": [{"subnet_id": subnet.id, "public_ip_address": {}}],
            },
        )

    cpu = node_group(
        "cpu", config.get("cpuPlatform") or "cpu-d3", config.get("cpuPreset") or "16vcpu-64gb"
    )
    gpu = node_group(
        "gpu",
        config.get("gpuPlatform") or "gpu-h100-sxm",
        config.get("gpuPreset") or "8gpu-128vcpu-1600gb",
    )

    agent_disk = nebius.ComputeV1Disk(
        "agent-boot-disk",
        parent_id=parent_id,
        name=f"{prefix}-agent-boot",
        type=config.require("agentDiskType"),
        size_gibibytes=config.require_int("agentDiskGib"),
        source_image_family={"image_family": "ubuntu22.04-driverless"},
    )
    agent = nebius.ComputeV1Instance(
        "agent",
        parent_id=parent_id,
        name=f"{prefix}-agent",
        resources={"platform": "cpu-d3", "preset": "4vcpu-16gb"},
        boot_disk={"attach_mode": "READ_WRITE", "existing_disk": {"id": agent_disk.id}},
        network_interfaces=[
            {"name": "eth0", "subnet_id": subnet.id, "ip_address": {}, "public_ip_address": {}}
        ],
    )

    # Nebius Object Storage speaks S3: credentials come from the named AWS profile or the
    # environment at run time and are never part of the stack's inputs.
    storage = aws.Provider(
        "object-storage",
        region=region,
        profile=config.get("awsProfile"),
        endpoints=[{"s3": f"https://storage.{region}.nebius.cloud"}],
        s3_use_path_style=True,
        skip_credentials_validation=True,
        skip_region_validation=True,
        skip_requesting_account_id=True,
        skip_metadata_api_check=True,
    )
    bucket = aws.s3.Bucket(
        "bucket",
        bucket=config.get("bucket") or f"{prefix}-runs",
        opts=pulumi.ResourceOptions(provider=storage),
    )

    context = config.get("context") or f"nebius-{project}"
    kubeconfig = pulumi.Output.all(
        cluster.status.control_plane.endpoints.public_endpoint,
        cluster.status.control_plane.auth.cluster_ca_certificate,
        cluster.id,
    ).apply(lambda args: kubeconfig_document(context, args[0] or "", args[1] or "", args[2]))

    pulumi.export("cluster_id", cluster.id)
    pulumi.export("cpu_node_group_id", cpu.id)
    pulumi.export("gpu_node_group_id", gpu.id)
    pulumi.export("agent_id", agent.id)
    # Evidence for plan-spec --existing: each id below names a resource of this stack whose
    # state records the disks' size and count (the agent's disk, the node groups' boot disks).
    pulumi.export("agent_boot_disk_id", agent_disk.id)
    pulumi.export("bucket", bucket.bucket)
    pulumi.export("kubeconfig", kubeconfig)
