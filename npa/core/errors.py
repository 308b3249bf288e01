"""Every error npa reports to a user, in one hierarchy.

Every failure a user can meet is an :class:`NpaError`: a message that says what is wrong, an exit
code, and where one exists the exact command that fixes it. The CLI prints these cleanly (never a
traceback) and, under ``--json``, as an object whose ``kind`` is the class's.

The tree (exit code in brackets; a subclass keeps its parent's unless it says otherwise)::

    NpaError [1]
    +-- InvalidInput [2]                 the user's input is wrong
    |   +-- InvalidStoreUri                  a store URI npa cannot use
    |   +-- SourceRefused                    a source tree that cannot be staged as it is
    +-- NotFound [3]                     every applicable source said it does not exist
    |   +-- ObjectAbsent                     a store key
    |   +-- BucketAbsent                     the bucket or file-store root itself
    +-- Unavailable [4]                  a source could not be asked: unknown, never absent
    |   +-- StoreUnavailable                 the object store
    |   |   +-- VerificationUnavailable          it could not confirm a committed source
    |   +-- BackendUnavailable               an execution backend (nothing is concluded)
    |   +-- NotStable                        an API that is not stable enough to launch into
    |   +-- AmbiguousExistence               whether a run's job exists cannot be told
    |   +-- LocalStateUnavailable            a folder on this machine refused (full, read-only)
    |   +-- RunMismatch                      the manifest under a run's key is another run's
    +-- LockBusy [5]                     another process holds a lock npa needs
    +-- ToolMissing [6]                  an external tool is not installed
    +-- StateCorrupt [1]                 a state file npa cannot read as what it wrote
    +-- SecretLeak [1]                   a record about to be written holds a credential value
    +-- SourceChanged [1]                a file changed while it was staged
    +-- StackOperationFailed [1]         the pulumi engine failed a stack operation
    +-- BackendError [1]                 a backend refused or failed an operation
    |   +-- TransientRefusal                 refused for a reason that may pass
    |   +-- LaunchRejected [2]               the job itself was rejected
    +-- LaunchStopped [1]                supervision ended a launch (it carries the final state)
    +-- GatesFailed [1]                  a gate of submit did not pass; nothing was written
    |   +-- GatesUnknown [4]                 every gate that did not pass could not be asked
    +-- Interrupted [130]                the user stopped a multi-step operation

Exceptions that never reach a user (control flow inside one module) are not part of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

# Exit codes are part of the CLI contract; scripts branch on them.
EXIT_OK = 0
EXIT_FAILURE = 1  # a command ran and found the thing it checks not ok
EXIT_INVALID = 2  # bad input: usage, spec, reference
EXIT_NOT_FOUND = 3  # authoritatively absent
EXIT_UNAVAILABLE = 4  # could not verify: a source failed; never means "absent"
EXIT_BUSY = 5  # another process holds the lock
EXIT_TOOL_MISSING = 6  # a required external tool is not installed


class NpaError(Exception):
    """Base of every error npa reports to a user."""

    exit_code: ClassVar[int] = EXIT_FAILURE
    kind: ClassVar[str] = "error"

    def __init__(
        self,
        message: str,
        *,
        fix: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of the error, as ``--json`` prints it."""
        body: dict[str, Any] = {
            "kind": self.kind,
            "message": self.message,
            "exit_code": self.exit_code,
        }
        if self.fix:
            body["fix"] = self.fix
        if self.details:
            body["details"] = self.details
        return {"error": body}


class InvalidInput(NpaError):
    """The user's input (flags, spec, names, references) is wrong."""

    exit_code = EXIT_INVALID
    kind = "invalid_input"


class NotFound(NpaError):
    """Every applicable source answered authoritatively that the thing does not exist."""

    exit_code = EXIT_NOT_FOUND
    kind = "not_found"


class Unavailable(NpaError):
    """A source could not be asked or did not answer: unknown, never absent."""

    exit_code = EXIT_UNAVAILABLE
    kind = "unavailable"


class RunMismatch(Unavailable):
    """The manifest stored under a run's key names another run (its id, workflow, prefix or
    project disagree with the key): nothing of it is shown as the run's, and nothing about the
    run is concluded from it."""

    kind = "run_mismatch"


class LockBusy(NpaError):
    """Another process holds an exclusive lock npa needs."""

    exit_code = EXIT_BUSY
    kind = "lock_busy"


class ToolMissing(NpaError):
    """An external tool (pulumi, kube-apiserver, ...) is not installed where npa looks."""

    exit_code = EXIT_TOOL_MISSING
    kind = "tool_missing"


class StateCorrupt(NpaError):
    """A local state file exists but cannot be read as what npa wrote."""

    exit_code = EXIT_FAILURE
    kind = "state_corrupt"


# --- input ------------------------------------------------------------------------------------


class InvalidStoreUri(InvalidInput):
    kind = "invalid_store_uri"


class SourceRefused(InvalidInput):
    """The tree cannot be staged as it is (escaping symlink, committed source differs, ...)."""

    kind = "source_refused"


