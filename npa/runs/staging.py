"""Content-addressed source staging.

A source tree becomes, under the run's prefix (see docs/storage-layout.md):

- ``source/blobs/<sha256>``: each distinct file content once;
- ``source/manifest.json``: path, digest, size and mode of every file, written *last* and only
  if absent. Its sha256 is the source digest.

Because the manifest is written after every blob it names, and only once, a reader who finds a
manifest finds a complete source, and a run's committed source can never change. Repeating a
staging of the same tree repairs missing or damaged blobs and uploads nothing else; staging a
different tree under the same run is refused, naming the files that differ.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from npa.adapters.storage import ObjectAbsent, ObjectInfo, ObjectStore
from npa.core.errors import InvalidInput, NpaError, StateCorrupt
from npa.core.fsio import atomic_write_json
from npa.runs.ignore import IgnoreRules

MANIFEST_VERSION = 1
# A source tree is code and small assets; bigger files belong in a stage's inputs.
MAX_FILE_BYTES = 1 << 30
READ_CHUNK = 1 << 20
# Upper bound on file bytes held in memory by uploads in flight.
UPLOAD_MEMORY_BYTES = 256 << 20


def default_jobs() -> int:
    """Parallel uploads when none are asked for: four per usable CPU, at most 32. Each request
    costs client CPU (signing, parsing), so more threads than that only contend for the GIL;
    on 2 CPUs against a local store 8 beat 16 (bench/stage_vs_s3sync.py)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(32, 4 * cpus))


class SourceChanged(NpaError):
    """A file changed while npa read it; the staged source would not be one consistent tree."""

    kind = "source_changed"


class SourceRefused(InvalidInput):
    """The tree cannot be staged as it is (escaping symlink, committed source differs, ...)."""

    kind = "source_refused"


class ManifestEntry(BaseModel):
    path: str
    digest: str
    size: int
    mode: int


class SourceManifest(BaseModel):
    version: int = MANIFEST_VERSION
    files: list[ManifestEntry]

    def canonical_bytes(self) -> bytes:
        body = self.model_dump(mode="json")
        return (json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n").encode()

    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical_bytes()).hexdigest()


@dataclass(frozen=True)
class LocalFile:
    path: str  # relative, '/'-separated
    abs_path: Path
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
class StagePlan:
    """What a staging found; the numbers the summary reports."""

    files: list[HashedFile] = field(default_factory=list)
    uploaded: int = 0
    uploaded_bytes: int = 0
    repaired: int = 0
    orphans_removed: int = 0
    already_committed: bool = False


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
                if not target.is_relative_to(root):
                    refused.append(f"{rel} -> {os.readlink(entry.path)} (leaves the tree)")
                    continue
                if not target.exists():
                    refused.append(f"{rel} -> {os.readlink(entry.path)} (dangling)")
                    continue
                if target.is_dir():
                    if not rules.ignored(rel, is_dir=True):
                        refused.append(f"{rel} -> {os.readlink(entry.path)} (links a directory)")
                    continue
                if rules.ignored(rel, is_dir=False):
                    continue
                # A link to a file inside the tree is staged as that file's content.
                st = target.stat()
                out.append(_local(rel, Path(entry.path), st))
            elif stat.S_ISDIR(st.st_mode):
                if not rules.ignored(rel, is_dir=True):
                    walk(rel, rules)
            elif stat.S_ISREG(st.st_mode) and not rules.ignored(rel, is_dir=False):
                out.append(_local(rel, Path(entry.path), st))
            # Sockets, fifos and devices are not source.

    walk("", top)
    top.check(root)
    if refused:
        raise SourceRefused(
            f"source {root} has symlinks npa will not stage: " + "; ".join(refused[:20]),
            fix="replace each with a copy of what it points to, or list it in .npaignore",
            details={"symlinks": refused},
        )
    big = [f.path for f in out if f.size > MAX_FILE_BYTES]
    if big:
        raise SourceRefused(
            f"source files larger than 1 GiB are not staged: {', '.join(big[:10])}",
            fix="list them in .npaignore and pass them to the stage as inputs",
        )
    return out


def _local(rel: str, path: Path, st: os.stat_result) -> LocalFile:
    return LocalFile(
        rel, path, st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_ctime_ns, st.st_ino
    )


