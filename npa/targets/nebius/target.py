"""The ``nebius`` target: two stacks, the cloud cluster (``nebius``) and then the cluster stack
the ``kubernetes`` target also uses, whose kubeconfig is the cloud stack's output. Its quota is
the disks it creates, against the Nebius quota API or figures in a file, less the disks its
state proves exist."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npa.adapters.infra.runner import InfraRunner, StackSpec
from npa.adapters.infra.sdk_plugins import sdk_plugin
from npa.core.commands import npa_command
from npa.core.paths import NpaPaths, check_context_name
from npa.plan.infra import GIB, DiskNeed, QuotaRequirement, build_region, cluster_requirements
from npa.plan.infra import disk_needs as infra_disk_needs
from npa.plan.quota import ExistingCheck, ExistingDisk, QuotaAssessment, QuotaScope, assess
from npa.spec.model import Infrastructure, Workflow
from npa.targets.base import (
    AsksQuotaApi,
    Layout,
    LayoutAsk,
    ProvesExistingDisks,
    ProvisionRequest,
    QuotaApiAsk,
    StackInput,
    Target,
)
from npa.targets.kubernetes.target import K8S_PLUGIN, cluster_stack, prepare_cluster_destroy

if TYPE_CHECKING:
    from npa.plan.evidence import DiskReader
    from npa.plan.quota import QuotaSource

# The Nebius SDK is bridged from the Nebius Terraform provider through the terraform-provider
# plugin; which version is read from the installed SDK (pulumi-nebius, pinned in pyproject.toml),
# as for every provider SDK, so the plugin npa checks for is the one the SDK will request.
NEBIUS_PLUGINS = (sdk_plugin("pulumi_nebius"), sdk_plugin("pulumi_aws"))


def nebius_config(
    infra: Infrastructure, project: str, parent_id: str | None, region: str | None
) -> dict[str, str]:
    """The nebius program's config: the cluster shape from the spec (or npa's defaults)."""
    return {
        "npa:project": project,
        "npa:parentId": parent_id or "",
        "npa:region": build_region(infra, region),
        "npa:agentDiskGib": str(infra.agent.disk_gib),
        "npa:agentDiskType": infra.agent.disk_type.value,
        "npa:cpuNodeCount": str(infra.cpu_nodes.count),
        "npa:cpuDiskGib": str(infra.cpu_nodes.disk_gib),
        "npa:cpuDiskType": infra.cpu_nodes.disk_type.value,
        "npa:gpuNodeCount": str(infra.gpu_nodes.count),
        "npa:gpuDiskGib": str(infra.gpu_nodes.disk_gib),
        "npa:gpuDiskType": infra.gpu_nodes.disk_type.value,
    }


def existing_disks(
    stack: str, resources: Sequence[dict[str, Any]], backend: str | None = None
) -> list[ExistingCheck]:
    """The disks the nebius stack's (refreshed) state records: the node groups' boot disks and
    the agent's disk, each a claim citing its resource and checked by the same rule as
    ``plan-spec --existing`` (:func:`npa.plan.evidence.check_existing`). A resource the state
    marks for deletion (a replaced node group) is no claim: its disks are going."""
    from npa.plan.evidence import StackState, check_existing, leaving, resource_record
    from npa.plan.quota import PulumiOutputProof, PulumiOutputRef

    claims = []
    for resource in resources:
        record = None if leaving(resource) else resource_record(resource)
        if record is None:
            continue
        (disks,) = record.disks
        assert disks.role is not None
        ref = PulumiOutputRef(stack=stack, resource=str(resource["urn"]), backend=backend)
        claims.append(
            ExistingDisk.model_validate(
                {
                    "role": disks.role,
                    "disk_type": disks.disk_type,
                    "size_gib": disks.size_bytes // GIB,
                    "count": disks.count,
                    "evidence": PulumiOutputProof(pulumi=ref),
                }
            )
        )
    state = StackState(outputs={}, resources=list(resources))
    return check_existing(
        claims, QuotaScope(), read_state=lambda _ref: state, origin=f"the state of stack {stack}"
    )


def nebius_profile_project(home: Path | None = None) -> str | None:
    """The project (``parent-id``) of the Nebius CLI's default profile, if it has one."""
    import yaml

    path = (home or Path.home()) / ".nebius" / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text("utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None
    profiles = config.get("profiles") if isinstance(config, dict) else None
    profile = profiles.get(config.get("default")) if isinstance(profiles, dict) else None
    parent = profile.get("parent-id") if isinstance(profile, dict) else None
    return str(parent) if parent else None


class NebiusTarget(Target, ProvesExistingDisks, AsksQuotaApi):
    name = "nebius"
    plugins = (K8S_PLUGIN, *NEBIUS_PLUGINS)
    profile_hint = "cat ~/.nebius/config.yaml  # the parent-id of a profile is --nebius-project"

    def profile_project(self) -> str | None:
        return nebius_profile_project()

    def layout(self, paths: NpaPaths, project: str, ask: LayoutAsk) -> Layout:
        infra = ask.infra or Infrastructure()
        ctx = ask.context or infra.context or f"nebius-{project}"
        check_context_name(ctx)
        api = ask.quota_api
        cloud_config = nebius_config(infra, project, api.project, api.region)
        cloud = StackSpec(f"{project}.nebius", "nebius", {**cloud_config, "npa:context": ctx})
        cluster = cluster_stack(
            paths, project, ctx, source=None, document="(from the nebius stack)"
        )
        kubeconfig = StackInput(
            stack=cluster.name,
            source=cloud.name,
            output="kubeconfig",
            config_key="npa:kubeconfigDocument",
            wait_note="previewed after the nebius stack exists: its kubeconfig comes from the "
            "new cluster",
            missing="the nebius stack gave no kubeconfig output; the cluster stack cannot run",
        )
        return Layout(
            project,
            self.name,
            ctx,
            [cloud, cluster],
            f"provision.{project}.nebius",
            inputs=[kubeconfig],
        )

    def infrastructure(self, spec: Path | None) -> Infrastructure:
        if spec is None:
            return Infrastructure()
        from npa.spec.validate import load_workflow

        return load_workflow(spec).infrastructure

    def prepare_destroy(self, spec: StackSpec) -> None:
        prepare_cluster_destroy(spec)

    def existing(self, lay: Layout, runner: InfraRunner, *, refresh: bool) -> list[ExistingCheck]:
        cloud = lay.stacks[0]
        if not runner.exists(cloud.name):
            return []
        if refresh:
            runner.refresh(cloud)
        return existing_disks(cloud.name, runner.resources(cloud.name), runner.backend.url)

    def _quota_fix(self, req: ProvisionRequest, infra: Infrastructure) -> str:
        """The same provisioning with the Nebius quota API as evidence: the project of the
        Nebius CLI's profile, the spec's region (or npa's default)."""
        project = req.quota_api.project or self.profile_project()
        if project is None:
            return self.profile_hint
        argv = ["provision-if-absent", "--project", str(req.project or "default"), "--target"]
        argv += [self.name, "--nebius-project", project]
        argv += ["--nebius-region", req.quota_api.region or infra.region or "eu-north1"]
        if req.spec is not None:
            argv += ["--spec", str(req.spec)]
        return npa_command(*argv)

    def quota_gate(
        self,
        req: ProvisionRequest,
        infra: Infrastructure,
        *,
        store: str | None,
        local_jobs: Path,
        existing: Sequence[ExistingCheck],
    ) -> QuotaAssessment:
        from npa.plan.quota_sources import quota_sources

        needs = infra_disk_needs(infra)
        scope = self.plan_scope(infra, req.quota_api.region, req.quota_api.project)
        api = self.quota_api_source(req.quota_api, scope)
        sources = quota_sources(req.quota_files, api=api, extra=req.extra_sources)
        if not sources:
            return QuotaAssessment(
                verdict="blocked-unknown",
                lines=[],
                existing=list(existing),
                sources=[],
                problems=["no quota evidence: unknown is never permission to create"],
                fix=self._quota_fix(req, infra),
            )
        requirements = cluster_requirements(needs)
        return assess(requirements, sources, needs=needs, existing=existing, scope=scope)

    def quota_api_source(self, api: QuotaApiAsk, scope: QuotaScope) -> QuotaSource | None:
        from npa.plan.quota_sources import NebiusQuotaSource

        if not api.project:
            return None
        assert scope.region is not None
        return NebiusQuotaSource(api.project, scope.region, endpoint=api.endpoint)

    def disk_reader(self, api: QuotaApiAsk) -> DiskReader:
        from npa.plan.quota_sources import NebiusDiskLookup

        return NebiusDiskLookup(endpoint=api.endpoint).get

    def plan_needs(self, infra: Infrastructure) -> list[DiskNeed]:
        return infra_disk_needs(infra)

    def plan_requirements(
        self, needs: list[DiskNeed], workflow: Workflow
    ) -> list[QuotaRequirement]:
        return cluster_requirements(needs)

    def plan_scope(
        self, infra: Infrastructure, region: str | None, project: str | None
    ) -> QuotaScope:
        return QuotaScope(region=build_region(infra, region), project=project)
