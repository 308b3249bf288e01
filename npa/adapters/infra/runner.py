"""Open, preview, apply, refresh and destroy npa's stacks through the Pulumi Automation API.

Programs run inline: this Python process serves the language runtime, so no language plugin is
needed, and the program of each stack kind is the one in ``stacks.PROGRAMS`` that the plain
``pulumi`` CLI runs from the top-level Pulumi.yaml. A program reads everything it needs from
``npa:*`` stack config, which npa sets before every operation.

The state backend is a URL: ``file://<dir>`` by default, ``s3://...`` for a team. For a
``file://`` backend npa can inspect the stack's lock files and take a read-only copy of the
checkpoint, which is what makes ``--preview`` write nothing: the preview runs against a
snapshot in a temporary backend, since the engine locks the stack even for a preview.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from npa.adapters.infra.changes import ResourceChange, change_from_event, count, merge
from npa.adapters.infra.progress import EngineWatch, StepProgress
from npa.core.commands import bootstrap_tools_command, pulumi_install_command
from npa.core.errors import (
    InvalidInput,
    LockBusy,
    NpaError,
    StackOperationFailed,
    ToolMissing,
    Unavailable,
)
from npa.core.fsio import refusals_named
from npa.core.paths import tools_cache_root
from npa.core.procs import pid_running, run_child

# The Pulumi project name; the same as the top-level Pulumi.yaml so the plain CLI sees the stacks.
PROJECT = "npa"
PULUMI_VERSION = "3.260.0"
_ORG = "organization"  # what a diy backend calls the (only) organization
OUTPUT_READ_SECONDS = 60


def find_pulumi() -> Path:
    """The pulumi CLI: ``$NPA_PULUMI_BIN``, then the bootstrap-tools cache, then ``PATH``."""
    candidates: list[Path] = []
    if os.environ.get("NPA_PULUMI_BIN"):
        candidates.append(Path(os.environ["NPA_PULUMI_BIN"]))
    candidates.append(tools_cache_root() / f"pulumi-{PULUMI_VERSION}" / "bin" / "pulumi")
    on_path = shutil.which("pulumi")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ToolMissing(
        f"the pulumi CLI {PULUMI_VERSION} is not installed where npa looks "
        "($NPA_PULUMI_BIN, the npa tools cache, PATH)",
        fix=bootstrap_tools_command("pulumi") or pulumi_install_command(PULUMI_VERSION),
    )


def pulumi_home() -> Path:
    return Path(os.environ.get("PULUMI_HOME") or Path.home() / ".pulumi")


def plugin_installed(kind: str, name: str, version: str) -> bool:
    """Whether ``<kind>-<name>-v<version>`` is in the plugin cache (nothing is downloaded)."""
    return (pulumi_home() / "plugins" / f"{kind}-{name}-v{version}").is_dir()


# The state backends the pulumi CLI opens itself (its "diy" backends), and the schemes of a
# Pulumi Cloud (or self-hosted Pulumi service) address.
DIY_SCHEMES = ("file", "s3", "gs", "azblob", "postgres")
SERVICE_SCHEMES = ("https", "http")
PULUMI_CLOUD = "https://api.pulumi.com"


def check_backend_url(url: str, *, fix_argv: list[str] | None = None) -> str:
    """``url`` if the pulumi CLI can use it as a state backend, else InvalidInput whose fix is
    ``fix_argv`` with the default backend put in."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    ok = scheme in DIY_SCHEMES or (scheme in SERVICE_SCHEMES and bool(parsed.netloc))
    if scheme == "file" and not (parsed.path or parsed.netloc):
        ok = False
    if not ok:
        from npa.core.commands import npa_command

        schemes = ", ".join(f"{s}://" for s in DIY_SCHEMES)
        raise InvalidInput(
            f"backend URL {url!r} is not a Pulumi state backend: use {schemes}, or a Pulumi "
            f"Cloud address such as {PULUMI_CLOUD}",
            fix=npa_command(*fix_argv) if fix_argv else f"pulumi login --help  # for {url}",
        )
    return url


def is_service(url: str) -> bool:
    """Whether ``url`` is a Pulumi Cloud (or self-hosted service) backend."""
    return urlparse(url).scheme.lower() in SERVICE_SCHEMES


