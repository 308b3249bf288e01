"""The run layout: where one run's objects live in its store, and what its parts are called.

Everything below is derived from a run's workflow and run id; every module that needs one of
these names asks here, so a reader finds the layout in one place (docs/storage-layout.md
describes the same tree for people)::

    <store>/<workflow>/<run>/                       the run root (NPA_RUN_PREFIX)
      npa-workflow/                                 the run prefix npa writes under
        manifest.json  plan.json  tasks/<stage><suffix>  source/  logs/
        stages/<stage>/outputs/<path>  stages/<stage>/logs/  stages/<stage>/checkpoints/<path>
        stages/<stage>/attempts/wave-<W>-shard-<S>[.attempt-<N>.json]   starts; phases
    <store>/.npa-index/<project>/                   the project's run index (npa/runs/index.py)
      .complete                                     every earlier run of the project is indexed
      <newest-first order>.<run>@<workflow>         one marker per run, written before its objects

Names in ``$NPA_HOME/locks``: ``manifest.<project>.<run>`` (every manifest writer on this
machine), ``launch.<project>.<run>[.r<N>][.a<N>]`` (one launch transaction: its lock and journal),
``supervisor.<project>.<run>`` (the run's watcher, held for its life).

Job names: ``npa-<workflow>-<run>``, ``-r<N>`` for the N-th ``--resume-run``, ``-a<N>`` for the
watcher's N-th relaunch. A stage's task is named ``<run>-<stage>``; on a backend that runs one
task per wave, wave ``W`` of it is ``<run>-<stage>-w<W>``.

Waves: a stage of ``shards`` shards, ``parallel`` at a time, runs ``ceil(shards / parallel)``
waves; wave ``w`` runs shards ``w * parallel`` up to ``min((w + 1) * parallel, shards)``.
"""

from __future__ import annotations

import math
import re

PREFIX_LEAF = "npa-workflow"
# The folder, beside a workflow's runs, that holds the source blobs and trees its runs share.
SHARED_SOURCE = "npa-source"
MANIFEST_NAME = "manifest.json"
PLAN_NAME = "plan.json"
# Beside the manifest, the pages of a large run's stage records (:mod:`npa.runs.manifest`).
MANIFEST_PAGES = "manifest-pages"

# The run index: one folder per project, beside the workflows (a workflow name starts with a
# letter or digit, so it never collides). Marker names start with their run id's newest-first
# order, so a plain ascending listing yields the newest runs first; the completeness mark
# starts with ".", which sorts before every marker, so it arrives in the same first page.
RUN_INDEX = ".npa-index"
INDEX_COMPLETE = ".complete"
# The shape prepare-run gives run ids; only folders of this shape are runs.
RUN_ID_SHAPE = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")
_NEWEST_FIRST = str.maketrans("0123456789abcdef", "fedcba9876543210")

_WAVE_TASK = re.compile(r"(?P<base>.+)-w(?P<wave>0|[1-9][0-9]*)")


# --- the store ----------------------------------------------------------------------------------


def run_prefix(workflow: str, run_id: str) -> str:
    """The key prefix everything npa writes for one run lives under, inside its store."""
    return f"{workflow}/{run_id}/{PREFIX_LEAF}"


def run_root(prefix: str) -> str:
    """The run's root (``<workflow>/<run>``, or a URI ending so) from its run prefix."""
    return prefix.removesuffix(f"/{PREFIX_LEAF}")


def stage_key(prefix: str, stage: str) -> str:
    """Where one stage's data lives under the run prefix."""
    return f"{prefix}/stages/{stage}"


def output_key(prefix: str, stage: str, path: str) -> str:
    """Where a stage's declared output ``path`` lives (a folder output keeps its ``/``)."""
    return f"{stage_key(prefix, stage)}/outputs/{path}"


def checkpoint_key(prefix: str, stage: str, path: str) -> str:
    return f"{stage_key(prefix, stage)}/checkpoints/{path}"


