"""Which run an operation acts on. A run is never picked silently: it is named, or chosen.

- ``--resume-run RUN_ID`` names a reserved run; an unknown id is an error, never a new run.
- Without it, a non-interactive shell is refused (listing the candidates and both ways on);
  an interactive one is asked, and may decline.
- ``prepare-run`` is how a new, distinct run is made.
"""

from __future__ import annotations

from collections.abc import Callable

from npa.core.errors import InvalidInput, NotFound
from npa.runs.identity import ReservationRecord, RunEntry

Ask = Callable[[list[RunEntry]], str | None]


def choose_run(
    record: ReservationRecord,
    resume_run: str | None,
    *,
    spec_sha256: str,
    interactive: bool,
    ask: Ask | None = None,
    prepare_command: str,
) -> tuple[RunEntry, list[str]]:
    """The run to act on and any warnings about it (e.g. the spec changed since it was made)."""
    if resume_run is not None:
        entry = record.find(resume_run)
        if entry is None:
            raise NotFound(
                f"run {resume_run!r} is not reserved for workflow {record.workflow!r} in project "
                f"{record.project!r}",
                fix=f'RUN_ID="$({prepare_command})"',
            )
        return entry, _stale(entry, spec_sha256)

    candidates = list(reversed(record.runs))
    if not candidates:
        raise InvalidInput(
            f"no run is reserved for workflow {record.workflow!r} in project {record.project!r}",
            fix=f'RUN_ID="$({prepare_command})"',
        )
    listed = ", ".join(
        c.run_id + (" (spec changed since)" if c.spec_sha256 != spec_sha256 else "")
        for c in candidates[:5]
    )
    if not interactive or ask is None:
        raise InvalidInput(
            "which run? npa never picks one silently; name it with --resume-run RUN_ID "
            f"(recent: {listed}) or prepare a new run",
            fix=f'RUN_ID="$({prepare_command})"',
        )
    chosen = ask(candidates)
    entry = record.find(chosen) if chosen else None
    if entry is None:
        raise InvalidInput("no run chosen", fix=f'RUN_ID="$({prepare_command})"')
    return entry, _stale(entry, spec_sha256)


def _stale(entry: RunEntry, spec_sha256: str) -> list[str]:
    if entry.spec_sha256 == spec_sha256:
        return []
    return [f"warning: the spec changed since run {entry.run_id} was reserved ({entry.spec})"]
