"""Content-addressed source staging.

A source tree becomes (see docs/storage-layout.md):

- ``<workflow>/npa-source/blobs/<sha256>``: each distinct file content once, shared by every
  run of the workflow, so a new run of an edited tree uploads only what changed;
- ``<workflow>/npa-source/trees/<sha256>.json``: the manifest of one tree (path, digest, size
  and mode of every file), named by its own sha256, the *source digest*; written after every
  blob it names;
- ``<workflow>/npa-source/trees/<sha256>.list``: the same tree as a list a POSIX shell reads
  (:func:`restore_list`), written just before the tree: what a pod restores the files from;
- ``<run prefix>/source/manifest.json``: the run's committed source, the same bytes, written
  last and only if absent. A run's committed source can never change.

Trust the commit, verify on request: an unchanged re-run computes the source digest locally
(a stat index spares reading unchanged files) and confirms the run's committed manifest with
one request. ``verify=True`` lists the blobs and repairs missing or damaged ones.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shlex
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from npa.adapters.storage import ObjectAbsent, ObjectInfo, ObjectStore
from npa.core.errors import (
    InvalidInput,
    LocalStateUnavailable,
    SourceChanged,
    SourceRefused,
    StateCorrupt,
    StoreUnavailable,
    VerificationUnavailable,
)
from npa.core.fsio import atomic_write_bytes
from npa.core.layout import shared_source_key
from npa.runs.ignore import IgnoreRules

MANIFEST_VERSION = 1
# A source tree is code and small assets; bigger files belong in a stage's inputs.
MAX_FILE_BYTES = 1 << 30
READ_CHUNK = 1 << 20
# Upper bound on file bytes held in memory by uploads in flight.
UPLOAD_MEMORY_BYTES = 256 << 20
# Linux's clock for file timestamps (linux/time.h); Python's time module does not name it.
_CLOCK_REALTIME_COARSE = 5


def default_jobs() -> int:
    """Parallel uploads when none are asked for: four per usable CPU, at most 32. Each request
    costs client CPU (signing, parsing), so more threads than that only contend for the GIL;
    on 2 CPUs against a local store 8 beat 16 (bench/stage_vs_s3sync.py)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(32, 4 * cpus))


class ManifestEntry(BaseModel):
    path: str
    digest: str
    size: int
    mode: int


class SourceManifest(BaseModel):
    version: int = MANIFEST_VERSION
    files: list[ManifestEntry]

    def canonical_bytes(self) -> bytes:
        return canonical_manifest([(e.path, e.digest, e.size, e.mode) for e in self.files])

    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical_bytes()).hexdigest()


def canonical_manifest(entries: list[tuple[str, str, int, int]]) -> bytes:
    """The manifest's bytes from ``(path, "sha256:<hex>", size, mode)`` rows: files sorted by
    the UTF-8 bytes of their path, keys sorted, no spaces, one trailing newline; byte for
    byte what ``json.dumps(..., sort_keys=True, separators=(",", ":"))`` gives, written out
    directly because that costs a quarter of a second at 20,000 files."""
    quote = json.encoder.encode_basestring_ascii  # json.dumps' own escaping (ensure_ascii)
    rows = sorted(entries, key=lambda e: e[0].encode())
    files = ",".join(
        f'{{"digest":{quote(d)},"mode":{int(m)},"path":{quote(p)},"size":{int(s)}}}'
        for p, d, s, m in rows
    )
    return f'{{"files":[{files}],"version":{MANIFEST_VERSION}}}\n'.encode()


@dataclass(frozen=True)
class LocalFile:
    path: str  # relative, '/'-separated
    abs_path: str  # a str, not a Path: building 20,000 Paths costs more than the scan
    size: int
    mode: int
    mtime_ns: int
    ctime_ns: int
    ino: int


@dataclass
class HashedFile:
    file: LocalFile
    sha256: str
    md5: str


