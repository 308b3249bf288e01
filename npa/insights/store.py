"""The local insights store: one SQLite file, one row set per run.

Ingesting a run replaces that run's rows inside one transaction, so re-ingesting the same run
leaves the store exactly as it was, and a run that moved on (a re-ingest after it finished)
is updated rather than duplicated. Runs are keyed by ``<workflow>/<run id>``.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from npa.core.errors import InvalidInput, NotFound, NpaError, local_state_error
from npa.core.fsio import refusals_named
from npa.core.suggest import unknown
from npa.insights.scan import RunFacts, StageFacts

SCHEMA_VERSION = 1
DEFAULT_NAME = "insights.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_key TEXT PRIMARY KEY, workflow TEXT NOT NULL, run_id TEXT NOT NULL,
    project TEXT, backend TEXT, state TEXT, submitted_at TEXT, updated_at TEXT,
    prefix_uri TEXT, manifest_sha256 TEXT NOT NULL, supervisor TEXT NOT NULL,
    ingested_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS stages (
    run_key TEXT NOT NULL, stage TEXT NOT NULL, position INTEGER NOT NULL,
    state TEXT NOT NULL, classification TEXT, detail TEXT,
    started_at TEXT, ended_at TEXT, duration_s REAL,
    waves INTEGER NOT NULL, attempts INTEGER NOT NULL, recoveries INTEGER NOT NULL,
    tool TEXT, image TEXT, output_bytes INTEGER NOT NULL,
    PRIMARY KEY (run_key, stage)
);
CREATE TABLE IF NOT EXISTS metrics (
    run_key TEXT NOT NULL, stage TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL,
    PRIMARY KEY (run_key, stage, name)
);
CREATE TABLE IF NOT EXISTS logs (
    run_key TEXT NOT NULL, stage TEXT, key TEXT NOT NULL, tail TEXT NOT NULL,
    PRIMARY KEY (run_key, key)
);
"""
_TABLES = ("runs", "stages", "metrics", "logs")
Change = Literal["added", "updated", "unchanged"]


def resolve(path: Path) -> Path:
    """A directory names ``<dir>/insights.sqlite``; anything else is the database file."""
    return path / DEFAULT_NAME if path.is_dir() else path


@contextmanager
def connect(path: Path, *, create: bool) -> Iterator[sqlite3.Connection]:
    """The store at ``path``; with ``create``, made if missing. A store this call made is
    removed again when the block fails: a full disk leaves no half-made database behind."""
    db = resolve(path)
    if not create and not db.is_file():
        raise NotFound(
            f"no insights store at {db}",
            fix="npa workbench workflow list --json  # then ingest-run a run_prefix it prints "
            f"with --output-path {shlex.quote(str(path))}",
        )
    made = create and not db.exists()
    try:
        if create:
            _create_private(db)
        with _opened(db, create=create) as conn:
            yield conn
    except BaseException:
        if made:
            for leftover in (db, db.with_name(db.name + "-journal")):
                with suppress(FileNotFoundError):
                    leftover.unlink()
        raise


