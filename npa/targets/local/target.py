"""The ``local`` target: one stack of owner-only directories (the local object store and the
local executor's state), measured against the disk that holds the project's store."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from npa.adapters.infra.runner import StackSpec
from npa.core.paths import NpaPaths
from npa.plan.infra import LOCAL_STORE_SIZE, DiskNeed, QuotaRequirement, local_requirements
from npa.plan.quota import ExistingCheck, QuotaAssessment, assess
from npa.spec.model import Infrastructure, Workflow
from npa.targets.base import Layout, LayoutAsk, MeasuresLocalDisk, ProvisionRequest, Target


class LocalTarget(Target, MeasuresLocalDisk):
    name = "local"

    def layout(self, paths: NpaPaths, project: str, ask: LayoutAsk) -> Layout:
        spec = StackSpec(
            f"{project}.local",
            "local",
            {
                "npa:storeDir": str(paths.local_store),
                "npa:executorDir": str(paths.local_jobs),
            },
        )
        return Layout(project, self.name, None, [spec], f"provision.{project}.local")

    def quota_gate(
        self,
        req: ProvisionRequest,
        infra: Infrastructure,
        *,
        store: str | None,
        local_jobs: Path,
        existing: Sequence[ExistingCheck],
    ) -> QuotaAssessment:
        from npa.plan.quota_sources import local_store_source, quota_sources

        if req.spec is not None:
            from npa.spec.validate import load_workflow

            requirements = local_requirements(load_workflow(req.spec))
        else:
            requirements = [QuotaRequirement(name=LOCAL_STORE_SIZE, unit="bytes", required=0)]
        assert store is not None  # the services give a MeasuresLocalDisk target its store
        sources = quota_sources(
            req.quota_files,
            local=local_store_source(store, local_jobs),
            extra=req.extra_sources,
        )
        return assess(requirements, sources)

    def plan_requirements(
        self, needs: list[DiskNeed], workflow: Workflow
    ) -> list[QuotaRequirement]:
        return local_requirements(workflow)
