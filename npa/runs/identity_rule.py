"""Whose manifest it is: the one identity rule every reader of a stored run applies.

Kept apart from :mod:`npa.runs.reading` (which needs the plan and manifest models) so that a
reader holding only a manifest's identity fields, as ``list`` does, applies the same rule
without importing those models. :mod:`npa.runs.reading` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from npa.core.errors import RunMismatch
from npa.core.layout import PREFIX_LEAF, run_prefix


class ManifestIdentity(Protocol):
    """The fields of a manifest that say whose record it is."""

    @property
    def run_id(self) -> str: ...
    @property
    def workflow(self) -> str: ...
    @property
    def prefix(self) -> str: ...
    @property
    def project(self) -> str: ...


@dataclass(frozen=True)
class RunKey:
    """Where a manifest was found: the run id, workflow and prefix its store key names, and the
    project the reader asked about (None when the reader has no project, as ``insights``)."""

    run_id: str
    workflow: str
    prefix: str  # <workflow>/<run>/npa-workflow, relative to the store
    project: str | None = None


def key_of_prefix_uri(uri: str) -> RunKey:
    """The run key a run prefix URI (``…/<workflow>/<run>/npa-workflow``) names; a URI of
    another shape yields the key its last parts would name, which no run's manifest matches."""
    parts = uri.rstrip("/").split("/")
    if parts[-1] == PREFIX_LEAF:
        parts = parts[:-1]
    workflow, run_id = (["", *parts])[-2:]
    return RunKey(run_id=run_id, workflow=workflow, prefix=run_prefix(workflow, run_id))


def _status_command(run_id: str, project: str) -> str:
    return f"npa workbench workflow status {run_id} --project {project}"


def check_run_identity(m: ManifestIdentity, key: RunKey, where: str) -> RunMismatch | None:
    """None when ``m`` is the record of the run ``key`` names; else the one error every reader
    reports (``where`` is the manifest's address, for the message)."""
    mine = (m.run_id, m.workflow, m.prefix)
    if mine != (key.run_id, key.workflow, key.prefix):
        fields = [
            name
            for name, theirs, ours in zip(
                ("run_id", "workflow", "prefix"),
                mine,
                (key.run_id, key.workflow, key.prefix),
                strict=True,
            )
            if theirs != ours
        ]
        error = RunMismatch(
            f"the manifest at {where} is the record of run {m.run_id} of workflow {m.workflow} "
            f"(prefix {m.prefix}, project {m.project}), not of run {key.run_id} of workflow "
            f"{key.workflow} whose key it is under ({', '.join(fields)} disagree); none of its "
            "state is shown as this run's",
            fix=_status_command(m.run_id, m.project) + "  # the run it names",
        )
        error.details["disagree"] = fields
    elif key.project is not None and m.project != key.project:
        error = RunMismatch(
            f"the manifest at {where} is the record of run {m.run_id} of project {m.project}, "
            f"not of project {key.project}; none of its state is shown as this project's",
            fix=_status_command(m.run_id, m.project),
        )
        error.details["disagree"] = ["project"]
    else:
        return None
    error.details["manifest"] = {
        "run_id": m.run_id, "workflow": m.workflow, "prefix": m.prefix, "project": m.project,
    }  # fmt: skip
    return error
