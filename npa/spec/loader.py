"""Read a spec document: YAML text -> plain Python values plus where each value was written.

Values are built from PyYAML's node graph rather than with ``yaml.safe_load`` so that every
value can be traced back to its line and column (errors point into the file), duplicate keys are
errors instead of silently keeping the last one, and aliases cannot expand a small file into a
huge document. The tags are exactly the safe loader's. A document with nothing to report (the
common case, and all of a large spec's time) is read straight from libyaml's events
(:class:`npa.core.yamlread.EventReader`), and its node graph is composed only if a later check
asks where a value was written; anything the event reader leaves alone is read as nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import yaml

from npa.core.yamlread import EventReader, NotPlainData, plain_scalar

# Past this many values (keys, scalars, lists and mappings, counting what aliases expand to) a
# document is refused: it bounds what an alias can make of a small file. 20,000 stages of a
# rich workflow (physical-ai.yaml's, about 70 values each) are a third of it.
MAX_NODES = 4_000_000
# 20,000 such stages are 10 to 20 MiB of YAML, comments included.
MAX_BYTES = 32 * 1024 * 1024

try:  # libyaml is much faster; the pure-Python parser gives the same nodes.
    _Base: type[Any] = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Base = yaml.SafeLoader

# The safe loader's implicit resolvers by first character, as tuples (it has no path or
# wildcard resolvers, so the first character decides which patterns can apply).
_IMPLICIT: dict[str, tuple[tuple[str, Any], ...]] = {
    first: tuple(resolvers) for first, resolvers in _Base.yaml_implicit_resolvers.items()
}
_STR = "tag:yaml.org,2002:str"
# Distinct plain scalars whose tag is remembered while one document is read.
_RESOLVED_CACHE = 50_000


class _Loader(_Base):  # type: ignore[misc]
    """The safe loader with a faster resolver: the same tags, remembered for values that
    repeat (every stage has the same keys), without building a list of candidate patterns for
    every scalar (the resolver is called once per key and per value)."""

    def __init__(self, stream: Any) -> None:
        self._known: dict[str, str] = {}
        super().__init__(stream)

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode:
            if not implicit[0]:
                return str(self.DEFAULT_SCALAR_TAG)
            known = self._known
            tag = known.get(value)
            if tag is None:
                tag = str(self.DEFAULT_SCALAR_TAG)
                for candidate, pattern in _IMPLICIT.get(value[:1], ()):
                    if pattern.match(value):
                        tag = str(candidate)
                        break
                if len(known) < _RESOLVED_CACHE:
                    known[value] = tag
            return tag
        if kind is yaml.SequenceNode:
            return str(self.DEFAULT_SEQUENCE_TAG)
        return str(self.DEFAULT_MAPPING_TAG)


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
    """The values of a document and its node graph, which says where each was written.

    Positions are looked up only for the values a problem is reported about, so reading a
    valid document never pays for them."""

    data: Any
    root: yaml.Node | None = None
    # Plain scalars YAML 1.1 (this reader) and YAML 1.2 read differently, by where they are.
    ambiguous: dict[Path, YamlReadings] = field(default_factory=dict)
    _entries: dict[int, dict[str | int, tuple[yaml.Node, yaml.Node]]] = field(
        default_factory=dict, repr=False
    )
    # The text, when the values were read from its events: the node graph is composed from
    # it the first time a position is asked for.
    source: str | None = field(default=None, repr=False)

    def tree(self) -> yaml.Node | None:
        """The document's node graph (composed now if the values were read without it)."""
        if self.root is None and self.source is not None:
            self.root = yaml.compose(self.source, Loader=_Loader)
        return self.root

    def position(self, path: Path) -> Position | None:
        """Where ``path`` (or, failing that, its nearest parent) was written: a mapping entry
        at its key, a list item at the item."""
        node = self.tree()
        if node is None:
            return None
        where = node
        for part in path:
            if isinstance(node, yaml.MappingNode):
                entry = self._mapping(node).get(part)
                if entry is None:
                    break
                where, node = entry
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if not 0 <= part < len(node.value):
                    break
                where = node = node.value[part]
            else:
                break
        return _pos(where)

    def written(self, path: Path) -> str | None:
        """The text of the plain (unquoted) scalar at ``path`` as the file has it, if it is one."""
        node = self.tree()
        for part in path:
            if isinstance(node, yaml.MappingNode):
                entry = self._mapping(node).get(part)
                node = entry[1] if entry else None
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                node = node.value[part] if 0 <= part < len(node.value) else None
            else:
                return None
        return node.value if isinstance(node, yaml.ScalarNode) and not node.style else None

    def _mapping(self, node: yaml.MappingNode) -> dict[str | int, tuple[yaml.Node, yaml.Node]]:
        found = self._entries.get(id(node))
        if found is None:
            found = {}
            scalars = yaml.constructor.SafeConstructor()
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                try:
                    key = scalars.construct_object(key_node, deep=True)
                except yaml.YAMLError:
                    continue
                # The first of duplicate keys is the one the document keeps.
                found.setdefault(_key_part(key), (key_node, value_node))
            self._entries[id(node)] = found
        return found


