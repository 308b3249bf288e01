"""The stage tasks of a run, and the task files a person reviews with ``render``.

:func:`stage_tasks` turns a validated workflow and its plan into one backend-neutral
:class:`StageTask` per stage (what each stage runs, reads and writes, and where); the backend
the registry selects encodes those as its task files (:func:`render_run`, which ``render`` and
``submit`` both call, so what a person reviews is byte for byte what launches).
:func:`pinned_images` pins every image by digest (a tag can point at different bytes by the
time the pod pulls it). No backend is named here: each is reached through the registry
(:mod:`npa.backends`) and the interface (:mod:`npa.backends.base`).
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from npa.backends.base import (
    ExecutionBackend,
    RunTasks,
    StageTask,
    TaskInput,
    TaskOutput,
)
from npa.core.collector import collector_paused
from npa.core.errors import InvalidInput
from npa.core.layout import input_variable, output_key, output_variable, run_prefix, task_name
from npa.core.paths import context_problem
from npa.plan.model import WorkflowPlan
from npa.spec.imageref import DIGEST, parse_image_ref
from npa.spec.model import Tool, Workflow, store_uri_problem


@dataclass(frozen=True)
class RenderedTask:
    stage: str
    filename: str
    text: str

    @cached_property  # read for the index, the result and submit's manifest: hashed once
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class DigestFile:
    """A ``--digests`` file. ``pins`` maps TOOL_REF to ``sha256:<hex>`` or a pinned reference;
    ``chosen`` is set when the file is ``preflight-images --json`` output: the image preflight
    chose for each tool (after its --image-override/--image), whose pins were verified and are
    rendered exactly as they are."""

    pins: dict[str, str]
    chosen: dict[str, str] | None = None


def load_digests(path: Path) -> DigestFile:
    """A ``--digests`` file: ``TOOL_REF: sha256:<hex>`` (or a full ``repo@sha256:<hex>``),
    optionally under ``digests:``, or the JSON ``preflight-images --json`` printed."""
    from npa.core.userfiles import read_user_text
    from npa.spec.loader import load_text

    doc, problems = load_text(read_user_text(path, "digests file", encodings="yaml"))
    if doc is None:
        raise InvalidInput(f"digests file {path} is not valid YAML: {problems[0].message}")
    data = doc.data
    chosen: dict[str, str] | None = None
    if isinstance(data, dict) and {"images", "digests"} <= set(data):
        rows = data["images"]
        if not isinstance(rows, list) or not all(
            isinstance(r, dict) and isinstance(r.get("tool"), str) for r in rows
        ):
            raise InvalidInput(f"{path} is not preflight-images --json output (images rows)")
        chosen = {r["tool"]: str(r.get("reference")) for r in rows}
        data = data["digests"]
    elif isinstance(data, dict) and set(data) == {"digests"}:
        data = data["digests"]
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise InvalidInput(
            f"digests file {path} must map TOOL_REF to sha256:<64 hex>",
            fix=f"cat {shlex.quote(str(path))}  # each line maps a tool ref to sha256:<64 hex>",
        )
    return DigestFile(dict(data), chosen)


def same_repository(chosen: str, pinned: str) -> bool:
    """Whether ``pinned`` (a repository name from a digests file) is the repository of the
    chosen image ``chosen``: the same name, or, for a name without a registry host, that name
    resolved under a registry (what preflight-images does with --registry)."""
    if chosen == pinned:
        return True
    from npa.images.reference import names_registry, parse_reference

    try:
        ours = parse_reference(chosen)
        theirs = parse_reference(pinned)
    except InvalidInput:
        return False
    if ours.name == theirs.name:
        return True
    return not names_registry(chosen) and (
        theirs.path == chosen or theirs.path.endswith("/" + chosen)
    )


def resolve_images(
    workflow: Workflow, digests: dict[str, str], verified: dict[str, str] | None = None
) -> dict[str, str]:
    """TOOL_REF -> ``name@sha256:...``; every tool that cannot be pinned is reported at once.

    ``verified`` maps TOOL_REF to the pinned reference preflight verified (after any
    ``--image-override``/``--image``): it is used as it is, even from another repository,
    because it is exactly the image that was checked.
    """
    verified = verified or {}
    problems: list[str] = []
    for ref, given in sorted(verified.items()):
        parsed = parse_image_ref(given)
        if ref not in workflow.tools:
            problems.append(f"verified image for unknown tool {ref!r}")
        elif parsed is None or parsed.digest is None:
            problems.append(f"tool {ref!r}: verified image {given!r} is not pinned by digest")
    for ref in sorted(set(digests) - set(workflow.tools)):
        problems.append(
            f"digests name unknown tool {ref!r} (declared: {', '.join(workflow.tools)})"
        )
    used = {s.tool for s in workflow.stages}
    pinned: dict[str, str] = {}
    for ref, tool in workflow.tools.items():
        if ref not in used:
            continue
        if ref in verified:
            pinned[ref] = verified[ref]
            continue
        problem, image = _pin(ref, tool, digests.get(ref))
        if problem:
            problems.append(problem)
        elif image:
            pinned[ref] = image
    if problems:
        raise InvalidInput(
            "cannot render: images must be pinned by digest\n"
            + "\n".join(f"  - {p}" for p in problems),
            details={"problems": problems, "unpinned": True},
        )
    return pinned


def chosen_workflow(
    workflow: Workflow, overrides: Sequence[str], image: str | None, digests: DigestFile | None
) -> Workflow:
    """The workflow with each tool's image as ``--image-override``/``--image`` choose it (the
    rule of :func:`npa.images.overrides.with_chosen_images`), refused when ``digests`` is
    preflight's --json output for other images. ``render`` and ``submit`` both call this."""
    from npa.images.overrides import with_chosen_images

    chosen_wf = with_chosen_images(workflow, overrides, image)
    if digests is None or digests.chosen is None or not (overrides or image):
        return chosen_wf
    chosen = {ref: tool.image for ref, tool in chosen_wf.tools.items()}
    differ = [
        f"{tool}: preflight verified {digests.chosen[tool]}, the command was asked for "
        f"{chosen[tool]}"
        for tool in sorted(digests.chosen)
        if tool in chosen and digests.chosen[tool] != chosen[tool]
    ]
    if differ:
        raise InvalidInput(
            "the --digests file is preflight output for other images: " + "; ".join(differ),
            # The command again with the images preflight verified (the CLI builds it).
            details={
                "rerun_with": {
                    "--image-override": [f"{t}={i}" for t, i in sorted(digests.chosen.items())]
                }
            },
        )
    return chosen_wf


