"""The operation journal: an append-only, secret-free record of each step of an operation.

One journal per operation id (``operations/<id>.jsonl``). Its first record holds the one
command that resumes the operation; it is built from canonical arguments (absolute paths, the
explicit run id), so every interruption of the same operation prints the same command.
"""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from npa.core.errors import StateCorrupt
from npa.core.fsio import append_line
from npa.core.paths import NpaPaths
from npa.runs.secrets import ensure_secret_free


class OperationJournal:
    """Append records to, and read back, the journal of one operation."""

    def __init__(self, paths: NpaPaths, operation_id: str) -> None:
        self.operation_id = operation_id
        self.path: Path = paths.operation_journal(operation_id)

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out: list[dict[str, Any]] = []
        for number, line in enumerate(self.path.read_text("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                # A crash can cut the last line short; any other bad line is damage.
                if number == len(self.path.read_text("utf-8").splitlines()):
                    continue
                raise StateCorrupt(
                    f"{self.path} line {number} is not JSON",
                    fix=f"mv {self.path} {self.path}.broken",
                ) from None
        return out

    def begin(self, operation: str, resume_argv: list[str], **details: Any) -> str:
        """Start (or resume) the operation; returns the resume command as one shell line."""
        command = shlex.join(resume_argv)
        first = self.records()[:1]
        if first and first[0].get("resume") != command:
            # Same operation id, different arguments: the journal keeps the original command.
            command = str(first[0].get("resume"))
        self.append("begin" if not first else "resume", "started", resume=command, **details)
        return command

    def append(self, step: str, status: str, **details: Any) -> None:
        record = {
            "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "operation": self.operation_id,
            "step": step,
            "status": status,
            **details,
        }
        line = json.dumps(record, sort_keys=True, ensure_ascii=False)
        append_line(self.path, ensure_secret_free(line, f"journal {self.path}"))
