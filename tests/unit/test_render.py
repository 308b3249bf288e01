"""Rendering: digest pinning, the YAML-safe filter, injection, atomic output and --diff."""

from __future__ import annotations

import errno
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from npa.core import templates
from npa.core.errors import InvalidInput, LocalStateUnavailable
from npa.core.layout import PHASES_SUFFIX
from npa.core.templates import Joined, literal_block_holds, yaml_block, yaml_filter
from npa.render.tasks import load_digests, resolve_images
from npa.services.render import INDEX, render_spec, render_workflow
from npa.spec.model import Workflow
from tests.unit.specdata import DIGEST_A, DIGEST_B, base_spec, dump

pytestmark = pytest.mark.unit

DIGESTS = {"cur": DIGEST_A}

HOSTILE = [
    "line one\nline two",
    "key: value",
    "a: b\nc: d",
    "{{ run_id }}",
    "{% if true %}x{% endif %}",
    "# not a comment",
    "value # trailing",
    "&anchor value",
    "*alias",
    "!!python/object:os.system",
    "- item",
    "? complex",
    "'single' \"double\" `back`",
    "\ttab and \\ backslash",
    "ls\u2028sep\u2029par\x85nel",
    "emoji \U0001f600 and \ufeff bom",
    "",
    " leading and trailing ",
    "null",
    "true",
    "0x1F",
    "---\n...\n",
]


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # render looks for the run's reservation: an empty NPA_HOME has none.
    monkeypatch.setenv("NPA_HOME", str(tmp_path / "npa-home"))


def workflow_with(**stage_fields: Any) -> Workflow:
    spec = base_spec()
    spec["stages"][0].update(stage_fields)
    return Workflow.model_validate(spec)


def parsed(text: str) -> dict[str, Any]:
    """The first wave's task of a stage's file."""
    data = next(yaml.safe_load_all(text))
    assert isinstance(data, dict)
    return data


def waves(text: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(text))


def calls(script: str, function: str) -> list[list[str]]:
    """The arguments of every call of ``function`` in a rendered script, as the shell reads
    them."""
    # The calls follow the library the setup writes out (a heredoc no tokenizer reads).
    calls_part = script.split("\nNPA_STAGE_LIBRARY\n", 1)[-1]
    words = shlex.split(calls_part.replace(" || exit", ""))
    return [words[i + 1 : i + 1 + _ARITY[function]] for i, w in enumerate(words) if w == function]


_ARITY = {"npa_fetch": 3, "npa_restore": 2, "npa_command": 2, "npa_upload": 3, "npa_output": 2,
          "npa_shard": 3}  # fmt: skip


def _sky_load(text: str) -> Any:
    """What SkyPilot reads a task file with."""
    from sky.utils.yaml_utils import read_yaml_str

    return read_yaml_str(text)


@pytest.mark.parametrize("value", HOSTILE)
def test_yaml_filter_round_trips(value: str) -> None:
    assert _sky_load(f"k: {yaml_filter(value)}\n") == {"k": value}
    nested = {value: [value, {"x": value}], "n": [1, 2.5, 1e20, -3e-7, None, True]}
    assert _sky_load(f"k: {yaml_filter(nested)}\n") == {"k": nested}
    assert _sky_load(f"k: {yaml_filter(value, block=True)}\nz: 0\n") == {"k": value, "z": 0}


