"""Validate, plan and render do the same work per stage at every size, counted, not timed.

Two ways the work per stage grew with the workflow (issue 34), each held by a property here:

- the cyclic garbage collector rescanning the whole live workflow, plan and tasks while they
  are built: each collection of the oldest generation is O(stages) and more of them run as the
  workflow grows, so the CPU per stage grew 4x from 200 to 20,000 stages. Validation, planning
  and rendering pause it (:func:`npa.core.collector.collector_paused`): at a size far past
  every threshold (unpaused, the collector runs dozens of times), it runs at most once, on the
  young generation, when it resumes; what the build left alive is frozen, so that collection
  no longer rescans it.
- per-stage work that walks the whole workflow or run: the lines of Python run for ``n``,
  ``2n`` and ``4n`` stages are counted (a count that does not depend on the machine), and the
  lines the last ``2n`` stages add must be twice what the middle ``n`` add, as they are when
  each stage costs the same. Work of O(stages) per stage makes it more than twice.

Work that is once a run, not once a stage, is counted too: render compiles its task template
once and makes its files durable with one ``syncfs``, for 20 stages as for 80.
"""

from __future__ import annotations

import gc
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from tests.unit.specdata import DIGEST_A, base_spec, dump

pytestmark = pytest.mark.unit

KUBE_CONTEXT = "test-ctx"
STORE = "s3://bucket/workflows"


def chain_spec(stages: int) -> str:
    """A chain with fan-in and waves: each stage reads the previous one's output and depends on
    the stage half-way back."""
    spec = base_spec()
    spec["tools"] = {"cur": {"image": "registry.example.com/cur:1.0"}}
    spec["stages"] = [
        {
            "name": f"s{i}",
            "tool": "cur",
            "command": f"run-step {i}",
            "env": {"STEP": str(i)},
            "outputs": [{"name": "out", "path": "out/"}],
            "resources": {"cpus": 2, "memory_gib": 4},
            "waves": {"shards": 4, "parallel": 2},
            **({"inputs": [{"name": "up", "from": f"s{i - 1}.out"}]} if i else {}),
            **({"depends_on": [f"s{i // 2}"]} if i > 1 else {}),
        }
        for i in range(stages)
    ]
    return dump(spec)


def steps(root: Path) -> dict[str, Callable[[Path], object]]:
    """Each step as its command runs it, in process, on a spec file."""
    from npa.services.plan import plan_spec
    from npa.services.render import render_spec
    from npa.spec.validate import load_workflow

    digests = root / "digests.yaml"
    digests.write_text(dump({"cur": DIGEST_A}))
    renders = iter(range(1000))

    def render(spec: Path) -> object:
        return render_spec(
            spec,
            "r1",
            root / f"out-{next(renders)}",
            digests_file=digests,
            kube_context=KUBE_CONTEXT,
            store_uri=STORE,
        )

    return {
        "validate": load_workflow,
        "plan": lambda spec: plan_spec(spec, "r1", target="kubernetes").model_dump_json(),
        "render": render,
    }


def builders(spec: Path) -> dict[str, Callable[[], object]]:
    """The domain builders other commands reach (submit renders through render_run, its quota
    gate plans with build_plan), each ready to run on the spec's workflow and plan: each must
    pause the collector itself."""
    from npa.backends import backend_for_infra
    from npa.core.paths import NpaPaths
    from npa.plan.model import build_plan
    from npa.render.tasks import render_run
    from npa.services.render import render_workflow
    from npa.spec.validate import load_workflow

    workflow = load_workflow(spec)
    plan = build_plan(workflow, "r1", store_uri=STORE)
    backend = backend_for_infra(f"k8s/{KUBE_CONTEXT}", NpaPaths.from_env())
    images = {"cur": f"registry.example.com/cur@{DIGEST_A}"}
    return {
        "build_plan": lambda: build_plan(workflow, "r1", store_uri=STORE),
        "render_run": lambda: render_run(workflow, plan, backend, images=images),
        "render_workflow": lambda: render_workflow(
            workflow, "r1", kube_context=KUBE_CONTEXT, digests={"cur": DIGEST_A}
        ),
    }


