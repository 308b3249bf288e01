"""One definition of a stage's environment (docs/spec.md, "A stage's environment"): the local
host-process runtime, the local container runtime and the SkyPilot task give a stage the same
variable names for the same task, and none of them takes anything from the environment npa
itself runs in."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.adapters.containers import ContainerEngine, client_env
from npa.adapters.kube.secrets import store_environment
from npa.backends import contract
from npa.backends.base import RunTasks, StageTask, TaskInput, TaskOutput
from npa.backends.local import tasks as local_tasks
from npa.backends.local.executor import ContainerRuntime, shard_variables
from npa.backends.skypilot import tasks as sky_tasks
from npa.core.errors import InvalidInput
from npa.core.layout import input_variable, output_variable
from npa.spec.model import BASE_NAMES, Workflow
from tests.tiers import examples
from tests.unit.specdata import base_spec, one_stage_task

pytestmark = pytest.mark.unit

# What the submitting shell holds; no builder may take any of it.
CANARIES = {
    "CANARY_SECRET": "canary-secret-value",
    "AWS_SECRET_ACCESS_KEY": "canary-aws-secret-value",
    "REG_AUTH": "canary:registry-password",
    "HTTPS_PROXY": "http://canary-proxy.invalid:3128",
}
# The documented base (docs/spec.md): every stage on every backend has these names.
BASE = {"PATH", "HOME", "LANG", "TZ"}

names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
env_names = st.from_regex(r"[A-Z][A-Z0-9_]{0,6}", fullmatch=True).filter(
    lambda n: not n.startswith("NPA_") and n not in BASE
)


@st.composite
def stage_tasks(draw: Any, *, with_secrets: bool) -> tuple[StageTask, RunTasks]:
    inputs = draw(st.lists(names, max_size=3, unique=True))
    outputs = draw(st.lists(names, max_size=3, unique=True))
    env = draw(st.dictionaries(env_names, st.text(max_size=8), max_size=4))
    secret_names = [n for n in draw(st.lists(env_names, max_size=2, unique=True)) if n not in env]
    shards = draw(st.integers(1, 6))
    parallel = draw(st.integers(1, shards))
    task = StageTask(
        stage="probe",
        task_name="npa-run-1-probe",
        command="env",
        env=env,
        secrets={n: f"env:SRC_{n}" for n in secret_names} if with_secrets else {},
        image="registry.example.com/shell@sha256:" + "a" * 64,
        depends_on=[],
        shards=shards,
        parallel=parallel,
        waves=-(-shards // parallel),
        retries=0,
        accelerators=None,
        cpus=1,
        memory_gib=None,
        disk_gib=1,
        inputs=[
            TaskInput(name=n, variable=input_variable(n), uri=f"s3://in/{n}/", kind="auto")
            for n in inputs
        ],
        outputs=[
            TaskOutput(
                name=n,
                variable=output_variable(n),
                path=f"{n}/",
                kind="prefix",
                uri=f"s3://b/w/run-1/npa-workflow/stages/probe/outputs/{n}",
                key=f"w/run-1/npa-workflow/stages/probe/outputs/{n}",
            )
            for n in outputs
        ],
        run_as_user=1000,
        run_as_group=1000,
        fs_group=1000,
    )
    run = RunTasks(
        workflow="w",
        run_id="run-1",
        store="s3://b",
        prefix="w/run-1/npa-workflow",
        run_root="s3://b/w/run-1",
        tasks=[task],
    )
    return task, run


def local_task(run: RunTasks, runtime: local_tasks.Runtime) -> local_tasks.LocalTask:
    engine = "podman" if runtime == "container" else None
    return local_tasks.parse(local_tasks.encode(run, runtime=runtime, engine=engine)["probe"])


def secret_values(task: StageTask) -> dict[str, str]:
    return {f"SRC_{n}": f"value-of-{n}" for n in task.secrets}


def process_names(run: RunTasks, root: Path) -> set[str]:
    """What a host-process shard is given (the executor's own composition)."""
    task = local_task(run, "process")
    secrets = contract.secret_values(task.secrets, secret_values(run.tasks[0]))
    return set(contract.host_env(shard_variables(task, 0, 0, 1, secrets), str(root)))


def container_names(run: RunTasks, root: Path) -> set[str]:
    """What a container shard is given: every ``--env`` of the engine's command line, and its
    image's PATH."""
    task = local_task(run, "container")
    secrets = contract.secret_values(task.secrets, secret_values(run.tasks[0]))
    env = shard_variables(task, 0, 0, 1, secrets)
    runtime = ContainerRuntime(ContainerEngine("podman", "/usr/bin/podman"), "run-1", root, root)
    argv = runtime.argv(task, "npa-1-probe-w0-s0-a1", env, root, {})
    given = [argv[i + 1].split("=", 1)[0] for i, word in enumerate(argv) if word == "--env"]
    assert len(given) == len(set(given))
    return {*given, *contract.IMAGE_GIVES}


def skypilot_names(run: RunTasks, wave: int) -> set[str]:
    """What a pod's command is given by npa: the wave task's envs, the two variables the run
    script sets from the node, and its image's PATH."""
    text = sky_tasks.encode(run, kube_context="kind-npa")["probe"]
    doc = yaml.safe_load(sky_tasks.documents(text)[wave])
    assert "NPA_SHARD=" in doc["run"] or "npa_shard " in doc["run"]
    # HOME is the run script's to give, around the command alone: SkyPilot's own setup reads
    # its home from the task's envs.
    assert "HOME" not in doc["envs"]
    assert f"npa_command {contract.HOME_DIR} " in doc["run"]
    # The secrets the run script gives the command, each under its own name.
    line = next(x for x in doc["run"].splitlines() if x.startswith("npa_command "))
    secrets = shlex.split(line)[3].split()
    return {*doc["envs"], "NPA_SHARD", "NPA_ATTEMPT", "HOME", *secrets, *contract.IMAGE_GIVES}


@settings(max_examples=examples(60), deadline=None)
@given(st.data())
def test_every_backend_gives_a_stage_the_same_names(tmp_path_factory: Any, data: Any) -> None:
    root = tmp_path_factory.mktemp("shard")
    task, run = data.draw(stage_tasks(with_secrets=False))
    want = contract.stage_names(task, run)
    assert want >= BASE and set(task.env) <= want
    assert process_names(run, root) == want
    assert container_names(run, root) == want
    for wave in range(task.waves):
        assert skypilot_names(run, wave) == want


@settings(max_examples=examples(40), deadline=None)
@given(st.data())
def test_both_local_runtimes_give_declared_secrets_by_name(
    tmp_path_factory: Any, data: Any
) -> None:
    root = tmp_path_factory.mktemp("shard")
    task, run = data.draw(stage_tasks(with_secrets=True))
    want = contract.stage_names(task, run)
    assert set(task.secrets) <= want
    assert process_names(run, root) == want == container_names(run, root)
    # The task file names each secret's source, never a value.
    text = local_tasks.encode(run, runtime="process", engine=None)["probe"]
    assert all(v not in text for v in secret_values(task).values())
    # A pod gets them by reference to the run's Secret; its command, by their declared names.
    for wave in range(task.waves):
        assert skypilot_names(run, wave) == want
    sky_text = sky_tasks.encode(run, kube_context="kind-npa")["probe"]
    assert all(v not in sky_text for v in secret_values(task).values())
    assert sky_tasks.declared_secrets(sky_text) == task.secrets


def test_no_builder_takes_the_submitters_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    _, run = one_stage_task("env", {"GREETING": "hi"})
    host = contract.host_env(
        shard_variables(local_task(run, "process"), 0, 0, 1, {}), str(tmp_path)
    )
    assert host["PATH"] == contract.HOST_PATH
    assert host["HOME"] == f"{tmp_path}/home" and host["LANG"] == "C.UTF-8"
    env = shard_variables(local_task(run, "container"), 0, 0, 1, {})
    runtime = ContainerRuntime(
        ContainerEngine("podman", "/usr/bin/podman"), "r", tmp_path, tmp_path
    )
    argv = runtime.argv(local_task(run, "container"), "n", env, tmp_path, {})
    assert "--http-proxy=false" in argv  # podman would copy the client's proxy variables
    text = sky_tasks.encode(run, kube_context="kind-npa")["probe"]
    for name, value in CANARIES.items():
        assert name not in host and value not in " ".join(argv) and value not in text
    # The engine's client keeps its own environment (it needs it to run); it passes the
    # container nothing of it, since only the --env names above reach the container.
    assert client_env(env)["HOME"] != contract.HOME_DIR


def test_the_pod_command_runs_without_the_store_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store Secret gives the pod the store's credentials for the stage library; the run
    script names each for the library to remove before the command runs, except one the
    stage's own env sets."""
    task, run = one_stage_task("aws s3 ls", {"AWS_REGION": "eu-north1"})
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "example-token")
    script = sky_tasks.run_script(task, run)
    (line,) = [line for line in script.splitlines() if line.startswith("npa_command ")]
    words = shlex.split(line.removesuffix(" || exit"))
    assert words[1:4] == [contract.HOME_DIR, "aws s3 ls", ""]  # "": no secret declared
    assert set(words[4:]) == set(contract.STORE_VARIABLES) - {"AWS_REGION"}
    # The names are the ones the store Secret holds.
    held, _ = store_environment(profile=None, endpoint_url="http://127.0.0.1:9", region="r1")
    assert set(held) == set(contract.STORE_VARIABLES)


