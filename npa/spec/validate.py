"""Validate a workflow spec and report every problem at once.

The pydantic models of :mod:`npa.spec.model` check every field's type, syntax and one-field
rules in one pass over the whole document (pydantic reports every field's errors, not the first
one's). Then whole-document rules check what no single field can: references between stages and
tools, cycles, duplicates and accelerator fit. They read the document as written, skipping any
value of the wrong shape (already reported), so a broken field never hides a problem elsewhere
in the same stage. Each problem carries its path in the document (``stages[1].inputs[0].from``),
the line and column where it was written, and a hint saying how to fix it. Every step is
linear in the size of the document.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

from pydantic import BaseModel, ValidationError

from npa.core.collector import collector_paused
from npa.core.errors import InvalidInput
from npa.core.userfiles import read_user_text
from npa.spec import imageref
from npa.spec.loader import MAX_BYTES, LoadedDocument, Path, load_text
from npa.spec.model import (
    ACCELERATORS,
    API_VERSION,
    DNS_LABEL,
    ENV_NAME,
    IDENT,
    LABEL_KEY,
    ONE_SOURCE,
    RULE_ERROR,
    STORE_URI,
    TOOL_REF,
    Checkpoint,
    GpuNodes,
    Stage,
    Workflow,
    parse_accelerators,
    relative_path_problem,
)

# What a stage's fit against the GPU node group reads of that group.
FIT_FIELDS = ("count", "accelerators")
# Past this many dependency cycles, the rest are counted rather than spelled out.
MAX_CYCLES_SHOWN = 50


class SpecIssue(BaseModel):
    """One problem in a spec."""

    path: str
    message: str
    hint: str
    line: int | None = None
    column: int | None = None

    def describe(self) -> str:
        where = f"{self.line}:{self.column} " if self.line is not None else ""
        return f"{where}{self.path or '<document>'}: {self.message} (hint: {self.hint})"


@dataclass
class _Collector:
    doc: LoadedDocument | None
    issues: list[SpecIssue]
    seen: set[tuple[str, str]] = field(default_factory=set)

    def add(self, path: Path, message: str, hint: str) -> None:
        """Record a problem once: a rule that pass 1 (the model) and pass 2 (the raw document)
        both check, so that it is reported whatever else fails, is not listed twice."""
        where = format_path(path)
        if (where, message) in self.seen:
            return
        self.seen.add((where, message))
        pos = self.doc.position(path) if self.doc else None
        self.issues.append(
            SpecIssue(
                path=where,
                message=message,
                hint=hint,
                line=pos.line if pos else None,
                column=pos.column if pos else None,
            )
        )


def format_path(path: Iterable[str | int]) -> str:
    """``("stages", 1, "env", "A.B")`` -> ``stages[1].env["A.B"]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{_quote(part)}]"
    return out


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'


# --- pass 1: the model ----------------------------------------------------------------------

_PATTERN_HINTS = {
    DNS_LABEL: "use lowercase letters, digits and '-', at most 63 characters, starting and "
    "ending with a letter or digit",
    IDENT: "use lowercase letters, digits and '_', starting with a letter, at most 63 characters",
    TOOL_REF: "use lowercase letters, digits, '_' and '-', starting with a letter",
    ENV_NAME: "environment variable names use letters, digits and '_', not starting with a digit",
    LABEL_KEY: "label keys use letters, digits, '.', '_', '/' and '-', at most 63 characters",
    ACCELERATORS: "write the GPU model and count, e.g. H100:8",
    STORE_URI: "e.g. s3://bucket/prefix; percent-encode other characters (%20)",
    imageref.PATTERN: "write [registry[:port]/]repository[:tag][@sha256:<64 hex>] in lowercase",
}
_PATTERN_MESSAGES = {
    ACCELERATORS: "{value!r} is not NAME:N",
    STORE_URI: "{value!r} is not an object-store URI (s3://, gs://, r2:// or file:///) "
    "in printable ASCII without spaces",
    imageref.PATTERN: "{value!r} is not a valid image reference",
}


