"""A SkyPilot task file rendered and read back with stand-ins (for the stage library and the
pod's variables), then given the real text, is byte for byte the file rendered without them; a
text the stand-ins cannot be proven in is rendered the old way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npa.backends.skypilot.tasks import STAND_IN, VARIABLES_STAND_IN, StandIns
from npa.services.render import render_workflow
from npa.spec.model import Workflow
from tests.unit.specdata import DIGEST_A, base_spec

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPA_HOME", str(tmp_path / "npa-home"))


def rendered(workflow: Workflow) -> dict[str, str]:
    made = render_workflow(workflow, "run-1", kube_context="ctx", digests={"cur": DIGEST_A})
    return {t.stage: t.text for t in made}


def unspliced(workflow: Workflow, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The files rendered without stand-ins, as before them."""
    with monkeypatch.context() as patch:
        patch.setattr(StandIns, "of", classmethod(lambda cls, library: None))
        return rendered(workflow)


# Text for commands, env values and URIs: the stand-in itself, YAML's structure characters,
# what a literal block cannot hold (a tab, a trailing space, a non-ASCII character).
_text = st.lists(
    st.sampled_from(
        [
            STAND_IN,
            f"\n  {STAND_IN}\n",
            VARIABLES_STAND_IN,
            f'"{VARIABLES_STAND_IN}"',
            "\n",
            "  ",
            "a: b",
            "# c",
            "|",
            "---",
            "\t",
            " \n",
            "é",
        ]
    )
    | st.text(max_size=6),
    max_size=5,
).map("".join)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=_text, value=_text, key=_text, shards=st.integers(1, 4), secrets=st.booleans())
def test_the_files_are_the_files_rendered_without_stand_ins(
    monkeypatch: pytest.MonkeyPatch, command: str, value: str, key: str, shards: int, secrets: bool
) -> None:
    spec: dict[str, Any] = base_spec()
    first = spec["stages"][0]
    first["command"] = command or "true"
    first["env"] = {"HOSTILE": value}
    first["inputs"][0]["uri"] = f"s3://raw/{key.replace(chr(0), '')}"
    first["waves"] = {"shards": shards, "parallel": 1}
    if secrets:  # the pod's variables differ from the other stages'
        first["secrets"] = {"TOKEN": "env:NPA_TOKEN"}
    try:
        workflow = Workflow.model_validate(spec)
    except ValueError:  # a value the spec refuses reaches no renderer
        return
    assert rendered(workflow) == unspliced(workflow, monkeypatch)


@pytest.mark.parametrize("stand_in", [STAND_IN, VARIABLES_STAND_IN])
def test_a_spec_value_holding_a_stand_in_is_rendered_without_stand_ins(
    monkeypatch: pytest.MonkeyPatch, stand_in: str
) -> None:
    spec = base_spec()
    spec["stages"][0]["command"] = f"echo {stand_in}\n{stand_in}\n"
    workflow = Workflow.model_validate(spec)
    made: list[str | None] = []
    render = StandIns.render
    monkeypatch.setattr(
        StandIns, "render", lambda self, *a: made.append(render(self, *a)) or made[-1]
    )
    files = rendered(workflow)
    assert [text is None for text in made] == [True, False, False]  # curate went the old way
    assert files["curate"].count(stand_in) == 2
    assert files == unspliced(workflow, monkeypatch)


def texts(waves: int) -> tuple[str, dict[str, Any], str]:
    """A library, the values and a text shaped as the template writes them."""
    library = "lib() {\n  echo one\n\n  echo two\n}\n"
    setup = f"mkdir -p /tmp/npa\ncat <<'END'\n{STAND_IN}\nEND\nnpa_begin\n"
    text = "".join(
        f"name: w{i}\nsetup: |2\n  mkdir -p /tmp/npa\n  cat <<'END'\n  {STAND_IN}\n  END\n"
        f'  npa_begin\nrun: x\nenv: "{VARIABLES_STAND_IN}"\n' + ("---\n" if i < waves - 1 else "")
        for i in range(waves)
    )
    return library, {"setup": setup, "waves": [{}] * waves}, text


def test_the_library_goes_in_as_lines_of_the_block_indented_by_two() -> None:
    library, values, text = texts(2)
    stand_ins = StandIns.of(library)
    assert stand_ins is not None and stand_ins.fits(text, values)
    out = text.replace(stand_ins.line, stand_ins.lines)
    block = "  lib() {\n    echo one\n\n    echo two\n  }\n"
    assert out.count(block) == 2 and STAND_IN not in out


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace(f"  {STAND_IN}", f"    {STAND_IN}", 1),  # not the setup's indent
        lambda t: t + f"extra: {STAND_IN}\n",  # one more than a wave each
        lambda t: t.replace(f"  {STAND_IN}\n", "  nothing\n", 1),  # a wave without it
        lambda t: t + f"extra: {VARIABLES_STAND_IN}\n",  # the variables' once more
        lambda t: t.replace(f'"{VARIABLES_STAND_IN}"', f"'{VARIABLES_STAND_IN}'", 1),  # not JSON
    ],
)
def test_a_text_the_stand_ins_cannot_be_proven_in_does_not_fit(change: Any) -> None:
    library, values, text = texts(2)
    stand_ins = StandIns.of(library)
    assert stand_ins is not None
    assert stand_ins.fits(text, values)
    assert not stand_ins.fits(change(text), values)


@pytest.mark.parametrize(
    "library",
    ["tab\there\n", "trailing space \n", "é\n", f"holds {STAND_IN}\n", f"{VARIABLES_STAND_IN}\n"],
)
def test_a_library_a_literal_block_cannot_hold_gets_no_stand_in(library: str) -> None:
    assert StandIns.of(library) is None


def test_a_setup_written_as_a_quoted_string_does_not_fit() -> None:
    library, values, text = texts(1)
    stand_ins = StandIns.of(library)
    assert stand_ins is not None
    values["setup"] = values["setup"] + "caf\u00e9\n"  # a literal block cannot hold it
    assert not stand_ins.fits(text, values)


@pytest.mark.parametrize(
    ("written", "value", "proven"),
    [
        ('[{"name": "A"}]', [{"name": "A"}], True),
        ('[{"name": "A"}]', [{"name": "B"}], False),  # reads back as something else
        ('[{"name":\n "A"}]', [{"name": "A"}], False),  # more than one line
        ("- a", ["a"], False),  # not a node that fits a value's place on its line
    ],
)
def test_the_variables_text_is_proven_once_on_its_own(
    written: str, value: Any, proven: bool
) -> None:
    stand_ins = StandIns.of("lib\n")
    assert stand_ins is not None
    assert stand_ins.proves(written, value) is proven
    assert (written in stand_ins.proven) is proven
