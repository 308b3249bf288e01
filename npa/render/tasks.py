"""Render a validated workflow into one SkyPilot task YAML per stage.

Rendering is pure: it takes the workflow, the run id, the kube context and the image digests,
and returns file contents. It refuses to produce a task whose image is not pinned by digest,
because a tag can point at different bytes by the time the pod pulls it.

The staged source and the stage's inputs are fetched by the task's own ``setup``, in the pod,
with the AWS CLI and the store credentials and endpoint the pod takes from the project's store
Secret. They are not SkyPilot ``file_mounts``: SkyPilot reads those on its API server and jobs
controller, and only when AWS itself is an enabled cloud there, which an S3-compatible store
that is not AWS (MinIO, Nebius, moto) never makes it.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from npa import __version__
from npa.core.errors import InvalidInput
from npa.images.contract import pod_security_context
from npa.plan.model import StagePlan, WorkflowPlan, build_plan
from npa.render.yamlsafe import yaml_value
from npa.spec.imageref import DIGEST, parse_image_ref
from npa.spec.model import Stage, Tool, Workflow, env_suffix

TEMPLATE = "skypilot-task.yaml.j2"
SOURCE_MOUNT = "/npa/source"
INPUT_MOUNT = "/npa/inputs"
# What a task's setup fetches with the AWS CLI; file:// only exists on the machine that renders.
MOUNTABLE = ("s3://",)
# The setup's fixed part. A URI ending in "/" is a folder (synced); any other is one object
# (copied), or a folder when no object has exactly that key, as SkyPilot decides for mounts.
_FETCH = """set -e
npa_as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }
npa_owned_dir() { npa_as_root mkdir -p "$1" && npa_as_root chown "$(id -u):$(id -g)" "$1"; }
npa_fetch() {
  case "$1" in
    */) npa_owned_dir "$2" && aws s3 sync --only-show-errors "$1" "$2" ;;
    *) npa_owned_dir "$(dirname "$2")"
       aws s3 cp --only-show-errors "$1" "$2" 2>/dev/null \\
         || { npa_owned_dir "$2" && aws s3 sync --only-show-errors "$1/" "$2"; } ;;
  esac
}
command -v aws >/dev/null 2>&1 || {
  echo "npa: the image has no aws CLI on PATH; a stage fetches its inputs with it" >&2
  exit 127
}
"""


class YamlText(str):
    """Text the yaml filter produced; the only thing a template may output."""


def templates_dir() -> Path:
    """``$NPA_TEMPLATES_DIR``, else the repository's ``templates/`` (a checkout or an editable
    install), else the copy an installed wheel put under ``<prefix>/share/npa/templates``."""
    override = os.environ.get("NPA_TEMPLATES_DIR")
    if override:
        return Path(override)
    checkout = Path(__file__).resolve().parents[2] / "templates"
    if (checkout / TEMPLATE).is_file():
        return checkout
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        files = distribution("npa").files or []
    except PackageNotFoundError:
        files = []
    for file in files:
        if file.name == TEMPLATE and file.parent.name == "templates":
            return Path(str(file.locate())).resolve().parent
    return checkout  # missing: the caller's error names this path


def _finalize(value: Any) -> Any:
    if not isinstance(value, YamlText):
        raise InvalidInput(
            f"template bug: a value ({type(value).__name__}) was written without the yaml filter",
            fix=f"pipe every value through '| yaml' in {templates_dir() / TEMPLATE}",
        )
    return value


@lru_cache(maxsize=4)
def _environment(root: str) -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(root),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # the output is YAML; the yaml filter does the escaping
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=_finalize,
    )
    env.filters["yaml"] = lambda value: YamlText(yaml_value(value))
    return env


def task_name(run_id: str, stage: str) -> str:
    """The name a stage's task carries: unique within a run (stage names are), so it picks the
    stage's task out of the run's pipeline job. It starts with a letter because SkyPilot names
    the task's cluster after it, and a cluster name must (a run id starts with a digit)."""
    return f"npa-{run_id}-{stage}"