_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.parametrize("length", [1, 1017, 1020, 1021, 1022, 1023, 1024, 1025, 4000])
@pytest.mark.parametrize("char", ["a", "\u0301", "\U0001f600"])  # escaped: 6 and 10 characters
def test_a_key_longer_than_an_implicit_key_may_be_reads_back(length: int, char: str) -> None:
    """YAML reads an implicit key only up to 1,024 characters, as written (escapes included):
    a longer one is written as an explicit key (``? "..."``)."""
    key = char * max(1, (length - 2) // (len(yaml_filter(char)) - 2))  # about length, quoted
    value = {key: None, "b": [1, {key: {key: 2}}]}
    assert _sky_load(f"k: {yaml_filter(value)}\nz: 0\n") == {"k": value, "z": 0}


@given(value=_values)
def test_any_value_reads_back_through_skypilot_as_one_node(value: Any) -> None:
    assert _sky_load(f"k: {yaml_filter(value)}\nz: 0\n") == {"k": value, "z": 0}


# Scripts: printable ASCII, newlines and the characters that tempt a block to misread.
_script_text = st.text(st.sampled_from([*"ab #:-|>{}&*!'\"\\\n\t", "\u2028", "\r", "\x85"]))


@given(text=_script_text | st.text())
def test_a_script_reads_back_exactly_whichever_form_the_filter_picks(text: str) -> None:
    written = yaml_filter(text, block=True)
    assert _sky_load(f"k: {written}\nz: 0\n") == {"k": text, "z": 0}
    assert written.startswith("|") == literal_block_holds(text)


# Parts of a Joined text: short ones, and long ones (as the stage library is); mostly of what a
# literal block holds, so most texts are written as blocks.
_part_text = st.text(st.sampled_from([*"ab #:-\n"])) | _script_text
_part = _part_text | st.builds(
    lambda text, n: text * n, _part_text.filter(bool), st.integers(1, 3000)
).filter(lambda text: len(text) >= 2048)


@given(parts=st.lists(_part, min_size=1, max_size=5), indent=st.sampled_from([2, 4]))
def test_a_joined_text_is_written_as_the_text_it_joins(parts: list[str], indent: int) -> None:
    joined = Joined(parts)
    text = "\n".join(parts)
    assert joined == text
    for _ in range(2):  # the second time from what was kept of the long parts
        assert literal_block_holds(joined) == literal_block_holds(text)
        if literal_block_holds(text):
            assert yaml_block(joined, indent) == yaml_block(text, indent)
        assert yaml_filter(joined, block=True) == yaml_filter(text, block=True)


def test_a_long_part_shared_by_many_texts_is_indented_once() -> None:
    library = "".join(f"line {i}\n\n" for i in range(500)) + "end"
    templates._indented.cache_clear()
    for stage in range(50):
        yaml_block(Joined([library, f"npa_fetch {stage}\n"]))
    made = templates._indented.cache_info()
    # Each text indented is a miss: the 50 stages' own lines, and the library once.
    assert made.misses == 51
    assert made.hits == 49


def test_a_reviewable_script_is_a_literal_block() -> None:
    script = "set -e\necho 'a: b' # done\n\nexit 0\n"
    assert yaml_filter(script, block=True) == "|2\n  set -e\n  echo 'a: b' # done\n\n  exit 0"
    assert not yaml_filter("tab\there\n", block=True).startswith("|")


def test_non_finite_floats_are_refused() -> None:
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            yaml_filter(bad)


def test_hostile_values_do_not_change_the_rendered_structure() -> None:
    env = {f"V{i}": v for i, v in enumerate(HOSTILE)}
    command = "\n".join(HOSTILE)
    hostile = render_workflow(
        workflow_with(env=env, command=command),
        "run-1",
        kube_context=None,
        digests=DIGESTS,
    )
    plain = render_workflow(
        Workflow.model_validate(base_spec()), "run-1", kube_context=None, digests=DIGESTS
    )
    got, want = parsed(hostile[0].text), parsed(plain[0].text)
    assert calls(got["run"], "npa_command") == [["/npa/home", command]]
    for key, value in env.items():
        assert got["envs"][key] == value
    # Apart from the values we injected, the document is exactly the plain one.
    for key in env:
        del got["envs"][key]
    got["run"] = want["run"]
    assert got == want
    assert list(got) == ["name", "num_nodes", "resources", "envs", "setup", "run", "config"]


def test_hostile_values_in_names_and_uris_are_refused_or_quoted() -> None:
    spec = base_spec()
    spec["storage"]["uri"] = "s3://bucket/a:#{{b}}"
    spec["stages"][0]["inputs"][0]["uri"] = "s3://raw/x#y&z*q"
    spec["infrastructure"]["context"] = "ctx:with@odd+chars"
    tasks = render_workflow(
        Workflow.model_validate(spec), "run-1", kube_context=None, digests=DIGESTS
    )
    data = parsed(tasks[0].text)
    # The URI reaches the setup's shell as one quoted word, never as shell syntax.
    assert calls(data["setup"], "npa_fetch") == [["s3://raw/x#y&z*q", "/npa/inputs/raw", "auto"]]
    assert data["envs"]["NPA_RUN_PREFIX"] == "s3://bucket/a:#{{b}}/demo/run-1"
    assert data["resources"]["infra"] == "k8s/ctx:with@odd+chars"


def test_one_file_per_stage_one_task_per_wave_with_the_stage_contract() -> None:
    tasks = render_workflow(
        Workflow.model_validate(base_spec()), "run-7", kube_context="other-ctx", digests=DIGESTS
    )
    assert [t.filename for t in tasks] == ["curate.yaml", "augment.yaml", "evaluate.yaml"]
    docs = waves(tasks[1].text)
    # 10 shards, 4 at a time: three waves of 4, 4 and 2 nodes, chained in order. Names start
    # with a letter: SkyPilot names each task's cluster after it.
    assert [d["name"] for d in docs] == [
        "npa-run-7-augment-w0",
        "npa-run-7-augment-w1",
        "npa-run-7-augment-w2",
    ]
    assert [d["num_nodes"] for d in docs] == [4, 4, 2]
    assert [d["envs"]["NPA_WAVE"] for d in docs] == ["0", "1", "2"]
    aug = docs[0]
    res = aug["resources"]
    assert res["infra"] == "k8s/other-ctx"
    assert res["image_id"] == f"docker:registry.example.com/gpu@{DIGEST_B}"
    assert res["accelerators"] == "H100:8"
    assert res["job_recovery"] == {"max_restarts_on_errors": 2}
    envs = aug["envs"]
    assert envs["NPA_RUN_ID"] == "run-7" and envs["NPA_STAGE"] == "augment"
    assert (envs["NPA_WAVES"], envs["NPA_SHARDS"], envs["NPA_SHARDS_PER_WAVE"]) == ("3", "10", "4")
    # Inputs and outputs are local paths; the store URIs are in the setup and run scripts.
    assert envs["NPA_OUTPUT_AUG"] == "/npa/outputs/augmented"
    assert envs["NPA_INPUT_CLIPS"] == "/npa/inputs/clips"
    assert envs["NPA_SOURCE_DIR"] == "/npa/source"
    assert not any(k in envs for k in ("NPA_SHARD", "NPA_ATTEMPT", "NPA_SOURCE_MANIFEST"))
    stages = "s3://bucket/workflows/demo/run-7/npa-workflow/stages"
    assert calls(aug["setup"], "npa_fetch") == [
        [f"{stages}/curate/outputs/curated/clips", "/npa/inputs/clips", "prefix"]
    ]
    assert calls(aug["setup"], "npa_restore") == [
        [
            "s3://bucket/workflows/demo/npa-source",
            "s3://bucket/workflows/demo/run-7/npa-workflow/source/manifest.json",
        ]
    ]
    assert calls(aug["run"], "npa_shard") == [
        [f"{stages}/augment/attempts", "augment", PHASES_SUFFIX]
    ]
    assert aug["run"].rstrip("\n").endswith("\nnpa_uploaded")  # after every upload
    assert calls(aug["run"], "npa_upload") == [
        ["prefix", "/npa/outputs/augmented", f"{stages}/augment/outputs/augmented"]
    ]
    assert "file_mounts" not in aug and "workdir" not in aug
    assert all(d["setup"] == aug["setup"] and d["run"] == aug["run"] for d in docs)
    ctx = aug["config"]["kubernetes"]["pod_config"]["spec"]["securityContext"]
    assert ctx == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}
    cur = parsed(tasks[0].text)
    assert cur["resources"]["image_id"] == f"docker:registry.example.com/cur@{DIGEST_A}"
    assert "accelerators" not in cur["resources"]
    report = parsed(tasks[2].text)
    assert report["envs"]["NPA_OUTPUT_REPORT"] == "/npa/outputs/report.json"
    assert calls(report["run"], "npa_upload") == [
        ["file", "/npa/outputs/report.json", f"{stages}/evaluate/outputs/report.json"]
    ]