def service_login_missing(url: str, env: dict[str, str] | None = None) -> bool:
    """True when nothing can authenticate to the Pulumi service at ``url``: no
    ``PULUMI_ACCESS_TOKEN`` and no token for it in ``$PULUMI_HOME/credentials.json`` (where
    ``pulumi login`` keeps it). Nothing is sent anywhere to find out."""
    env = dict(os.environ) if env is None else env
    if env.get("PULUMI_ACCESS_TOKEN"):
        return False
    try:
        stored = json.loads((pulumi_home() / "credentials.json").read_text("utf-8"))
    except (OSError, json.JSONDecodeError):
        return True
    tokens = stored.get("accessTokens") if isinstance(stored, dict) else None
    return not (isinstance(tokens, dict) and tokens.get(url.rstrip("/")))


@dataclass(frozen=True)
class Backend:
    """Where stack state lives, and where that choice came from (for the reader)."""

    url: str
    origin: str = "default"

    @property
    def local_dir(self) -> Path | None:
        """The directory of a ``file://`` backend (``file://~/x`` is under the home
        directory, as the pulumi CLI reads it); None for every other backend."""
        parsed = urlparse(self.url)
        if parsed.scheme != "file":
            return None
        if parsed.netloc == "~":
            return Path.home() / parsed.path.lstrip("/")
        return Path(parsed.netloc + parsed.path) if parsed.netloc else Path(parsed.path)

    def checkpoint(self, stack: str) -> Path | None:
        root = self.local_dir
        return None if root is None else root / ".pulumi" / "stacks" / PROJECT / f"{stack}.json"

    def lock_dir(self, stack: str) -> Path | None:
        root = self.local_dir
        return None if root is None else root / ".pulumi" / "locks" / _ORG / PROJECT / stack


_STACK_PART = re.compile(r"^[A-Za-z0-9_.-]+$")


def read_stack_state(backend: Backend, stack: str) -> dict[str, Any] | None:
    """The state (``deployment``) of ``stack`` in ``backend``, read-only, or None when there is
    no such stack. A ``file://`` backend's checkpoint is read as a file (no pulumi process, no
    lock taken); any other backend through ``pulumi stack export``. Unavailable when the state
    cannot be read."""
    parts = stack.split("/")
    if len(parts) not in (1, 3) or any(not _STACK_PART.match(p) or p in (".", "..") for p in parts):
        raise Unavailable(f"{stack!r} is not a stack name (STACK or organization/project/STACK)")
    root = backend.local_dir
    if root is None:
        return InfraRunner(backend).stack_export(stack)
    project, name = (PROJECT, stack) if len(parts) == 1 else (parts[1], parts[2])
    path = root / ".pulumi" / "stacks" / project / f"{name}.json"
    try:
        if path.is_file():
            text = path.read_text("utf-8")
        elif path.with_suffix(".json.gz").is_file():
            text = gzip.decompress(path.with_suffix(".json.gz").read_bytes()).decode("utf-8")
        else:
            return None
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise Unavailable(f"the state of stack {stack} ({path}) cannot be read: {exc}") from None
    latest = data.get("checkpoint", {}).get("latest") if isinstance(data, dict) else None
    return dict(latest) if isinstance(latest, dict) else {}


@dataclass(frozen=True)
class StackLock:
    """One lock file on a stack: who holds it, and whether that process still runs."""

    path: str
    pid: int | None
    hostname: str | None
    stale: bool


@dataclass
class StackSpec:
    """One stack to operate on: its name, its program kind, and the config the program reads."""

    name: str
    kind: str
    config: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    """What one stack operation did (or, for a preview, would do), and what the engine warned
    about while doing it."""

    changes: list[ResourceChange]
    summary: dict[str, int]
    outputs: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def mutating(self) -> list[ResourceChange]:
        return [c for c in self.changes if c.op in ("create", "update", "replace", "delete")]


def _program(kind: str) -> Callable[[], None]:
    def run() -> None:
        from stacks import PROGRAMS

        PROGRAMS[kind]()

    return run


