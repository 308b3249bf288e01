"""Validate a workflow spec and report every problem at once.

Validation runs in two passes over the same document. The pydantic models check each field's
shape; then whole-document rules check what no single field can: references between stages and
tools, cycles, duplicates, accelerator fit, and paths that could leave the run prefix. Each
problem carries its path in the document (``stages[1].inputs[0].from``), the line and column
where it was written, and a hint saying how to fix it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

from pydantic import BaseModel, ValidationError

from npa.core.errors import InvalidInput, NotFound
from npa.spec.imageref import parse_image_ref
from npa.spec.loader import LoadedDocument, Path, load_text
from npa.spec.model import (
    API_VERSION,
    DNS_LABEL,
    ENV_NAME,
    IDENT,
    URI,
    Checkpoint,
    Infrastructure,
    Metadata,
    Stage,
    Storage,
    Tool,
    Workflow,
    parse_accelerators,
)

_SAFE_CONTEXT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:+-]{0,252}$")


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

    def add(self, path: Path, message: str, hint: str) -> None:
        pos = self.doc.position(path) if self.doc else None
        self.issues.append(
            SpecIssue(
                path=format_path(path),
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


# --- pass 1: field shapes --------------------------------------------------------------------

_PATTERN_HINTS = {
    DNS_LABEL: "use lowercase letters, digits and '-', at most 63 characters, starting and "
    "ending with a letter or digit",
    IDENT: "use lowercase letters, digits and '_', starting with a letter, at most 63 characters",
    ENV_NAME: "environment variable names use letters, digits and '_', not starting with a digit",
}


def _pydantic_issues(exc: ValidationError, prefix: Path, out: _Collector) -> None:
    for err in exc.errors(include_url=False):
        loc: list[str | int] = [p for p in err["loc"] if p != "[key]"]
        is_key = "[key]" in err["loc"]
        path = (*prefix, *loc)
        kind = err["type"]
        value = err.get("input")
        message = err["msg"]
        if kind == "missing":
            hint = f"add the required field '{loc[-1]}'"
        elif kind == "extra_forbidden":
            hint = "remove it or fix its spelling (unknown keys are not allowed; see docs/spec.md)"
            message = f"unknown field {loc[-1]!r}"
        elif kind == "string_pattern_mismatch":
            pattern = str((err.get("ctx") or {}).get("pattern", ""))
            message = f"{value!r} is not allowed here"
            hint = _PATTERN_HINTS.get(pattern, "see docs/spec.md for the allowed syntax")
            if isinstance(value, str) and ("/" in value or ".." in value):
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
        elif kind.startswith(("int", "float")) or kind in {"greater_than", "less_than_equal"}:
            hint = "write a plain number in the allowed range"
        elif kind.startswith("string"):
            hint = "write a string (quote it if YAML reads it as a number, boolean or date)"
        else:
            hint = "see docs/spec.md for this field"
        if is_key:
            message = f"invalid key {value!r}"
        out.add(path, message, hint)


def _parse_part(model: type[BaseModel], data: Any, path: Path, out: _Collector) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        _pydantic_issues(exc, path, out)
        return None


# --- pass 2: whole-document rules ------------------------------------------------------------


def _relative_path_problem(value: str) -> str | None:
    """Why ``value`` cannot be a path under the run prefix, or None if it can."""
    if value.startswith("/"):
        return "is absolute; it must be relative to the run prefix"
    if "://" in value:
        return "is a URI; outputs and checkpoints live under the run prefix, give a relative path"
    if "\\" in value:
        return "contains a backslash"
    parts = value.rstrip("/").split("/")
    if any(p in {"", ".", ".."} for p in parts):
        return "contains an empty, '.' or '..' segment, which could escape the run prefix"
    if any(not p.isprintable() or p != p.strip() for p in parts):
        return "contains whitespace at a segment edge or an unprintable character"
    return None


def _uri_problem(value: str) -> str | None:
    if not URI.fullmatch(value):
        return "is not an object-store URI (s3://, gs://, r2:// or file:///)"
    rest = value.split("://", 1)[1]
    if value.startswith("file://") and not rest.startswith("/"):
        return "is a file:// URI without an absolute path (file:///abs/path)"
    if ".." in rest.split("/"):
        return "contains a '..' segment"
    return None


def _check_document(raw: Mapping[str, Any], out: _Collector) -> Workflow | None:
    tools_raw = raw.get("tools")
    stages_raw = raw.get("stages")
    tool_names = set(tools_raw) if isinstance(tools_raw, dict) else set()

    parts_ok = True  # every part parsed on its own
    infra: Infrastructure | None = None
    for key, model in (("metadata", Metadata), ("storage", Storage)):
        if isinstance(raw.get(key), dict):
            parts_ok &= _parse_part(model, raw[key], (key,), out) is not None
    if isinstance(raw.get("infrastructure"), dict):
        infra = _parse_part(Infrastructure, raw["infrastructure"], ("infrastructure",), out)
        parts_ok &= infra is not None
    elif "infrastructure" not in raw:
        infra = Infrastructure()

    tools: dict[str, Tool] = {}
    if isinstance(tools_raw, dict):
        for ref, tool_raw in tools_raw.items():
            tool = _parse_part(Tool, tool_raw, ("tools", ref), out)
            parts_ok &= tool is not None
            if tool is not None:
                tools[ref] = tool
                if parse_image_ref(tool.image) is None:
                    out.add(
                        ("tools", ref, "image"),
                        f"{tool.image!r} is not a valid image reference",
                        "write [registry[:port]/]repository[:tag][@sha256:<64 hex>] in lowercase",
                    )

    stages: list[tuple[int, Stage]] = []
    raw_names: dict[str, int] = {}
    if isinstance(stages_raw, list):
        for i, stage_raw in enumerate(stages_raw):
            if isinstance(stage_raw, dict) and isinstance(stage_raw.get("name"), str):
                name = stage_raw["name"]
                if name in raw_names:
                    out.add(
                        ("stages", i, "name"),
                        f"duplicate stage name {name!r} (first used by stages[{raw_names[name]}])",
                        "give every stage a unique name",
                    )
                else:
                    raw_names[name] = i
            stage = _parse_part(Stage, stage_raw, ("stages", i), out)
            parts_ok &= stage is not None
            if stage is not None:
                stages.append((i, stage))

    declared = {
        s.name: {o.name for o in s.outputs} for _, s in stages if raw_names.get(s.name) is not None
    }
    for i, stage in stages:
        _check_stage(i, stage, tool_names, raw_names, declared, infra, out)

    _check_cycles(stages, raw_names, out)

    if infra is not None:
        if infra.context is not None and not _SAFE_CONTEXT.fullmatch(infra.context):
            out.add(
                ("infrastructure", "context"),
                f"kube context {infra.context!r} cannot be used as a name",
                "use letters, digits and . _ @ : + -, with no '/' and no spaces",
            )
        if parse_accelerators(infra.gpu_nodes.accelerators) is None:
            out.add(
                ("infrastructure", "gpu_nodes", "accelerators"),
                f"{infra.gpu_nodes.accelerators!r} is not NAME:N",
                "write the GPU model and count per node, e.g. H100:8",
            )

    # The per-part pass cannot see the document's own shape (apiVersion, kind, missing or
    # unknown top-level keys, a list where a mapping belongs, invalid tool refs): take those
    # from validating the whole document, and the rest from the parts above.
    try:
        workflow = Workflow.model_validate(raw)
    except ValidationError as exc:
        top = _Collector(out.doc, [])
        _pydantic_issues(exc, (), top)
        seen = {(i.path, i.message) for i in out.issues}
        for err, issue in zip(exc.errors(include_url=False), top.issues, strict=True):
            shape = len(err["loc"]) <= 1 or (err["loc"][0] == "tools" and "[key]" in err["loc"])
            if shape and (issue.path, issue.message) not in seen:
                out.issues.append(issue)
        return None
    return workflow if parts_ok else None


def _check_stage(
    i: int,
    stage: Stage,
    tool_names: set[str],
    stage_index: dict[str, int],
    declared: dict[str, set[str]],
    infra: Infrastructure | None,
    out: _Collector,
) -> None:
    at: Path = ("stages", i)
    if stage.tool not in tool_names:
        known = ", ".join(sorted(tool_names)) or "none declared"
        out.add(
            (*at, "tool"),
            f"unknown tool {stage.tool!r}",
            f"declare it under tools: or use one of: {known}",
        )
    for key in stage.env:
        if key.upper().startswith("NPA_"):
            out.add(
                (*at, "env", key),
                f"environment variable {key!r} uses the reserved NPA_ prefix",
                "rename it; npa sets NPA_* variables itself (run id, stage, inputs, outputs)",
            )

    seen_inputs: set[str] = set()
    for j, inp in enumerate(stage.inputs):
        ip: Path = (*at, "inputs", j)
        if inp.name in seen_inputs:
            out.add((*ip, "name"), f"duplicate input name {inp.name!r}", "name each input once")
        seen_inputs.add(inp.name)
        if (inp.uri is None) == (inp.from_ is None):
            out.add(ip, "an input needs exactly one of 'uri' or 'from'", "keep one of the two")
            continue
        if inp.uri is not None:
            problem = _uri_problem(inp.uri)
            if problem:
                out.add((*ip, "uri"), f"{inp.uri!r} {problem}", "e.g. s3://bucket/raw/")
            continue
        ref = inp.from_ or ""
        src, _, output = ref.partition(".")
        if not src or not output:
            out.add(
                (*ip, "from"),
                f"{ref!r} is not <stage>.<output>",
                "name the upstream stage and one of its outputs, e.g. curate.clips",
            )
        elif src == stage.name:
            out.add((*ip, "from"), "a stage cannot read its own output", "read an upstream stage")
        elif src not in stage_index:
            out.add(
                (*ip, "from"),
                f"unknown stage {src!r}",
                f"use one of: {', '.join(sorted(stage_index)) or 'none'}",
            )
        elif src in declared and output not in declared[src]:
            have = ", ".join(sorted(declared[src])) or "none"
            out.add(
                (*ip, "from"),
                f"stage {src!r} declares no output {output!r}",
                f"declare it under stages[{stage_index[src]}].outputs (declared: {have})",
            )

    seen_outputs: set[str] = set()
    # Each stage writes under its own outputs prefix, so only paths within a stage can clash.
    output_paths: dict[str, int] = {}
    for j, output_decl in enumerate(stage.outputs):
        op: Path = (*at, "outputs", j)
        if output_decl.name in seen_outputs:
            out.add((*op, "name"), f"duplicate output name {output_decl.name!r}", "name each once")
        seen_outputs.add(output_decl.name)
        problem = _relative_path_problem(output_decl.path)
        if problem:
            out.add((*op, "path"), f"{output_decl.path!r} {problem}", "e.g. curated/clips/")
            continue
        key = output_decl.path.rstrip("/")
        if key in output_paths:
            out.add(
                (*op, "path"),
                f"{output_decl.path!r} is also the path of outputs[{output_paths[key]}]",
                "give every output of a stage its own path",
            )
        else:
            output_paths[key] = j

    if stage.checkpoint is not None:
        problem = _relative_path_problem(stage.checkpoint.path)
        if problem:
            out.add(
                (*at, "checkpoint", "path"),
                f"{stage.checkpoint.path!r} {problem}",
                "e.g. checkpoints/augment/",
            )

    seen_deps: set[str] = set()
    for j, dep in enumerate(stage.depends_on):
        if dep == stage.name:
            out.add((*at, "depends_on", j), "a stage cannot depend on itself", "remove it")
        elif dep not in stage_index:
            out.add(
                (*at, "depends_on", j),
                f"unknown stage {dep!r}",
                f"use one of: {', '.join(sorted(stage_index)) or 'none'}",
            )
        elif dep in seen_deps:
            out.add((*at, "depends_on", j), f"{dep!r} is listed twice", "list it once")
        seen_deps.add(dep)

    if stage.waves.parallel > stage.waves.shards:
        out.add(
            (*at, "waves", "parallel"),
            f"parallel ({stage.waves.parallel}) is larger than shards ({stage.waves.shards})",
            "set parallel to at most the number of shards",
        )

    accel = stage.resources.accelerators
    if accel is not None:
        parsed = parse_accelerators(accel)
        if parsed is None:
            out.add(
                (*at, "resources", "accelerators"),
                f"{accel!r} is not NAME:N",
                "write the GPU model and count, e.g. H100:8",
            )
        elif infra is not None:
            node = parse_accelerators(infra.gpu_nodes.accelerators)
            if infra.gpu_nodes.count == 0:
                out.add(
                    (*at, "resources", "accelerators"),
                    f"the stage needs {accel} but infrastructure.gpu_nodes.count is 0",
                    "set infrastructure.gpu_nodes.count to at least 1",
                )
            elif node is not None and (node[0].lower() != parsed[0].lower() or parsed[1] > node[1]):
                out.add(
                    (*at, "resources", "accelerators"),
                    f"{accel} does not fit a GPU node ({infra.gpu_nodes.accelerators})",
                    "request at most the GPUs of one node, of the node's model",
                )


def _check_cycles(stages: list[tuple[int, Stage]], index: dict[str, int], out: _Collector) -> None:
    graph = {s.name: sorted(upstream(s) & set(index)) for _, s in stages}
    position = {s.name: i for i, s in stages}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    reported: set[frozenset[str]] = set()

    for start in graph:
        if state.get(start):
            continue
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(graph[start]))]
        path = [start]
        state[start] = 1
        while stack:
            node, edges = stack[-1]
            nxt = next(edges, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt]
                key = frozenset(cycle)
                if key not in reported:
                    reported.add(key)
                    out.add(
                        ("stages", position[nxt], "depends_on"),
                        "dependency cycle: " + " -> ".join(cycle),
                        "remove one edge; a stage cannot depend on itself, even indirectly",
                    )
            elif nxt in graph and not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(graph[nxt])))


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
    issues = sorted(out.issues, key=lambda i: (i.line or 0, i.column or 0))
    return (workflow if not issues else None), issues


def validate_text(text: str) -> tuple[Workflow | None, list[SpecIssue]]:
    """Parse and validate spec text."""
    doc, problems = load_text(text)
    if doc is None:
        return None, [
            SpecIssue(path="", message=p.message, hint=p.hint, line=p.line, column=p.column)
            for p in problems
        ]
    return validate_document(doc)


def read_spec_text(path: FsPath) -> str:
    """Read a spec file, turning OS errors into clear npa errors."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(
            f"spec file {path} does not exist",
            fix=f"ls {shlex.quote(str(path.parent.absolute()))}  # the specs beside it",
        ) from None
    except IsADirectoryError:
        raise InvalidInput(f"{path} is a directory, not a spec file") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read spec file {path}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"{path} is not UTF-8 text (byte {exc.start})", fix=f"iconv -t UTF-8 {path}"
        ) from None


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