def test_unpinned_images_are_refused_all_at_once() -> None:
    spec = base_spec()
    spec["tools"]["gpu"]["image"] = "registry.example.com/gpu:2.0"
    workflow = Workflow.model_validate(spec)
    with pytest.raises(InvalidInput) as exc:
        render_workflow(workflow, "run-1", kube_context=None, digests={})
    assert "'cur'" in exc.value.message and "'gpu'" in exc.value.message
    assert exc.value.details["unpinned"] is True


def test_render_of_a_spec_names_the_preflight_of_that_spec(tmp_path: Path) -> None:
    from npa.services.render import render_spec

    spec = base_spec()
    spec["tools"]["gpu"]["image"] = "registry.example.com/gpu:2.0"
    path = tmp_path / "my spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(InvalidInput) as exc:
        render_spec(path, "run-1", tmp_path / "out", kube_context="c")
    assert exc.value.fix is not None
    assert exc.value.fix.startswith(f"npa workbench workflow preflight-images '{path}'")


@pytest.mark.parametrize(
    ("digests", "needle"),
    [
        ({"cur": "sha256:abc"}, "not sha256:<64 hex>"),
        ({"cur": DIGEST_A, "nope": DIGEST_A}, "unknown tool 'nope'"),
        ({"cur": DIGEST_A, "gpu": DIGEST_A}, "the spec pins"),
        ({"cur": f"other.example.com/cur@{DIGEST_A}"}, "digest is for"),
    ],
)
def test_bad_digests_are_refused(digests: dict[str, str], needle: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        resolve_images(Workflow.model_validate(base_spec()), digests)
    assert needle in exc.value.message


def test_full_pinned_reference_in_digests_file(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text(f"digests:\n  cur: registry.example.com/cur:1.0@{DIGEST_A}\n")
    images = resolve_images(Workflow.model_validate(base_spec()), load_digests(f).pins)
    assert images["cur"] == f"registry.example.com/cur@{DIGEST_A}"
    f.write_text("- not a mapping\n")
    with pytest.raises(InvalidInput):
        load_digests(f)


def test_render_needs_a_context_and_a_mountable_store() -> None:
    spec = base_spec()
    del spec["infrastructure"]["context"]
    spec["storage"]["uri"] = "file:///tmp/store"
    spec["stages"][0]["inputs"][0]["uri"] = "file:///tmp/raw/"
    workflow = Workflow.model_validate(spec)
    # Without a context no backend is selected: the error says how to choose one.
    with pytest.raises(InvalidInput) as exc:
        render_workflow(workflow, "r1", kube_context=None, digests=DIGESTS)
    assert "no kube context" in exc.value.message and "--infra local" in exc.value.message
    # The backend the context selects refuses a store its pods cannot fetch from, and every
    # external input the same way, all at once.
    with pytest.raises(InvalidInput) as exc:
        render_workflow(workflow, "r1", kube_context="ctx", digests=DIGESTS)
    assert "not an object store a pod can fetch from" in exc.value.message
    problems = exc.value.details["problems"]
    assert len(problems) == 2, problems
    assert problems[0].startswith("store 'file:///tmp/store' is not an object store")
    assert problems[1].startswith("stage 'curate' input 'raw': file:///tmp/raw/ is not in an S3")


def write_spec(tmp_path: Path, spec: dict[str, Any]) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(dump(spec))
    return path


def write_digests(tmp_path: Path) -> Path:
    path = tmp_path / "digests.yaml"
    path.write_text(f"cur: {DIGEST_A}\n")
    return path


def test_render_writes_owner_only_files_and_an_index(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = render_spec(
        write_spec(tmp_path, base_spec()), "run-1", out, digests_file=write_digests(tmp_path)
    )
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["curate.yaml", "augment.yaml", "evaluate.yaml", INDEX]
    )
    assert os.stat(out).st_mode & 0o777 == 0o700
    assert all(os.stat(p).st_mode & 0o777 == 0o600 for p in out.iterdir())
    assert [f.stage for f in result.files] == ["curate", "augment", "evaluate"]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")]
    assert leftovers == []


def test_failed_render_leaves_the_previous_render_untouched(tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec_path = write_spec(tmp_path, base_spec())
    render_spec(spec_path, "run-1", out, digests_file=write_digests(tmp_path))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(InvalidInput):
        render_spec(spec_path, "run-2", out, digests_file=None)  # 'cur' is not pinned
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def _logged(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A log of each task file made (``make``) and each file written (its name), in order."""
    from npa.backends.local import tasks as local_tasks
    from npa.backends.skypilot.tasks import Shapes
    from npa.services import render as render_service

    log: list[str] = []
    shaped, dumped, write = (
        Shapes.render,
        local_tasks.LocalTask.model_dump,
        render_service._write_new_file,
    )

    def made(original: Any) -> Any:
        return lambda *args, **kwargs: log.append("make") or original(*args, **kwargs)

    monkeypatch.setattr(Shapes, "render", made(shaped))
    monkeypatch.setattr(local_tasks.LocalTask, "model_dump", made(dumped))
    monkeypatch.setattr(
        render_service,
        "_write_new_file",
        lambda directory, name, text: log.append(name) or write(directory, name, text),
    )
    return log


@pytest.mark.parametrize("infra", [None, "local"])
def test_render_writes_each_file_as_it_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, infra: str | None
) -> None:
    """Task files are written a batch at a time as they are made, so a render holds one batch
    of texts however many stages (a 20,000-stage render held 240 MB of them); the index last."""
    from npa.services import render as render_service

    monkeypatch.setattr(render_service, "_BATCH", 2)
    log = _logged(monkeypatch)
    spec = base_spec()
    spec["stages"] = [
        {
            "name": f"s{i}",
            "tool": "cur",
            "command": f"run {i}",
            "outputs": [{"name": "o", "path": "o/"}],
        }
        for i in range(6)
    ]
    options: dict[str, Any] = {"infra": "local", "runtime": "process"} if infra else {}
    suffix = ".json" if infra else ".yaml"
    render_spec(
        write_spec(tmp_path, spec),
        "run-1",
        tmp_path / "out",
        digests_file=write_digests(tmp_path),
        **options,
    )
    pairs = [("make", "make", f"s{i}{suffix}", f"s{i + 1}{suffix}") for i in range(0, 6, 2)]
    assert log == [x for pair in pairs for x in pair] + [INDEX]


@pytest.mark.parametrize("fails", ["make", "write"])
def test_a_render_failing_midway_leaves_the_previous_render_and_no_staging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """A file that cannot be made (a template bug) or written (the disk is full) after others
    were written: the earlier render is as it was, nothing is left beside it, and a template
    bug's error says how to render again."""
    from npa.backends.skypilot.tasks import Shapes
    from npa.services import render as render_service

    out = tmp_path / "out"
    spec_path = write_spec(tmp_path, base_spec())
    render_spec(spec_path, "run-1", out, digests_file=write_digests(tmp_path))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    count: list[int] = []
    shaped, write = Shapes.render, render_service._write_new_file

    def make(self: Shapes, values: dict[str, Any]) -> str:
        count.append(1)
        if fails == "make" and len(count) == 3:
            raise InvalidInput("template bug: a test's")
        return shaped(self, values)

    def written(directory: Path, name: str, text: str) -> None:
        if fails == "write" and name.startswith("evaluate"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(directory, name, text)

    monkeypatch.setattr(Shapes, "render", make)
    monkeypatch.setattr(render_service, "_write_new_file", written)
    raised = InvalidInput if fails == "make" else LocalStateUnavailable
    with pytest.raises(raised) as exc:
        render_spec(spec_path, "run-2", out, digests_file=write_digests(tmp_path))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
    if fails == "make":
        assert exc.value.fix is not None and "render" in exc.value.fix
    else:
        assert "No space left" in exc.value.message and str(out) in exc.value.message


def test_render_refuses_to_replace_a_directory_it_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(InvalidInput) as exc:
        render_spec(
            write_spec(tmp_path, base_spec()), "run-1", out, digests_file=write_digests(tmp_path)
        )
    assert "refusing" in exc.value.message
    assert (out / "notes.txt").read_text() == "keep me"


def test_diff_against_a_previous_render(tmp_path: Path) -> None:
    spec = base_spec()
    spec_path = write_spec(tmp_path, spec)
    digests = write_digests(tmp_path)
    first = tmp_path / "r1"
    render_spec(spec_path, "run-1", first, digests_file=digests)
    same = render_spec(
        spec_path, "run-1", tmp_path / "r2", digests_file=digests, diff_against=first
    )
    assert same.changed == [] and same.diff == ""
    spec["stages"][1]["retries"] = 5
    del spec["stages"][2]
    spec_path = write_spec(tmp_path, spec)
    changed = render_spec(spec_path, "run-1", first, digests_file=digests, diff_against=first)
    assert changed.changed == ["augment.yaml", "evaluate.yaml"]
    assert "-    max_restarts_on_errors: 2\n+    max_restarts_on_errors: 5\n" in (
        changed.diff or ""
    )
    assert "+++ /dev/null" in (changed.diff or "")
    assert not (first / "evaluate.yaml").exists()
    assert "changed against" in "\n".join(changed.text_lines())


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--context", "ctx\nother", "holds control characters"),
        ("--context", "clusters//x", "has '//'"),
        ("--context", " padded", "starts or ends with a space"),
        ("--store-uri", "s3://bucket/run\ns3://other", "printable ASCII"),
        ("--store-uri", "s3://bucket/../other", "'..' segment"),
        ("--store-uri", "s3://bucket/./x", "'..' segment"),
        ("--store-uri", "s3:///no-bucket", "names no bucket"),
        ("--store-uri", "file:///tmp/store", "a pod can fetch from"),
        ("--image-override", "ghost=registry.example.com/x:1", "unknown tool 'ghost'"),
        ("--image-override", "cur=Not A Ref", "malformed"),
        ("--image", "UPPER/Case:1", "malformed"),
    ],
)
def test_render_flags_are_checked_like_the_spec_fields_they_replace(
    tmp_path: Path, flag: str, value: str, needle: str
) -> None:
    from tests.harness.cli import invoke_npa

    spec = tmp_path / "spec.yaml"
    spec.write_text(dump(base_spec()))
    digests = tmp_path / "d.yaml"
    digests.write_text(f"cur: {DIGEST_A}\n")
    out = tmp_path / "out"
    res = invoke_npa("workbench", "workflow", "render", str(spec), "--run-id", "r1", "--out",
                  str(out), "--digests", str(digests), flag, value)  # fmt: skip
    assert res.code == 2, res.stdout + res.stderr
    assert needle in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()


def test_render_pins_the_image_an_override_chose(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(dump(base_spec()))
    digests = tmp_path / "d.yaml"
    digests.write_text(f"cur: mirror.example.com/team/cur2@{DIGEST_A}\n")
    with pytest.raises(
        InvalidInput, match=re.escape("digest is for 'mirror.example.com/team/cur2'")
    ):
        render_spec(spec, "r1", tmp_path / "no", digests_file=digests)
    result = render_spec(
        spec,
        "r1",
        tmp_path / "out",
        digests_file=digests,
        image_overrides=["cur=mirror.example.com/team/cur2:2.0"],
    )
    task = parsed((tmp_path / "out" / result.files[0].file).read_text())
    assert task["resources"]["image_id"] == f"docker:mirror.example.com/team/cur2@{DIGEST_A}"
    # A short name the registry resolved (preflight-images --registry) is the same image.
    render_spec(
        spec, "r1", tmp_path / "out", digests_file=digests, image_overrides=["cur=cur2:2.0"]
    )
    task = parsed((tmp_path / "out" / result.files[0].file).read_text())
    assert task["resources"]["image_id"] == f"docker:mirror.example.com/team/cur2@{DIGEST_A}"


def test_render_pins_preflight_output_exactly_as_verified(tmp_path: Path) -> None:
    import json

    spec = tmp_path / "spec.yaml"
    spec.write_text(dump(base_spec()))
    pinned = f"mirror.example.com/other/curator@{DIGEST_A}"
    preflight = {
        "spec": str(spec),
        "registry": None,
        "context": None,
        "contract_version": 1,
        "images": [
            {
                "tool": "cur",
                "reference": "mirror.example.com/other/curator:3",
                "source": "override",
            },
            {"tool": "gpu", "reference": f"registry.example.com/gpu@{DIGEST_B}", "source": "spec"},
        ],
        "digests": {"cur": pinned, "gpu": f"registry.example.com/gpu@{DIGEST_B}"},
    }
    digests = tmp_path / "preflight.json"
    digests.write_text(json.dumps(preflight))
    result = render_spec(spec, "r1", tmp_path / "out", digests_file=digests)
    curate = parsed((tmp_path / "out" / result.files[0].file).read_text())
    assert curate["resources"]["image_id"] == f"docker:{pinned}"
    # The same overrides again are fine; different ones contradict what was verified.
    render_spec(
        spec,
        "r1",
        tmp_path / "out",
        digests_file=digests,
        image_overrides=["cur=mirror.example.com/other/curator:3"],
    )
    with pytest.raises(
        InvalidInput, match=re.escape("preflight verified mirror.example.com/other")
    ):
        render_spec(
            spec,
            "r1",
            tmp_path / "out",
            digests_file=digests,
            image_overrides=["cur=registry.example.com/cur:9"],
        )


def test_one_rule_pins_each_task_for_render_and_submit() -> None:
    """pinned_images, which render and submit both call: a --digests file wins over what
    submit's preflight resolved, preflight's own output is pinned as verified, and without
    either the chosen image must carry its digest."""
    from npa.render.tasks import DigestFile, chosen_workflow, pinned_images

    workflow = chosen_workflow(
        Workflow.model_validate(base_spec()), ["cur=registry.example.com/other:2"], None, None
    )
    resolved = {"cur": f"registry.example.com/other@{DIGEST_B}"}
    plain = DigestFile({"cur": DIGEST_A})
    assert (
        pinned_images(workflow, plain, resolved)["cur"] == f"registry.example.com/other@{DIGEST_A}"
    )
    verified = DigestFile({"cur": f"mirror.example.com/x@{DIGEST_A}"}, {"cur": "mirror:1"})
    assert pinned_images(workflow, verified, resolved)["cur"] == f"mirror.example.com/x@{DIGEST_A}"
    assert pinned_images(workflow, None, resolved)["cur"] == resolved["cur"]
    with pytest.raises(InvalidInput, match=re.escape("registry.example.com/other:2 is not pinned")):
        pinned_images(workflow, None)
    # preflight output for other images than the flags choose is refused by the same rule.
    with pytest.raises(InvalidInput, match="preflight verified mirror:1"):
        chosen_workflow(
            Workflow.model_validate(base_spec()), [], "registry.example.com/y:1", verified
        )
