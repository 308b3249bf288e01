"""The stage contract: what a stage's command sees, the same on every backend.

docs/spec.md ("The stage contract") states it for people; this module is the one place code
takes it from. Every backend encodes a stage with :func:`stage_env` and the paths below, and
adds the three per-shard variables of :func:`shard_env` when a shard starts:

- the working directory is :data:`SOURCE_DIR`, the run's committed source as a tree of files;
- input ``NAME`` is the local path ``/npa/inputs/NAME`` (a folder, or a file for a file input);
- output ``NAME`` with path ``P`` is ``/npa/outputs/P`` (a folder, created empty for each shard,
  or a file whose parent folder exists); what a shard leaves there is put under the output's key
  in the run's store when it succeeds;
- ``NPA_WORKFLOW``, ``NPA_RUN_ID``, ``NPA_STAGE``, ``NPA_RUN_PREFIX``, ``NPA_SOURCE_DIR``,
  ``NPA_WAVES``, ``NPA_SHARDS``, ``NPA_SHARDS_PER_WAVE``, ``NPA_INPUT_*``, ``NPA_OUTPUT_*``,
  ``NPA_CHECKPOINT_*`` and the stage's own ``env`` are fixed for the stage;
- ``NPA_WAVE``, ``NPA_SHARD`` and ``NPA_ATTEMPT`` are set for each shard it starts.

A backend that runs a stage as a host process, not in its image, cannot put it under ``/npa``:
it gives each shard a root folder laid out the same way and moves every path there
(:func:`relocate`), so paths differ by that root and nothing else.

A stage's environment is built here, never inherited from whoever submitted or executes it
(docs/spec.md, "A stage's environment"): the base :data:`BASE` (``HOME`` a folder of the shard's
own, ``LANG``, ``TZ``), the contract's ``NPA_*``, the stage's own ``env``, and the values of
the ``secrets`` it declares, each read from its named source (:func:`secret_values`) and written
to no file: by the local executor when the shard starts, by ``submit`` into the run's Kubernetes
Secret for a pod, whose run script gives them to the command
(:mod:`npa.backends.skypilot.tasks`). ``PATH`` is the image's in an image; a host process, which
has no image, gets :data:`HOST_PATH` (:func:`host_env`). The store credentials the stage library
uses (:data:`STORE_VARIABLES`) are for the library alone: the command runs without them.
"""

from __future__ import annotations

from collections.abc import Mapping

from npa.backends.base import RunTasks, StageTask
from npa.core.errors import InvalidInput

ROOT = "/npa"
SOURCE_DIR = f"{ROOT}/source"
INPUTS_DIR = f"{ROOT}/inputs"
OUTPUTS_DIR = f"{ROOT}/outputs"
HOME_DIR = f"{ROOT}/home"

WAVE = "NPA_WAVE"
SHARD = "NPA_SHARD"
ATTEMPT = "NPA_ATTEMPT"
PER_SHARD = (WAVE, SHARD, ATTEMPT)
#: The prefix of every variable npa sets; a stage's own ``env`` may not use it.
RESERVED_PREFIX = "NPA_"

#: The base every stage gets on every backend: a home folder of its own (empty, made afresh for
#: each shard's start, as its outputs are), a UTF-8 locale every C library has, and UTC. The
#: stage's own ``env`` may set any of them differently.
BASE: dict[str, str] = {"HOME": HOME_DIR, "LANG": "C.UTF-8", "TZ": "UTC"}
#: Given by a pod's run script to the stage's command alone, never in the SkyPilot task's
#: ``envs``: SkyPilot runs its own setup prelude with those envs in its environment, and a
#: ``HOME`` there moves what SkyPilot reads from home (its workdir, ``~/.bashrc``).
SET_AROUND_THE_COMMAND = ("HOME",)
#: What a stage sees beside the variables npa sets: its image's ``PATH`` (an engine or the
#: kubelet sets the default when the image has none).
IMAGE_GIVES = ("PATH",)
#: ``PATH`` for a stage run as a host process, which has no image: the default of Debian and of
#: the OCI runtimes, never the submitter's (a stage that needs more sets ``PATH`` in its ``env``).
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What the stage library on a pod reaches the store with (the project's store Secret, or, with
#: a stage role, the run's scoped session from the run's Secret: docs/spec.md, "Store
#: credentials"); the stage's command runs without them unless its own ``env`` sets one.
STORE_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
)
#: The one kind of secret source: a variable of the environment npa runs in when it starts the
#: stage (the submitting shell's, which the local executor inherits).
SECRET_FROM_ENV = "env:"