def attempts_key(prefix: str, stage: str, wave: int, shard: int) -> str:
    """Where the count of a shard's starts lives (``NPA_ATTEMPT``; every backend counts there)."""
    return f"{stage_key(prefix, stage)}/attempts/wave-{wave}-shard-{shard}"


# What follows a shard's attempts key for the record of one attempt's phases
# (:mod:`npa.backends.phases`); ``%s`` is the attempt number (the stage library fills it in).
PHASES_SUFFIX = ".attempt-%s.json"


def phases_key(prefix: str, stage: str, wave: int, shard: int, attempt: int) -> str:
    """Where the record of one shard attempt's phases lives: beside the shard's start count."""
    return attempts_key(prefix, stage, wave, shard) + PHASES_SUFFIX % attempt


def attempts_folder(prefix: str, stage: str) -> str:
    """The folder of a stage's start counts and phase records (ends with ``/``)."""
    return f"{stage_key(prefix, stage)}/attempts/"


def stage_logs_key(prefix: str, stage: str) -> str:
    return f"{stage_key(prefix, stage)}/logs"


def manifest_key(prefix: str) -> str:
    return f"{prefix}/{MANIFEST_NAME}"


def manifest_page_name(page: int | str) -> str:
    """One page of a paged manifest, relative to the run prefix: a number for a page of stage
    records, ``order`` for the run's stage order."""
    return (
        f"{MANIFEST_PAGES}/{page:04d}.json"
        if isinstance(page, int)
        else f"{MANIFEST_PAGES}/{page}.json"
    )


def manifest_page_key(prefix: str, page: int | str) -> str:
    return f"{prefix}/{manifest_page_name(page)}"


def plan_key(prefix: str) -> str:
    return f"{prefix}/{PLAN_NAME}"


def task_key(prefix: str, stage: str, suffix: str) -> str:
    return f"{prefix}/tasks/{stage}{suffix}"


def source_key(prefix: str) -> str:
    return f"{prefix}/source"


def shared_source_key(prefix: str) -> str:
    """Where the source blobs and trees every run of a workflow shares live
    (``<workflow>/npa-source``), from one run's prefix (``<workflow>/<run>/npa-workflow``)."""
    return f"{prefix.rsplit('/', 2)[0]}/{SHARED_SOURCE}"


def newest_first(run_id: str) -> str:
    """A key part that sorts newest first: each hex digit of the run id (``YYYYMMDD-HHMMSS-``
    and 24 random bits, all hex digits) replaced by its complement. Same length and dashes, so
    ascending order of the result is descending order of the ids."""
    return run_id.lower().translate(_NEWEST_FIRST)


def run_index_prefix(project: str) -> str:
    """Where the project's run index lives in its store (ends with ``/``)."""
    return f"{RUN_INDEX}/{project}/"


def run_index_key(project: str, workflow: str, run_id: str) -> str:
    """The marker that says run ``run_id`` of ``workflow`` in this store is ``project``'s."""
    return f"{run_index_run_prefix(project, run_id)}{workflow}"


def run_index_run_prefix(project: str, run_id: str) -> str:
    """The prefix every marker of one run id shares, whatever its workflow."""
    return f"{run_index_prefix(project)}{newest_first(run_id)}.{run_id}@"


def run_index_complete_key(project: str) -> str:
    return f"{run_index_prefix(project)}{INDEX_COMPLETE}"


def run_of_index_key(project: str, key: str) -> tuple[str, str] | None:
    """(run id, workflow) a marker key of ``project`` names; None for any other key."""
    name = key.removeprefix(run_index_prefix(project))
    order, dot, rest = name.partition(".")
    run_id, at, workflow = rest.partition("@")
    if name == key or not (dot and at and workflow) or "/" in workflow:
        return None
    return (run_id, workflow) if newest_first(run_id) == order else None


# --- local locks and journals -------------------------------------------------------------------