def _pydantic_issues(exc: ValidationError, prefix: Path, out: _Collector) -> None:
    for err in exc.errors(include_url=False):
        loc: list[str | int] = [p for p in err["loc"] if p != "[key]"]
        is_key = "[key]" in err["loc"]
        path = (*prefix, *loc)
        kind = err["type"]
        value = err.get("input")
        message = err["msg"]
        ctx = err.get("ctx") or {}
        if kind == RULE_ERROR:
            out.add(path, str(ctx["message"]), str(ctx["hint"]))
            continue
        if kind == "missing":
            hint = f"add the required field '{loc[-1]}'"
        elif kind == "extra_forbidden":
            hint = "remove it or fix its spelling (unknown keys are not allowed; see docs/spec.md)"
            message = f"unknown field {loc[-1]!r}"
        elif kind == "string_pattern_mismatch":
            pattern = str(ctx.get("pattern", ""))
            message = _PATTERN_MESSAGES.get(pattern, "{value!r} is not allowed here").format(
                value=value
            )
            hint = _PATTERN_HINTS.get(pattern, "see docs/spec.md for the allowed syntax")
            if (
                isinstance(value, str)
                and ("/" in value or ".." in value)
                and pattern
                in (
                    DNS_LABEL,
                    IDENT,
                    TOOL_REF,
                )
            ):
                hint = (
                    "names become path components under the run prefix, so '/' and '..' "
                    "are refused (they could escape it); " + hint
                )
        elif kind == "literal_error" and loc == ["apiVersion"]:
            hint = f"set apiVersion: {API_VERSION}"
        elif kind in {"dict_type", "model_type", "model_attributes_type"}:
            hint = "this must be a mapping (key: value lines)"
        elif kind == "list_type":
            hint = "this must be a list ('- item' lines)"
        elif kind.startswith(("int", "float")) or kind in {
            "greater_than",
            "greater_than_equal",
            "less_than",
            "less_than_equal",
        }:
            hint = "write a plain number in the allowed range (not quoted)"
        elif kind == "string_type" and (text := _written(out, path)) is not None:
            # A plain value YAML read as something else: the quoted form is the fix.
            key = f"{loc[-1]}: " if loc and isinstance(loc[-1], str) else ""
            readings = out.doc.ambiguous.get(path) if out.doc is not None else None
            message = (
                readings.describe()
                if readings is not None
                else f"{text} is read as {type(value).__name__} {value!r}, not as text"
            )
            hint = f'write {key}"{text}" (quoted, it is text)'
        elif kind.startswith("string"):
            hint = "write a string (quote it if YAML reads it as a number, boolean or date)"
        else:
            hint = "see docs/spec.md for this field"
        if is_key and kind != "string_pattern_mismatch":
            message = f"invalid key {value!r}: {message}"
        elif is_key:
            message = f"invalid key {value!r}"
        out.add(path, message, hint)


def _written(out: _Collector, path: Path) -> str | None:
    return out.doc.written(path) if out.doc is not None else None


def _check_yaml_forms(doc: LoadedDocument, out: _Collector) -> None:
    """Every plain value YAML 1.1 (npa's reader) and YAML 1.2 read differently (``0755``,
    ``yes``, ``on``, ``1_000``, ``1:30``, a date): refused wherever it is, since the writer may
    have meant either, with the quoted form to write for the text."""
    for path, readings in doc.ambiguous.items():
        out.add(path, readings.describe(), readings.hint(path[-1] if path else None))


# --- pass 2: whole-document rules ------------------------------------------------------------


def _gpu_nodes(raw: Mapping[str, Any]) -> GpuNodes | None:
    """The GPU node group's count and accelerators, which is all the fit checks read, when those
    two are valid on their own (their problems, and any elsewhere in ``infrastructure``, are
    reported by pass 1); None when they are not, so fit checks never run against a guess. An
    error elsewhere in the section therefore never hides a stage's fit error."""
    infra = raw.get("infrastructure", {})
    section = infra.get("gpu_nodes", {}) if isinstance(infra, dict) else None
    if not isinstance(section, dict):
        return None
    try:
        return GpuNodes.model_validate({k: section[k] for k in FIT_FIELDS if k in section})
    except ValidationError:
        return None