def input_path(name: str) -> str:
    """Where input ``name`` is, as the stage sees it."""
    return f"{INPUTS_DIR}/{name}"


def output_path(path: str) -> str:
    """Where an output declared with ``path`` is written, as the stage sees it (no trailing
    ``/`` for a folder)."""
    return f"{OUTPUTS_DIR}/{path.rstrip('/')}"


def stage_env(task: StageTask, run: RunTasks) -> dict[str, str]:
    """The base, every contract variable that is the same for all shards of ``task``, then the
    stage's own ``env``, in a fixed order (task files are compared byte for byte). No secret's
    value: those are added when a shard starts."""
    env: dict[str, str] = {
        **BASE,
        "NPA_WORKFLOW": run.workflow,
        "NPA_RUN_ID": run.run_id,
        "NPA_STAGE": task.stage,
        "NPA_RUN_PREFIX": run.run_root or "",
        "NPA_SOURCE_DIR": SOURCE_DIR,
        "NPA_WAVES": str(task.waves),
        "NPA_SHARDS": str(task.shards),
        "NPA_SHARDS_PER_WAVE": str(task.parallel),
    }
    for inp in task.inputs:
        env[inp.variable] = input_path(inp.name)
    for out in task.outputs:
        env[out.variable] = output_path(out.path)
    if task.checkpoint_uri is not None and task.checkpoint_loader is not None:
        env["NPA_CHECKPOINT_URI"] = task.checkpoint_uri
        env["NPA_CHECKPOINT_LOADER"] = task.checkpoint_loader
    env.update(task.env)
    return env


def stage_names(task: StageTask, run: RunTasks) -> set[str]:
    """The name of every variable a shard of ``task`` sees on every backend: what
    :func:`stage_env` fixes, the per-shard three, the secrets and what the image gives."""
    return {*stage_env(task, run), *PER_SHARD, *task.secrets, *IMAGE_GIVES}


def secret_values(secrets: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The value of each declared secret (name -> ``env:VAR``), read from ``environ``. Raises
    InvalidInput naming the first whose source is unset or empty."""
    values = {}
    for name, source in sorted(secrets.items()):
        variable = source.removeprefix(SECRET_FROM_ENV)
        value = environ.get(variable, "") if source.startswith(SECRET_FROM_ENV) else ""
        if not value:
            raise InvalidInput(
                f"secret {name} is read from {source}, which is not set in the environment "
                "npa runs in",
                fix=f"read -rs {variable} && export {variable}  # then submit again from here",
            )
        values[name] = value
    return values


def host_env(env: Mapping[str, str], root: str) -> dict[str, str]:
    """What a host-process shard is given: :data:`HOST_PATH` (it has no image to give one),
    then ``env`` (the stage's variables, the shard's and its secrets) with the contract's paths
    moved under ``root``; nothing of the executor's own environment."""
    return {"PATH": HOST_PATH, **relocate_env(env, root)}


def shard_env(wave: int, shard: int, attempt: int) -> dict[str, str]:
    """The variables one shard's start adds: its wave, its shard number (from 0 across the
    stage) and how many times this shard of this wave has been started in the run (from 1)."""
    return {WAVE: str(wave), SHARD: str(shard), ATTEMPT: str(attempt)}


def relocate(value: str, root: str) -> str:
    """``value`` with a leading ``/npa`` replaced by ``root`` (a shard's root folder); any other
    value unchanged."""
    if value == ROOT or value.startswith(f"{ROOT}/"):
        return root.rstrip("/") + value[len(ROOT) :]
    return value


def relocate_env(env: Mapping[str, str], root: str) -> dict[str, str]:
    """The contract's paths in ``env`` moved under ``root``; the stage's own variables are left
    as the spec wrote them."""
    moved = {}
    for key, value in env.items():
        path_var = key == "NPA_SOURCE_DIR" or key.startswith(("NPA_INPUT_", "NPA_OUTPUT_"))
        path_var = path_var or (key == "HOME" and value == HOME_DIR)
        moved[key] = relocate(value, root) if path_var else value
    return moved