class InfraRunner:
    """Stack operations against one backend, with the real pulumi CLI."""

    def __init__(self, backend: Backend, *, pulumi_bin: Path | None = None) -> None:
        self.backend = backend
        self.pulumi_bin = pulumi_bin or find_pulumi()

    # --- environment ----------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The pulumi CLI's environment: no plugin downloads, no update checks, dynamic
        providers in this interpreter, and the passphrase the user set (if any)."""
        env = {
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_PYTHON_CMD": sys.executable,
            "PULUMI_BACKEND_URL": self.backend.url,
            "PATH": f"{self.pulumi_bin.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        if (
            "PULUMI_CONFIG_PASSPHRASE" not in os.environ
            and "PULUMI_CONFIG_PASSPHRASE_FILE" not in os.environ
        ):
            # npa's stacks hold no secret values (credentials are referred to by path or
            # profile name), so an empty passphrase is the default; a team that wants its
            # state encrypted sets PULUMI_CONFIG_PASSPHRASE(_FILE) and npa passes it through.
            env["PULUMI_CONFIG_PASSPHRASE"] = ""
        return env

    def _options(self, backend_url: str, work_dir: Path | None) -> Any:
        from pulumi import automation as auto

        env = self.env()
        env["PULUMI_BACKEND_URL"] = backend_url
        return auto.LocalWorkspaceOptions(
            work_dir=str(work_dir) if work_dir else None,
            pulumi_command=auto.PulumiCommand(
                root=str(self.pulumi_bin.parent.parent), skip_version_check=True
            ),
            project_settings=auto.ProjectSettings(
                name=PROJECT, runtime="python", backend=auto.ProjectBackend(url=backend_url)
            ),
            secrets_provider="passphrase",
            env_vars=env,
        )

    @contextlib.contextmanager
    def _open(
        self, spec: StackSpec, backend_url: str | None = None, work_dir: Path | None = None
    ) -> Iterator[Any]:
        """The stack, created if absent, with the program's config set. The workspace lives in
        a temporary directory: config is set from npa's arguments on every operation."""
        from pulumi import automation as auto

        if backend_url is None:
            self.mend()
        with contextlib.ExitStack() as cleanup:
            if work_dir is None:
                work_dir = Path(
                    cleanup.enter_context(tempfile.TemporaryDirectory(prefix="npa-ws-"))
                )
            try:
                stack = auto.create_or_select_stack(
                    stack_name=spec.name,
                    project_name=PROJECT,
                    program=_program(spec.kind),
                    opts=self._options(backend_url or self.backend.url, work_dir),
                )
                config = {"npa:stack": spec.kind, **spec.config}
                stack.set_all_config({k: auto.ConfigValue(value=v) for k, v in config.items()})
            except auto.errors.CommandError as exc:
                raise self._failure("open", spec.name, exc) from None
            yield stack

    def mend(self) -> list[str]:
        """Remove what a killed pulumi left half-written in a ``file://`` backend (see
        ``mend_torn_sidecars``) before pulumi reads it; the files removed."""
        root = self.backend.local_dir
        return [] if root is None else mend_torn_sidecars(root)

    # --- reading state --------------------------------------------------------------------
    def exists(self, stack: str) -> bool:
        """Whether the backend has the stack (read-only for file:// backends)."""
        checkpoint = self.backend.checkpoint(stack)
        if checkpoint is not None:
            return checkpoint.exists()
        return stack in self.list_stacks()

    def list_stacks(self) -> list[str]:
        from pulumi import automation as auto

        workspace = auto.LocalWorkspace(**vars(self._options(self.backend.url, None)))
        return [s.name for s in workspace.list_stacks()]

    def deployment(self, stack: str) -> dict[str, Any] | None:
        """The stack's checkpoint (``deployment`` of ``pulumi stack export``), or None."""
        checkpoint = self.backend.checkpoint(stack)
        if checkpoint is not None:
            if not checkpoint.exists():
                return None
            data = json.loads(checkpoint.read_text("utf-8"))
            return dict(data.get("checkpoint", {}).get("latest") or {})
        if stack not in self.list_stacks():
            return None
        with self._open(StackSpec(stack, "none")) as opened:
            return dict(opened.export_stack().deployment)

    def resources(self, stack: str) -> list[dict[str, Any]]:
        """The resources recorded in the stack's state (empty when there is no stack)."""
        deployment = self.deployment(stack) or {}
        return list(deployment.get("resources") or [])

    def _state_or_none(self, stack: str) -> list[dict[str, Any]] | None:
        """The recorded resources, or None when the state cannot be read (a failure report then
        rests on the engine's events alone)."""
        from pulumi import automation as auto

        try:
            return self.resources(stack)
        except (OSError, ValueError, auto.errors.CommandError):
            return None

    def _settle(self, watch: EngineWatch, stack: str, before: list[dict[str, Any]] | None) -> None:
        after = self._state_or_none(stack)
        if before is not None and after is not None:
            watch.settle(before, after)

    def stack_export(self, stack: str) -> dict[str, Any] | None:
        """The stack's state as ``pulumi stack export`` prints its ``deployment`` (a secret
        stays encrypted), or None when the backend has no such stack. Read-only; for any
        backend, a stack of any project (``organization/project/stack``)."""
        qualified = stack if "/" in stack else f"{_ORG}/{PROJECT}/{stack}"
        with tempfile.TemporaryDirectory(prefix="npa-export-") as cwd:
            # An empty working directory: a Pulumi.yaml where npa runs must not be picked up.
            try:
                proc = run_child(
                    [str(self.pulumi_bin), "stack", "export", "--stack", qualified],
                    cwd=cwd,
                    env={**os.environ, **self.env()},
                    timeout=OUTPUT_READ_SECONDS,
                )
            except subprocess.TimeoutExpired:
                raise Unavailable(
                    f"pulumi stack export of {qualified} did not answer within "
                    f"{OUTPUT_READ_SECONDS} s (backend {self.backend.url})"
                ) from None
        if proc.returncode != 0:
            if "no stack named" in proc.stderr:
                return None
            tail = " ".join(proc.stderr.strip().splitlines()[-3:])
            raise Unavailable(
                f"pulumi stack export of {qualified} failed (backend {self.backend.url}): {tail}"
            )
        try:
            exported = json.loads(proc.stdout or "{}")
        except json.JSONDecodeError:
            raise Unavailable(f"pulumi stack export of {qualified} printed no JSON") from None
        deployment = exported.get("deployment") if isinstance(exported, dict) else None
        return dict(deployment) if isinstance(deployment, dict) else {}

    def pending_operations(self, stack: str) -> list[dict[str, Any]]:
        deployment = self.deployment(stack) or {}
        return list(deployment.get("pending_operations") or [])

    def locks(self, stack: str) -> list[StackLock]:
        """Lock files on the stack (file:// backends only; others report none)."""
        lock_dir = self.backend.lock_dir(stack)
        if lock_dir is None or not lock_dir.is_dir():
            return []
        here = socket.gethostname()
        found = []
        for path in sorted(lock_dir.glob("*.json")):
            try:
                content = json.loads(path.read_text("utf-8"))
            except (OSError, json.JSONDecodeError):
                content = {}
            pid = content.get("pid") if isinstance(content.get("pid"), int) else None
            host = content.get("hostname")
            stale = host == here and pid is not None and not pid_running(pid)
            found.append(StackLock(str(path), pid, host, stale))
        return found

    # --- operations -----------------------------------------------------------------------
    def preview(self, spec: StackSpec, *, read_only: bool) -> Outcome:
        """What ``up`` would change, after reading every recorded resource back (so something
        deleted by hand shows as created again). ``read_only`` previews a snapshot of a file://
        backend in a temporary one, so neither the backend nor NPA_HOME is written."""
        if read_only and self.backend.local_dir is not None:
            with (
                self._snapshot(spec.name) as (url, work_dir),
                self._open(spec, url, work_dir) as stack,
            ):
                return self._preview(stack, spec.name)
        with self._open(spec) as stack:
            return self._preview(stack, spec.name)

    def _preview(self, stack: Any, name: str) -> Outcome:
        from pulumi import automation as auto

        events: list[ResourceChange] = []
        watch = EngineWatch(name)
        try:
            stack.preview(
                on_event=_collect(events, watch),
                color="never",
                suppress_progress=True,
                refresh=True,
            )
        except auto.errors.CommandError as exc:
            raise self._failure("preview", name, exc) from None
        changes = merge(events)
        return Outcome(changes=changes, summary=count(changes), warnings=watch.warnings)

    @contextlib.contextmanager
    def _snapshot(self, stack: str) -> Iterator[tuple[str, Path]]:
        with tempfile.TemporaryDirectory(prefix="npa-preview-") as tmp:
            root = Path(tmp) / "backend"
            meta = self.backend.local_dir / ".pulumi" / "meta.yaml"  # type: ignore[operator]
            source = self.backend.checkpoint(stack)
            # A full temporary folder is named as such (a copy's ENOSPC carries no file name).
            with refusals_named("copy the stack state for a read-only preview into", root):
                if source is not None and source.exists():
                    target = root / ".pulumi" / "stacks" / PROJECT / source.name
                    target.parent.mkdir(parents=True)
                    shutil.copyfile(source, target)
                    if meta.exists():
                        shutil.copyfile(meta, root / ".pulumi" / "meta.yaml")
                root.mkdir(parents=True, exist_ok=True)
                work_dir = Path(tmp) / "work"
                work_dir.mkdir()
            yield f"file://{root}", work_dir

    def up(
        self, spec: StackSpec, *, progress: Callable[[StepProgress], None] | None = None
    ) -> Outcome:
        """``pulumi up``: each step is reported to ``progress`` as it starts and ends. A failure
        names the steps that completed before it (they are in the stack's state)."""
        from pulumi import automation as auto

        events: list[ResourceChange] = []
        watch = EngineWatch(spec.name, progress)
        before = self._state_or_none(spec.name)
        try:
            with self._open(spec) as stack:
                result = stack.up(
                    on_event=_collect(events, watch),
                    color="never",
                    suppress_progress=True,
                    refresh=True,
                )
        except auto.errors.CommandError as exc:
            self._settle(watch, spec.name, before)
            raise self._failure("up", spec.name, exc, watch) from None
        changes = merge(events)
        outputs = {k: v.value for k, v in result.outputs.items() if not v.secret}
        return Outcome(
            changes=changes, summary=count(changes), outputs=outputs, warnings=watch.warnings
        )

    def refresh(self, spec: StackSpec, *, clear_pending_creates: bool = False) -> Outcome:
        """Bring the state in line with what exists. ``clear_pending_creates`` drops creates a
        killed run left pending (the next ``up`` creates or adopts them again)."""
        from pulumi import automation as auto

        events: list[ResourceChange] = []
        try:
            with self._open(spec) as stack:
                stack.refresh(
                    on_event=_collect(events),
                    color="never",
                    suppress_progress=True,
                    clear_pending_creates=clear_pending_creates or None,
                )
        except auto.errors.CommandError as exc:
            raise self._failure("refresh", spec.name, exc) from None
        changes = merge(events)
        return Outcome(changes=changes, summary=count(changes))

    def preview_destroy(self, spec: StackSpec) -> Outcome:
        """What a destroy would delete, from the recorded state (nothing is written)."""
        changes = [
            ResourceChange(
                urn=r["urn"], type=r["type"], name=r["urn"].rsplit("::", 1)[-1], op="delete"
            )
            for r in reversed(self.resources(spec.name))
            if r.get("type") != "pulumi:pulumi:Stack"
            and not str(r.get("type", "")).startswith("pulumi:providers:")
        ]
        return Outcome(changes=changes, summary=count(changes))

    def destroy(
        self, spec: StackSpec, *, progress: Callable[[StepProgress], None] | None = None
    ) -> Outcome:
        from pulumi import automation as auto

        events: list[ResourceChange] = []
        watch = EngineWatch(spec.name, progress)
        before = self._state_or_none(spec.name)
        try:
            with self._open(spec) as stack:
                stack.destroy(
                    on_event=_collect(events, watch), color="never", suppress_progress=True
                )
                stack.workspace.remove_stack(spec.name)
        except auto.errors.CommandError as exc:
            self._settle(watch, spec.name, before)
            raise self._failure("destroy", spec.name, exc, watch) from None
        changes = merge(events)
        return Outcome(changes=changes, summary=count(changes))

    def clear_stale_locks(self, spec: StackSpec, locks: list[StackLock]) -> None:
        """Remove locks proven stale. ``pulumi cancel`` needs the stack; a first ``up`` killed
        after taking its lock and before writing the stack's checkpoint leaves only the lock
        file, which is removed as ``pulumi cancel`` would."""
        if self.exists(spec.name):
            self.cancel(spec)
            return
        for lock in locks:
            if lock.stale:
                Path(lock.path).unlink(missing_ok=True)

    def cancel(self, spec: StackSpec) -> None:
        """Remove the stack's lock (``pulumi cancel``); only for locks proven stale."""
        from pulumi import automation as auto

        try:
            with self._open(spec) as stack:
                stack.cancel()
        except auto.errors.CommandError as exc:
            raise self._failure("cancel", spec.name, exc) from None

    def _failure(
        self, operation: str, stack: str, exc: Exception, watch: EngineWatch | None = None
    ) -> NpaError:
        from pulumi import automation as auto

        completed = list(watch.completed) if watch is not None else []
        left = (
            "\ncompleted before the failure (recorded in the stack state): " + "; ".join(completed)
            if completed
            else ""
        )
        text = str(exc)
        if isinstance(exc, auto.errors.ConcurrentUpdateError):
            return LockBusy(
                f"stack {stack} is locked by another pulumi operation",
                details={"stack": stack, "operation": operation},
            )
        stderr = getattr(exc, "stderr", None) or text
        tail = "\n".join(line for line in stderr.strip().splitlines()[-12:])
        if "no resource plugin" in stderr or "could not find plugin" in stderr.lower():
            only = ("kubernetes-plugin",) if "kubernetes" in stderr else ()
            install = bootstrap_tools_command(*only)
            return ToolMissing(
                f"pulumi {operation} of stack {stack} needs a provider plugin that is not "
                f"installed:\n{tail}"
                + (
                    ""
                    if install
                    else "\n(npa's bootstrap-tools script installs it; this "
                    "install of npa came without it)"
                ),
                fix=install,
            )
        refused = passphrase_refusal(stderr, stack)
        if refused is not None:
            return refused
        if "failed to load checkpoint" in stderr or ("backend" in stderr and "login" in stderr):
            return Unavailable(f"the state backend {self.backend.url} cannot be read:\n{tail}")
        return StackOperationFailed(
            f"pulumi {operation} of stack {stack} failed:\n{tail}{left}",
            details={"stack": stack, "operation": operation, "completed": completed},
        )