def manifest_lock(project: str, run_id: str) -> str:
    return f"manifest.{project}.{run_id}"


def watcher_lock(project: str, run_id: str) -> str:
    return f"supervisor.{project}.{run_id}"


def watcher_dir(project: str, run_id: str) -> str:
    """The watcher's folder under ``$NPA_HOME/supervisors``."""
    return f"{project}.{run_id}"


def launch_name(project: str, run_id: str, *, resumes: int, job_name: str, base: str) -> str:
    """The lock and journal name of one launch: each resume and each relaunch is its own.
    ``base`` is the run's current job name before any relaunch (see :func:`relaunch_suffix`)."""
    name = f"launch.{project}.{run_id}" + (f".r{resumes}" if resumes else "")
    return name + relaunch_suffix(job_name, base)


# --- job and task names -------------------------------------------------------------------------


def job_name(workflow: str, run_id: str) -> str:
    return f"npa-{workflow}-{run_id}"


def resume_job_name(workflow: str, run_id: str, attempt: int) -> str:
    return f"{job_name(workflow, run_id)}-r{attempt}"


def relaunch_job_name(base: str, attempt: int) -> str:
    """The job name of the watcher's ``attempt``-th relaunch of the job called ``base``."""
    return f"{base}-a{attempt}"


def relaunch_suffix(name: str, base: str) -> str:
    """``""`` when ``name`` is ``base`` itself, ``.a<N>`` when it is the ``N``-th relaunch of the
    job called ``base``: journal and lock names carry it, so each attempt launches once.

    Read against the base, never from the name's tail alone: a run id ends in six hex digits,
    and one in 160 of them (``a`` and five digits, as in ``-a94508``) looks like a relaunch.
    Any other name (one an earlier npa derived that way) gets ``.<name>``: its own journal."""
    if name == base:
        return ""
    attempt = name.removeprefix(f"{base}-a")
    if attempt != name and attempt.isascii() and attempt.isdigit():
        return f".a{attempt}"
    return f".{name}"


def task_name(run_id: str, stage: str) -> str:
    """The name a stage's task carries: unique within a run (stage names are), so it picks the
    stage's task out of the run's pipeline job. It starts with a letter because SkyPilot names
    the task's cluster after it, and a cluster name must (a run id starts with a digit)."""
    return f"npa-{run_id}-{stage}"


def wave_task_name(run_id: str, stage: str, wave: int) -> str:
    """The name of the task that runs wave ``wave`` of a stage (one task per wave)."""
    return f"{task_name(run_id, stage)}-w{wave}"


def wave_of_task(run_id: str, name: str) -> tuple[str, int] | None:
    """(stage, wave) of a wave task's name; None when ``name`` is not one of the run's.

    Unambiguous although stage names may end in ``-w<N>`` themselves: every wave task carries
    exactly one suffix, so the last one is the wave's."""
    head = task_name(run_id, "")
    match = _WAVE_TASK.fullmatch(name)
    if match is None or not match["base"].startswith(head) or len(match["base"]) == len(head):
        return None
    return match["base"][len(head) :], int(match["wave"])


# --- waves and shards ---------------------------------------------------------------------------


def wave_count(shards: int, parallel: int) -> int:
    """How many waves run ``shards`` pieces ``parallel`` at a time."""
    return math.ceil(shards / parallel)


def shards_of_wave(wave: int, parallel: int, shards: int) -> list[int]:
    """The shards wave ``wave`` runs."""
    return list(range(wave * parallel, min((wave + 1) * parallel, shards)))


# --- the stage contract -------------------------------------------------------------------------


def input_variable(name: str) -> str:
    """The environment variable that tells a stage where its input ``name`` is."""
    return f"NPA_INPUT_{name.upper()}"


def output_variable(name: str) -> str:
    """The environment variable that tells a stage where to write its output ``name``."""
    return f"NPA_OUTPUT_{name.upper()}"
