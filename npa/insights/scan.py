"""Read one run prefix into a :class:`RunFacts`: nothing in the run had to be instrumented.

Sources, all already written by submit and the backends (docs/storage-layout.md):
``manifest.json`` (states, waves, supervisor record, outputs), ``plan.json`` (stage order and
tools), ``stages/<stage>/logs/*.log`` and ``logs/supervisor.log`` (tails only), and metrics files
in two known schemas anywhere under ``stages/<stage>/``: ``metrics.json`` (a JSON object; numeric
leaves, nested keys joined with ``.``) and ``metrics.jsonl`` (one object per line, either
``{"name": N, "value": V}`` or numeric leaves; the last value of a name wins).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from npa.adapters.storage import ObjectAbsent, ObjectStore, inspect_command
from npa.core.errors import NotFound
from npa.core.layout import MANIFEST_NAME, PLAN_NAME
from npa.runs.manifest import RunManifest, parse_manifest, parse_plan, read_pages
from npa.runs.reading import check_run_identity, key_of_prefix_uri, shown_stage_states
from npa.runs.secrets import KnownSecrets

TAIL_LINES = 20
TAIL_BYTES = 4096
METRIC_FILES = ("metrics.json", "metrics.jsonl")


@dataclass
class StageFacts:
    stage: str
    position: int
    state: str
    classification: str | None
    detail: str | None
    started_at: str | None
    ended_at: str | None
    duration_s: float | None
    waves: int
    attempts: int  # wave attempts in total; retries = attempts - waves
    recoveries: int  # supervisor records about this stage that took a recovery
    tool: str | None
    image: str | None
    output_bytes: int
    metrics: dict[str, float] = field(default_factory=dict)
    log_tails: dict[str, str] = field(default_factory=dict)  # log key -> last lines

    @property
    def retries(self) -> int:
        return max(0, self.attempts - self.waves)

    @property
    def image_digest(self) -> str | None:
        if self.image and "@" in self.image:
            return self.image.rsplit("@", 1)[1]
        return None


@dataclass
class RunFacts:
    workflow: str
    run_id: str
    project: str
    backend: str
    state: str
    submitted_at: str
    updated_at: str
    prefix_uri: str
    manifest_sha256: str
    supervisor: dict[str, Any]
    stages: list[StageFacts]
    run_logs: dict[str, str] = field(default_factory=dict)


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        return round(
            (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 3
        )
    except ValueError:
        return None


def _tail(data: bytes) -> str:
    text = data[-TAIL_BYTES:].decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-TAIL_LINES:])


def _scrub(value: Any, secrets: KnownSecrets) -> Any:
    if isinstance(value, str):
        return secrets.redact(value)
    if isinstance(value, list):
        return [_scrub(v, secrets) for v in value]
    if isinstance(value, dict):
        return {_scrub(k, secrets): _scrub(v, secrets) for k, v in value.items()}
    return value


def redact_facts(facts: RunFacts, secrets: KnownSecrets) -> RunFacts:
    """``facts`` with every known credential value replaced by the name of its source, in
    every text copied out of the run (a stage may have echoed one into its log)."""
    stages = [
        replace(
            s,
            classification=_scrub(s.classification, secrets),
            detail=_scrub(s.detail, secrets),
            metrics=_scrub(s.metrics, secrets),
            log_tails=_scrub(s.log_tails, secrets),
        )
        for s in facts.stages
    ]
    return replace(
        facts,
        stages=stages,
        supervisor=_scrub(facts.supervisor, secrets),
        run_logs=_scrub(facts.run_logs, secrets),
    )


def _numeric_leaves(value: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(value, bool):
        return out
    if isinstance(value, int | float):
        out[prefix] = float(value)
    elif isinstance(value, dict):
        for key, inner in value.items():
            out.update(_numeric_leaves(inner, f"{prefix}.{key}" if prefix else str(key)))
    return out


def parse_metrics(name: str, data: bytes) -> dict[str, float]:
    """Metrics from one file of a known schema; unreadable content yields nothing."""
    text = data.decode("utf-8", errors="replace")
    if name == "metrics.json":
        try:
            return _numeric_leaves(json.loads(text))
        except ValueError:
            return {}
    found: dict[str, float] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        if "name" in row and isinstance(row.get("value"), int | float):
            found[str(row["name"])] = float(row["value"])
        else:
            found.update(_numeric_leaves(row))
    return found


def _stage_facts(
    store: ObjectStore,
    objects: list[str],
    manifest: RunManifest,
    name: str,
    position: int,
    tool: str | None,
    state: str,
) -> StageFacts:
    """One stage: its record, its metrics files and the tails of its logs."""
    rec = manifest.stages.get(name)
    waves = rec.waves if rec is not None else []
    prefix = f"stages/{name}/"
    metrics: dict[str, float] = {}
    tails: dict[str, str] = {}
    for key in objects:
        if not key.startswith(prefix):
            continue
        base = key.rsplit("/", 1)[-1]
        if base in METRIC_FILES:
            metrics.update(parse_metrics(base, store.get(key)))
        elif key.startswith(prefix + "logs/") and base.endswith(".log"):
            tails[key] = _tail(store.get(key))
    recoveries = sum(
        1
        for a in manifest.supervisor.attempts
        if a.what.startswith(f"stage {name}") and a.recovery not in (None, "stopped")
    )
    started = rec.started_at if rec is not None else None
    ended = rec.ended_at if rec is not None else None
    return StageFacts(
        stage=name,
        position=position,
        state=state,
        classification=rec.classification if rec is not None else None,
        detail=rec.detail if rec is not None else None,
        started_at=started,
        ended_at=ended,
        duration_s=_seconds(started, ended),
        waves=len(waves),
        attempts=sum(w.attempts for w in waves),
        recoveries=recoveries,
        tool=tool,
        image=manifest.images.get(tool) if tool else None,
        output_bytes=sum(rec.outputs.values()) if rec is not None else 0,
        metrics=metrics,
        log_tails=tails,
    )


def scan(store: ObjectStore, where: str) -> RunFacts:
    """Everything the run under ``store`` (opened at its run prefix) left behind."""
    try:
        raw = store.get(MANIFEST_NAME)
    except ObjectAbsent:
        raise NotFound(
            f"{where} holds no run manifest ({MANIFEST_NAME})",
            fix=inspect_command(store, "", listing=True)
            + f"  # a run prefix holds {MANIFEST_NAME}; npa workbench workflow list --json "
            "shows them",
        ) from None
    manifest = parse_manifest(
        raw, f"{where}/{MANIFEST_NAME}", inspect_command(store, MANIFEST_NAME)
    )
    # The same identity check every reader makes: another run's manifest under this key is
    # reported, never ingested as this run.
    mismatch = check_run_identity(manifest, key_of_prefix_uri(where), f"{where}/{MANIFEST_NAME}")
    if mismatch is not None:
        raise mismatch
    read_pages(store, "", manifest)
    try:
        plan = parse_plan(
            store.get(PLAN_NAME), f"{where}/{PLAN_NAME}", inspect_command(store, PLAN_NAME)
        )
    except ObjectAbsent:
        plan = None
    tools = {s.name: s.tool for s in plan.stages} if plan is not None else {}
    recorded = manifest.stages
    order = (list(plan.order) if plan is not None else []) or list(recorded)
    order += [s for s in recorded if s not in order]
    objects = [o.key for o in store.list("")]
    # A final run's stages read as every reader shows them (only final states).
    shown = shown_stage_states(manifest, order)
    stages = [
        _stage_facts(store, objects, manifest, name, position, tools.get(name), shown[name].state)
        for position, name in enumerate(order)
    ]
    supervisor = manifest.supervisor.model_dump(mode="json")
    run_logs = {k: _tail(store.get(k)) for k in objects if k.startswith("logs/")}
    return RunFacts(
        workflow=manifest.workflow,
        run_id=manifest.run_id,
        project=manifest.project,
        backend=manifest.backend,
        state=manifest.state,
        submitted_at=manifest.submitted_at,
        updated_at=manifest.updated_at,
        prefix_uri=where,
        manifest_sha256=hashlib.sha256(raw).hexdigest(),
        supervisor={k: v for k, v in supervisor.items() if k != "attempts"}
        | {"attempts": supervisor["attempts"]},
        stages=stages,
        run_logs=run_logs,
    )
