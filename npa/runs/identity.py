"""Run identity: reserve a run id up front, in a locked, atomic record per project and workflow.

The record lives at ``runs/<project>/<workflow>.json`` and is scoped by the project's stable
identity (its recorded id, not just the alias) and the workflow's identity (the spec's
``metadata.name``). The historical global ``paidf-first-run-id`` file is only reported: it is
never reused, rewritten or deleted.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from npa.core.errors import InvalidInput, StateCorrupt
from npa.core.fsio import atomic_write_json, exclusive_lock, read_json
from npa.core.paths import NpaPaths, safe_component

RECORD_VERSION = 1


class RunEntry(BaseModel):
    """One reserved run."""

    run_id: str
    reserved_at: str
    spec: str
    spec_sha256: str
    store: str
    # The source directory the user staged for this run, once staging has begun: a retry
    # without --source reuses it rather than falling back to a default.
    source: str | None = None


class ReservationRecord(BaseModel):
    """Every run reserved for one workflow of one project."""

    version: int = RECORD_VERSION
    project: str
    project_identity: str
    workflow: str
    runs: list[RunEntry] = []

    def find(self, run_id: str) -> RunEntry | None:
        return next((r for r in self.runs if r.run_id == run_id), None)


def read_spec_identity(spec_path: Path) -> tuple[str, str]:
    """The workflow identity (``metadata.name``) and the sha256 of the spec file.

    Only ``metadata.name`` is read here; ``validate-spec`` (and submit's spec gate) check the
    rest.
    """
    from npa.spec.loader import load_text
    from npa.spec.validate import read_spec_text

    text = read_spec_text(spec_path)
    loaded, problems = load_text(text)
    if loaded is None:
        raise InvalidInput(
            f"spec {spec_path} is not valid YAML: {problems[0].message}",
            fix=f"npa workbench workflow validate-spec {spec_path}",
        )
    doc = loaded.data
    name = doc.get("metadata", {}).get("name") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict) or not name:
        raise InvalidInput(
            f"spec {spec_path} has no metadata.name, which names the workflow",
            fix=f"npa workbench workflow validate-spec {spec_path}",
        )
    workflow = safe_component(str(name), "workflow name (metadata.name)")
    return workflow, hashlib.sha256(text.encode("utf-8")).hexdigest()


def new_run_id(now: datetime | None = None) -> str:
    """A fresh run id: UTC time to the second plus 24 random bits (``20260101-120000-a1b2c3``).

    Lower-case letters, digits and '-', so it is valid in S3 keys, Kubernetes names and paths.
    """
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def load_record(
    paths: NpaPaths, project: str, project_identity: str, workflow: str
) -> ReservationRecord:
    """The reservation record, or an empty one; refuses a record of a different project."""
    path = paths.run_reservation(project, workflow)
    if not path.exists():
        return ReservationRecord(
            project=project, project_identity=project_identity, workflow=workflow
        )
    data: Any = read_json(path)
    try:
        record = ReservationRecord.model_validate(data)
    except ValidationError as exc:
        raise StateCorrupt(
            f"{path} is not a run reservation record: {exc.errors()[0]['msg']}",
            fix=f"mv {path} {path}.broken  # keep it for inspection",
        ) from None
    if record.project_identity != project_identity or record.workflow != workflow:
        raise InvalidInput(
            f"the runs recorded in {path} belong to project identity {record.project_identity}, "
            f"but project {project!r} is now {project_identity}; npa will not mix their runs",
            fix=f"npa configure --show --project {project}  # or use a new project alias",
        )
    return record


def reserve_run(
    paths: NpaPaths,
    *,
    project: str,
    project_identity: str,
    workflow: str,
    spec: Path,
    spec_sha256: str,
    store: str,
) -> RunEntry:
    """Reserve a new, distinct run id and record it atomically under the record's lock."""
    path = paths.run_reservation(project, workflow)
    with exclusive_lock(
        paths.lock(f"runs.{project}.{workflow}"), timeout=10, purpose="reserving a run id"
    ):
        record = load_record(paths, project, project_identity, workflow)
        run_id = new_run_id()
        while record.find(run_id) is not None:
            run_id = new_run_id()
        entry = RunEntry(
            run_id=run_id,
            reserved_at=datetime.now(UTC).isoformat(timespec="seconds"),
            spec=str(spec.resolve()),
            spec_sha256=spec_sha256,
            store=store,
        )
        record.runs.append(entry)
        atomic_write_json(path, record.model_dump(mode="json"))
    return entry


def remember_source(
    paths: NpaPaths,
    *,
    project: str,
    project_identity: str,
    workflow: str,
    run_id: str,
    source: Path,
) -> None:
    """Record the source directory a run is staged from (first one wins; it never changes)."""
    path = paths.run_reservation(project, workflow)
    with exclusive_lock(
        paths.lock(f"runs.{project}.{workflow}"), timeout=10, purpose="recording a run's source"
    ):
        record = load_record(paths, project, project_identity, workflow)
        entry = record.find(run_id)
        if entry is None or entry.source is not None:
            return
        entry.source = str(source)
        atomic_write_json(path, record.model_dump(mode="json"))


def legacy_run_id_warning(paths: NpaPaths) -> str | None:
    """A warning when the historical global run-id file exists; it is only ever read."""
    legacy = paths.legacy_first_run_id
    try:
        with legacy.open("rb") as f:
            head = f.read(128)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"warning: cannot read legacy {legacy} ({exc.strerror}); ignoring it"
    shown = head.decode("utf-8", "replace").strip().splitlines()[0] if head.strip() else ""
    return (
        f"warning: legacy {legacy} exists (holding {shown!r}); npa does not reuse it for new "
        "runs and leaves it untouched — resume an old run explicitly with --resume-run RUN_ID"
    )