def _strings(value: Any) -> list[tuple[int, str]]:
    """(index, item) of the string items of a list; anything else yields nothing."""
    if not isinstance(value, list):
        return []
    return [(i, item) for i, item in enumerate(value) if isinstance(item, str)]


def _mappings(value: Any) -> list[tuple[int, dict[str, Any]]]:
    if not isinstance(value, list):
        return []
    return [(i, item) for i, item in enumerate(value) if isinstance(item, dict)]


@dataclass
class _Index:
    """What stages refer to: stage names (first use), their declared outputs, tool refs."""

    stages: dict[str, int]
    outputs: dict[str, set[str]]
    tools: set[str] | None  # None when ``tools`` is not a mapping (reported by pass 1)


def _index(
    raw: Mapping[str, Any], stages: list[tuple[int, dict[str, Any]]], out: _Collector
) -> _Index:
    names: dict[str, int] = {}
    outputs: dict[str, set[str]] = {}
    for i, stage in stages:
        name = stage.get("name")
        if not isinstance(name, str):
            continue
        if name in names:
            out.add(
                ("stages", i, "name"),
                f"duplicate stage name {name!r} (first used by stages[{names[name]}])",
                "give every stage a unique name",
            )
            continue
        names[name] = i
        outputs[name] = {
            o["name"] for _, o in _mappings(stage.get("outputs")) if isinstance(o.get("name"), str)
        }
    tools = raw.get("tools")
    return _Index(names, outputs, set(tools) if isinstance(tools, dict) else None)


def _check_references(raw: Mapping[str, Any], out: _Collector) -> None:
    stages = _mappings(raw.get("stages"))
    index = _index(raw, stages, out)
    gpu_nodes = _gpu_nodes(raw)
    for i, stage in stages:
        _check_stage(i, stage, index, gpu_nodes, out)
    _check_cycles(stages, index, out)


def _known(names: Iterable[str]) -> str:
    shown = sorted(names)
    more = f" (+{len(shown) - 20} more)" if len(shown) > 20 else ""
    return (", ".join(shown[:20]) or "none") + more


