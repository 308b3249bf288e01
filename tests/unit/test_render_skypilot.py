"""Every file render writes is loaded by SkyPilot's own task loader and means what we meant."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from npa.adapters.kube.secrets import run_secret_name
from npa.backends import contract
from npa.backends.skypilot import tasks as sky_tasks
from npa.services.render import render_spec
from tests.unit.specdata import DIGEST_A, base_spec, dump

pytestmark = pytest.mark.unit


def sky_load(config: dict[str, Any]) -> Any:
    import sky  # slow to import (1-3 s); only here, never at CLI start-up

    return sky.Task.from_yaml_config(copy.deepcopy(config))  # it consumes what it is given


def check_all(out: Path, context: str) -> list[Any]:
    """Every wave task of every rendered file, loaded by SkyPilot and compared with the YAML."""
    tasks = []
    files = sorted(out.glob("*.yaml"))
    assert files
    for path in files:
        configs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        assert configs
        for wave, config in enumerate(configs):
            task = sky_load(config)
            (resources,) = list(task.resources)
            assert str(resources.cloud) == "Kubernetes"
            assert resources.region == context
            assert resources.image_id == {context: config["resources"]["image_id"]}
            assert "@sha256:" in config["resources"]["image_id"]
            assert task.name == config["name"] and task.name.endswith(f"-w{wave}")
            assert task.num_nodes == config["num_nodes"] >= 1
            assert task.envs == config["envs"] and task.envs["NPA_WAVE"] == str(wave)
            assert task.setup == config["setup"] and task.run == config["run"]
            assert not task.file_mounts and task.workdir is None
            recovery = config["resources"]["job_recovery"]
            # SkyPilot fills in the default strategy; the restart budget is ours.
            assert (
                resources.job_recovery["max_restarts_on_errors"]
                == recovery["max_restarts_on_errors"]
            )
            if "accelerators" in config["resources"]:
                name, count = config["resources"]["accelerators"].split(":")
                assert resources.accelerators == {name: int(count)}
            pod = task.to_yaml_config()["resources"]["_cluster_config_overrides"]
            assert pod == config["config"]
            tasks.append(task)
    return tasks


def render_pinned(spec: dict[str, Any], run_id: str, tmp_path: Path) -> Path:
    """Render ``spec`` (tool ``cur`` pinned to DIGEST_A) for ``run_id``; the folder written."""
    path = tmp_path / "spec.yaml"
    path.write_text(dump(spec))
    digests = tmp_path / "d.yaml"
    digests.write_text(f"cur: {DIGEST_A}\n")
    out = tmp_path / "out"
    render_spec(path, run_id, out, digests_file=digests)
    return out


def test_examples_render_to_tasks_skypilot_loads(tmp_path: Path) -> None:
    out = tmp_path / "physai"
    render_spec(
        Path("examples/physical-ai.yaml"),
        "demo-1",
        out,
        digests_file=Path("examples/physical-ai.digests.yaml"),
    )
    tasks = check_all(out, "nebius-physai")
    assert [t.name for t in tasks] == [
        "npa-demo-1-augment-w0", "npa-demo-1-augment-w1", "npa-demo-1-augment-w2",
        "npa-demo-1-augment-w3", "npa-demo-1-curate-w0", "npa-demo-1-evaluate-w0",
    ]  # fmt: skip
    tiny = tmp_path / "tiny"
    render_spec(
        Path("examples/tiny-local.yaml"),
        "tiny-1",
        tiny,
        kube_context="kind-npa",
        store_uri="s3://npa-test/workflows",
    )
    square = [t for t in check_all(tiny, "kind-npa") if "-square-" in t.name]
    assert [(t.name, t.num_nodes) for t in square] == [("npa-tiny-1-square-w0", 2)]


@pytest.mark.parametrize(
    "context",
    ["arn:aws:eks:us-east-1:123456789012:cluster/gpu-prod", "user@team/ctx", "my cluster"],
)
def test_any_context_kubectl_names_renders_to_a_task_skypilot_reads_back(
    tmp_path: Path, context: str
) -> None:
    out = tmp_path / "out"
    render_spec(
        Path("examples/tiny-local.yaml"),
        "ctx-1",
        out,
        kube_context=context,
        store_uri="s3://npa-test/workflows",
    )
    assert check_all(out, context)


def test_hostile_and_large_specs_render_to_loadable_tasks(tmp_path: Path) -> None:
    spec = base_spec()
    spec["stages"][0]["env"] = {
        "NEWLINE": "a\nb: c",
        "TEMPLATE": "{{ x }}",
        "HASH": "# x",
        "ANCHOR": "&a *a",
    }
    spec["stages"][0]["command"] = "echo 'a: b'\n# comment?\necho {{ x }} &a *a"
    stages = spec["stages"]
    for i in range(30):
        stages.append(
            {
                "name": f"extra-{i}",
                "tool": "gpu" if i % 2 else "cur",
                "command": f"echo {i}",
                "inputs": [{"name": "aug", "from": "augment.aug"}],
                "outputs": [{"name": "o", "path": f"extra/{i}/"}],
                "resources": {
                    "accelerators": "H100:4",
                    "cpus": 8.5,
                    "memory_gib": 30,
                    "disk_gib": 50,
                },
                "waves": {"shards": i + 1, "parallel": 1 + i // 4},
                "retries": i % 4,
            }
        )
    tasks = check_all(render_pinned(spec, "big-1", tmp_path), "test-ctx")
    waves = 1 + 3 + 1 + sum(-(-(i + 1) // (1 + i // 4)) for i in range(30))
    assert len(tasks) == waves
    curate = next(t for t in tasks if t.name == "npa-big-1-curate-w0")
    assert curate.envs["NEWLINE"] == "a\nb: c"
    command = "echo 'a: b'\n# comment?\necho {{ x }} &a *a"
    hidden = " ".join(contract.STORE_VARIABLES)  # the store's, for the library alone
    assert f"npa_command /npa/home {shlex.quote(command)} '' {hidden} || exit" in curate.run
    assert "HOME" not in curate.envs  # the run script gives it to the command alone


def test_declared_secrets_render_as_references_to_the_runs_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage's secrets reach its pods by name: each task's pod_config takes them from the
    run's Secret (name and key), the run script hands them to the command under their declared
    names, and no value, set in the rendering shell or not, is in any file render writes."""
    canary = "canary-value-7f3a9c"
    monkeypatch.setenv("NPA_TEST_CANARY", canary)
    spec = base_spec()
    spec["stages"][0]["secrets"] = {"TOKEN": "env:NPA_TEST_CANARY", "AWS_SESSION_TOKEN": "env:T2"}
    out = render_pinned(spec, "sec-1", tmp_path)
    tasks = check_all(out, "test-ctx")  # SkyPilot's loader reads the reference back
    name = run_secret_name(spec["metadata"]["name"], "sec-1")
    stage = spec["stages"][0]["name"]
    mine = [t for t in tasks if t.name.startswith(f"npa-sec-1-{stage}-w")]
    assert mine
    scoped = [
        {
            "name": variable,
            "valueFrom": {
                "secretKeyRef": {"name": name, "key": f"npa.store.{variable}", "optional": True}
            },
        }
        for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    ]
    for task in mine:
        pod = task.to_yaml_config()["resources"]["_cluster_config_overrides"]
        (container,) = pod["kubernetes"]["pod_config"]["spec"]["containers"]
        assert container == {
            "env": [
                {
                    "name": "NPA_SECRET_AWS_SESSION_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": name, "key": "T2"}},
                },
                {
                    "name": "NPA_SECRET_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": name, "key": "NPA_TEST_CANARY"}},
                },
                *scoped,
            ]
        }
        # The command gets both by name; the store's session token is still hidden from it
        # first (the secret of that name is given after).
        line = next(x for x in task.run.splitlines() if x.startswith("npa_command "))
        assert shlex.split(line)[3] == "AWS_SESSION_TOKEN TOKEN"
        assert "AWS_SESSION_TOKEN" in shlex.split(line)[4:]
    for other in (t for t in tasks if t not in mine):
        overrides = other.to_yaml_config()["resources"]["_cluster_config_overrides"]
        # Only the run-scoped store credentials' optional references (present when submit
        # assumed a stage role for the run, else the store Secret's stand).
        assert overrides["kubernetes"]["pod_config"]["spec"]["containers"] == [{"env": scoped}]
    text = (out / f"{stage}.yaml").read_text()
    assert sky_tasks.declared_secrets(text) == {
        "TOKEN": "env:NPA_TEST_CANARY",
        "AWS_SESSION_TOKEN": "env:T2",
    }
    for written in out.rglob("*"):
        assert not written.is_file() or canary.encode() not in written.read_bytes(), written


