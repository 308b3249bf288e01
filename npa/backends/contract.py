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
"""

from __future__ import annotations

from collections.abc import Mapping

from npa.backends.base import RunTasks, StageTask

ROOT = "/npa"
SOURCE_DIR = f"{ROOT}/source"
INPUTS_DIR = f"{ROOT}/inputs"
OUTPUTS_DIR = f"{ROOT}/outputs"

WAVE = "NPA_WAVE"
SHARD = "NPA_SHARD"
ATTEMPT = "NPA_ATTEMPT"
PER_SHARD = (WAVE, SHARD, ATTEMPT)
#: The prefix of every variable npa sets; a stage's own ``env`` may not use it.
RESERVED_PREFIX = "NPA_"


def input_path(name: str) -> str:
    """Where input ``name`` is, as the stage sees it."""
    return f"{INPUTS_DIR}/{name}"


def output_path(path: str) -> str:
    """Where an output declared with ``path`` is written, as the stage sees it (no trailing
    ``/`` for a folder)."""
    return f"{OUTPUTS_DIR}/{path.rstrip('/')}"


def stage_env(task: StageTask, run: RunTasks) -> dict[str, str]:
    """Every contract variable that is the same for all shards of ``task``, then the stage's
    own ``env``, in a fixed order (task files are compared byte for byte)."""
    env: dict[str, str] = {
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
        moved[key] = relocate(value, root) if path_var else value
    return moved