@contextmanager
def _opened(db: Path, *, create: bool) -> Iterator[sqlite3.Connection]:
    try:
        conn = sqlite3.connect(db if create else f"file:{db}?mode=ro", uri=not create)
    except sqlite3.Error as exc:
        raise _refused(exc, db) or InvalidInput(f"cannot open {db} as SQLite: {exc}") from None
    try:
        if create:
            conn.executescript(_SCHEMA)
            conn.execute(
                "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
        yield conn
    except sqlite3.DatabaseError as exc:
        raise _refused(exc, db) or InvalidInput(
            f"{db} is not an npa insights store: {exc}"
        ) from None
    finally:
        conn.close()


def _refused(exc: sqlite3.Error, db: Path) -> NpaError | None:
    """SQLite's word for the system refusing the file (a full disk, a read-only mount, a
    missing permission, an I/O error) as the npa error any refused write of npa is; None for
    an answer about the file's content."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary code of an extended one
    if code == sqlite3.SQLITE_FULL:
        number = errno.ENOSPC
    elif code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM):
        number = errno.EROFS if _on_read_only_mount(db) else errno.EACCES
    elif code == sqlite3.SQLITE_IOERR:
        number = errno.EIO
    else:
        return None
    return local_state_error(OSError(number, os.strerror(number)), "write the insights store", db)


def _on_read_only_mount(db: Path) -> bool:
    try:
        return bool(os.statvfs(db.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _create_private(db: Path) -> None:
    """The store holds log tails: owner-only from its first byte (SQLite gives its journal the
    same mode), and tightened if an earlier version left it readable by others."""
    with refusals_named("create the folder of the insights store", db.parent):
        db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if db.exists() and not db.is_file():
        raise _not_a_file(db)
    # Non-blocking: a FIFO that appears meanwhile is refused, not waited on.
    with refusals_named("create the insights store", db):
        fd = os.open(db, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_a_file(db)
        if info.st_uid == os.getuid() and info.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def _not_a_file(db: Path) -> InvalidInput:
    return InvalidInput(
        f"--output-path {db} is not a regular file; the insights store is a SQLite file",
        fix="--output-path " + shlex.quote(str(db.parent / "insights.db")),  # a new file
    )


def run_key(facts: RunFacts) -> str:
    return f"{facts.workflow}/{facts.run_id}"


def ingest(conn: sqlite3.Connection, facts: RunFacts) -> Change:
    """Replace the run's rows with ``facts`` in one transaction."""
    key = run_key(facts)
    row = conn.execute("SELECT manifest_sha256 FROM runs WHERE run_key = ?", (key,)).fetchone()
    if row is not None and row[0] == facts.manifest_sha256:
        return "unchanged"
    with conn:
        for table in _TABLES:
            conn.execute(f"DELETE FROM {table} WHERE run_key = ?", (key,))
        conn.execute(
            "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                key, facts.workflow, facts.run_id, facts.project, facts.backend, facts.state,
                facts.submitted_at, facts.updated_at, facts.prefix_uri, facts.manifest_sha256,
                json.dumps(facts.supervisor, sort_keys=True),
                datetime.now(UTC).isoformat(timespec="seconds"),
            ),
        )  # fmt: skip
        for s in facts.stages:
            conn.execute(
                "INSERT INTO stages VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    key, s.stage, s.position, s.state, s.classification, s.detail, s.started_at,
                    s.ended_at, s.duration_s, s.waves, s.attempts, s.recoveries, s.tool, s.image,
                    s.output_bytes,
                ),
            )  # fmt: skip
            conn.executemany(
                "INSERT INTO metrics VALUES (?,?,?,?)",
                [(key, s.stage, n, v) for n, v in sorted(s.metrics.items())],
            )
            conn.executemany(
                "INSERT INTO logs VALUES (?,?,?,?)",
                [(key, s.stage, k, t) for k, t in sorted(s.log_tails.items())],
            )
        conn.executemany(
            "INSERT INTO logs VALUES (?,?,?,?)",
            [(key, None, k, t) for k, t in sorted(facts.run_logs.items())],
        )
    return "added" if row is None else "updated"


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    return {t: int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in _TABLES}


def load(conn: sqlite3.Connection, run: str) -> RunFacts:
    """The stored run named ``run`` (a run id, or ``<workflow>/<run id>``)."""
    column = "run_key" if "/" in run else "run_id"
    rows = conn.execute(f"SELECT * FROM runs WHERE {column} = ?", (run,)).fetchall()
    if not rows:
        known = [r[0] for r in conn.execute("SELECT run_key FROM runs ORDER BY run_key")]
        ids = [k.split("/", 1)[-1] for k in known] if column == "run_id" else known
        raise NotFound(
            unknown("run", run, ids) + " (runs of the insights store)",
            fix=f"npa workbench workflow list --json  # run {run}'s run_prefix, for ingest-run",
        )
    if len(rows) > 1:
        raise InvalidInput(
            f"run id {run!r} is stored for several workflows: {', '.join(r[0] for r in rows)}; "
            "name one of them by that key",
        )
    names = [d[1] for d in conn.execute("PRAGMA table_info(runs)")]
    r: dict[str, Any] = dict(zip(names, rows[0], strict=True))
    key = r["run_key"]
    snames = [d[1] for d in conn.execute("PRAGMA table_info(stages)")]
    stages = []
    for srow in conn.execute("SELECT * FROM stages WHERE run_key = ? ORDER BY position", (key,)):
        s: dict[str, Any] = dict(zip(snames, srow, strict=True))
        metrics = dict(
            conn.execute(
                "SELECT name, value FROM metrics WHERE run_key = ? AND stage = ?", (key, s["stage"])
            ).fetchall()
        )
        tails = dict(
            conn.execute(
                "SELECT key, tail FROM logs WHERE run_key = ? AND stage = ?", (key, s["stage"])
            ).fetchall()
        )
        del s["run_key"]
        stages.append(StageFacts(**s, metrics=metrics, log_tails=tails))
    return RunFacts(
        workflow=r["workflow"],
        run_id=r["run_id"],
        project=r["project"],
        backend=r["backend"],
        state=r["state"],
        submitted_at=r["submitted_at"],
        updated_at=r["updated_at"],
        prefix_uri=r["prefix_uri"],
        manifest_sha256=r["manifest_sha256"],
        supervisor=json.loads(r["supervisor"]),
        stages=stages,
    )
