"""validate-spec and schema: read-only checks of a workflow spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field

from npa.core.errors import EXIT_INVALID
from npa.core.output import Result
from npa.core.text import plural
from npa.spec.model import API_VERSION
from npa.spec.validate import SpecIssue, read_spec_text, validate_text


class ValidateResult(Result):
    """Every problem in a spec, or confirmation that it is valid."""

    spec: str
    valid: bool
    workflow: str | None
    stages: int
    issues: list[SpecIssue]

    def text_lines(self) -> list[str]:
        if self.valid:
            stages = plural(self.stages, "stage")
            return [f"ok: {self.spec} is a valid workflow {self.workflow!r} ({stages})"]
        noun = "issue" if len(self.issues) == 1 else "issues"
        lines = [f"invalid: {self.spec} has {len(self.issues)} {noun}"]
        for issue in self.issues:
            where = f"{self.spec}:{issue.line}:{issue.column}" if issue.line else self.spec
            lines.append(f"  {where}: {issue.path or '<document>'}: {issue.message}")
            lines.append(f"      hint: {issue.hint}")
        return lines

    def exit_code(self) -> int:
        return 0 if self.valid else EXIT_INVALID


def validate_spec(path: Path) -> ValidateResult:
    """Validate the spec at ``path``. Reads the file; writes nothing."""
    workflow, issues = validate_text(read_spec_text(path))
    return ValidateResult(
        spec=str(path),
        valid=workflow is not None,
        workflow=workflow.metadata.name if workflow else None,
        stages=len(workflow.stages) if workflow else 0,
        issues=issues,
    )


class SchemaResult(Result):
    """The JSON Schema of the spec. Text output is the schema document itself."""

    api_version: str
    json_schema: dict[str, Any] = Field(description="JSON Schema, draft 2020-12.")

    def text_lines(self) -> list[str]:
        return json.dumps(self.json_schema, indent=2, sort_keys=True).splitlines()


def spec_schema() -> SchemaResult:
    from npa.spec.schema import workflow_json_schema

    return SchemaResult(api_version=API_VERSION, json_schema=workflow_json_schema())
