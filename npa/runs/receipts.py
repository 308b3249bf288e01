"""Submission receipts: ``workflow-submissions/<project>/<run>.json``, owner-only.

A receipt is what lets any later shell find a run without environment variables: where its
objects are, which plan and source it ran, and which job carries it. It names where
credentials come from, never what they are.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from npa.core.errors import NotFound, StateCorrupt
from npa.core.fsio import atomic_write_bytes, read_json
from npa.core.paths import NpaPaths
from npa.runs.secrets import ensure_secret_free

RECEIPT_VERSION = 1


class JobIdentity(BaseModel):
    backend: str
    job_id: str | None = None
    job_name: str | None = None


class Receipt(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = RECEIPT_VERSION
    project: str
    project_identity: str
    workflow: str
    run_id: str
    submitted_at: str
    store: str
    workflow_prefix: str
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    credentials_source: str
    source_digest: str | None = None
    plan_digest: str | None = None
    # Stage -> sha256 of the task file launched for it (what `render --run-id` must reproduce).
    tasks: dict[str, str] = Field(default_factory=dict)
    runtime: str | None = None  # container | process
    job: JobIdentity | None = None


def write_receipt(paths: NpaPaths, receipt: Receipt) -> Path:
    """Write (or replace) the receipt atomically with mode 0600."""
    path = paths.submission_receipt(receipt.project, receipt.run_id)
    text = json.dumps(receipt.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(path, ensure_secret_free(text, f"receipt {path}").encode("utf-8"))
    return path


def read_receipt(paths: NpaPaths, project: str, run_id: str) -> Receipt:
    path = paths.submission_receipt(project, run_id)
    if not path.exists():
        raise NotFound(
            f"no receipt for run {run_id} of project {project} at {path}",
            fix=f"ls {path.parent}",
        )
    try:
        return Receipt.model_validate(read_json(path))
    except ValidationError as exc:
        raise StateCorrupt(
            f"{path} is not a submission receipt: {exc.errors()[0]['msg']}",
            fix=f"mv {path} {path}.broken",
        ) from None


def list_receipts(paths: NpaPaths, project: str) -> list[Receipt]:
    """Every receipt of ``project``, oldest first."""
    folder = paths.submission_receipt(project, "x").parent
    receipts = [read_receipt(paths, project, p.stem) for p in sorted(folder.glob("*.json"))]
    return sorted(receipts, key=lambda r: r.submitted_at)
