"""The JSON Schema of the workflow spec, for editors (YAML language servers) and other tools.

It is generated from the same pydantic models ``validate-spec`` validates with (in strict mode),
so a value the schema refuses is one npa refuses too. The schema cannot express the rules that
need the whole document (references, cycles, duplicates, fit); ``validate-spec`` adds those.
"""

from __future__ import annotations

from typing import Any

from npa.spec.model import API_VERSION, Workflow

SCHEMA_ID = "https://npa.dev/schemas/workflow-v1.json"


def _closed_maps(node: Any) -> Any:
    """A map whose keys must match a pattern is rendered by pydantic as ``patternProperties``,
    which lets a key that does not match through. npa refuses such keys, so say so:
    ``propertyNames`` carries the pattern and every value gets the value schema."""
    if isinstance(node, list):
        return [_closed_maps(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _closed_maps(value) for key, value in node.items()}
    patterns = out.get("patternProperties")
    if isinstance(patterns, dict) and len(patterns) == 1 and "additionalProperties" not in out:
        ((pattern, values),) = patterns.items()
        del out["patternProperties"]
        out["propertyNames"] = {**out.get("propertyNames", {}), "pattern": pattern}
        out["additionalProperties"] = values
    return out


def workflow_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of ``apiVersion: npa/v1`` workflow specs."""
    schema = _closed_maps(Workflow.model_json_schema(by_alias=True, mode="validation"))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": f"npa workflow ({API_VERSION})",
        **schema,
    }