@dataclass
class StagingTally:
    """What a staging found; the numbers the summary reports."""

    files: list[HashedFile] = field(default_factory=list)
    body: bytes = b""  # the manifest's canonical bytes
    digest: str = ""  # the source digest: sha256 of ``body``
    hashed: int = 0  # files read and hashed; the others reused the stat index
    uploaded: int = 0
    uploaded_bytes: int = 0
    repaired: int = 0
    already_committed: bool = False
    # The store's blobs were listed and checked (asked for, or nothing trusted said they exist).
    listed: bool = False

    def manifest(self) -> SourceManifest:
        """The manifest as a model (parsed on demand: at 20,000 files that takes a while)."""
        return SourceManifest.model_validate_json(self.body)


# --- walking the tree -----------------------------------------------------------------------


def scan_tree(root: Path, rules: IgnoreRules | None = None) -> list[LocalFile]:
    """Every file to stage under ``root``, honouring ignore files (``rules``: what is left out
    at the top, see :mod:`npa.runs.ignore`); refuses escaping symlinks and unchosen
    credentials."""
    root = root.resolve()
    top = rules or IgnoreRules.for_tree(root)
    if not root.is_dir():
        raise InvalidInput(f"source {root} is not a directory")
    out: list[LocalFile] = []
    refused: list[str] = []

    def walk(rel_dir: str, rules: IgnoreRules) -> None:
        rules = rules.enter(root, rel_dir)
        here = root / rel_dir if rel_dir else root
        with os.scandir(here) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = Path(os.path.realpath(entry.path))
                if rules.ignored(rel, is_dir=target.is_dir()):
                    continue  # left out by an ignore file, wherever it points
                if not target.is_relative_to(root):
                    refused.append(f"{rel} -> {os.readlink(entry.path)} (leaves the tree)")
                    continue
                if not target.exists():
                    refused.append(f"{rel} -> {os.readlink(entry.path)} (dangling)")
                    continue
                if target.is_dir():
                    refused.append(f"{rel} -> {os.readlink(entry.path)} (links a directory)")
                    continue
                # A link to a file inside the tree is staged as that file's content.
                st = target.stat()
                out.append(_local(rel, entry.path, st))
            elif stat.S_ISDIR(st.st_mode):
                if not rules.ignored(rel, is_dir=True):
                    walk(rel, rules)
            elif stat.S_ISREG(st.st_mode) and not rules.ignored(rel, is_dir=False):
                out.append(_local(rel, entry.path, st))
            # Sockets, fifos and devices are not source.

    walk("", top)
    top.check(root)
    ignore = shlex.quote(str(root / ".npaignore"))
    if refused:
        links = " ".join(shlex.quote(r.split(" -> ", 1)[0]) for r in refused[:20])
        raise SourceRefused(
            f"source {root} has symlinks npa will not stage: "
            + "; ".join(refused[:20])
            + "; replace each with a copy of what it points to, or leave it out in .npaignore",
            fix=f"printf '%s\\n' {links} >> {ignore}  # leaves them out",
            details={"symlinks": refused},
        )
    big = [f.path for f in out if f.size > MAX_FILE_BYTES]
    if big:
        raise SourceRefused(
            f"source files larger than 1 GiB are not staged: {', '.join(big[:10])}; leave them "
            "out in .npaignore and pass them to the stage as inputs",
            fix=f"printf '%s\\n' {' '.join(shlex.quote(p) for p in big[:20])} >> {ignore}",
        )
    return out


def _local(rel: str, path: str, st: os.stat_result) -> LocalFile:
    return LocalFile(
        rel, path, st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_ctime_ns, st.st_ino
    )


def _changed(path: str) -> SourceChanged:
    return SourceChanged(
        f"{path} changed while npa read it; the staged source would not be one consistent "
        "tree: run the same command again once nothing writes into the source tree"
    )


def _same(a: os.stat_result, f: LocalFile) -> bool:
    return (a.st_size, a.st_mtime_ns, a.st_ctime_ns, a.st_ino) == (
        f.size,
        f.mtime_ns,
        f.ctime_ns,
        f.ino,
    )