def _check_stage(
    i: int,
    stage: dict[str, Any],
    index: _Index,
    gpu_nodes: GpuNodes | None,
    out: _Collector,
) -> None:
    at: Path = ("stages", i)
    own = stage.get("name") if isinstance(stage.get("name"), str) else None
    tool = stage.get("tool")
    if index.tools is not None and isinstance(tool, str) and tool not in index.tools:
        out.add(
            (*at, "tool"),
            f"unknown tool {tool!r}",
            "declare it under tools: or use one of: "
            + (_known(index.tools) if index.tools else "none declared"),
        )

    inputs = _mappings(stage.get("inputs"))
    _unique_names(at, "input", inputs, out)
    for j, inp in inputs:
        # The model checks this too, but only when the input's fields are valid; checked here,
        # a bad name (or any other field) no longer hides it.
        if (inp.get("uri") is None) == (inp.get("from") is None):
            out.add((*at, "inputs", j), ONE_SOURCE[0], ONE_SOURCE[1])
        ref = inp.get("from")
        if "uri" in inp or not isinstance(ref, str):
            continue
        src, _, output = ref.partition(".")
        if not src or not output:
            continue  # pass 1 reported the syntax
        if src == own:
            out.add(
                (*at, "inputs", j, "from"),
                "a stage cannot read its own output",
                "read an upstream stage",
            )
        elif src not in index.stages:
            out.add(
                (*at, "inputs", j, "from"),
                f"unknown stage {src!r}",
                f"use one of: {_known(index.stages)}",
            )
        elif output not in index.outputs[src]:
            out.add(
                (*at, "inputs", j, "from"),
                f"stage {src!r} declares no output {output!r}",
                f"declare it under stages[{index.stages[src]}].outputs "
                f"(declared: {_known(index.outputs[src])})",
            )

    outputs = _mappings(stage.get("outputs"))
    _unique_names(at, "output", outputs, out)
    # Each stage writes under its own outputs prefix, so only paths within a stage can clash.
    output_paths: dict[str, int] = {}
    for j, output_decl in outputs:
        path = output_decl.get("path")
        if not isinstance(path, str) or not path or relative_path_problem(path):
            continue
        key = path.rstrip("/")
        if key in output_paths:
            out.add(
                (*at, "outputs", j, "path"),
                f"{path!r} is also the path of outputs[{output_paths[key]}]",
                "give every output of a stage its own path",
            )
        else:
            output_paths[key] = j

    seen_deps: set[str] = set()
    for j, dep in _strings(stage.get("depends_on")):
        if dep == own:
            out.add((*at, "depends_on", j), "a stage cannot depend on itself", "remove it")
        elif dep not in index.stages:
            out.add(
                (*at, "depends_on", j),
                f"unknown stage {dep!r}",
                f"use one of: {_known(index.stages)}",
            )
        elif dep in seen_deps:
            out.add((*at, "depends_on", j), f"{dep!r} is listed twice", "list it once")
        seen_deps.add(dep)

    resources = stage.get("resources")
    accel = resources.get("accelerators") if isinstance(resources, dict) else None
    parsed = parse_accelerators(accel) if isinstance(accel, str) else None
    if parsed is not None and gpu_nodes is not None:
        node = parse_accelerators(gpu_nodes.accelerators)
        if gpu_nodes.count == 0:
            out.add(
                (*at, "resources", "accelerators"),
                f"the stage needs {accel} but infrastructure.gpu_nodes.count is 0",
                "set infrastructure.gpu_nodes.count to at least 1",
            )
        elif node is not None and (node[0].lower() != parsed[0].lower() or parsed[1] > node[1]):
            out.add(
                (*at, "resources", "accelerators"),
                f"{accel} does not fit a GPU node ({gpu_nodes.accelerators})",
                "request at most the GPUs of one node, of the node's model",
            )


def _unique_names(
    at: Path, kind: str, items: list[tuple[int, dict[str, Any]]], out: _Collector
) -> None:
    """Every ``name`` among a stage's inputs (or outputs) used once."""
    seen: set[str] = set()
    for j, item in items:
        name = item.get("name")
        if not isinstance(name, str):
            continue
        if name in seen:
            out.add(
                (*at, f"{kind}s", j, "name"),
                f"duplicate {kind} name {name!r}",
                f"name each {kind} once",
            )
        seen.add(name)


def _upstream_names(stage: dict[str, Any]) -> set[str]:
    deps = {d for _, d in _strings(stage.get("depends_on"))}
    for _, inp in _mappings(stage.get("inputs")):
        ref = inp.get("from")
        if isinstance(ref, str) and "." in ref:
            deps.add(ref.split(".", 1)[0])
    return deps


def _check_cycles(stages: list[tuple[int, dict[str, Any]]], index: _Index, out: _Collector) -> None:
    """Every dependency cycle, found by one depth-first walk (linear in stages + edges)."""
    graph: dict[str, list[str]] = {}
    for i, stage in stages:
        name = stage.get("name")
        if isinstance(name, str) and index.stages.get(name) == i:
            deps = _upstream_names(stage)
            deps.discard(name)
            graph[name] = sorted(d for d in deps if d in index.stages)
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    on_path: dict[str, int] = {}  # node -> its position in ``path``
    reported: set[frozenset[str]] = set()
    unreported = 0

    for start in graph:
        if state.get(start):
            continue
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(graph[start]))]
        path = [start]
        on_path[start] = 0
        state[start] = 1
        while stack:
            node, edges = stack[-1]
            nxt = next(edges, None)
            if nxt is None:
                stack.pop()
                path.pop()
                del on_path[node]
                state[node] = 2
                continue
            if state.get(nxt) == 1:
                if len(reported) >= MAX_CYCLES_SHOWN:
                    unreported += 1
                    continue
                cycle = [*path[on_path[nxt] :], nxt]
                key = frozenset(cycle)
                if key not in reported:
                    reported.add(key)
                    out.add(
                        ("stages", index.stages[nxt], "depends_on"),
                        "dependency cycle: " + " -> ".join(cycle),
                        "remove one edge; a stage cannot depend on itself, even indirectly",
                    )
            elif not state.get(nxt):
                state[nxt] = 1
                on_path[nxt] = len(path)
                path.append(nxt)
                stack.append((nxt, iter(graph[nxt])))
    if unreported:
        out.add(
            ("stages",),
            f"{unreported} more dependency cycles (the first {MAX_CYCLES_SHOWN} are listed)",
            "remove the edges listed above first, then validate again",
        )