# What pulumi prints when the passphrase secrets provider cannot open a stack's secrets: the
# passphrase given does not decrypt them, or the file PULUMI_CONFIG_PASSPHRASE_FILE names cannot
# be read (pulumi 3.260's words).
_WRONG_PASSPHRASE = "incorrect passphrase"
_UNREADABLE_PASSPHRASE_FILE = re.compile(r"unable to read PULUMI_CONFIG_PASSPHRASE_FILE: (.*)")


def passphrase_refusal(stderr: str, stack: str) -> NpaError | None:
    """The npa error for pulumi refusing the passphrase of ``stack`` (None for any other
    failure): which variable gave it, and how to give the right one without writing it into
    the shell's history."""
    unreadable = _UNREADABLE_PASSPHRASE_FILE.search(stderr)
    named = os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE")
    if unreadable is not None and named:
        return InvalidInput(
            f"PULUMI_CONFIG_PASSPHRASE_FILE names {named}, which pulumi cannot read "
            f"({unreadable.group(1).strip()}), so the secrets of stack {stack} cannot be opened",
            fix=f"ls -l {shlex.quote(named)}  # the file holding the passphrase of stack {stack}",
            details={"stack": stack, "variable": "PULUMI_CONFIG_PASSPHRASE_FILE"},
        )
    if _WRONG_PASSPHRASE not in stderr:
        return None
    if "PULUMI_CONFIG_PASSPHRASE" in os.environ:
        given, variable = "the passphrase in PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE"
    elif named:
        given, variable = f"the passphrase in {named}", "PULUMI_CONFIG_PASSPHRASE_FILE"
    else:
        given = (
            "no passphrase (neither PULUMI_CONFIG_PASSPHRASE nor PULUMI_CONFIG_PASSPHRASE_FILE "
            "is set; npa then uses an empty one)"
        )
        variable = None
    return InvalidInput(
        f"{given} does not decrypt the secrets of stack {stack}: it was made with another "
        "passphrase",
        fix="read -rs PULUMI_CONFIG_PASSPHRASE && export PULUMI_CONFIG_PASSPHRASE  "
        f"# type the passphrase stack {stack} was made with (it stays out of the shell history)",
        details={"stack": stack, "variable": variable},
    )


