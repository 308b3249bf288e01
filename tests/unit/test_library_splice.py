"""A SkyPilot task file rendered and read back with a stand-in for the stage library, then
spliced, is byte for byte the file rendered with the library in it; a text the splice cannot
prove is rendered the old way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npa.backends.skypilot import tasks
from npa.backends.skypilot.tasks import STAND_IN, LibrarySplice
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
    """The files rendered with the library in every one, as before the splice."""
    with monkeypatch.context() as patch:
        patch.setattr(LibrarySplice, "of", classmethod(lambda cls, library: None))
        return rendered(workflow)


# Text for commands, env values and URIs: the stand-in itself, YAML's structure characters,
# what a literal block cannot hold (a tab, a trailing space, a non-ASCII character).
_text = st.lists(
    st.sampled_from(
        [STAND_IN, f"\n  {STAND_IN}\n", "\n", "  ", "a: b", "# c", "|", "---", "\t", " \n", "é"]
    )
    | st.text(max_size=6),
    max_size=5,
).map("".join)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=_text, value=_text, key=_text, shards=st.integers(1, 4))
def test_the_spliced_files_are_the_files_rendered_with_the_library(
    monkeypatch: pytest.MonkeyPatch, command: str, value: str, key: str, shards: int
) -> None:
    spec: dict[str, Any] = base_spec()
    first = spec["stages"][0]
    first["command"] = command or "true"
    first["env"] = {"HOSTILE": value}
    first["inputs"][0]["uri"] = f"s3://raw/{key.replace(chr(0), '')}"
    first["waves"] = {"shards": shards, "parallel": 1}
    try:
        workflow = Workflow.model_validate(spec)
    except ValueError:  # a value the spec refuses reaches no renderer
        return
    assert rendered(workflow) == unspliced(workflow, monkeypatch)


def test_a_spec_value_holding_the_stand_in_is_rendered_with_the_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = base_spec()
    spec["stages"][0]["command"] = f"echo {STAND_IN}\n{STAND_IN}\n"
    workflow = Workflow.model_validate(spec)
    spliced: list[str] = []
    into = LibrarySplice.into
    monkeypatch.setattr(
        LibrarySplice, "into", lambda self, text: spliced.append(text) or into(self, text)
    )
    files = rendered(workflow)
    assert len(spliced) == 2  # the other two stages; curate went the old way
    assert files["curate"].count(STAND_IN) == 2
    assert files == unspliced(workflow, monkeypatch)


def library_and_values(waves: int) -> tuple[str, dict[str, Any], str]:
    library = "lib() {\n  echo one\n\n  echo two\n}\n"
    setup = f"mkdir -p /tmp/npa\ncat <<'END'\n{STAND_IN}\nEND\nnpa_begin\n"
    text = "".join(
        f"name: w{i}\nsetup: |2\n  mkdir -p /tmp/npa\n  cat <<'END'\n  {STAND_IN}\n  END\n"
        "  npa_begin\nrun: x\n" + ("---\n" if i < waves - 1 else "")
        for i in range(waves)
    )
    return library, {"setup": setup, "waves": [{}] * waves}, text


def test_the_splice_puts_each_library_line_in_the_block_indented_by_two() -> None:
    library, values, text = library_and_values(2)
    splice = LibrarySplice.of(library)
    assert splice is not None and splice.fits(text, values)
    out = splice.into(text)
    block = "  lib() {\n    echo one\n\n    echo two\n  }\n"
    assert out.count(block) == 2 and STAND_IN not in out


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace(f"  {STAND_IN}", f"    {STAND_IN}", 1),  # not the setup's indent
        lambda t: t + f"extra: {STAND_IN}\n",  # one more than a wave each
        lambda t: t.replace(f"  {STAND_IN}\n", "  nothing\n", 1),  # a wave without it
    ],
)
def test_a_text_the_splice_cannot_prove_does_not_fit(change: Any) -> None:
    library, values, text = library_and_values(2)
    splice = LibrarySplice.of(library)
    assert splice is not None
    assert not splice.fits(change(text), values)


@pytest.mark.parametrize(
    "library", ["tab\there\n", "trailing space \n", "é\n", f"holds {STAND_IN}\n"]
)
def test_a_library_a_literal_block_cannot_hold_is_never_spliced(library: str) -> None:
    assert LibrarySplice.of(library) is None


def test_a_setup_written_as_a_quoted_string_does_not_fit() -> None:
    library, values, text = library_and_values(1)
    splice = LibrarySplice.of(library)
    assert splice is not None
    values["setup"] = values["setup"] + "caf\u00e9\n"  # a literal block cannot hold it
    assert not splice.fits(text, values)
    assert tasks.STAND_IN in text
