"""Kubeconfig files read the way kubectl reads them.

``KUBECONFIG`` may name several files (``a:b``, ``;`` on Windows). kubectl merges them: files
that do not exist are skipped, the first file to define a context, cluster or user by a name
wins, ``current-context`` comes from the first file that sets one, and relative file
references (certificates, keys, token files, an exec command with a path) are resolved against
the directory of the file that holds them. An explicit ``--kubeconfig`` names one file that
must exist. Context names are free text: EKS names are ARNs
(``arn:aws:eks:us-east-1:123456789012:cluster/gpu-prod``), so nothing here treats ``/`` or
``:`` in a name as special.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npa.core.errors import InvalidInput
from npa.core.paths import NpaPaths

# Per section: the keys that hold file paths, resolved against the file's directory.
_PATH_KEYS = {
    "cluster": ("certificate-authority",),
    "user": ("client-certificate", "client-key", "tokenFile"),
}
_SECTIONS = (("clusters", "cluster"), ("users", "user"), ("contexts", "context"))


class KubeconfigError(InvalidInput, ValueError):
    """A kubeconfig cannot be read, or lacks what was asked of it: an input error naming the
    file, so one that reaches the user is reported as such, never as a context nobody
    defines."""


def _unreadable(path: Path, why: str) -> KubeconfigError:
    return KubeconfigError(
        f"{path} is {why}", fix=f"kubectl config view --kubeconfig {path}  # kubectl's reading"
    )


def default_kubeconfig() -> Path:
    """``~/.kube/config``, the file kubectl reads when ``KUBECONFIG`` is unset."""
    return Path.home() / ".kube" / "config"


def split_list(value: str) -> list[Path]:
    """The files of a ``KUBECONFIG`` value in order: empty entries and repeats dropped."""
    out: list[Path] = []
    for part in value.split(os.pathsep):
        if part and Path(part).expanduser() not in out:
            out.append(Path(part).expanduser())
    return out


def source_files(explicit: Path | None = None, env: Mapping[str, str] | None = None) -> list[Path]:
    """The files kubectl would read: ``--kubeconfig``, else ``$KUBECONFIG``, else ~/.kube/config.
    npa's ``--kubeconfig`` may also be a list like ``$KUBECONFIG``."""
    env = os.environ if env is None else env
    if explicit is not None and os.pathsep in str(explicit):
        return [p.absolute() for p in split_list(str(explicit))]
    if explicit is not None:
        return [explicit.expanduser().absolute()]
    listed = env.get("KUBECONFIG")
    if listed:
        return [p.absolute() for p in split_list(listed)]
    return [default_kubeconfig()]


def join_list(files: Iterable[Path]) -> str:
    """The ``KUBECONFIG`` value naming ``files``."""
    return os.pathsep.join(str(p) for p in files)