def pinned_images(
    workflow: Workflow, digests: DigestFile | None, verified: dict[str, str] | None = None
) -> dict[str, str]:
    """The one rule for the pinned reference each tool's task runs, for ``render`` and
    ``submit`` alike (``workflow``: its images as :func:`chosen_workflow` chose them):

    - ``--digests`` with preflight's --json output: its pins exactly as preflight verified them;
    - ``--digests`` with a ``TOOL_REF: sha256:<hex>`` map: each chosen image with that digest;
    - otherwise what submit's own preflight verified (``verified``), when it ran;
    - otherwise the chosen image's own digest: an image without one is refused (exit 2).
    """
    if digests is not None and digests.chosen is not None:
        return resolve_images(workflow, {}, digests.pins)
    if digests is not None and digests.pins:
        return resolve_images(workflow, digests.pins, None)
    return resolve_images(workflow, {}, verified)


def _pin(ref: str, tool: Tool, given: str | None) -> tuple[str | None, str | None]:
    image = parse_image_ref(tool.image)
    if image is None:
        return f"tool {ref!r}: {tool.image!r} is not a valid image reference", None
    digest = given
    # The repository written in the digests file where it names one: for a name without a
    # registry host it says which registry the name resolved under.
    name = image.name
    if given is not None and not DIGEST.fullmatch(given):
        other = parse_image_ref(given)
        if other is None or other.digest is None:
            return f"tool {ref!r}: {given!r} is not sha256:<64 hex> or repo@sha256:<64 hex>", None
        if not same_repository(image.name, other.name):
            return (
                f"tool {ref!r}: digest is for {other.name!r}, the image is {image.name!r} "
                "(pass the same --image-override/--image you gave preflight-images, or its "
                "--json output as --digests)",
                None,
            )
        digest, name = other.digest, other.name
    if image.digest and digest and image.digest != digest:
        return (
            f"tool {ref!r}: the spec pins {image.digest} but the digests file says {digest}",
            None,
        )
    digest = digest or image.digest
    if digest is None:
        return (
            f"tool {ref!r}: {tool.image} is not pinned by digest and no digest was given",
            None,
        )
    return None, f"{name}@{digest}"