class _TooLarge(Exception):
    pass


@dataclass(frozen=True)
class YamlReadings:
    """A plain scalar that YAML 1.1 (PyYAML, this reader) and YAML 1.2's core schema (what
    most other tools read today) take for different values: ``0755`` is 493 in one and 755 in
    the other, ``yes`` is true in one and the text in the other. A spec refuses it: the writer
    quotes it or writes a form both read alike."""

    text: str  # as written
    yaml11: Any  # what this reader made of it
    yaml12: Any  # what a YAML 1.2 core reader makes of it

    def describe(self) -> str:
        return (
            f"{self.text} is read as {_shown(self.yaml11)} by YAML 1.1 (npa's reader) and as "
            f"{_shown(self.yaml12)} by YAML 1.2"
        )

    def hint(self, key: str | int | None) -> str:
        quoted = f'"{self.text}"'
        written = f"{key}: {quoted}" if isinstance(key, str) else quoted
        if isinstance(self.yaml11, bool):
            return f"write {written} for the text, or {str(self.yaml11).lower()} for a boolean"
        if isinstance(self.yaml11, int) and isinstance(self.yaml12, int):
            return f"write {written} for the text, or {self.yaml11} or {self.yaml12} for a number"
        return f"write {written} for the text"


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f'the text "{value}"'
    if isinstance(value, int | float):
        return f"the number {value!r}"
    return f"the {type(value).__name__} {value}"


# YAML 1.2 core schema: only these plain forms are booleans and numbers (everything else that
# is not null is text).
_CORE_BOOL = re.compile(r"true|True|TRUE|false|False|FALSE")
_CORE_INT = re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")
_CORE_FLOAT = re.compile(
    r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.nan|\.NaN|\.NAN"
)
_TYPED = {
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:timestamp",
}


def _core_reading(text: str) -> Any:
    """What a YAML 1.2 core-schema reader makes of a plain scalar that is not null."""
    if _CORE_BOOL.fullmatch(text):
        return text.lower() == "true"
    if _CORE_INT.fullmatch(text):
        if text.startswith("0o"):
            return int(text[2:], 8)
        return int(text, 16) if text.startswith("0x") else int(text, 10)
    if _CORE_FLOAT.fullmatch(text):
        return float(text.replace(".", "", 1) if text.lstrip("+-")[1:2].isalpha() else text)
    return text


def _readings(node: yaml.ScalarNode, value: Any) -> YamlReadings | None:
    """The two readings of a plain scalar when they differ (None when both agree)."""
    if node.style or node.tag not in _TYPED:  # plain: None, or "" from libyaml
        return None
    core = _core_reading(node.value)
    both_nan = core != core and value != value  # .nan is not equal to itself
    same = type(core) is type(value) and (core == value or both_nan)
    return None if same else YamlReadings(node.value, value, core)


def _written(root: yaml.Node) -> tuple[int, list[yaml.Node]]:
    """The values written in the document (each node once, keys included), and the nodes that
    aliases repeat (in the order first met)."""
    seen: set[int] = set()
    repeated: dict[int, yaml.Node] = {}
    count = 0
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            repeated.setdefault(id(node), node)
            continue
        seen.add(id(node))
        count += 1
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in reversed(node.value):
                todo += [value_node, key_node]
        elif isinstance(node, yaml.SequenceNode):
            todo += reversed(node.value)
    return count, list(repeated.values())


def _too_large(root: yaml.Node) -> LoadProblem:
    """Past :data:`MAX_NODES`: what was counted and the limit, and the aliases only when the
    document has some (counted once more, after the refusal; reading pays nothing for it)."""
    written, repeated = _written(root)
    if not repeated:
        return LoadProblem(
            f"the spec holds {written:,} values (keys, scalars, lists and mappings), more than "
            f"the {MAX_NODES:,} a spec may hold",
            "split the workflow into specs of fewer stages",
        )
    lines = ", ".join(str(n.start_mark.line + 1) for n in repeated[:5])
    more = f" and {len(repeated) - 5} more" if len(repeated) > 5 else ""
    return LoadProblem(
        f"the spec expands to more than {MAX_NODES:,} values (keys, scalars, lists and mappings) "
        f"through its aliases: {written:,} are written in the file, the rest are copies of "
        f"{len(repeated)} anchored {'value' if len(repeated) == 1 else 'values'} (at line "
        f"{lines}{more})",
        "write the repeated values out where they are used, instead of aliasing them (*name)",
        repeated[0].start_mark.line + 1,
        repeated[0].start_mark.column + 1,
    )