def mend_torn_sidecars(root: Path) -> list[str]:
    """Remove the metadata files a killed pulumi left half-written in a ``file://`` backend.

    The backend (gocloud's fileblob) writes each state file to a temporary name and renames it,
    so a kill never tears one; but it keeps each file's content type and checksum in a
    ``<file>.attrs`` beside it, written in place. A kill between creating and filling one leaves
    it empty or cut short, and pulumi then refuses the whole stack ("failed to load checkpoint:
    EOF"). A missing ``.attrs`` is read as default metadata, so removing a torn one loses nothing.
    Returns the removed files, relative to ``root``."""
    removed = []
    for sidecar in sorted((root / ".pulumi").rglob("*.attrs")):
        try:
            parsed = json.loads(sidecar.read_bytes() or b"null")
        except (OSError, ValueError):
            parsed = None
        if isinstance(parsed, dict):
            continue
        with contextlib.suppress(FileNotFoundError):
            sidecar.unlink()
            removed.append(sidecar.relative_to(root).as_posix())
    return removed


def _collect(sink: list[ResourceChange], watch: EngineWatch | None = None) -> Callable[[Any], None]:
    def handle(event: Any) -> None:
        change = change_from_event(event)
        if change is not None:
            sink.append(change)
        if watch is not None:
            watch(event)

    return handle
