"""The ``file://`` backend: the embedded store under NPA_HOME, or any local directory.

Writes go to a temporary file under ``<root>/.npa-tmp`` and are renamed into place, so a reader
(or a process killed mid-write) never sees a partial object under its key. create-if-absent
publishes with ``link(2)``, which fails atomically when the key exists — the ``O_EXCL`` guarantee
without ever exposing a half-written file. A writer killed mid-write leaves its temporary file,
whose name carries the writer (host, pid and start time: :func:`npa.core.procs.writer_tag`).
Every write first removes the temporary files of writers of this host that no longer run, and
those of other hosts' writers (the store may be a shared folder) untouched for
:data:`TMP_MAX_AGE` seconds (a live writer keeps touching its own).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import uuid
from pathlib import Path

from npa.adapters.storage.base import ListPage, ObjectInfo, ObjectStore, check_key
from npa.core.errors import (
    InvalidInput,
    LocalStateUnavailable,
    ObjectAbsent,
    StoreUnavailable,
    os_fix,
    os_reason,
)
from npa.core.fsio import ensure_private_dir, remove_abandoned_temps
from npa.core.procs import TEMP_MAX_AGE, writer_tag

TMP_DIR = ".npa-tmp"
TMP_MAX_AGE = TEMP_MAX_AGE


class FileStore(ObjectStore):
    """Objects as files under ``root``; a key's ``/`` separators become directories."""

    read_concurrency = 1

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = root.as_uri()

    def _path(self, key: str) -> Path:
        check_key(key)
        if key.split("/", 1)[0] == TMP_DIR:
            raise InvalidInput(f"object key {key!r} is reserved for the file store's own use")
        return self.root / key

    def _unavailable(
        self, exc: OSError | LocalStateUnavailable, what: str, key: str
    ) -> StoreUnavailable:
        code = exc.errno if isinstance(exc, OSError) else exc.details.get("errno")
        reason = os_reason(exc) if isinstance(exc, OSError) else exc.message
        return StoreUnavailable(
            f"could not {what} {self.uri}/{key}: {reason}",
            fix=os_fix(self.root, code),
            details={"store": self.uri, "errno": code},
        )

    def sweep_temps(self, *, now: float | None = None) -> int:
        """Remove the temporary files killed writers left (:func:`remove_abandoned_temps`);
        returns how many. Done at every write."""
        return remove_abandoned_temps(self.root / TMP_DIR, now=now)

    def _write_tmp(self, data: bytes) -> Path:
        self.sweep_temps()
        tmp_dir = ensure_private_dir(self.root / TMP_DIR)
        tmp = tmp_dir / f"{writer_tag()}-{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # a full disk: never leave the part written
            raise
        return tmp

    def put(self, key: str, data: bytes, *, content_md5: str | None = None) -> ObjectInfo:
        path = self._path(key)
        try:
            tmp = self._write_tmp(data)
            try:
                ensure_private_dir(path.parent)
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        except (OSError, LocalStateUnavailable) as exc:
            raise self._unavailable(exc, "write", key) from None
        return ObjectInfo(key, len(data))

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectAbsent(f"{self.uri}/{key} does not exist") from None
        except OSError as exc:
            raise self._unavailable(exc, "read", key) from None

    def head(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectAbsent(f"{self.uri}/{key} does not exist") from None
        except OSError as exc:
            raise self._unavailable(exc, "look up", key) from None
        if not path.is_file():
            raise ObjectAbsent(f"{self.uri}/{key} is a prefix, not an object")
        return ObjectInfo(key, st.st_size)

    def list_page(
        self, prefix: str, *, token: str | None = None, page_size: int = 1000
    ) -> ListPage:
        # Walk only the directory the prefix names; keys sort like S3's (by UTF-8 bytes).
        start = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        keys: list[str] = []
        try:
            for dirpath, dirnames, filenames in os.walk(start, onerror=_raise):
                rel_dir = os.path.relpath(dirpath, self.root)
                if rel_dir == ".":
                    dirnames[:] = [d for d in dirnames if d != TMP_DIR]
                    rel_dir = ""
                for name in filenames:
                    key = f"{rel_dir}/{name}" if rel_dir else name
                    if key.startswith(prefix) and (token is None or key > token):
                        keys.append(key)
        except FileNotFoundError:
            keys = []
        except OSError as exc:
            raise self._unavailable(exc, "list", prefix) from None
        keys.sort(key=str.encode)
        # Only the page's own objects are looked up: a page of a large folder costs its page.
        page: list[ObjectInfo] = []
        more = False
        for key in keys:
            if len(page) == page_size:
                more = True
                break
            try:
                page.append(ObjectInfo(key, os.stat(self.root / key).st_size))
            except FileNotFoundError:
                continue  # deleted since the walk
            except OSError as exc:
                raise self._unavailable(exc, "list", prefix) from None
        return ListPage(tuple(page), page[-1].key if more else None)

    def children(self, prefix: str) -> builtins.list[str]:
        folder = self.root / prefix.rstrip("/") if prefix else self.root
        try:
            names = [e.name for e in os.scandir(folder) if e.is_dir() and e.name != TMP_DIR]
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise self._unavailable(exc, "list", prefix) from None
        return sorted(names, key=str.encode)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._unavailable(exc, "delete", key) from None

    def create_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        try:
            tmp = self._write_tmp(data)
            try:
                ensure_private_dir(path.parent)
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        except (OSError, LocalStateUnavailable) as exc:
            raise self._unavailable(exc, "create", key) from None
        return True


def _raise(exc: OSError) -> None:
    raise exc
