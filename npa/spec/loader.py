"""Read a spec document: YAML text -> plain Python values plus where each value was written.

Values are built from PyYAML's node graph rather than with ``yaml.safe_load`` so that every
value keeps its line and column (errors point into the file), duplicate keys are errors instead
of silently keeping the last one, and aliases cannot expand a small file into a huge document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

# Past this many values a document is refused; a real workflow has a few thousand.
MAX_NODES = 200_000
MAX_BYTES = 8 * 1024 * 1024

try:  # libyaml is much faster; the pure-Python parser gives the same nodes.
    _Loader: type[Any] = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Position:
    line: int  # 1-based
    column: int  # 1-based


@dataclass(frozen=True)
class LoadProblem:
    """A document that could not be read as YAML at all."""

    message: str
    hint: str
    line: int | None = None
    column: int | None = None


@dataclass
class LoadedDocument:
    data: Any
    positions: dict[Path, Position] = field(default_factory=dict)

    def position(self, path: Path) -> Position | None:
        """Where ``path`` (or, failing that, its nearest parent) was written."""
        probe = tuple(path)
        while True:
            found = self.positions.get(probe)
            if found is not None or not probe:
                return found
            probe = probe[:-1]


class _TooLarge(Exception):
    pass


class _Builder:
    def __init__(self) -> None:
        self.positions: dict[Path, Position] = {}
        self.count = 0
        self.scalars = yaml.constructor.SafeConstructor()
        self.problems: list[LoadProblem] = []

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise _TooLarge
        self.positions.setdefault(path, _pos(node))
        if isinstance(node, yaml.MappingNode):
            result: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    self.problems.append(
                        LoadProblem(
                            "merge keys (<<) are not supported in a workflow spec",
                            "write the keys out in full",
                            *_line_col(key_node),
                        )
                    )
                    continue
                key = self.build_key(key_node)
                if key is _UNHASHABLE:
                    continue
                if key in result:
                    self.problems.append(
                        LoadProblem(
                            f"duplicate key {key!r}",
                            "each key may appear once per mapping; remove or rename one",
                            *_line_col(key_node),
                        )
                    )
                    continue
                child = (*path, _key_part(key))
                self.positions.setdefault(child, _pos(key_node))
                result[key] = self.build(value_node, child)
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        try:
            return self.scalars.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.problems.append(
                LoadProblem(
                    f"cannot read value: {_first_line(exc)}", "quote the value", *_line_col(node)
                )
            )
            return None

    def build_key(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            self.problems.append(
                LoadProblem(
                    "a mapping key must be a plain value, not a list or mapping",
                    "use a string key",
                    *_line_col(node),
                )
            )
            return _UNHASHABLE
        self.count += 1
        try:
            return self.scalars.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.problems.append(
                LoadProblem(
                    f"cannot read key: {_first_line(exc)}", "quote the key", *_line_col(node)
                )
            )
            return _UNHASHABLE


_UNHASHABLE = object()


def _key_part(key: Any) -> str | int:
    return key if isinstance(key, str | int) and not isinstance(key, bool) else str(key)


def _pos(node: yaml.Node) -> Position:
    return Position(node.start_mark.line + 1, node.start_mark.column + 1)


def _line_col(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_text(text: str) -> tuple[LoadedDocument | None, list[LoadProblem]]:
    """Parse one YAML document. Returns the document, or ``None`` and the problems found."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        return None, [
            LoadProblem(f"the spec is larger than {MAX_BYTES} bytes", "split the workflow")
        ]
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or str(exc)
        context = f" ({exc.context})" if exc.context else ""
        return None, [
            LoadProblem(
                f"YAML syntax error: {problem}{context}",
                "fix the YAML at the position shown (check indentation, quotes and colons)",
                mark.line + 1 if mark else None,
                mark.column + 1 if mark else None,
            )
        ]
    except (yaml.YAMLError, ValueError, UnicodeError) as exc:
        return None, [
            LoadProblem(
                f"cannot read YAML: {_first_line(exc)}",
                "check the file encoding (UTF-8) and YAML syntax",
            )
        ]
    except RecursionError:
        return None, [LoadProblem("the YAML is nested too deeply", "flatten the document")]
    if not nodes or nodes[0] is None:
        return None, [LoadProblem("the spec is empty", "start from examples/tiny-local.yaml")]
    if len(nodes) > 1:
        return None, [
            LoadProblem(
                "the file holds more than one YAML document",
                "keep one workflow per file (remove the extra '---')",
            )
        ]
    builder = _Builder()
    try:
        data = builder.build(nodes[0], ())
    except _TooLarge:
        return None, [
            LoadProblem(
                f"the spec expands to more than {MAX_NODES} values (aliases?)",
                "write values out instead of repeating large anchors",
            )
        ]
    except RecursionError:
        return None, [
            LoadProblem(
                "the YAML is nested too deeply (or an alias refers to itself)",
                "flatten the document",
            )
        ]
    if builder.problems:
        return None, builder.problems
    return LoadedDocument(data, builder.positions), []