@pytest.fixture
def home(npa_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("NPA_HOME", str(npa_home))
    yield npa_home


@pytest.fixture
def collections() -> Iterator[Callable[[Callable[[], object]], list[int]]]:
    """Runs a call and returns the generation of every collection that started during it."""
    seen: list[int] = []
    watching: list[bool] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and watching:
            seen.append(info["generation"])

    def during(call: Callable[[], object]) -> list[int]:
        seen.clear()
        gc.collect()  # what came before is not the call's to collect
        watching.append(True)
        try:
            call()
        finally:
            watching.clear()
        assert gc.isenabled()  # resumed afterwards
        return list(seen)

    assert gc.isenabled()
    gc.callbacks.append(note)
    try:
        yield during
    finally:
        gc.callbacks.remove(note)


def collected(started: list[int]) -> str:
    return (
        f"the collector ran {len(started)} times while it built (generation 0, 1, 2: "
        f"{', '.join(str(started.count(g)) for g in range(3))} times): it may run once, on the "
        "young generation, when it resumes"
    )


STAGES_PAST_THRESHOLDS = 600  # hundreds of thousands of objects; generation 0 fills every 700


COMMANDS = ("validate", "plan", "render")
BUILDERS = ("build_plan", "render_run", "render_workflow")


@pytest.mark.parametrize("name", [*COMMANDS, *BUILDERS])
def test_the_collector_does_not_run_while_a_workflow_is_built(
    name: str,
    home: Path,
    tmp_path: Path,
    collections: Callable[[Callable[[], object]], list[int]],
) -> None:
    spec = tmp_path / "chain.yaml"
    spec.write_text(chain_spec(STAGES_PAST_THRESHOLDS))
    if name in COMMANDS:
        run = steps(tmp_path)[name]
        started = collections(lambda: run(spec))
    else:
        started = collections(builders(spec)[name])
    assert started in ([], [0]), f"{name}: {collected(started)}"


@pytest.mark.parametrize("name", [*COMMANDS, *BUILDERS])
def test_what_a_build_leaves_alive_is_frozen_not_scanned_again(
    name: str, home: Path, tmp_path: Path
) -> None:
    """Everything built under the pause was young: unfrozen, the first collection after it
    rescanned all of it to free nothing (build_plan at 20,000 stages: 0.75 s; frozen, 0.53 s).
    It is frozen instead, and the young generation starts empty."""
    spec = tmp_path / "chain.yaml"
    spec.write_text(chain_spec(STAGES_PAST_THRESHOLDS))
    call = (lambda: steps(tmp_path)[name](spec)) if name in COMMANDS else builders(spec)[name]
    gc.unfreeze()
    gc.collect()
    before = gc.get_freeze_count()
    built = call()
    young, _, _ = gc.get_count()
    frozen = gc.get_freeze_count() - before
    assert built is not None or name == "render"
    assert frozen >= 100 * STAGES_PAST_THRESHOLDS, f"{name}: {frozen} objects frozen"
    assert young < gc.get_threshold()[0], f"{name}: {young} young objects left to scan"


def lines_run(run: Callable[[Path], object], spec: Path) -> int:
    """How many lines of Python one run executes (each pass of a loop counts, comprehensions
    included): the same count on every machine (the steps start no thread whose waiting
    would be counted)."""
    count = 0

    def line(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        count += event == "line"
        return line

    before = sys.gettrace()  # a coverage tracer, when there is one, is back afterwards
    sys.settrace(line)
    try:
        run(spec)
    finally:
        sys.settrace(before)
    return count


SIZES = (20, 40, 80)  # n, 2n, 4n


@pytest.mark.parametrize("step", COMMANDS)
def test_each_stage_runs_the_same_number_of_lines(step: str, home: Path, tmp_path: Path) -> None:
    """Rendering runs about 11,000 lines a stage here, repeatably to 0.01%. A comprehension
    over the run's tasks in each stage's task values (one line per stage, per stage) makes the
    last 2n stages cost 0.5% more than twice the middle n: that fails here."""
    run = steps(tmp_path)[step]
    counted = {}
    for n in (SIZES[0], *SIZES):  # the first run is a warm-up: imports and caches fill once
        spec = tmp_path / f"chain-{n}.yaml"
        spec.write_text(chain_spec(n))
        counted[n] = lines_run(run, spec)
    n, double, quadruple = SIZES
    middle = counted[double] - counted[n]  # what n more stages add
    last = counted[quadruple] - counted[double]  # what 2n more stages add
    assert last <= 2.002 * middle, (
        f"{step}: lines per added stage grew from {middle / n:.1f} to {last / (2 * n):.1f} "
        f"between {double} and {quadruple} stages ({counted}): some stage does work that grows "
        "with the workflow"
    )


@pytest.mark.skipif(
    sys.platform != "linux", reason="syncfs(2) is Linux's: elsewhere each file is fsynced"
)
def test_render_flushes_and_compiles_its_template_once_a_run_not_once_a_stage(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted through to the real calls: render makes its files durable and compiles the task
    template the same number of times for 20 stages as for 80 (an fsync per task file
    committed the journal once a file, about 0.1 ms of CPU each: 2 s of a 20,000-stage
    render)."""
    import jinja2

    from npa.core.templates import yaml_environment
    from npa.services import render as render_service

    counts: Counter[str] = Counter()

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(os, "fsync", counting("fsync", os.fsync))
    monkeypatch.setattr(render_service, "_syncfs", counting("syncfs", render_service._syncfs))
    monkeypatch.setattr(
        jinja2.Environment, "compile", counting("compile", jinja2.Environment.compile)
    )
    run = steps(tmp_path)["render"]
    counted = {}
    for n in (20, 80):
        spec = tmp_path / f"chain-{n}.yaml"
        spec.write_text(chain_spec(n))
        yaml_environment.cache_clear()  # each run loads the template afresh
        counts.clear()
        run(spec)
        counted[n] = dict(counts)
    assert counted[20] == counted[80], counted
    assert counted[80]["compile"] == 1, counted
    assert counted[80].get("fsync", 0) + counted[80].get("syncfs", 0) <= 3, counted
