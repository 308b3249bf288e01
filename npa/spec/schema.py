"""The JSON Schema of the workflow spec, for editors (YAML language servers) and other tools."""

from __future__ import annotations

from typing import Any

from npa.spec.model import API_VERSION, Workflow

SCHEMA_ID = "https://npa.dev/schemas/workflow-v1.json"


def workflow_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of ``apiVersion: npa/v1`` workflow specs."""
    schema = Workflow.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": f"npa workflow ({API_VERSION})",
        **schema,
    }