class _Builder:
    def __init__(self) -> None:
        self.count = 0
        self.scalars = yaml.constructor.SafeConstructor()
        self.constructors = self.scalars.yaml_constructors
        self.problems: list[LoadProblem] = []
        self.ambiguous: dict[int, YamlReadings] = {}  # by id of the node

    def build(self, node: yaml.Node) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise _TooLarge
        if isinstance(node, yaml.ScalarNode):
            if node.tag == _STR:
                return node.value
            value = self.scalar(node, "value", "quote the value")
            readings = _readings(node, value)
            if readings is not None:
                self.ambiguous[id(node)] = readings
            return value
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
                result[key] = self.build(value_node)
            return result
        return [self.build(item) for item in node.value]

    def scalar(self, node: yaml.ScalarNode, what: str, hint: str) -> Any:
        try:
            constructor = self.constructors.get(node.tag)
            if constructor is None:
                return self.scalars.construct_object(node, deep=True)  # raises: unknown tag
            return constructor(self.scalars, node)
        except (yaml.YAMLError, ValueError, TypeError) as exc:
            self.problems.append(
                LoadProblem(f"cannot read {what}: {_first_line(exc)}", hint, *_line_col(node))
            )
            return _UNHASHABLE if what == "key" else None

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
        if node.tag == _STR:
            return node.value
        return self.scalar(node, "key", "quote the key")


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
    if (size := len(text.encode("utf-8", "surrogatepass"))) > MAX_BYTES:
        return None, [
            LoadProblem(
                f"the spec is {size:,} bytes, more than the {MAX_BYTES:,} a spec may hold",
                "split the workflow into specs of fewer stages",
            )
        ]
    doc = _read_plain(text)
    if doc is not None:
        return doc, []
    return _read_nodes(text)


def _read_nodes(text: str) -> tuple[LoadedDocument | None, list[LoadProblem]]:
    """The document read as a node graph: every problem reported where it was written."""
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
        data = builder.build(nodes[0])
    except _TooLarge:
        return None, [_too_large(nodes[0])]
    except RecursionError:
        return None, [
            LoadProblem(
                "the YAML is nested too deeply (or an alias refers to itself)",
                "flatten the document",
            )
        ]
    if builder.problems:
        return None, builder.problems
    doc = LoadedDocument(data, nodes[0])
    if builder.ambiguous:
        doc.ambiguous = _paths_of(nodes[0], builder.ambiguous)
    return doc, []


class _SpecReader(EventReader):
    """A spec's values from its events, for a document with nothing to report: every key once,
    at most :data:`MAX_NODES` values, no plain scalar YAML 1.1 and 1.2 read differently (each
    of those raises :class:`NotPlainData`, and the node graph's reading reports it)."""

    def plain(self, text: str) -> Any:
        if _ambiguous(text):
            raise NotPlainData
        return plain_scalar(text)[1]


@lru_cache(maxsize=4096)
def _ambiguous(text: str) -> bool:
    """Whether YAML 1.1 and 1.2 read this plain scalar differently."""
    tag, value = plain_scalar(text)
    return _readings(yaml.ScalarNode(tag, text), value) is not None


def _read_plain(text: str) -> LoadedDocument | None:
    """The document read from its events, when it holds plain data and nothing to report
    (reading a large spec so takes about two thirds of the time); None: read it as nodes."""
    try:
        data = _SpecReader(unique_keys=True, limit=MAX_NODES).read(text)
    except Exception:  # anything to report, the node graph's reading says it
        return None
    if data is None:  # empty, or null: reported as the node graph reads it
        return None
    return LoadedDocument(data, source=text)


def _paths_of(root: yaml.Node, found: dict[int, YamlReadings]) -> dict[Path, YamlReadings]:
    """Where each of ``found``'s nodes is in the document (a second walk, made only for a
    document that has any)."""
    scalars = yaml.constructor.SafeConstructor()
    out: dict[Path, YamlReadings] = {}
    stack: list[tuple[yaml.Node, Path]] = [(root, ())]
    seen: set[int] = set()
    while stack:
        node, path = stack.pop()
        if id(node) in found:
            out.setdefault(path, found[id(node)])
        if id(node) in seen:  # an alias: its node was walked where it was defined
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*path, i)) for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                try:
                    key = scalars.construct_object(key_node, deep=True)
                except yaml.YAMLError:
                    continue
                stack.append((value_node, (*path, _key_part(key))))
    return out
