"""What the SkyPilot backend runs for each stage: digest-pinned SkyPilot task YAML, one task per
wave.

A stage's file holds one YAML document per wave, each a task of ``num_nodes`` = the wave's
shards; the run's job chains them all, so waves run in order and a wave's shards run at once, as
on every backend (a resume can start a stage at any wave). Every node sees the stage contract
(:mod:`npa.backends.contract`): its ``setup`` restores the run's committed source as files,
fetches the inputs and makes ``/npa`` the contract's tree; its ``run`` sets ``NPA_SHARD`` (from
SkyPilot's node rank) and ``NPA_ATTEMPT``, runs the command in ``/npa/source`` and uploads what
the shard left in its outputs, and writes the record of the attempt's phases as it exits
(:mod:`npa.backends.phases`). What the pod does is the shell library
``npa/templates/skypilot-stage.sh``, written out by the setup; the task lists its calls. The store
is reached with the AWS CLI and the credentials and endpoint the pod takes from the project's
store Secret (``npa-store``, which ``submit`` keeps current; with a stage role, the key and
token are the run's scoped session, from the run's Secret: :func:`scoped_store_env`), not with
SkyPilot's
``file_mounts``: those are read by SkyPilot's API server and jobs controller, which can reach an
S3-compatible store only when AWS itself is an enabled cloud there (docs/spec.md says more, with
the figures that chose this).

A stage's declared ``secrets`` reach its pods by reference only: its task's ``pod_config`` gives
the container one variable ``NPA_SECRET_<NAME>`` per secret, taken (``secretKeyRef``) from the
run's Secret (:func:`npa.adapters.kube.secrets.run_secret_name`) under the key of its source
variable; ``submit`` writes that Secret from its own environment before the launch
(:func:`declared_secrets` reads back what the task files reference). The run script hands each
to the command alone, under its declared name; the task file holds the Secret's name and keys,
never a value.

Encoding is pure: a stage's neutral task (:class:`StageTask`) and the kube context go in, the
task file's text comes out. Every value passes through the one yaml filter of
:func:`npa.core.templates.yaml_environment` (which refuses any other output). Files that differ
only in their values are made from one shape (:class:`Shapes`), whose first file is also
rendered in full, parsed back and compared with what was meant, so neither spec text nor a
template change can alter the task's structure unnoticed.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from npa.adapters.kube.secrets import STORE_KEY_PREFIX, run_secret_name
from npa.adapters.storage.stage_scope import SCOPED_VARIABLES
from npa.backends import contract
from npa.backends.base import RunTasks, StageTask, pod_security_context
from npa.core.errors import InvalidInput
from npa.core.layout import (
    PHASES_SUFFIX,
    PREFIX_LEAF,
    SHARED_SOURCE,
    shards_of_wave,
    source_key,
    stage_key,
    wave_task_name,
)
from npa.core.templates import (
    IMPLICIT_KEY,
    Joined,
    Shape,
    Slot,
    block_form,
    templates_dir,
    yaml_environment,
    yaml_filter,
)
from npa.core.yamlread import read_document

TEMPLATE = "skypilot-task.yaml.j2"
LIBRARY = "skypilot-stage.sh"
# Where the setup writes the library; the run sources it (setup and run share the node).
LIBRARY_PATH = "/tmp/npa/stage.sh"
_LIBRARY_END = "NPA_STAGE_LIBRARY"
# What a pod fetches with the AWS CLI; file:// exists only on the machine that renders.
MOUNTABLE = ("s3://",)
#: The pod's variable that carries secret ``NAME`` to the run script, which gives it to the
#: command as ``NAME`` and nothing else (spec names never take the reserved ``NPA_`` prefix).
SECRET_PREFIX = "NPA_SECRET_"


@lru_cache(maxsize=4)
def _library(root: str) -> str:
    path = Path(root) / LIBRARY
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(
            f"cannot read the stage library {path}: {exc.strerror}; the npa package is "
            "incomplete: reinstall it",
            fix=f"ls -l {shlex.quote(str(path.parent))}",
        ) from None


def mount_problems(store: str | None, external_inputs: list[tuple[str, str, str]]) -> list[str]:
    """Why a pod could not fetch the run's data: the store, and each external input given as
    (stage, input, uri)."""
    problems = []
    if store is None:
        problems.append("no object store: set storage.uri or pass --store-uri")
    elif not store.startswith(MOUNTABLE):
        problems.append(
            f"store {store!r} is not an object store a pod can fetch from (s3://, AWS or "
            "S3-compatible)"
        )
    for stage, name, uri in external_inputs:
        if not uri.startswith(MOUNTABLE):
            problems.append(
                f"stage {stage!r} input {name!r}: {uri} is not in an S3 or S3-compatible store "
                "(s3://), which a pod fetches its inputs from"
            )
    return problems


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _call(function: str, *args: str) -> str:
    return " ".join([function, *(shlex.quote(a) for a in args)])


@lru_cache(maxsize=4)
def _setup_head(library: str) -> str:
    """The start of every setup: write the library, source it, begin (the same text in every
    stage's file, so made once)."""
    return "\n".join(
        [
            f"mkdir -p {LIBRARY_PATH.rsplit('/', 1)[0]}",
            f"cat > {LIBRARY_PATH} <<'{_LIBRARY_END}'",
            library.rstrip("\n"),
            _LIBRARY_END,
            f". {LIBRARY_PATH}",
            "npa_begin",
        ]
    )


def setup_script(task: StageTask, run: RunTasks, library: str) -> str:
    """What every node of every wave does first: write the library, make ``/npa`` the contract's
    tree, restore the source, fetch the inputs, seal both. Joined from the head every stage
    shares and the stage's own lines, so the yaml filter makes the head's block once."""
    assert run.run_root is not None
    leaf = f"{run.run_root}/{PREFIX_LEAF}"
    shared = f"{run.run_root.rsplit('/', 1)[0]}/{SHARED_SOURCE}"
    lines = [_call("npa_restore", shared, f"{source_key(leaf)}/manifest.json")]
    for inp in task.inputs:
        assert inp.uri is not None
        uri = inp.uri.rstrip("/") if inp.kind == "prefix" else inp.uri
        lines.append(_call("npa_fetch", uri, contract.input_path(inp.name), inp.kind))
    lines.append("npa_seal")
    return Joined([_setup_head(library), "\n".join(lines) + "\n"])


def run_script(task: StageTask, run: RunTasks) -> str:
    """What every node runs: its shard and attempt, empty outputs, the command in the
    contract's working directory, then the outputs into the store (only when it succeeded)."""
    assert run.run_root is not None
    leaf = f"{run.run_root}/{PREFIX_LEAF}"
    attempts = f"{stage_key(leaf, task.stage)}/attempts"
    lines = [f". {LIBRARY_PATH}", _call("npa_shard", attempts, task.stage, PHASES_SUFFIX)]
    for out in task.outputs:
        lines.append(_call("npa_output", out.kind, contract.output_path(out.path)))
    # The command runs without the store's credentials (the library's alone), unless the
    # stage's own env sets one.
    hidden = [name for name in contract.STORE_VARIABLES if name not in task.env]
    home = task.env.get("HOME", contract.HOME_DIR)
    secrets = " ".join(sorted(task.secrets))
    lines.append(_call("npa_command", home, task.command, secrets, *hidden) + " || exit")
    for out in task.outputs:
        assert out.uri is not None
        uri = out.uri.rstrip("/")
        lines.append(_call("npa_upload", out.kind, contract.output_path(out.path), uri))
    lines.append("npa_uploaded")
    return "\n".join(lines) + "\n"


def wave_envs(task: StageTask, run: RunTasks, wave: int) -> dict[str, str]:
    """The stage's built environment (:func:`contract.stage_env`: the base, the contract's
    fixed variables, the stage's own ``env``) with this wave's ``NPA_WAVE`` (``NPA_SHARD`` and
    ``NPA_ATTEMPT`` are set on the node by the run script; ``PATH`` is the image's)."""
    envs: dict[str, str] = {}
    for key, value in contract.stage_env(task, run).items():
        if key in contract.SET_AROUND_THE_COMMAND:
            continue  # the run script gives it to the command alone (run_script)
        envs[key] = value
        if key == "NPA_SHARDS_PER_WAVE":
            envs[contract.WAVE] = str(wave)
    return envs


def secret_env(task: StageTask, run: RunTasks) -> list[dict[str, Any]]:
    """The container variables that carry the stage's secrets: each ``NPA_SECRET_<NAME>`` from
    the run's Secret, under the key of its source variable (names only, never a value)."""
    secret = run_secret_name(run.workflow, run.run_id)
    return [
        {
            "name": f"{SECRET_PREFIX}{name}",
            "valueFrom": {
                "secretKeyRef": {
                    "name": secret,
                    "key": source.removeprefix(contract.SECRET_FROM_ENV),
                }
            },
        }
        for name, source in sorted(task.secrets.items())
    ]


def scoped_store_env(run: RunTasks) -> list[dict[str, Any]]:
    """The container variables that give the stage library the run-scoped store credentials
    when ``submit`` wrote them into the run's Secret (a stage role is configured): each of
    :data:`SCOPED_VARIABLES` from key ``npa.store.<NAME>``, optional, so a run without them
    (no role, or no Secret at all) keeps the store Secret's. A container's ``env`` wins over
    its ``envFrom`` (Kubernetes' rule), so where the keys exist the pod has the run's
    credentials and not the project's."""
    secret = run_secret_name(run.workflow, run.run_id)
    return [
        {
            "name": name,
            "valueFrom": {
                "secretKeyRef": {
                    "name": secret,
                    "key": f"{STORE_KEY_PREFIX}{name}",
                    "optional": True,
                }
            },
        }
        for name in SCOPED_VARIABLES
    ]


def declared_secrets(text: str) -> dict[str, str]:
    """The secrets one stage's task file gives its pods (name -> ``env:VARIABLE``), read back
    from its ``pod_config``: what the run's Secret must hold for this file to start."""
    found: dict[str, str] = {}
    for doc in documents(text):
        parsed = read_document(doc) or {}
        spec = parsed.get("config", {}).get("kubernetes", {}).get("pod_config", {}).get("spec", {})
        for container in spec.get("containers", []):
            for var in container.get("env", []):
                ref = (var.get("valueFrom") or {}).get("secretKeyRef")
                if ref and str(var.get("name", "")).startswith(SECRET_PREFIX):
                    name = var["name"].removeprefix(SECRET_PREFIX)
                    found[name] = f"{contract.SECRET_FROM_ENV}{ref['key']}"
    return found


def task_values(
    task: StageTask, run: RunTasks, *, kube_context: str, library: str
) -> dict[str, Any]:
    """The values one stage's template is rendered with: what all its waves share, and each
    wave's own name, node count and ``NPA_WAVE``."""
    return {
        "infra": f"k8s/{kube_context}",
        "image_id": f"docker:{task.image}",
        "accelerators": task.accelerators,
        "cpus": None if task.cpus is None else _number(task.cpus),
        "memory": None if task.memory_gib is None else _number(task.memory_gib),
        "disk_size": task.disk_gib,
        "retries": task.retries,
        "setup": setup_script(task, run, library),
        "run": run_script(task, run),
        "security_context": pod_security_context(
            task.run_as_user, task.run_as_group, task.fs_group
        ),
        "secret_env": secret_env(task, run) + scoped_store_env(run),
        "waves": [
            {
                "name": wave_task_name(run.run_id, task.stage, wave),
                "nodes": len(shards_of_wave(wave, task.parallel, task.shards)),
                "envs": wave_envs(task, run, wave),
            }
            for wave in range(task.waves)
        ],
    }


def encoded(run: RunTasks, *, kube_context: str) -> Iterator[tuple[str, str]]:
    """(stage, task YAML: one document per wave) in plan order, each made as it is asked for.
    Every task's image must already be pinned."""
    root = str(templates_dir())
    template = yaml_environment(root).get_template(TEMPLATE)
    library = _library(root)
    shapes = Shapes(template)
    for task in run.tasks:
        yield (
            task.stage,
            shapes.render(task_values(task, run, kube_context=kube_context, library=library)),
        )


def encode(run: RunTasks, *, kube_context: str) -> dict[str, str]:
    """Stage -> task YAML, in plan order (:func:`encoded`, all at once)."""
    return dict(encoded(run, kube_context=kube_context))


class _Walk:
    """One pass over a task's values in the layout :func:`task_values` gives them: what decides
    the template's control flow (the key), the values the yaml filter writes (in order), and,
    when asked, the values with a :class:`~npa.core.templates.Slot` in each such value's place.

    A value that is none or empty is not a slot: it is part of the key, as the template may test
    it. Every other value's type is, and a key of a mapping the template iterates (``envs``) is
    a slot too, with whether it is too long to be written as an implicit key."""

    __slots__ = ("flat", "key", "slots")

    def __init__(self, values: dict[str, Any], *, slots: bool = False) -> None:
        self.key: list[Any] = []
        self.flat: list[Any] = []
        self.slots: dict[str, Any] | None = {} if slots else None
        out = {}
        for name, value in values.items():
            if name == "waves":
                self.key.append(len(value))
                out[name] = [self._wave(wave) for wave in value]
            else:
                out[name] = self._value(value)
        if self.slots is not None:
            self.slots = out

    def _wave(self, wave: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, value in wave.items():
            if name == "envs":
                self.key.append(len(value))
                out[name] = {self._value(k, key=True): self._value(v) for k, v in value.items()}
            else:
                out[name] = self._value(value)
        return out

    def _value(self, value: Any, *, key: bool = False) -> Any:
        if value is None or not value:
            self.key.append(repr(value))
            return value
        if key:
            self.key.append(len(value) > 100 and len(yaml_filter(value)) >= IMPLICIT_KEY)
        self.key.append(type(value))
        self.flat.append(value)
        return Slot(str(len(self.flat) - 1)) if self.slots is not None else value


class Shapes:
    """Renders task files through shapes (:class:`~npa.core.templates.Shape`), one per outcome
    of the template's control flow, and proves each before using it.

    A shape is recorded by rendering the template once with a Slot in each value's place
    (:class:`_Walk` says which); a template that does more with a value than write it or test it
    for none or emptiness refuses it, and every file of that key renders the full way. The
    filter writes a value as one line of flow YAML, or, where the template asks for a block and
    the text allows one, a literal block; which, and the newlines such a block ends in, are part
    of the shape's key as well. A file of a shape is its text with each value's filter output
    in its hole.

    The first file of each key is also rendered the full way (the template, then the text read
    back and compared with the values: :func:`_check_structure`), and the shape is used only
    when its text for that file is that file, byte for byte. Every other file of the key
    differs only in what the filter wrote into each hole: one line of flow YAML in a value's
    place reads back as that value wherever the place is (or a key's, when it is short enough
    to be an implicit one: the key says so), and a literal block whose lines are all indented
    by two reads back as its lines whatever they are, ended and chomped as the key says.
    """

    def __init__(self, template: Any) -> None:
        self.template = template
        self.recorded: dict[tuple[Any, ...], tuple[Shape, tuple[int, ...]] | None] = {}
        self.proven: dict[tuple[Any, ...], bool] = {}
        self.full = 0  # files rendered the full way (the first of each key, and the refused)

    def render(self, values: dict[str, Any]) -> str:
        """The task file of ``values``."""
        walk = _Walk(values)
        key = tuple(walk.key)
        if key not in self.recorded:
            self.recorded[key] = self._record(values)
        recorded = self.recorded[key]
        if recorded is None:
            return self._full(values)
        shape, blocks = recorded
        forms = {slot: block_form(walk.flat[slot]) for slot in blocks}
        proof = (key, *forms.values())
        proven = self.proven.get(proof)
        if proven:
            return shape.fill(walk.flat, forms)
        text = self._full(values)
        if proven is None:
            self.proven[proof] = shape.fill(walk.flat, forms) == text
        return text

    def _record(self, values: dict[str, Any]) -> tuple[Shape, tuple[int, ...]] | None:
        walk = _Walk(values, slots=True)
        assert walk.slots is not None
        try:
            shape = Shape.recorded(self.template.render(**walk.slots), len(walk.flat))
        except Exception:  # ShapeRefused, or an error the full render then reports
            return None
        return shape, tuple(sorted({slot for slot, block in shape.holes if block}))

    def _full(self, values: dict[str, Any]) -> str:
        self.full += 1
        text: str = self.template.render(**values)
        _check_structure(text, values)
        return text


def documents(text: str) -> list[str]:
    """The wave tasks of one stage's file, each as its own YAML text, in wave order: split where
    the encoder separates them (a value can never hold a line of its own: every one is quoted
    or an indented block)."""
    return [doc for doc in text.split("\n---\n") if doc.strip()]


def _check_structure(text: str, values: dict[str, Any]) -> None:
    """Parse what was rendered and confirm the values came back exactly, so a template change
    that lets a value leak into the structure fails here rather than on the cluster."""
    parsed = [read_document(doc) for doc in documents(text)]  # as SkyPilot's loader reads it
    if len(parsed) != len(values["waves"]):
        raise InvalidInput(
            f"template bug: the file {templates_dir() / TEMPLATE} rendered does not hold one "
            "task per wave"
        )
    for doc, wave in zip(parsed, values["waves"], strict=True):
        checks = {
            "name": (doc.get("name"), wave["name"]),
            "num_nodes": (doc.get("num_nodes"), wave["nodes"]),
            "envs": (doc.get("envs"), wave["envs"]),
            "setup": (doc.get("setup"), values["setup"]),
            "run": (doc.get("run"), values["run"]),
            "image_id": (doc.get("resources", {}).get("image_id"), values["image_id"]),
            "secrets": (_secret_env_of(doc), values["secret_env"]),
        }
        for key, (got, want) in checks.items():
            if got != want:
                raise InvalidInput(
                    f"template bug: {key} rendered by {templates_dir() / TEMPLATE} does not read "
                    "back as written"
                )


def _secret_env_of(doc: dict[str, Any]) -> Any:
    spec = doc.get("config", {}).get("kubernetes", {}).get("pod_config", {}).get("spec", {})
    containers = spec.get("containers") or [{}]
    return containers[0].get("env", [])