def test_the_job_skypilot_keeps_holds_the_rendered_tasks_as_written(tmp_path: Path) -> None:
    """The job's user YAML, which SkyPilot's server dumps from the pipeline submit launches
    (``use_user_specified_yaml``) and its queue answers as ``user_yaml``, is document for
    document what render showed: render writes every field in the form SkyPilot keeps it, so
    nothing a person reviewed is filled in, dropped or reshaped on the way. The cluster tier
    reads the same back from a real jobs controller."""
    from sky.utils import dag_utils

    from npa.backends.skypilot.jobs import build_dag

    out = tmp_path / "tiny"
    render_spec(Path("examples/tiny-local.yaml"), "tiny-1", out, kube_context="kind-npa",
                store_uri="s3://npa-test/workflows")  # fmt: skip
    # GPUs, waves of several nodes and pod overrides: the physical-AI example has them all.
    render_spec(Path("examples/physical-ai.yaml"), "demo-1", out / "physai",
                digests_file=Path("examples/physical-ai.digests.yaml"))  # fmt: skip
    texts = [
        yaml.safe_dump(doc, sort_keys=False)
        for path in sorted(out.rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
    ]
    assert len(texts) > 6
    dag = build_dag(texts, "npa-tiny-local-tiny-1")
    kept = dag_utils.dump_chain_dag_to_yaml_str(dag, use_user_specified_yaml=True)
    docs = list(yaml.safe_load_all(kept))
    assert docs[0]["name"] == "npa-tiny-local-tiny-1"
    assert docs[1:] == [yaml.safe_load(t) for t in texts]