def _load(path: Path) -> dict[str, Any]:
    import yaml

    from npa.core.userfiles import read_user_text

    try:
        # Capped and regular-only: a KUBECONFIG entry can name /dev/zero or a FIFO.
        data = yaml.safe_load(read_user_text(path, "kubeconfig"))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise _unreadable(path, f"not valid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise _unreadable(path, f"not valid YAML: {' '.join(str(exc).split())}") from None
    except InvalidInput as exc:
        raise KubeconfigError(exc.message, fix=exc.fix) from None
    if data is None:  # an empty file: kubectl reads it as a config with nothing in it
        return {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise _unreadable(path, f"not a kubeconfig: its YAML is a {kind}, not a mapping")
    return data


def _absolute(section: str, body: Mapping[str, Any], base: Path) -> dict[str, Any]:
    out = dict(body)
    for key in _PATH_KEYS.get(section, ()):
        value = out.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            out[key] = str(base / Path(value).expanduser())
    exec_ = out.get("exec")
    if section == "user" and isinstance(exec_, dict):
        command = exec_.get("command")
        # kubectl resolves an exec command only when it is a path, not a name looked up on PATH.
        if isinstance(command, str) and os.sep in command and not os.path.isabs(command):
            out["exec"] = {**exec_, "command": str(base / command)}
    return out


@dataclass
class Merged:
    """Several kubeconfig files merged as kubectl merges them."""

    files: list[Path]  # the files that exist and were read, in order
    contexts: dict[str, dict[str, Any]]
    clusters: dict[str, dict[str, Any]]
    users: dict[str, dict[str, Any]]
    current_context: str | None

    def describe(self) -> str:
        return join_list(self.files) or "(no kubeconfig file exists)"


def merge(files: Iterable[Path], *, must_exist: bool = False) -> Merged:
    """Read and merge ``files`` (first definition of a name wins). Missing files are skipped
    unless ``must_exist`` (an explicit ``--kubeconfig``)."""
    read: list[Path] = []
    named: dict[str, dict[str, dict[str, Any]]] = {"clusters": {}, "users": {}, "contexts": {}}
    current: str | None = None
    for path in files:
        # Anything that exists is read, and refused by _load unless it is a regular file.
        if not path.exists():
            if must_exist:
                raise KubeconfigError(f"kubeconfig {path} does not exist")
            continue
        try:
            data = _load(path)
        except OSError as exc:
            raise KubeconfigError(f"cannot read {path}: {exc.strerror}") from None
        read.append(path)
        base = path.resolve().parent
        for plural, section in _SECTIONS:
            entries = data.get(plural) or []
            if not isinstance(entries, list):
                raise KubeconfigError(f"{path}: {plural} is not a list (kubectl reads a list)")
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    continue
                if entry["name"] in named[plural]:
                    continue
                body = entry.get(section) or {}
                if not isinstance(body, dict):
                    raise KubeconfigError(f"{path}: {section} {entry['name']!r} is not a mapping")
                named[plural][entry["name"]] = {
                    **entry,
                    section: _absolute(section, body, base),
                }
        named_current = data.get("current-context")
        if current is None and named_current:
            if not isinstance(named_current, str):
                raise KubeconfigError(f"{path}: current-context is not a name")
            current = named_current
    return Merged(read, named["contexts"], named["clusters"], named["users"], current)


def minimal(merged: Merged, context: str) -> str:
    """One context with its cluster and user as a self-contained kubeconfig (YAML text).

    The context keeps its real name: kubectl and SkyPilot select it by that name.
    """
    import yaml

    if context not in merged.contexts:
        known = ", ".join(sorted(merged.contexts)) or "none"
        raise KubeconfigError(f"{merged.describe()} has no context {context!r} (it has: {known})")
    entry = merged.contexts[context]
    body = entry.get("context") or {}
    cluster_name = body.get("cluster")
    user_name = body.get("user")
    for field, value in (("cluster", cluster_name), ("user", user_name)):
        if value is not None and not isinstance(value, str):
            raise KubeconfigError(f"context {context!r}: its {field} is not a name")
    if cluster_name not in merged.clusters:
        raise KubeconfigError(
            f"context {context!r} names cluster {cluster_name!r}, which {merged.describe()} "
            "does not define"
        )
    users = [merged.users[user_name]] if user_name in merged.users else []
    placed = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [merged.clusters[cluster_name]],
        "users": users,
        "contexts": [entry],
        "current-context": context,
        "preferences": {},
    }
    return str(yaml.safe_dump(placed, sort_keys=True))


def minimal_from(source: str, context: str) -> str:
    """:func:`minimal` of the files a ``KUBECONFIG``-style ``source`` names (the one file of a
    ``--kubeconfig`` must exist; of a list, missing files are skipped as kubectl skips them)."""
    files = split_list(source)
    return minimal(merge(files, must_exist=len(files) == 1), context)


@dataclass(frozen=True)
class Resolved:
    """The kubeconfig a read-only command uses for a context, and why that one."""

    value: str  # a path, or a KUBECONFIG list of paths
    origin: str  # "$KUBECONFIG", "placed by npa", "~/.kube/config"


def for_context(paths: NpaPaths, context: str, env: Mapping[str, str] | None = None) -> Resolved:
    """Where ``context`` is read from, as kubectl would and then npa's placement.

    ``$KUBECONFIG`` first when it defines the context (the user's explicit choice, honoured as
    kubectl honours it), then the kubeconfig ``provision-if-absent`` placed for the context,
    then ``~/.kube/config``. When none defines it, the placed path is returned so the caller
    reports that it is missing. A file of ``$KUBECONFIG`` or ``~/.kube/config`` that cannot be
    read raises :class:`KubeconfigError` naming it, as kubectl fails on it.
    """
    env = os.environ if env is None else env
    listed = env.get("KUBECONFIG")
    if listed and _defines(split_list(listed), context):
        return Resolved(join_list(split_list(listed)), "$KUBECONFIG")
    placed = paths.cluster_kubeconfig(context)
    if placed.is_file():
        return Resolved(str(placed), "placed by npa")
    if not listed and _defines([default_kubeconfig()], context):
        return Resolved(str(default_kubeconfig()), "~/.kube/config")
    return Resolved(str(placed), "placed by npa")


def _defines(files: list[Path], context: str) -> bool:
    return context in merge(files).contexts
