"""What the SkyPilot backend runs for each stage: the digest-pinned task YAML of npa.render."""

from __future__ import annotations

from npa.backends.base import TaskContext
from npa.render.tasks import render_workflow


def render(context: TaskContext) -> dict[str, str]:
    """Stage -> task YAML, in plan order, with the verified images and the accelerator remap."""
    rendered = render_workflow(
        context.workflow,
        context.plan.run_id,
        kube_context=context.kube_context,
        digests={},
        store_uri=context.store,
        verified=context.images,
        accelerators=context.accelerators,
    )
    return {t.stage: t.text for t in rendered}
