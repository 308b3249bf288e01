"""The spec commands end to end through the CLI (in process: the same parsing, services and exit
codes as the console script, which tests/integration/test_cli_process.py runs), text and --json."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.cli import invoke_npa
from tests.unit.specdata import base_spec, dump

pytestmark = pytest.mark.unit

PHYSAI = "examples/physical-ai.yaml"
WF = ("workbench", "workflow")


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_mode, p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def readonly_home(npa_home: Path) -> Iterator[Path]:
    """An NPA_HOME that exists with some state in it, and cannot be written."""
    npa_home.mkdir(mode=0o700)
    # A valid, empty configuration: plan-spec reads it for the run's reservation.
    (npa_home / "config.json").write_text('{"version": 1, "projects": {}}\n')
    npa_home.chmod(0o500)
    try:
        yield npa_home
    finally:
        npa_home.chmod(0o700)


def test_validate_spec_text_and_json() -> None:
    res = invoke_npa(*WF, "validate-spec", PHYSAI)
    assert res.code == 0, res.stderr
    assert res.stdout.startswith("ok: examples/physical-ai.yaml is a valid workflow")
    js = invoke_npa(*WF, "validate-spec", PHYSAI, "--json").json()
    assert js["valid"] is True and js["issues"] == [] and js["stages"] == 3


def test_validate_spec_reports_every_error_with_exit_2(tmp_path: Path) -> None:
    spec = base_spec()
    spec["stages"][0]["tool"] = "nope"
    spec["stages"][1]["resources"]["accelerators"] = "H100"
    spec["stages"][2]["depends_on"] = ["ghost"]
    path = tmp_path / "bad.yaml"
    path.write_text(dump(spec))
    res = invoke_npa(*WF, "validate-spec", str(path))
    assert res.code == 2
    assert "has 3 issues" in res.stdout
    assert f"{path}:" in res.stdout and "hint:" in res.stdout
    js = invoke_npa(*WF, "validate-spec", str(path), "--json")
    assert js.code == 2
    assert sorted(i["path"] for i in js.json()["issues"]) == [
        "stages[0].tool",
        "stages[1].resources.accelerators",
        "stages[2].depends_on[0]",
    ]
    assert all(i["line"] and i["column"] and i["hint"] for i in js.json()["issues"])


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("apiVersion: npa/v1\nkind: [Workflow\nmetadata: {}\n")
    js = invoke_npa(*WF, "validate-spec", str(path), "--json")
    assert js.code == 2
    (issue,) = js.json()["issues"]
    assert issue["message"].startswith("YAML syntax error")
    assert (issue["line"], issue["column"]) == (3, 9)


def test_missing_spec_is_a_clean_error() -> None:
    res = invoke_npa(*WF, "validate-spec", "no/such/spec.yaml")
    assert res.code == 3
    assert res.stderr.startswith("error: spec file no/such/spec.yaml does not exist")
    assert "Traceback" not in res.stderr
    js = invoke_npa(*WF, "validate-spec", "no/such/spec.yaml", "--json")
    assert js.json()["error"]["kind"] == "not_found"


def test_plan_spec_blocked_at_21_gib_exact_figures() -> None:
    args = (*WF, "plan-spec", PHYSAI, "--run-id", "demo-1", "--quota-file")
    res = invoke_npa(*args, "examples/quota-21gib.yaml")
    assert res.code == 1, res.stderr
    assert "quota: BLOCKED" in res.stdout
    assert "required 1,251 GiB (1,343,251,021,824 bytes)" in res.stdout
    assert "available 21 GiB (22,548,578,304 bytes)" in res.stdout
    assert "shortfall 1,230 GiB (1,320,702,443,520 bytes)" in res.stdout
    js = invoke_npa(*args, "examples/quota-21gib.yaml", "--json")
    assert js.code == 1
    q = js.json()["quota"]
    ssd = next(x for x in q["lines"] if x["name"] == "compute.disk.size.network-ssd")
    assert (ssd["required"], ssd["required_gib"]) == (1343251021824, 1251)
    assert (ssd["shortfall"], ssd["shortfall_gib"]) == (1320702443520, 1230)
    count = next(x for x in q["lines"] if x["name"] == "compute.disk.count")
    assert (count["required"], count["available"], count["verdict"]) == (3, 27, "ok")
    plan = js.json()["plan"]
    assert plan["order"] == ["curate", "augment", "evaluate"]
    assert plan["stages"][1]["waves"] == {"shards": 16, "parallel": 4, "waves": 4}


def test_plan_spec_without_evidence_is_blocked_unknown(tmp_path: Path) -> None:
    res = invoke_npa(*WF, "plan-spec", PHYSAI, "--run-id", "demo-1")
    assert res.code == 4
    assert "BLOCKED-UNKNOWN" in res.stdout and "--quota-file" in res.stdout
    disagree = tmp_path / "other.yaml"
    disagree.write_text(
        "region: eu-north1\n"
        "quotas:\n  compute.disk.size.network-ssd: {limit: 2199023255552, usage: 0}\n"
        "  compute.disk.count: {limit: 32, usage: 5}\n"
    )
    js = invoke_npa(
        *WF,
        "plan-spec",
        PHYSAI,
        "--run-id",
        "demo-1",
        "--quota-file",
        "examples/quota-ample.yaml",
        "--quota-file",
        str(disagree),
        "--json",
    )
    assert js.code == 4
    assert js.json()["quota"]["verdict"] == "blocked-unknown"
    assert "disagree" in js.json()["quota"]["lines"][0]["reason"]
    skipped = invoke_npa(*WF, "plan-spec", PHYSAI, "--run-id", "demo-1", "--skip-quota")
    assert skipped.code == 0 and "quota: NOT-CHECKED" in skipped.stdout


def test_read_only_commands_write_nothing(readonly_home: Path, tmp_path: Path) -> None:
    before = snapshot(readonly_home.parent)
    assert not os.access(readonly_home, os.W_OK) or os.geteuid() == 0
    for args in (
        (*WF, "validate-spec", PHYSAI),
        (*WF, "validate-spec", "examples/tiny-local.yaml", "--json"),
        (
            *WF,
            "plan-spec",
            PHYSAI,
            "--run-id",
            "demo-1",
            "--quota-file",
            "examples/quota-21gib.yaml",
        ),
        (*WF, "plan-spec", "examples/tiny-local.yaml", "--run-id", "tiny-1", "--target", "local"),
        (*WF, "schema"),
    ):
        res = invoke_npa(*args)
        assert res.code in (0, 1), (args, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr
    assert snapshot(readonly_home.parent) == before
    assert stat.S_IMODE(readonly_home.stat().st_mode) == 0o500


def test_local_target_uses_the_store_filesystem(readonly_home: Path) -> None:
    js = invoke_npa(
        *WF,
        "plan-spec",
        "examples/tiny-local.yaml",
        "--run-id",
        "t1",
        "--target",
        "local",
        "--json",
    )
    q = js.json()["quota"]
    assert q["sources"] == ["local"]
    (line,) = q["lines"]
    assert line["name"] == "local.store.size"
    assert line["required"] == 4 * 2**30  # 1 + 2x1 (two shards at once) + 1 GiB
    assert line["verdict"] in ("ok", "blocked") and line["available"] > 0


def test_render_and_diff_from_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "r"
    base = (*WF, "render", PHYSAI, "--run-id", "demo-1", "--out", str(out))
    refused = invoke_npa(*base)
    assert refused.code == 2 and "pinned by digest" in refused.stderr
    assert not out.exists()
    ok = invoke_npa(*base, "--digests", "examples/physical-ai.digests.yaml", "--json")
    assert ok.code == 0, ok.stdout
    assert [f["file"] for f in ok.json()["files"]] == [
        "curate.yaml",
        "augment.yaml",
        "evaluate.yaml",
    ]
    other = ("--digests", "examples/physical-ai.digests.yaml", "--context", "other")
    again = invoke_npa(*base, *other, "--diff", str(out))
    assert again.code == 1  # like diff: something differs
    assert '-  infra: "k8s/nebius-physai"' in again.stdout
    assert '+  infra: "k8s/other"' in again.stdout
    # Another run of the same spec differs only by its run id, which the diff sets aside.
    run_2 = (*WF, "render", PHYSAI, "--run-id", "demo-2", "--out", str(tmp_path / "r2"))
    other_run = invoke_npa(*run_2, *other, "--diff", str(out), "--json")
    assert other_run.code == 0, other_run.stdout
    assert other_run.json()["changed"] == []


def test_schema_command() -> None:
    res = invoke_npa(*WF, "schema")
    assert res.code == 0
    schema = json.loads(res.stdout)
    assert schema["$schema"].endswith("2020-12/schema")
    assert set(schema["required"]) >= {"apiVersion", "kind", "metadata", "tools", "stages"}
    assert schema["additionalProperties"] is False
    wrapped = invoke_npa(*WF, "schema", "--json").json()
    assert wrapped["api_version"] == "npa/v1" and wrapped["json_schema"] == schema


def test_schema_accepts_the_examples_and_rejects_unknown_keys() -> None:
    import jsonschema
    import yaml

    schema = json.loads(invoke_npa(*WF, "schema").stdout)
    for name in ("physical-ai", "tiny-local"):
        with open(f"examples/{name}.yaml", encoding="utf-8") as fh:
            jsonschema.validate(yaml.safe_load(fh), schema)
    bad = base_spec()
    bad["stages"][0]["bogus"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32"])
def test_a_spec_saved_as_utf16_or_utf32_reads_as_its_utf8_copy(tmp_path: Path, codec: str) -> None:
    """As Windows PowerShell 5 saves a file (UTF-16 with a byte-order mark, CRLF): the same
    answers as the UTF-8 original, from validate-spec and from plan-spec."""
    text = Path("examples/tiny-local.yaml").read_text("utf-8")
    utf8, other = tmp_path / "utf8.yaml", tmp_path / "other.yaml"
    utf8.write_bytes(text.replace("\n", "\r\n").encode("utf-8"))
    other.write_bytes(text.replace("\n", "\r\n").encode(codec))  # utf-16/utf-32 write a mark
    for command in (
        ("validate-spec", "--json"),
        ("plan-spec", "--run-id", "enc-1", "--target", "local", "--json"),
    ):
        answers = [invoke_npa(*WF, command[0], str(p), *command[1:]) for p in (utf8, other)]
        assert [a.code for a in answers] == [0, 0], answers[1].stderr
        # (the same reading, not the disk's free bytes, which move between the two commands)
        readings = [
            re.sub(r'"available(_gib)?": \d+', "", a.stdout.replace(str(p), "SPEC"))
            for a, p in zip(answers, (utf8, other), strict=True)
        ]
        assert readings[1] == readings[0]


def test_a_quota_file_and_a_digests_file_in_utf16_read_as_their_utf8_copies(
    tmp_path: Path,
) -> None:
    """The other files only npa reads take UTF-16 too (`preflight-images --json > d.json` in
    Windows PowerShell 5 writes it): the same plan and the same task files as from UTF-8."""
    copies = {}
    for name in ("quota-21gib.yaml", "physical-ai.digests.yaml"):
        copies[name] = tmp_path / f"16-{name}"
        copies[name].write_bytes(Path("examples", name).read_text("utf-8").encode("utf-16"))
    plan = (*WF, "plan-spec", PHYSAI, "--run-id", "demo-1", "--json", "--quota-file")
    answers = [
        invoke_npa(*plan, q) for q in ("examples/quota-21gib.yaml", str(copies["quota-21gib.yaml"]))
    ]
    assert [a.code for a in answers] == [1, 1], answers[1].stderr
    # (each line names its source file, which differs)
    lines = [[{**x, "sources": []} for x in a.json()["quota"]["lines"]] for a in answers]
    assert lines[0] == lines[1] and lines[0][0]["verdict"] == "blocked"
    rendered = []
    for digests in ("examples/physical-ai.digests.yaml", str(copies["physical-ai.digests.yaml"])):
        out = tmp_path / f"r{len(rendered)}"
        render = invoke_npa(*WF, "render", PHYSAI, "--run-id", "demo-1", "--out", str(out),
                            "--digests", digests)  # fmt: skip
        assert render.code == 0, render.stderr
        rendered.append({p.name: p.read_bytes() for p in sorted(out.glob("*.yaml"))})
    assert rendered[0] == rendered[1] and len(rendered[0]) == 3