def _changed(path: str) -> SourceChanged:
    return SourceChanged(
        f"{path} changed while npa read it; the staged source would not be one consistent tree",
        fix="rerun the same command once nothing is writing into the source tree",
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


def build_manifest(files: list[HashedFile]) -> SourceManifest:
    entries = [
        ManifestEntry(
            path=h.file.path, digest="sha256:" + h.sha256, size=h.file.size, mode=h.file.mode
        )
        for h in sorted(files, key=lambda h: h.file.path.encode())
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


class HashIndex:
    """Digests of files already hashed, keyed by path and trusted only while the file's size,
    mtime, ctime and inode are unchanged — git's index idea, so an unchanged re-run reads
    nothing. An entry modified within ``RACY_NS`` of the moment the index was saved is not
    trusted (a write in the same timestamp tick would not show in the stat)."""

    RACY_NS = 2_000_000_000

    def __init__(self, entries: dict[str, list[Any]] | None = None, saved_ns: int = 0) -> None:
        self.entries = entries or {}
        self.saved_ns = saved_ns

    @classmethod
    def load(cls, path: Path) -> HashIndex:
        try:
            data = json.loads(path.read_bytes())
            return cls(dict(data["entries"]), int(data["saved_ns"]))
        except (OSError, ValueError, KeyError, TypeError):
            return cls()  # a cache: missing or damaged means hash everything

    @staticmethod
    def save(path: Path, files: list[HashedFile]) -> None:
        entries = {
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
        atomic_write_json(path, {"saved_ns": time.time_ns(), "entries": entries})

    def lookup(self, f: LocalFile) -> HashedFile | None:
        e = self.entries.get(f.path)
        if not e or e[:4] != [f.size, f.mtime_ns, f.ctime_ns, f.ino]:
            return None
        if max(f.mtime_ns, f.ctime_ns) >= self.saved_ns - self.RACY_NS:
            return None
        return HashedFile(f, str(e[4]), str(e[5]))


# --- staging ---------------------------------------------------------------------------------

Progress = Callable[[str, int], None]  # (phase, bytes just processed)
Step = Callable[[str, dict[str, Any]], None]  # journal hook: (step, details)


class SourceLayout:
    """Keys of a run's source under its ``npa-workflow`` prefix."""

    def __init__(self, run_prefix: str) -> None:
        self.prefix = f"{run_prefix}/source"
        self.blobs = f"{self.prefix}/blobs/"
        self.manifest = f"{self.prefix}/manifest.json"

    def blob(self, sha256: str) -> str:
        return self.blobs + sha256


def _intact(info: ObjectInfo | None, h: HashedFile) -> bool:
    """A stored blob is intact when its size matches and, where the store's etag is a plain
    MD5 (single-part S3 uploads), the etag matches the content's MD5 too."""
    if info is None or info.size != h.file.size:
        return False
    etag = info.etag
    if etag and len(etag) == 32 and all(c in "0123456789abcdef" for c in etag):
        return etag == h.md5
    return True


def load_committed(store: ObjectStore, layout: SourceLayout) -> SourceManifest | None:
    try:
        raw = store.get(layout.manifest)
    except ObjectAbsent:
        return None
    try:
        return SourceManifest.model_validate_json(raw)
    except ValueError:
        raise StateCorrupt(
            f"{store.uri}/{layout.manifest} is not a source manifest npa wrote",
            fix="prepare a new run: the committed source of this one cannot be trusted",
        ) from None


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
    rules: IgnoreRules | None = None,
) -> tuple[SourceManifest, StagePlan]:
    """Stage ``source`` under ``run_prefix`` and return the committed manifest and the tally.

    ``index`` is a local file remembering the digests of files whose stat has not changed
    (see :class:`HashIndex`); without it every file is read and hashed.
    """
    layout = SourceLayout(run_prefix)
    note: Step = step or (lambda _s, _d: None)
    tick: Progress = progress or (lambda _p, _n: None)
    plan = StagePlan()
    jobs = max(1, jobs or default_jobs())

    files = scan_tree(source, rules)
    note("scanned", {"files": len(files), "bytes": sum(f.size for f in files)})

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="npa-stage")
    try:
        # The store is asked what it holds while the tree is hashed.
        committed_f = pool.submit(load_committed, store, layout)
        held_f = pool.submit(lambda: {o.key: o for o in store.list(layout.blobs)})

        known = HashIndex.load(index) if index is not None else HashIndex()

        def hashed(f: LocalFile) -> HashedFile:
            h = known.lookup(f) or hash_file(f)
            tick("hash", f.size)
            return h

        plan.files = list(pool.map(hashed, files))
        if index is not None:
            HashIndex.save(index, plan.files)
        local = build_manifest(plan.files)
        committed = committed_f.result()
        held: dict[str, ObjectInfo] = held_f.result()
        note("hashed", {"source_digest": local.digest()})

        if committed is not None:
            if committed.digest() != local.digest():
                raise _differs(committed, local, store, layout, refuse_fix)
            plan.already_committed = True

        by_digest: dict[str, HashedFile] = {}
        for h in plan.files:
            by_digest.setdefault(h.sha256, h)
        todo = [h for d, h in by_digest.items() if not _intact(held.get(layout.blob(d)), h)]
        plan.repaired = sum(1 for h in todo if layout.blob(h.sha256) in held)
        missing = {h.sha256 for h in todo}
        tick("skip", sum(h.file.size for d, h in by_digest.items() if d not in missing))
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
            tick("upload", len(data))

        for _ in pool.map(upload, todo):
            pass
    finally:
        # On an error or Ctrl-C, queued uploads are cancelled rather than run to the end.
        pool.shutdown(wait=True, cancel_futures=True)
    note("blobs", {"uploaded": plan.uploaded, "repaired": plan.repaired, "held": len(held)})

    if committed is None and not store.create_if_absent(layout.manifest, local.canonical_bytes()):
        # Someone committed between our look and our write: theirs stands if it differs.
        committed = load_committed(store, layout)
        if committed is None or committed.digest() != local.digest():
            raise _differs(committed or SourceManifest(files=[]), local, store, layout, refuse_fix)
        plan.already_committed = True
    note("committed", {"source_digest": local.digest(), "already": plan.already_committed})

    wanted = {layout.blob(h.sha256) for h in plan.files}
    for key in sorted(set(held) - wanted):
        # Blobs of an interrupted staging of some other tree, never named by the manifest.
        store.delete(key)
        plan.orphans_removed += 1
    return local, plan


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
        f"{store.uri}/{layout.manifest}) and this tree differs: {'; '.join(diff)}",
        fix=fix or "prepare a new run for a different source",
        details={"committed": committed.digest(), "local": local.digest(), "differs": diff},
    )