# --- the object store ---------------------------------------------------------------------------


class ObjectAbsent(NotFound):
    """The store answered that this key does not exist."""

    kind = "object_absent"


class BucketAbsent(NotFound):
    """The bucket (or the file-store root) itself does not exist: a configuration problem."""

    kind = "bucket_absent"


class StoreUnavailable(Unavailable):
    """The store could not be reached, refused us, or answered something npa cannot trust.

    ``details["refused"]`` is true when the store refused the credentials (a person must fix
    them); ``details["errno"]`` holds the operating system's answer for a file store."""

    kind = "store_unavailable"


class VerificationUnavailable(StoreUnavailable):
    """The store could not confirm a run's committed source: unknown, never "changed"."""

    kind = "verification_unavailable"


# --- records and staging ------------------------------------------------------------------------


class SecretLeak(NpaError):
    kind = "secret_leak"


class SourceChanged(NpaError):
    """A file changed while npa read it; the staged source would not be one consistent tree."""

    kind = "source_changed"


class StackOperationFailed(NpaError):
    """The pulumi engine reported a failure for a stack operation."""

    kind = "stack_operation_failed"


# --- backends and launching ---------------------------------------------------------------------


class BackendError(NpaError):
    """A backend refused or failed an operation."""

    kind = "backend_error"


class BackendUnavailable(Unavailable):
    """The backend could not be asked: nothing may be concluded about existence."""

    kind = "backend_unavailable"


class TransientRefusal(BackendError):
    """The backend refused to create its controller for a reason that may pass (API server
    restarting, controller pod evicted, quota being released). Retrying is allowed only after
    the job's absence is proven."""

    kind = "transient_refusal"


class LaunchRejected(BackendError):
    """The backend rejected the job itself (bad task, unknown infra): retrying cannot help."""

    exit_code = InvalidInput.exit_code
    kind = "launch_rejected"


class LocalStateUnavailable(Unavailable):
    """The operating system refused a read or write of npa's own files on this machine (a full
    disk, a read-only mount, a missing permission): nothing about the run itself is concluded.
    Once the fix is applied, the command that failed recovers when run again (:func:`with_rerun`
    names it; the CLI does so with the command line as given when nothing more exact did)."""

    kind = "local_state_unavailable"


class NotStable(Unavailable):
    """The API a launch goes to did not answer ready long enough in a row."""

    kind = "api_not_stable"


class AmbiguousExistence(Unavailable):
    """npa cannot tell whether the run's job exists: launching could duplicate it."""

    kind = "ambiguous_existence"


