"""Every local path npa reads or writes, in one place.

The root is ``~/.npa`` unless ``NPA_HOME`` says otherwise. Names that become path components
(project aliases, run ids, kube contexts) are checked here so no caller can build a path that
escapes its directory.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from npa.core.errors import InvalidInput

# A component is one directory entry: no separators, no traversal, nothing hidden, bounded.
_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:+-]{0,252}$")


def safe_component(value: str, what: str) -> str:
    """Return ``value`` if it can be used as a single path component, else raise InvalidInput."""
    if not _COMPONENT.fullmatch(value) or ".." in value:
        raise InvalidInput(
            f"{what} {value!r} cannot be used as a name: use letters, digits and . _ @ : + -, "
            "starting with a letter or digit, with no '/' and no '..'",
        )
    return value


# Characters a context folder keeps as they are; everything else is %-escaped. ':' is escaped
# because a path holding it cannot be one entry of a KUBECONFIG list.
_FOLDER_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.@+")
_FOLDER_MAX = 200


def context_problem(value: str) -> str | None:
    """Why ``value`` cannot name a kube context npa targets, or None: the one rule for context
    names, for every command and the spec. Any name kubectl selects a context by is accepted
    (ARNs with ``:`` and ``/``, ``user@team/ctx``), except what SkyPilot cannot address after
    ``k8s/`` in a task's ``infra`` (it splits there on ``/`` and strips spaces): an empty name,
    control characters, a ``/`` at either end or twice in a row, spaces at either end or beside
    a ``/``."""
    if not value:
        return "is empty"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        return "holds control characters"
    if value != value.strip():
        return "starts or ends with a space"
    parts = value.split("/")
    if "" in parts:
        return "starts or ends with '/' or has '//' (SkyPilot's k8s/<context> cannot hold it)"
    if any(part != part.strip() for part in parts):
        return "has a space beside a '/' (SkyPilot's k8s/<context> would drop it)"
    return None


def check_context_name(value: str) -> str:
    """Return ``value`` if :func:`context_problem` finds nothing, else raise InvalidInput."""
    problem = context_problem(value)
    if problem is not None:
        raise InvalidInput(
            f"kube context {value!r} is not a context name npa can use: it {problem}",
            fix="kubectl config get-contexts -o name",
        )
    return value


def context_folder(context: str) -> str:
    """The one path component that stands for a kube context: the name %-escaped, so it
    reverses with :func:`context_from_folder`. A name whose escaped form is longer than a
    file name allows keeps a readable prefix and a hash of the whole (the placed kubeconfig
    still carries the real name)."""
    check_context_name(context)
    escaped = "".join(
        ch if ch in _FOLDER_SAFE else "".join(f"%{b:02X}" for b in ch.encode("utf-8"))
        for ch in context
    )
    if escaped.startswith("."):
        escaped = "%2E" + escaped[1:]
    if len(escaped) > _FOLDER_MAX:
        digest = hashlib.sha256(context.encode("utf-8")).hexdigest()[:16]
        cut = _FOLDER_MAX - 17
        # Never cut inside a %XX escape.
        cut -= next((n for n in (1, 2) if escaped[cut - n] == "%"), 0)
        escaped = escaped[:cut] + "~" + digest
    return escaped


def context_from_folder(folder: str) -> str | None:
    """The context name a folder made by :func:`context_folder` stands for (None for a
    hashed long name: read it from the placed kubeconfig's ``current-context``)."""
    return None if "~" in folder else unquote(folder, errors="strict")


def home_root() -> Path:
    """The npa state root: ``$NPA_HOME`` or ``~/.npa``."""
    override = os.environ.get("NPA_HOME")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".npa"


def tools_cache_root() -> Path:
    """Where scripts/bootstrap-tools caches the tools it installs or builds."""
    override = os.environ.get("NPA_TOOLS_CACHE")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "npa-tools"


@dataclass(frozen=True)
class NpaPaths:
    """The layout of one npa state root."""

    root: Path

    @classmethod
    def from_env(cls) -> NpaPaths:
        return cls(home_root())

    # --- configuration --------------------------------------------------------------------
    @property
    def config_file(self) -> Path:
        return self.root / "config.json"

    # --- runs -----------------------------------------------------------------------------
    @property
    def submissions_dir(self) -> Path:
        return self.root / "workflow-submissions"

    def submission_receipt(self, project: str, run_id: str) -> Path:
        """``workflow-submissions/<project>/<run>.json``: the receipt of one submission."""
        project = safe_component(project, "project")
        run_id = safe_component(run_id, "run id")
        return self.submissions_dir / project / f"{run_id}.json"

    @property
    def reservations_dir(self) -> Path:
        return self.root / "runs"

    def run_reservation(self, project: str, workflow: str) -> Path:
        """State record of the runs reserved for one workflow of one project."""
        project = safe_component(project, "project")
        workflow = safe_component(workflow, "workflow")
        return self.reservations_dir / project / f"{workflow}.json"

    @property
    def legacy_first_run_id(self) -> Path:
        """The historical global run-id file: read to warn about, never reused, never deleted."""
        return self.root / "paidf-first-run-id"

    # --- operations -----------------------------------------------------------------------
    @property
    def operations_dir(self) -> Path:
        return self.root / "operations"

    def operation_journal(self, operation_id: str) -> Path:
        operation_id = safe_component(operation_id, "operation id")
        return self.operations_dir / f"{operation_id}.jsonl"

    # --- clusters -------------------------------------------------------------------------
    @property
    def clusters_dir(self) -> Path:
        return self.root / "clusters"

    def cluster_kubeconfig(self, context: str) -> Path:
        """``clusters/<context folder>/kubeconfig``: placed by provisioning, never merged
        elsewhere. The folder is the context name escaped (:func:`context_folder`)."""
        return self.clusters_dir / context_folder(context) / "kubeconfig"

    # --- local infrastructure -------------------------------------------------------------
    @property
    def local_store(self) -> Path:
        """The embedded object store of the local target (``file://`` URIs point here)."""
        return self.root / "store"

    @property
    def local_jobs(self) -> Path:
        """The local executor's job table: one directory per job (state, logs, work)."""
        return self.root / "local-jobs"

    @property
    def pulumi_backend(self) -> Path:
        """Directory of the default ``file://`` Pulumi state backend."""
        return self.root / "pulumi"

    # --- caches and locks -----------------------------------------------------------------
    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    def cache(self, name: str) -> Path:
        return self.cache_dir / safe_component(name, "cache name")

    def source_index(self, tree: Path) -> Path:
        """The stat index of one source tree (digests of its files, keyed by their stat), named
        by a hash of the tree's absolute path so two trees never share one."""
        name = hashlib.sha256(str(tree).encode()).hexdigest()[:32]
        return self.cache("source-index") / f"{name}.json"

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks"

    def lock(self, name: str) -> Path:
        """A lock file; ``name`` may be dotted (``launch.<project>.<run>``), never a path."""
        return self.locks_dir / f"{safe_component(name, 'lock name')}.lock"


def docker_config_path(env: Mapping[str, str] | None = None) -> Path:
    """docker's client configuration file where docker looks for it: ``$DOCKER_CONFIG/config.json``,
    else ``config.json`` in ``.docker`` of the home folder (``HOME`` of ``env``)."""
    env = os.environ if env is None else env
    base = env.get("DOCKER_CONFIG")
    if base:
        return Path(base).expanduser() / "config.json"
    return Path(env.get("HOME") or Path.home()) / ".docker" / "config.json"