@dataclass(frozen=True)
class RenderedTask:
    stage: str
    filename: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def load_digests(path: Path) -> dict[str, str]:
    """A ``--digests`` file: ``TOOL_REF: sha256:<hex>`` (or a full ``repo@sha256:<hex>``)."""
    from npa.spec.loader import load_text

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read digests file {path}: {exc}") from None
    doc, problems = load_text(text)
    if doc is None:
        raise InvalidInput(f"digests file {path} is not valid YAML: {problems[0].message}")
    data = doc.data
    if isinstance(data, dict) and set(data) == {"digests"}:
        data = data["digests"]
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise InvalidInput(
            f"digests file {path} must map TOOL_REF to sha256:<64 hex>",
            fix=f"printf 'curator: sha256:<64 hex>\\n' > {path}",
        )
    return dict(data)


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
            fix=(
                "npa workbench workflow preflight-images <spec.yaml> --registry <registry>  "
                "# or pass --digests FILE mapping TOOL_REF: sha256:<digest>"
            ),
            details={"problems": problems},
        )
    return pinned


def _pin(ref: str, tool: Tool, given: str | None) -> tuple[str | None, str | None]:
    image = parse_image_ref(tool.image)
    if image is None:
        return f"tool {ref!r}: {tool.image!r} is not a valid image reference", None
    digest = given
    if given is not None and not DIGEST.fullmatch(given):
        other = parse_image_ref(given)
        if other is None or other.digest is None:
            return f"tool {ref!r}: {given!r} is not sha256:<64 hex> or repo@sha256:<64 hex>", None
        if other.name != image.name:
            return f"tool {ref!r}: digest is for {other.name!r}, the spec uses {image.name!r}", None
        digest = other.digest
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
    return None, image.pinned(digest)


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def task_context(
    stage: Stage,
    planned: StagePlan,
    plan: WorkflowPlan,
    tool: Tool,
    *,
    kube_context: str,
    image: str,
    accelerators: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The values one stage's template is rendered with. ``accelerators`` renames GPU types
    (spec name -> the name the cluster's node labels use)."""
    assert plan.run_prefix is not None
    envs: dict[str, str] = {
        "NPA_WORKFLOW": plan.workflow,
        "NPA_RUN_ID": plan.run_id,
        "NPA_STAGE": stage.name,
        "NPA_RUN_PREFIX": plan.run_prefix,
        # The staged source as stored (blobs named by digest + manifest.json); the backend
        # materialises the tree from the manifest.
        "NPA_SOURCE_MANIFEST": f"{SOURCE_MOUNT}/manifest.json",
        # One task file serves every wave; the launcher sets NPA_WAVE for each wave it starts.
        "NPA_WAVE": "0",
        "NPA_WAVES": str(planned.waves.waves),
        "NPA_SHARDS": str(planned.waves.shards),
        "NPA_SHARDS_PER_WAVE": str(planned.waves.parallel),
    }
    fetch = {SOURCE_MOUNT: f"{plan.run_prefix}/npa-workflow/source/"}
    for inp in planned.inputs:
        assert inp.uri is not None
        envs[f"NPA_INPUT_{env_suffix(inp.name)}"] = inp.uri
        fetch[f"{INPUT_MOUNT}/{inp.name}"] = inp.uri
    for out in planned.outputs:
        assert out.uri is not None
        envs[f"NPA_OUTPUT_{env_suffix(out.name)}"] = out.uri
    if stage.checkpoint is not None and planned.checkpoint_uri is not None:
        envs["NPA_CHECKPOINT_URI"] = planned.checkpoint_uri
        envs["NPA_CHECKPOINT_LOADER"] = stage.checkpoint.loader
    envs.update(stage.env)
    res = stage.resources
    accel = res.accelerators
    if accel is not None and accelerators:
        name, _, count = accel.partition(":")
        accel = f"{accelerators.get(name, name)}:{count}"
    return {
        "task_name": task_name(plan.run_id, stage.name),
        "infra": f"k8s/{kube_context}",
        "image_id": f"docker:{image}",
        "accelerators": accel,
        "cpus": None if res.cpus is None else _number(res.cpus),
        "memory": None if res.memory_gib is None else _number(res.memory_gib),
        "disk_size": res.disk_gib,
        "retries": stage.retries,
        "envs": envs,
        "setup": setup_script(fetch),
        "command": stage.command,
        "security_context": pod_security_context(
            tool.contract.run_as_user, tool.contract.run_as_group, tool.contract.fs_group
        ),
    }


def setup_script(fetch: dict[str, str]) -> str:
    """The task's setup: fetch each URI of ``fetch`` (path -> URI) to its path in the pod."""
    calls = [f"npa_fetch {shlex.quote(uri)} {shlex.quote(path)}" for path, uri in fetch.items()]
    return _FETCH + "\n".join(calls) + "\n"


def render_workflow(
    workflow: Workflow,
    run_id: str,
    *,
    kube_context: str | None,
    digests: dict[str, str],
    store_uri: str | None = None,
    verified: dict[str, str] | None = None,
    accelerators: dict[str, str] | None = None,
) -> list[RenderedTask]:
    """Render every stage, in plan order. Raises InvalidInput listing everything missing.

    ``verified``: pinned references preflight verified, used as they are (see
    :func:`resolve_images`); ``accelerators``: GPU renames from the cluster's node labels.
    """
    context = kube_context or workflow.infrastructure.context
    store = store_uri or (workflow.storage.uri if workflow.storage else None)
    problems = []
    if context is None:
        problems.append("no kube context: set infrastructure.context or pass --context")
    if store is None:
        problems.append("no object store: set storage.uri or pass --store-uri")
    elif not store.startswith(MOUNTABLE):
        problems.append(
            f"store {store!r} is not an object store a stage can fetch from (s3://, AWS or "
            "S3-compatible)"
        )
    for stage in workflow.stages:
        for inp in stage.inputs:
            if inp.uri is not None and not inp.uri.startswith(MOUNTABLE):
                problems.append(
                    f"stage {stage.name!r} input {inp.name!r}: {inp.uri} is not in an S3 or "
                    "S3-compatible store (s3://), which a stage fetches its inputs from"
                )
    if problems:
        raise InvalidInput(
            "cannot render:\n" + "\n".join(f"  - {p}" for p in problems),
            fix="npa workbench workflow render <spec.yaml> --run-id <id> --out <dir> "
            "--context <kube-context> --store-uri s3://<bucket>/<prefix>",
            details={"problems": problems},
        )
    assert context is not None
    images = resolve_images(workflow, digests, verified)
    plan = build_plan(workflow, run_id, store_uri=store)
    template = _environment(str(templates_dir())).get_template(TEMPLATE)
    stages = {s.name: s for s in workflow.stages}
    rendered = []
    for planned in plan.stages:
        stage = stages[planned.name]
        values = task_context(
            stage,
            planned,
            plan,
            workflow.tools[stage.tool],
            kube_context=context,
            image=images[stage.tool],
            accelerators=accelerators,
        )
        text = template.render(**values)
        _check_structure(text, values)
        rendered.append(RenderedTask(stage=stage.name, filename=f"{stage.name}.yaml", text=text))
    return rendered


def _check_structure(text: str, values: dict[str, Any]) -> None:
    """Parse what was rendered and confirm the values came back exactly, so a template change
    that lets a value leak into the structure fails here rather than on the cluster."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    parsed = yaml.load(text, Loader=loader)  # a safe loader: plain data only
    checks = {
        "name": (parsed.get("name"), values["task_name"]),
        "envs": (parsed.get("envs"), values["envs"]),
        "run": (parsed.get("run"), values["command"]),
        "setup": (parsed.get("setup"), values["setup"]),
        "image_id": (parsed.get("resources", {}).get("image_id"), values["image_id"]),
    }
    for key, (got, want) in checks.items():
        if got != want:
            raise InvalidInput(
                f"template bug: rendered {key} does not read back as written",
                fix=f"check {templates_dir() / TEMPLATE}",
            )


def version_banner() -> str:
    return f"npa {__version__}"