class LaunchStopped(NpaError):
    """Supervision ended the launch (FAILED_STARTUP, recovery exhausted, or a rejection);
    ``state`` is the run's final state (a :class:`npa.backends.base.JobState`)."""

    kind = "launch_stopped"

    def __init__(self, message: str, *, state: Enum, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.state = state


# --- commands -----------------------------------------------------------------------------------


class GatesFailed(NpaError):
    """At least one gate did not pass; nothing was staged or launched."""

    exit_code = EXIT_FAILURE
    kind = "gates_failed"


class GatesUnknown(GatesFailed):
    """Every gate that did not pass could not be asked (a store or API that did not answer):
    nothing is known to be wrong, so the exit code says "unavailable", as it would later on."""

    exit_code = EXIT_UNAVAILABLE


class Interrupted(NpaError):
    """The user stopped a multi-step operation; its journal holds the resume command."""

    exit_code = 130
    kind = "interrupted"


# --- the operating system -----------------------------------------------------------------------

_FULL = (errno.ENOSPC, errno.EDQUOT)
_READ_ONLY = (errno.EROFS,)
_DENIED = (errno.EACCES, errno.EPERM)


def _nearest_existing(path: Path | str, *, folder: bool = False) -> Path:
    """``path``, or its nearest ancestor that exists (with ``folder``, that is a folder):
    ``df``, ``findmnt`` and ``ls`` refuse a path that is not there, such as the file a refused
    write was to create, or one removed since."""
    found = Path(path)
    with contextlib.suppress(OSError):
        while found.parent != found and not (found.is_dir() if folder else found.exists()):
            found = found.parent
    return found


def _open_file_limits() -> tuple[int, int]:
    """This process's open-file limits (soft, hard); unlimited as -1."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return int(soft), int(hard)


def os_reason(exc: OSError) -> str:
    """What the system said about ``exc``, with what it means where the words alone mislead:
    a full disk or quota, and an open-file limit (a limit on this process, not a missing or
    unwritable file)."""
    reason = exc.strerror or str(exc)
    if exc.errno in _FULL:
        reason += " (the filesystem is full)" if exc.errno == errno.ENOSPC else " (quota exceeded)"
    elif exc.errno == errno.EMFILE:
        reason += f" (npa reached this process's limit of {_open_file_limits()[0]} open files)"
    elif exc.errno == errno.ENFILE:
        reason += " (the system's table of open files is full)"
    return reason


def _open_files_fix() -> str:
    """The command that raises the open-file limit of the shell npa runs from, to what the
    hard limit allows (or, when the hard limit is the soft one, for root to raise both)."""
    soft, hard = _open_file_limits()
    wanted = max(4096, 4 * soft)
    if hard < 0 or hard > soft:
        raised = wanted if hard < 0 else min(hard, wanted)
        return f"ulimit -n {raised}  # this shell's open-file limit is {soft}"
    return (
        f"sudo prlimit --pid $$ --nofile={wanted}:{wanted}  # this shell's open-file limit is "
        f"{soft}, its hard limit too"
    )


def os_fix(path: Path | str, code: int | None) -> str:
    """What a person runs about an OS refusal at ``path``: a command with real values, and the
    step it shows in a comment. A full or read-only disk is a filesystem's state, so its
    command names the folder (``path`` or the nearest that exists), which stays there."""
    if code == errno.EMFILE:
        return _open_files_fix()
    if code == errno.ENFILE:
        return "cat /proc/sys/fs/file-nr  # files open system-wide, unused, and the limit"
    path = _nearest_existing(path, folder=code in _FULL or code in _READ_ONLY)
    if code in _FULL:
        what = "quota" if code == errno.EDQUOT else "space"
        return f"df -h {path}  # free {what} on that filesystem"
    if code in _READ_ONLY:
        return f"findmnt -T {path}  # remount it read-write, or point NPA_HOME at a writable folder"
    if code in _DENIED:
        return f"ls -ld {path}  # make it readable and writable by you (chown or chmod)"
    return f"ls -ld {path}  # check that it exists and that you can write there"


def local_state_error(exc: OSError, action: str, path: Path | str | None = None) -> NpaError:
    """The npa error for an OS refusal of ``action`` (``write``, ``lock``, ...) on one of npa's
    own files: the path, what the system said, and the fix."""
    if path is None and exc.filename is None:
        return _unnamed_refusal(exc, action)
    where = path if path is not None else exc.filename
    return LocalStateUnavailable(
        f"could not {action} {where}: {os_reason(exc)}",
        fix=os_fix(where, exc.errno),
        details={"path": str(where), "errno": exc.errno},
    )


def _unnamed_refusal(exc: OSError, action: str) -> NpaError:
    """The last resort, for a refusal nobody named the file of (a write's ENOSPC carries no
    name; npa's writers name their own): the two folders npa writes in, never a ``?``."""
    from npa.core.paths import home_root

    folders = list(dict.fromkeys([str(home_root()), os.getcwd()]))
    reason = os_reason(exc)
    if exc.errno in _FULL:
        reason = reason.replace("(the filesystem is full)", "(a filesystem is full)")
        fix = f"df -h {' '.join(shlex.quote(f) for f in folders)}  # free space where it is full"
    else:
        fix = os_fix(folders[0], exc.errno)
    return LocalStateUnavailable(
        f"could not {action} a file under {' or '.join(folders)} (the system did not say which): "
        f"{reason}",
        fix=fix,
        details={"errno": exc.errno},
    )


def with_rerun(error: NpaError, command: str, *, replace: bool = False) -> NpaError:
    """``error`` with ``command`` (the one that recovers once the fix is applied) added to its
    fix; an error that already names its rerun keeps it, unless ``replace`` (a command that
    wraps the step that failed names itself instead)."""
    if "rerun" in error.details:
        if not replace:
            return error
        earlier = error.details.pop("rerun")
        if error.fix is not None:
            error.fix = error.fix.replace(f" && {earlier}", "", 1).removeprefix(earlier) or None
    error.details["rerun"] = command
    error.fix = _and_then(error.fix, command) if error.fix else command
    return error


def _and_then(fix: str, command: str) -> str:
    """One shell line: ``fix``, and ``command`` once it succeeded (``fix``'s comment, if it has
    one, stays at the end, where it comments nothing out)."""
    head, hashed, comment = fix.partition("  #")
    return f"{head.rstrip()} && {command}" + (f"  #{comment}" if hashed else "")


# A file store's OS answers that may pass on their own (a network file system's hiccup).
_PASSING_ERRNOS = frozenset({errno.EIO, errno.ETIMEDOUT, errno.EAGAIN, errno.ESTALE})


def passes_by_itself(error: NpaError) -> bool:
    """Whether ``error`` is a platform fault that may pass without anyone acting: a store or a
    backend that did not answer, reset the connection or answered a server error. Refused
    credentials, a missing bucket, and a full or read-only disk are not: a person must act.
    The one rule every long-running part of npa (the local executor, the run watcher) applies
    before it waits for a fault to pass instead of ending a run on it."""
    if isinstance(error, BackendUnavailable):
        return True
    if not isinstance(error, StoreUnavailable) or isinstance(error, VerificationUnavailable):
        return False
    if error.details.get("refused"):
        return False
    status = error.details.get("http_status")
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return False  # the request itself was refused: asking again gets the same answer
    code = error.details.get("errno")
    return code is None or code in _PASSING_ERRNOS