def _read_stable(f: LocalFile, sink: Callable[[bytes], None]) -> None:
    """Feed the file's bytes to ``sink`` in chunks, refusing them if the file changed since it
    was scanned or while it was read (size, mtime, ctime or inode differ)."""
    fd = os.open(f.abs_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if not _same(os.fstat(fd), f):
            raise _changed(f.path)
        n = 0
        while chunk := os.read(fd, READ_CHUNK):
            sink(chunk)
            n += len(chunk)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if n != f.size or not _same(after, f):
        raise _changed(f.path)


def read_checked(f: LocalFile) -> bytes:
    """The whole file, read as :func:`_read_stable` does."""
    chunks: list[bytes] = []
    _read_stable(f, chunks.append)
    return b"".join(chunks)


def hash_file(f: LocalFile) -> HashedFile:
    """SHA-256 (the content address) and MD5 (to compare with S3 ETags), streaming."""
    sha, md5 = hashlib.sha256(), hashlib.md5()

    def both(chunk: bytes) -> None:
        sha.update(chunk)
        md5.update(chunk)

    _read_stable(f, both)
    return HashedFile(f, sha.hexdigest(), md5.hexdigest())


class ByteBudget:
    """Bounds the bytes held in memory by concurrent uploads (one file is always allowed)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, n: int) -> Iterator[None]:
        with self._cond:
            while self.used and self.used + n > self.limit:
                self._cond.wait()
            self.used += n
        try:
            yield
        finally:
            with self._cond:
                self.used -= n
                self._cond.notify_all()


def manifest_rows(files: list[HashedFile]) -> list[tuple[str, str, int, int]]:
    return [(h.file.path, "sha256:" + h.sha256, h.file.size, h.file.mode) for h in files]


def build_manifest(files: list[HashedFile]) -> SourceManifest:
    entries = [
        ManifestEntry(path=p, digest=d, size=s, mode=m)
        for p, d, s, m in sorted(manifest_rows(files), key=lambda e: e[0].encode())
    ]
    return SourceManifest(files=entries)


def describe_difference(
    committed: SourceManifest, local: SourceManifest, limit: int = 20
) -> list[str]:
    """The paths that differ between two manifests, each with how."""
    old = {e.path: e for e in committed.files}
    new = {e.path: e for e in local.files}
    out: list[str] = []
    for path in sorted(old.keys() | new.keys()):
        a, b = old.get(path), new.get(path)
        if a is None:
            out.append(f"{path} (not in the committed source)")
        elif b is None:
            out.append(f"{path} (missing from this tree)")
        elif a.digest != b.digest:
            out.append(f"{path} (content differs)")
        elif a.mode != b.mode:
            out.append(f"{path} (mode {a.mode:o} vs {b.mode:o})")
    if len(out) > limit:
        return [*out[:limit], f"... and {len(out) - limit} more"]
    return out


# --- the stat index --------------------------------------------------------------------------


def timestamp_granularity_ns(files: list[LocalFile]) -> int:
    """How far apart two writes must be for their mtimes to differ, as far as npa can tell.

    A tree whose mtimes carry sub-second parts lives on a filesystem with fine timestamps,
    stamped from the kernel's coarse clock (one tick, a few ms); npa allows 20 ms or two
    ticks. A tree of whole-second mtimes may be on a 1 s or 2 s filesystem (ext3, HFS+, FAT):
    2 s."""
    if any(f.mtime_ns % 1_000_000_000 for f in files):
        tick = 0
        if sys.platform == "linux":
            with contextlib.suppress(OSError):
                tick = int(time.clock_getres(_CLOCK_REALTIME_COARSE) * 1e9)
        return max(20_000_000, 2 * tick)
    return 2_000_000_000


class HashIndex:
    """Digests of a tree's files, trusted only while the file's size, mtime, ctime and inode
    are unchanged: git's index idea, so an unchanged re-run reads no file.

    ``reference_ns`` is the clock read before the scan that last confirmed every entry. An
    entry modified less than ``granularity_ns`` before it is *racy*: a write in that same
    timestamp tick would leave the stat unchanged, so it is re-hashed (as git does) and
    becomes trusted once an index written after that tick confirms it. ``committed`` maps a
    shared source location to the last source digest committed there from this tree, which
    lets the next run upload only the blobs that tree does not name.
    """

    VERSION = 2

    def __init__(
        self,
        entries: dict[str, list[Any]] | None = None,
        reference_ns: int = 0,
        granularity_ns: int = 2_000_000_000,
        committed: dict[str, str] | None = None,
    ) -> None:
        self.entries = entries or {}
        self.reference_ns = reference_ns
        self.granularity_ns = granularity_ns
        self.committed = committed or {}

    @classmethod
    def load(cls, path: Path) -> HashIndex:
        try:
            data = json.loads(path.read_bytes())
            if data.get("version") != cls.VERSION:
                return cls()
            return cls(
                dict(data["entries"]),
                int(data["reference_ns"]),
                int(data["granularity_ns"]),
                {str(k): str(v) for k, v in data["committed"].items()},
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return cls()  # a cache: missing or damaged means hash everything

    def save(self, path: Path) -> None:
        """Write the index owner-only and atomically (NPA_HOME's cache). A cache that cannot
        be written (a full or read-only disk) is left as it was: the next run hashes more."""
        body = {
            "version": self.VERSION,
            "reference_ns": self.reference_ns,
            "granularity_ns": self.granularity_ns,
            "committed": self.committed,
            "entries": self.entries,
        }
        with contextlib.suppress(LocalStateUnavailable):
            atomic_write_bytes(path, json.dumps(body, separators=(",", ":")).encode())

    def lookup(self, f: LocalFile) -> HashedFile | None:
        e = self.entries.get(f.path)
        if not e or e[:4] != [f.size, f.mtime_ns, f.ctime_ns, f.ino]:
            return None
        if max(f.mtime_ns, f.ctime_ns) >= self.reference_ns - self.granularity_ns:
            return None  # racy: modified within a timestamp tick of the last confirmation
        return HashedFile(f, str(e[4]), str(e[5]))

    def record(self, files: list[HashedFile], reference_ns: int, granularity_ns: int) -> None:
        """Replace the entries with ``files``, all confirmed after ``reference_ns``."""
        self.entries = {
            h.file.path: [
                h.file.size,
                h.file.mtime_ns,
                h.file.ctime_ns,
                h.file.ino,
                h.sha256,
                h.md5,
            ]
            for h in files
        }
        self.reference_ns = reference_ns
        self.granularity_ns = granularity_ns


# --- staging ---------------------------------------------------------------------------------


class Progress(Protocol):
    """Where staging reports its progress: each phase starts with its totals."""

    def begin(self, phase: str, files: int, nbytes: int) -> None:
        """``phase`` ("hash" or "upload") will process ``files`` files of ``nbytes`` bytes."""

    def advance(self, phase: str, files: int, nbytes: int) -> None:
        """``files`` more files and ``nbytes`` more bytes of ``phase`` are done."""


class _Quiet:
    def begin(self, phase: str, files: int, nbytes: int) -> None:
        pass

    def advance(self, phase: str, files: int, nbytes: int) -> None:
        pass


Step = Callable[[str, dict[str, Any]], None]  # journal hook: (step, details)


class SourceLayout:
    """Keys of a run's source: the run's own commit under its ``npa-workflow`` prefix, and the
    blobs and trees every run of the workflow shares."""

    def __init__(self, run_prefix: str) -> None:
        self.prefix = f"{run_prefix}/source"
        self.manifest = f"{self.prefix}/manifest.json"
        self.shared = shared_source_key(run_prefix)
        self.blobs = f"{self.shared}/blobs/"
        self.trees = f"{self.shared}/trees/"

    def blob(self, sha256: str) -> str:
        return self.blobs + sha256

    def tree(self, digest: str) -> str:
        return f"{self.trees}{digest.removeprefix('sha256:')}.json"

    def tree_list(self, digest: str) -> str:
        return f"{self.trees}{digest.removeprefix('sha256:')}.list"


# Path bytes a restore list writes as they are; every other byte is a printf %b escape.
_LIST_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/+-")


def restore_mode(mode: int) -> int:
    """The mode a restored source file gets: readable by all, its executable bits kept."""
    return mode & 0o755 | 0o644


def restore_list(rows: list[tuple[str, str, int, int]]) -> bytes:
    """A tree as lines a POSIX shell reads with ``read -r sum mode path`` and decodes with
    ``printf '%b'``: the blob's sha256, the octal mode to restore, and the path with every byte
    outside ``[A-Za-z0-9._/+-]`` written ``\\0ooo`` (so spaces, newlines, quotes and non-ASCII
    names stay one field). Rows are ``(path, "sha256:<hex>", size, mode)``, as in the manifest."""
    lines = []
    for path, digest, _size, mode in sorted(rows, key=lambda r: r[0].encode()):
        encoded = "".join(
            chr(b) if b in _LIST_PLAIN else f"\\0{b:03o}" for b in path.encode("utf-8")
        )
        lines.append(f"{digest.removeprefix('sha256:')} {restore_mode(mode):o} {encoded}\n")
    return "".join(lines).encode("ascii")


def _is_md5(etag: str | None) -> bool:
    return etag is not None and len(etag) == 32 and all(c in "0123456789abcdef" for c in etag)


def _intact(info: ObjectInfo | None, size: int, md5: str) -> bool:
    """A stored object is intact when its size matches and, where the store's etag is a plain
    MD5 (single-part S3 uploads), the etag matches the content's MD5 too."""
    if info is None or info.size != size:
        return False
    return info.etag == md5 if _is_md5(info.etag) else True


def _holds(store: ObjectStore, key: str, body: bytes) -> bool | None:
    """Whether ``key`` holds exactly ``body``: one HEAD where the etag is the content MD5 (a
    GET only where it is not); None when the store says the key does not exist."""
    try:
        info = store.head(key)
    except ObjectAbsent:
        return None
    if info.size != len(body):
        return False
    if _is_md5(info.etag):
        return info.etag == hashlib.md5(body).hexdigest()
    try:
        return store.get(key) == body
    except ObjectAbsent:
        return None


def load_committed(store: ObjectStore, layout: SourceLayout) -> SourceManifest | None:
    try:
        raw = store.get(layout.manifest)
    except ObjectAbsent:
        return None
    try:
        return SourceManifest.model_validate_json(raw)
    except ValueError:
        raise StateCorrupt(
            f"{store.uri}/{layout.manifest} is not a source manifest npa wrote; the committed "
            "source of this run cannot be trusted: prepare a new run"
        ) from None


def _location(store: ObjectStore, layout: SourceLayout) -> str:
    """Names the shared source of a workflow in one store on one endpoint (index key)."""
    return f"{store.uri}/{layout.shared}" + (
        f" at {store.endpoint_url}" if store.endpoint_url else ""
    )


def stage_source(
    store: ObjectStore,
    source: Path,
    run_prefix: str,
    *,
    jobs: int | None = None,
    progress: Progress | None = None,
    step: Step | None = None,
    refuse_fix: str = "",
    index: Path | None = None,
    verify: bool = False,
    rules: IgnoreRules | None = None,
    before_commit: Callable[[], None] | None = None,
) -> StagingTally:
    """Stage ``source`` under ``run_prefix``; returns the tally, whose ``manifest()`` is the
    committed source. ``rules``: what the walk leaves out (see :func:`scan_tree`);
    ``before_commit`` runs before the commit, the run prefix's first object (it writes the run's
    index marker).

    ``index`` is a local file remembering the digests of files whose stat has not changed
    (see :class:`HashIndex`); without it every file is read and hashed. When the run already
    has a committed source, one request confirms it is this tree's and nothing else is asked;
    ``verify`` lists the blobs instead and repairs any that are missing or damaged.
    """
    layout = SourceLayout(run_prefix)
    note: Step = step or (lambda _s, _d: None)
    report: Progress = progress or _Quiet()
    plan = StagingTally()
    jobs = max(1, jobs or default_jobs())

    # Read before the scan: a file modified after this moment is never trusted by this index.
    reference_ns = time.time_ns()
    files = scan_tree(source, rules)
    note("scanned", {"files": len(files), "bytes": sum(f.size for f in files)})
    known = HashIndex.load(index) if index is not None else HashIndex()
    granularity = timestamp_granularity_ns(files)

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="npa-stage")
    try:
        plan.files, plan.hashed = _hash_all(pool, files, known, report)
        body = plan.body = canonical_manifest(manifest_rows(plan.files))
        digest = plan.digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if plan.hashed or len(known.entries) != len(files):
            # Saved now, whatever the store says next: these digests are facts about files.
            known.record(plan.files, reference_ns, granularity)
            if index is not None:
                known.save(index)
        note("hashed", {"source_digest": digest, "hashed": plan.hashed})

        local = plan.manifest
        location = _location(store, layout)
        tree_stored, present, committed = False, None, None
        if not verify:
            if _confirm(store, layout, body, local, refuse_fix):
                plan.already_committed = True
                note("committed", {"source_digest": digest, "already": True})
                _remember_commit(known, index, location, digest)
                return plan
            tree_stored, present = _trusted_blobs(
                store, layout, body, digest, known.committed.get(location)
            )
        else:
            committed = load_committed(store, layout)
            if committed is not None and committed.digest() != digest:
                raise _differs(committed, local(), store, layout, refuse_fix)
            plan.already_committed = committed is not None

        todo = [] if tree_stored else _blobs_to_upload(store, layout, plan, present)
        _upload(pool, store, layout, todo, plan, report)
    finally:
        # On an error or Ctrl-C, queued uploads are cancelled rather than run to the end.
        pool.shutdown(wait=True, cancel_futures=True)
    note("blobs", {"uploaded": plan.uploaded, "repaired": plan.repaired, "listed": plan.listed})

    if not tree_stored:
        _store_tree(store, layout, plan, verify)
    if committed is None:
        if before_commit is not None:
            before_commit()
        _commit(store, layout, plan, refuse_fix)
    note("committed", {"source_digest": digest, "already": plan.already_committed})
    _remember_commit(known, index, location, digest)
    return plan


def _blobs_to_upload(
    store: ObjectStore, layout: SourceLayout, plan: StagingTally, present: set[str] | None
) -> list[HashedFile]:
    """One file per distinct digest the store lacks: those not in ``present`` when the blobs
    the store holds are known, else what a listing shows missing or damaged (counted as
    repairs when the blob was there)."""
    by_digest: dict[str, HashedFile] = {}
    for h in plan.files:
        by_digest.setdefault(h.sha256, h)
    if present is not None:
        return [h for d, h in by_digest.items() if d not in present]
    plan.listed = True
    held = {o.key: o for o in store.list(layout.blobs)}
    todo = [
        h for d, h in by_digest.items() if not _intact(held.get(layout.blob(d)), h.file.size, h.md5)
    ]
    plan.repaired = sum(1 for h in todo if layout.blob(h.sha256) in held)
    return todo


def _store_tree(store: ObjectStore, layout: SourceLayout, plan: StagingTally, verify: bool) -> None:
    """The tree (its restore list first), once every blob it names is stored; ``verify``
    rewrites only what does not hold the expected bytes."""
    digest, body = plan.digest, plan.body
    listed = restore_list(manifest_rows(plan.files))
    if not (verify and _holds(store, layout.tree_list(digest), listed)):
        store.put(layout.tree_list(digest), listed, content_md5=_b64md5(listed))
    if not (verify and _holds(store, layout.tree(digest), body)):
        store.put(layout.tree(digest), body, content_md5=_b64md5(body))


def _commit(store: ObjectStore, layout: SourceLayout, plan: StagingTally, refuse_fix: str) -> None:
    """The run's commit, last, so a committed run always has its tree and blobs. Someone who
    committed between our look and our write stands if theirs differs (an error here)."""
    if store.create_if_absent(layout.manifest, plan.body):
        return
    theirs = load_committed(store, layout)
    if theirs is None or theirs.digest() != plan.digest:
        local = plan.manifest()
        raise _differs(theirs or SourceManifest(files=[]), local, store, layout, refuse_fix)
    plan.already_committed = True


def _remember_commit(known: HashIndex, index: Path | None, location: str, digest: str) -> None:
    """Record the tree committed at ``location`` (the next run trusts its blobs)."""
    if known.committed.get(location) != digest:
        known.committed[location] = digest
        if index is not None:
            known.save(index)


def _hash_all(
    pool: ThreadPoolExecutor, files: list[LocalFile], known: HashIndex, report: Progress
) -> tuple[list[HashedFile], int]:
    """Every file's digest: from the index where its stat allows, else read and hashed."""
    reused = [known.lookup(f) for f in files]
    todo = [f for f, h in zip(files, reused, strict=True) if h is None]
    report.begin("hash", len(todo), sum(f.size for f in todo))

    def hashed(f: LocalFile) -> HashedFile:
        h = hash_file(f)
        report.advance("hash", 1, f.size)
        return h

    fresh = iter(list(pool.map(hashed, todo)))
    out = [h if h is not None else next(fresh) for h in reused]
    return out, len(todo)


def _confirm(
    store: ObjectStore,
    layout: SourceLayout,
    body: bytes,
    local: Callable[[], SourceManifest],
    refuse_fix: str,
) -> bool:
    """The single request of a re-run: True when the run's committed manifest is this tree's,
    False when nothing is committed; a different committed tree is refused. A store that
    cannot answer is VERIFICATION_UNAVAILABLE, never "changed"."""
    try:
        same = _holds(store, layout.manifest, body)
        if same is None:
            return False
        if same:
            return True
        # The short answer said "different": read the commit to say how (or to find that the
        # store's metadata misled, and the bytes are this tree's after all).
        committed = load_committed(store, layout)
    except StoreUnavailable as error:
        raise _unverified(store, layout, error) from None
    if committed is None:
        return False
    if committed.canonical_bytes() == body:
        return True
    raise _differs(committed, local(), store, layout, refuse_fix)


def _unverified(
    store: ObjectStore, layout: SourceLayout, error: StoreUnavailable
) -> VerificationUnavailable:
    return VerificationUnavailable(
        f"could not confirm the committed source at {store.uri}/{layout.manifest}; nothing "
        f"was changed and nothing is known to differ: {error.message}",
        fix=error.fix,
        details=error.details,
    )


def _trusted_blobs(
    store: ObjectStore, layout: SourceLayout, body: bytes, digest: str, previous: str | None
) -> tuple[bool, set[str] | None]:
    """What stored trees vouch for, without listing: ``(True, None)`` when this very tree is
    stored already (by another run), so every blob it names is; else the blob digests of the
    tree this directory last committed here. ``(False, None)``: nothing vouches, list."""
    stored = _holds(store, layout.tree(digest), body)
    if stored:
        return True, None
    if stored is False or previous is None or previous == digest:
        return False, None  # a damaged tree object vouches for nothing either
    try:
        raw = store.get(layout.tree(previous))
    except ObjectAbsent:
        return False, None
    if "sha256:" + hashlib.sha256(raw).hexdigest() != previous:
        return False, None  # damaged: vouches for nothing
    try:
        return False, {e["digest"].removeprefix("sha256:") for e in json.loads(raw)["files"]}
    except (ValueError, KeyError, TypeError, AttributeError):
        return False, None


def _b64md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def _upload(
    pool: ThreadPoolExecutor,
    store: ObjectStore,
    layout: SourceLayout,
    todo: list[HashedFile],
    plan: StagingTally,
    report: Progress,
) -> None:
    report.begin("upload", len(todo), sum(h.file.size for h in todo))
    lock = threading.Lock()
    budget = ByteBudget(UPLOAD_MEMORY_BYTES)

    def upload(h: HashedFile) -> None:
        with budget.hold(h.file.size):
            data = read_checked(h.file)
            if hashlib.sha256(data).hexdigest() != h.sha256:
                raise _changed(h.file.path)
            md5 = base64.b64encode(bytes.fromhex(h.md5)).decode()
            store.put(layout.blob(h.sha256), data, content_md5=md5)
        with lock:
            plan.uploaded += 1
            plan.uploaded_bytes += len(data)
        report.advance("upload", 1, len(data))

    for _ in pool.map(upload, todo):
        pass


def _differs(
    committed: SourceManifest,
    local: SourceManifest,
    store: ObjectStore,
    layout: SourceLayout,
    fix: str,
) -> SourceRefused:
    diff = describe_difference(committed, local)
    return SourceRefused(
        f"run already has a committed source ({committed.digest()} at "
        f"{store.uri}/{layout.manifest}) and this tree differs: {'; '.join(diff)}"
        + ("" if fix else "; prepare a new run for a different source"),
        fix=fix or None,
        details={"committed": committed.digest(), "local": local.digest(), "differs": diff},
    )