def test_a_secret_is_declared_by_name_from_a_named_source() -> None:
    # The spec refuses a secret named after a base variable: the same names contract.py sets.
    assert BASE_NAMES == {*contract.BASE, *contract.IMAGE_GIVES} == BASE
    spec = base_spec()
    spec["stages"][0]["secrets"] = {"HF_TOKEN": "env:MY_HF_TOKEN"}
    assert Workflow.model_validate(spec).stages[0].secrets == {"HF_TOKEN": "env:MY_HF_TOKEN"}
    for secrets in ({"HF_TOKEN": "file:/x"}, {"HF_TOKEN": "MY_HF_TOKEN"}, {"HOME": "env:X"},
                    {"NPA_X": "env:X"}):  # fmt: skip
        bad = base_spec()
        bad["stages"][0]["secrets"] = secrets
        with pytest.raises(ValueError):
            Workflow.model_validate(bad)
    both = base_spec()
    both["stages"][0]["env"] = {"HF_TOKEN": "x"}
    both["stages"][0]["secrets"] = {"HF_TOKEN": "env:MY_HF_TOKEN"}
    with pytest.raises(ValueError, match="also in env"):
        Workflow.model_validate(both)
    with pytest.raises(InvalidInput) as missing:
        contract.secret_values({"HF_TOKEN": "env:MY_HF_TOKEN"}, {"MY_HF_TOKEN": ""})
    assert "MY_HF_TOKEN" in missing.value.message and missing.value.fix
    assert contract.secret_values({"HF_TOKEN": "env:T"}, {"T": "v"}) == {"HF_TOKEN": "v"}
