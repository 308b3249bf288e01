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

from npa.adapters.storage import ObjectAbsent, ObjectStore
from npa.core.errors import NotFound, StateCorrupt
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


def _get_json(store: ObjectStore, key: str) -> Any:
    try:
        return json.loads(store.get(key))
    except ObjectAbsent:
        return None
    except ValueError as exc:
        raise StateCorrupt(f"{store.uri}/{key} is not JSON: {exc}") from None


def scan(store: ObjectStore, where: str) -> RunFacts:
    """Everything the run under ``store`` (opened at its ``npa-workflow`` prefix) left behind."""
    try:
        raw = store.get("manifest.json")
    except ObjectAbsent:
        raise NotFound(
            f"{where} holds no run manifest (manifest.json)",
            fix="npa workbench insights ingest-run --input-path "
            "<store>/<workflow>/<run>/npa-workflow --output-path insights.db",
        ) from None
    try:
        manifest = json.loads(raw)
        workflow, run_id = str(manifest["workflow"]), str(manifest["run_id"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StateCorrupt(f"{where}/manifest.json is not an npa run manifest: {exc}") from None
    plan = _get_json(store, "plan.json") or {}
    plan_stages = {s.get("name"): s for s in plan.get("stages") or [] if isinstance(s, dict)}
    recorded = manifest.get("stages") or {}
    order = list(plan.get("order") or []) or list(recorded)
    order += [s for s in recorded if s not in order]
    objects = [o.key for o in store.list("")]
    supervisor = manifest.get("supervisor") or {}
    stages = []
    for position, name in enumerate(order):
        rec = recorded.get(name) or {}
        waves = rec.get("waves") or []
        tool = (plan_stages.get(name) or {}).get("tool")
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
            for a in supervisor.get("attempts") or []
            if str(a.get("what", "")).startswith(f"stage {name}")
            and a.get("recovery") not in (None, "stopped")
        )
        stages.append(
            StageFacts(
                stage=name,
                position=position,
                state=str(rec.get("state") or "NOT_RECORDED"),
                classification=rec.get("classification"),
                detail=rec.get("detail"),
                started_at=rec.get("started_at"),
                ended_at=rec.get("ended_at"),
                duration_s=_seconds(rec.get("started_at"), rec.get("ended_at")),
                waves=len(waves),
                attempts=sum(int(w.get("attempts") or 0) for w in waves),
                recoveries=recoveries,
                tool=tool,
                image=(manifest.get("images") or {}).get(tool) if tool else None,
                output_bytes=sum(int(v) for v in (rec.get("outputs") or {}).values()),
                metrics=metrics,
                log_tails=tails,
            )
        )
    run_logs = {k: _tail(store.get(k)) for k in objects if k.startswith("logs/")}
    return RunFacts(
        workflow=workflow,
        run_id=run_id,
        project=str(manifest.get("project") or ""),
        backend=str(manifest.get("backend") or ""),
        state=str(manifest.get("state") or ""),
        submitted_at=str(manifest.get("submitted_at") or ""),
        updated_at=str(manifest.get("updated_at") or ""),
        prefix_uri=where,
        manifest_sha256=hashlib.sha256(raw).hexdigest(),
        supervisor={k: v for k, v in supervisor.items() if k != "attempts"}
        | {"attempts": supervisor.get("attempts") or []},
        stages=stages,
        run_logs=run_logs,
    )