def _check_document(raw: Mapping[str, Any], out: _Collector) -> Workflow | None:
    try:
        workflow: Workflow | None = Workflow.model_validate(raw)
    except ValidationError as exc:
        workflow = None
        _pydantic_issues(exc, (), out)
    _check_references(raw, out)
    return workflow


def upstream(stage: Stage) -> set[str]:
    """Stages that must finish before ``stage``: depends_on plus the stages it reads from."""
    deps = set(stage.depends_on)
    for inp in stage.inputs:
        if inp.from_ and "." in inp.from_:
            deps.add(inp.from_.split(".", 1)[0])
    deps.discard(stage.name)
    return deps


# --- entry points ----------------------------------------------------------------------------


def validate_document(doc: LoadedDocument) -> tuple[Workflow | None, list[SpecIssue]]:
    """Validate a loaded document; returns the workflow or ``None`` and every issue found."""
    out = _Collector(doc, [])
    if not isinstance(doc.data, dict):
        out.add(
            (),
            "the spec must be a mapping with apiVersion, kind, metadata, tools, stages",
            "start from examples/tiny-local.yaml",
        )
        return None, out.issues
    workflow = _check_document(doc.data, out)
    _check_yaml_forms(doc, out)
    issues = sorted(out.issues, key=lambda i: (i.line or 0, i.column or 0))
    return (workflow if not issues else None), issues


@collector_paused()
def validate_text(text: str) -> tuple[Workflow | None, list[SpecIssue]]:
    """Parse and validate spec text, in time linear in its size.

    Parsing and validating allocate millions of objects that all stay alive until the end, so
    the cyclic garbage collector is paused (:func:`collector_paused`) and resumed once the parse
    tree is gone (``_validate`` has returned): what it then sees is the result alone."""
    return _validate(text)


def _validate(text: str) -> tuple[Workflow | None, list[SpecIssue]]:
    doc, problems = load_text(text)
    if doc is None:
        return None, [
            SpecIssue(path="", message=p.message, hint=p.hint, line=p.line, column=p.column)
            for p in problems
        ]
    return validate_document(doc)


def read_spec_text(path: FsPath) -> str:
    """Read a spec file: a regular file of at most the spec size limit, in UTF-8 or in the
    UTF-16 or UTF-32 YAML also reads (:func:`~npa.core.userfiles.decode_user_text`)."""
    return read_user_text(
        path, "spec file", limit=MAX_BYTES, missing_is_not_found=True, encodings="yaml"
    )


def load_workflow(path: FsPath) -> Workflow:
    """Read and validate a spec file, or raise InvalidInput listing every issue."""
    workflow, issues = validate_text(read_spec_text(path))
    if workflow is None:
        shown = "\n".join(f"  {i.describe()}" for i in issues[:20])
        more = f"\n  ... and {len(issues) - 20} more" if len(issues) > 20 else ""
        raise InvalidInput(
            f"{path} is not a valid workflow spec ({len(issues)} "
            f"{'issue' if len(issues) == 1 else 'issues'}):\n{shown}{more}",
            fix=f"npa workbench workflow validate-spec {path}",
            details={"issues": [i.model_dump() for i in issues]},
        )
    return workflow


__all__ = [
    "Checkpoint",
    "SpecIssue",
    "format_path",
    "load_workflow",
    "read_spec_text",
    "upstream",
    "validate_document",
    "validate_text",
]