def stage_tasks(
    workflow: Workflow,
    plan: WorkflowPlan,
    *,
    images: dict[str, str],
    accelerators: dict[str, str] | None = None,
) -> RunTasks:
    """Each stage's neutral task, in plan order. ``images`` maps TOOL_REF to the image a stage
    runs in (none for a backend that runs no image); ``accelerators`` renames GPU types (spec
    name -> the name the cluster's node labels use)."""
    prefix = run_prefix(plan.workflow, plan.run_id)
    stages = {s.name: s for s in workflow.stages}
    declared = {(s.name, o.name): o for s in workflow.stages for o in s.outputs}
    tasks = []
    for planned in plan.stages:
        stage = stages[planned.name]
        inputs = []
        for inp in planned.inputs:
            if inp.from_stage is not None and inp.from_output is not None:
                upstream = declared[(inp.from_stage, inp.from_output)]
                key = output_key(prefix, inp.from_stage, upstream.path).rstrip("/")
                kind = upstream.kind.value
            else:
                # An external URI: a folder when it ends in "/", else the object with exactly
                # that key, else the folder under it (decided when the stage fetches it).
                key, kind = None, "auto"
            variable = input_variable(inp.name)
            inputs.append(
                TaskInput(name=inp.name, variable=variable, uri=inp.uri, key=key, kind=kind)
            )
        accel = stage.resources.accelerators
        if accel is not None and accelerators:
            name, _, count = accel.partition(":")
            accel = f"{accelerators.get(name, name)}:{count}"
        tool = workflow.tools[stage.tool]
        tasks.append(
            StageTask(
                stage=stage.name,
                task_name=task_name(plan.run_id, stage.name),
                command=stage.command,
                env=dict(stage.env),
                secrets=dict(stage.secrets),
                image=images.get(stage.tool),
                depends_on=planned.depends_on,
                shards=planned.waves.shards,
                parallel=planned.waves.parallel,
                waves=planned.waves.waves,
                retries=planned.retries,
                accelerators=accel,
                cpus=stage.resources.cpus,
                memory_gib=stage.resources.memory_gib,
                disk_gib=stage.resources.disk_gib,
                inputs=inputs,
                outputs=[
                    TaskOutput(
                        name=o.name,
                        variable=output_variable(o.name),
                        path=o.path,
                        kind=o.kind,
                        uri=o.uri,
                        key=output_key(prefix, stage.name, o.path).rstrip("/"),
                    )
                    for o in planned.outputs
                ],
                checkpoint_uri=planned.checkpoint_uri if stage.checkpoint else None,
                checkpoint_loader=stage.checkpoint.loader if stage.checkpoint else None,
                run_as_user=tool.contract.run_as_user,
                run_as_group=tool.contract.run_as_group,
                fs_group=tool.contract.fs_group,
            )
        )
    return RunTasks(
        workflow=plan.workflow,
        run_id=plan.run_id,
        store=None
        if plan.run_prefix is None
        else plan.run_prefix.removesuffix(f"/{plan.workflow}/{plan.run_id}"),
        prefix=prefix,
        run_root=plan.run_prefix,
        tasks=tasks,
    )


def render_stream(
    workflow: Workflow,
    plan: WorkflowPlan,
    backend: ExecutionBackend,
    *,
    images: dict[str, str],
    accelerators: dict[str, str] | None = None,
) -> Iterator[RenderedTask]:
    """The task files ``backend`` launches for the run ``plan`` describes, in plan order, each
    made as it is asked for: exactly what ``submit`` stores and launches for the same workflow,
    plan, images and accelerator names (``render`` writes them as they come; ``submit`` takes
    them all, through :func:`render_run`). The caller pauses the collector
    (:func:`~npa.core.collector.collector_paused`) while it iterates."""
    run = stage_tasks(workflow, plan, images=images, accelerators=accelerators)
    for stage, text in backend.render_tasks(run):
        yield RenderedTask(stage=stage, filename=f"{stage}{backend.task_suffix}", text=text)


@collector_paused()  # every stage's task and text stay alive: see collector_paused
def render_run(
    workflow: Workflow,
    plan: WorkflowPlan,
    backend: ExecutionBackend,
    *,
    images: dict[str, str],
    accelerators: dict[str, str] | None = None,
) -> list[RenderedTask]:
    """Every task file of :func:`render_stream`, in plan order."""
    return list(render_stream(workflow, plan, backend, images=images, accelerators=accelerators))


def check_names(context: str | None, store: str | None) -> None:
    """A kube context and a store URI given to a render, checked as ``infrastructure.context``
    and ``storage.uri`` are: a name, never a path or several lines, and an object-store URI."""
    problems = []
    if context is not None and (problem := context_problem(context)):
        problems.append(f"kube context {context!r} {problem}")
    if store is not None and (problem := store_uri_problem(store)):
        problems.append(f"store {store!r} {problem}")
    if problems:
        raise InvalidInput(
            "cannot render:\n" + "\n".join(f"  - {p}" for p in problems),
            details={"problems": problems, "context": context, "store": store},
        )
