"""What the SkyPilot backend runs for each stage: a digest-pinned SkyPilot task YAML.

Encoding is pure: a stage's neutral task (:class:`StageTask`) and the kube context go in, the
task file's text comes out. Every value passes through the yaml filter (the template
environment refuses any other output), and the result is parsed back and compared with what was
meant, so spec text cannot change the task's structure.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from npa.backends.base import RunTasks, StageTask
from npa.backends.skypilot.yamlsafe import yaml_value
from npa.core.errors import InvalidInput
from npa.core.layout import PREFIX_LEAF, shared_source_key, source_key

TEMPLATE = "skypilot-task.yaml.j2"
SOURCE_MOUNT = "/npa/source"
INPUT_MOUNT = "/npa/inputs"
# SkyPilot mounts these schemes as storage; file:// only exists on the machine that renders.
MOUNTABLE = ("s3://", "gs://", "r2://")


class YamlText(str):
    """Text the yaml filter produced; the only thing a template may output."""


def templates_dir() -> Path:
    """``$NPA_TEMPLATES_DIR``, else the repository's ``templates/`` (a checkout or an editable
    install), else the copy an installed wheel put under ``<prefix>/share/npa/templates``."""
    override = os.environ.get("NPA_TEMPLATES_DIR")
    if override:
        return Path(override)
    checkout = Path(__file__).resolve().parents[3] / "templates"
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


def mount_problems(store: str | None, external_inputs: list[tuple[str, str, str]]) -> list[str]:
    """Why SkyPilot could not mount the run's data: the store, and each external input given
    as (stage, input, uri)."""
    problems = []
    if store is None:
        problems.append("no object store: set storage.uri or pass --store-uri")
    elif not store.startswith(MOUNTABLE):
        problems.append(f"store {store!r} is not an object store SkyPilot can mount (s3://, gs://)")
    for stage, name, uri in external_inputs:
        if not uri.startswith(MOUNTABLE):
            problems.append(f"stage {stage!r} input {name!r}: {uri} is not mountable")
    return problems


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def task_values(task: StageTask, run: RunTasks, *, kube_context: str) -> dict[str, Any]:
    """The values one stage's template is rendered with."""
    assert run.run_root is not None
    envs: dict[str, str] = {
        "NPA_WORKFLOW": run.workflow,
        "NPA_RUN_ID": run.run_id,
        "NPA_STAGE": task.stage,
        "NPA_RUN_PREFIX": run.run_root,
        # The staged source as stored: the run's manifest, and the blobs it names by digest,
        # which every run of the workflow shares; the backend materialises the tree from both.
        "NPA_SOURCE_MANIFEST": f"{SOURCE_MOUNT}/manifest.json",
        "NPA_SOURCE_BLOBS": f"{shared_source_key(f'{run.run_root}/{PREFIX_LEAF}')}/blobs/",
        # One task file serves every wave; the launcher sets NPA_WAVE for each wave it starts.
        "NPA_WAVE": "0",
        "NPA_WAVES": str(task.waves),
        "NPA_SHARDS": str(task.shards),
        "NPA_SHARDS_PER_WAVE": str(task.parallel),
    }
    mounts = {SOURCE_MOUNT: source_key(f"{run.run_root}/{PREFIX_LEAF}")}
    for inp in task.inputs:
        assert inp.uri is not None
        envs[inp.variable] = inp.uri
        mounts[f"{INPUT_MOUNT}/{inp.name}"] = inp.uri
    for out in task.outputs:
        assert out.uri is not None
        envs[out.variable] = out.uri
    if task.checkpoint_uri is not None and task.checkpoint_loader is not None:
        envs["NPA_CHECKPOINT_URI"] = task.checkpoint_uri
        envs["NPA_CHECKPOINT_LOADER"] = task.checkpoint_loader
    envs.update(task.env)
    return {
        "task_name": task.task_name,
        "infra": f"k8s/{kube_context}",
        "image_id": f"docker:{task.image}",
        "accelerators": task.accelerators,
        "cpus": None if task.cpus is None else _number(task.cpus),
        "memory": None if task.memory_gib is None else _number(task.memory_gib),
        "disk_size": task.disk_gib,
        "retries": task.retries,
        "envs": envs,
        "file_mounts": mounts,
        "command": task.command,
        "security_context": {
            "runAsNonRoot": True,
            "runAsUser": task.run_as_user,
            "runAsGroup": task.run_as_group,
            "fsGroup": task.fs_group,
        },
    }


def encode(run: RunTasks, *, kube_context: str) -> dict[str, str]:
    """Stage -> task YAML, in plan order. Every task's image must already be pinned."""
    template = _environment(str(templates_dir())).get_template(TEMPLATE)
    out: dict[str, str] = {}
    for task in run.tasks:
        values = task_values(task, run, kube_context=kube_context)
        text = template.render(**values)
        _check_structure(text, values)
        out[task.stage] = text
    return out


def _check_structure(text: str, values: dict[str, Any]) -> None:
    """Parse what was rendered and confirm the values came back exactly, so a template change
    that lets a value leak into the structure fails here rather than on the cluster."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    parsed = yaml.load(text, Loader=loader)  # a safe loader: plain data only
    checks = {
        "name": (parsed.get("name"), values["task_name"]),
        "envs": (parsed.get("envs"), values["envs"]),
        "run": (parsed.get("run"), values["command"]),
        "file_mounts": (parsed.get("file_mounts"), values["file_mounts"]),
        "image_id": (parsed.get("resources", {}).get("image_id"), values["image_id"]),
    }
    for key, (got, want) in checks.items():
        if got != want:
            raise InvalidInput(
                f"template bug: rendered {key} does not read back as written",
                fix=f"check {templates_dir() / TEMPLATE}",
            )
