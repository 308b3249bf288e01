"""``--json`` means JSON for every outcome: a usage error (an unknown flag, a missing argument, a
value of the wrong type or outside its choices) prints the same error object every other error
prints, on stdout, with exit code 2; without ``--json`` the usage text is unchanged.

The cases are drawn from the real command tree, so a command added later is covered too."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness.cli import invoke_npa
from tests.tiers import examples


@dataclass(frozen=True)
class Leaf:
    path: tuple[str, ...]
    arguments: tuple[str, ...]  # required positional arguments, by name
    typed: tuple[tuple[str, str], ...]  # (flag, a value its type refuses)
    has_json: bool


def _refused_value(param: object) -> str | None:
    """A value the option's type refuses, by the parser's own type names."""
    name = getattr(getattr(param, "type", None), "name", "")
    if name == "choice":
        return "no-such-choice-x"
    if name in ("integer", "float", "integer range", "float range"):
        return "not-a-number"
    return None


def _leaves() -> list[Leaf]:
    import typer.main

    from npa.cli.main import app

    found: list[Leaf] = []

    def walk(command: object, path: tuple[str, ...]) -> None:
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                walk(sub, (*path, name))
            return
        params = list(getattr(command, "params", []))
        arguments = tuple(
            p.name for p in params if p.param_type_name == "argument" and p.required and p.name
        )
        typed = []
        for p in params:
            if p.param_type_name != "option" or getattr(p, "is_flag", False):
                continue
            value = _refused_value(p)
            if value is not None and p.opts:
                typed.append((p.opts[0], value))
        has_json = any(p.param_type_name == "option" and "--json" in p.opts for p in params)
        found.append(Leaf(path, arguments, tuple(typed), has_json))

    walk(typer.main.get_command(app), ())
    return found


LEAVES = _leaves()
JSON_LEAVES = [leaf for leaf in LEAVES if leaf.has_json]


def _filler(leaf: Leaf) -> list[str]:
    return [f"{name}-value" for name in leaf.arguments]


def _assert_json_usage_error(args: list[str], mentions: str) -> None:
    result = invoke_npa(*args)
    assert result.code == 2, (args, result.stdout, result.stderr)
    body = json.loads(result.stdout)["error"]  # stdout is one JSON document, nothing else
    assert body["kind"] == "invalid_input"
    assert body["exit_code"] == 2
    assert mentions in body["message"], body
    assert body["fix"] == "npa " + " ".join(args_path(args)) + " --help"


def args_path(args: list[str]) -> list[str]:
    """The command words at the front of ``args``."""
    words = []
    for leaf in LEAVES:
        if tuple(args[: len(leaf.path)]) == leaf.path:
            words = list(leaf.path)
    return words


def test_the_tree_has_commands_of_every_kind() -> None:
    # The properties below only mean something if the walk found what they draw from.
    assert len(JSON_LEAVES) >= 20
    assert any(leaf.arguments for leaf in JSON_LEAVES)
    assert any(leaf.typed for leaf in JSON_LEAVES)


@settings(max_examples=examples(40))
@given(leaf=st.sampled_from(JSON_LEAVES), where=st.integers(min_value=0, max_value=8))
def test_an_unknown_flag_under_json_is_a_json_error(leaf: Leaf, where: int) -> None:
    rest = [*_filler(leaf), "--json"]
    rest.insert(min(where, len(rest)), "--no-such-flag-x")
    _assert_json_usage_error([*leaf.path, *rest], "--no-such-flag-x")


@settings(max_examples=examples(40))
@given(leaf=st.sampled_from([leaf for leaf in JSON_LEAVES if leaf.arguments]))
def test_a_missing_argument_under_json_is_a_json_error(leaf: Leaf) -> None:
    _assert_json_usage_error([*leaf.path, "--json"], "Missing argument")


@settings(max_examples=examples(40))
@given(data=st.data())
def test_a_refused_value_under_json_is_a_json_error(data: st.DataObject) -> None:
    leaf = data.draw(st.sampled_from([leaf for leaf in JSON_LEAVES if leaf.typed]))
    flag, value = data.draw(st.sampled_from(leaf.typed))
    _assert_json_usage_error([*leaf.path, *_filler(leaf), flag, value, "--json"], flag)


@pytest.mark.parametrize("leaf", JSON_LEAVES[:3], ids=lambda leaf: " ".join(leaf.path))
def test_without_json_a_usage_error_is_text_on_stderr(leaf: Leaf) -> None:
    result = invoke_npa(*leaf.path, *_filler(leaf), "--no-such-flag-x")
    assert result.code == 2
    assert result.stdout == ""
    assert "No such option: --no-such-flag-x" in result.stderr
    assert "Usage: npa " in result.stderr


def test_json_after_a_double_dash_is_not_the_flag() -> None:
    leaf = next(leaf for leaf in JSON_LEAVES if leaf.arguments)
    result = invoke_npa(*leaf.path, "--no-such-flag-x", "--", "--json")
    assert result.code == 2
    assert result.stdout == ""
