"""Dynamic resources for things on this machine: a private directory and a placed kubeconfig.

Their providers run in a separate process that unpickles them by reference, so they live in
an importable module (not in a program function) and their pickled form never changes between
runs. State holds paths and a content fingerprint only, never a file's contents.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from npa.core.fsio import atomic_write_text, ensure_private_dir


class DirectoryProvider(ResourceProvider):
    """An owner-only directory. Deleting it removes it only when empty: run data is never
    deleted by a teardown."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        path = Path(props["path"])
        ensure_private_dir(path)
        return CreateResult(id_=str(path), outs=props)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        if not Path(id_).is_dir():
            return ReadResult(id_="", outs={})
        return ReadResult(id_=id_, outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = olds.get("path") != news.get("path")
        return DiffResult(changes=changed, replaces=["path"] if changed else [])

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        with contextlib.suppress(FileNotFoundError, OSError):
            os.rmdir(id_)


class Directory(Resource, module="npa", name="Directory"):
    """``Directory(name, path)``: a 0700 directory created if absent."""

    path: pulumi.Output[str]

    def __init__(self, name: str, path: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(DirectoryProvider(), name, {"path": path}, opts)


def minimal_kubeconfig(source: str, context: str) -> str:
    """The one context ``context`` of the kubeconfig(s) at ``source`` (a path, or a
    ``KUBECONFIG`` list merged as kubectl merges it), with its cluster and user, as a
    self-contained kubeconfig (file references made absolute)."""
    from npa.adapters.kube.kubeconfig import minimal_from

    return minimal_from(source, context)


def fingerprint(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _content(props: dict[str, Any]) -> str:
    if props.get("document"):
        return str(props["document"])
    return minimal_kubeconfig(props["source"], props["context"])


# Every stack that places a context's kubeconfig claims it with a file of its own beside it:
# projects on one context share the one file, and the last claim's teardown removes it.
CLAIMS = "claims"


def _claims(destination: Path) -> Path:
    return destination.parent / CLAIMS


def _claim(props: dict[str, Any]) -> None:
    owner = props.get("owner")
    if owner:
        claims = _claims(Path(props["destination"]))
        ensure_private_dir(claims)
        atomic_write_text(claims / str(owner), "")


class KubeconfigProvider(ResourceProvider):
    """Writes the cluster kubeconfig to its own file (0600), never merging it anywhere. The
    file is shared by the projects on its context: each stack (``owner``) claims it, and a
    delete removes the file only with the last claim."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        text = _content(props)
        atomic_write_text(Path(props["destination"]), text)
        _claim(props)
        return CreateResult(
            id_=props["destination"], outs={**props, "fingerprint": fingerprint(text)}
        )

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        path = Path(id_)
        if not path.is_file():
            return ReadResult(id_="", outs={})
        placed = fingerprint(path.read_text("utf-8"))
        return ReadResult(id_=id_, outs={**props, "fingerprint": placed})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in ("destination",) if olds.get(k) != news.get(k)]
        # The placed file is what matters: reading the same context from another file (a
        # KUBECONFIG list, or the placed file itself) is no change while the content is equal.
        # A stack placed before claims existed records no owner: one update claims the file.
        changed = [k for k in ("context", "fingerprint", "owner") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(replaces or changed), replaces=replaces)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> Any:
        from pulumi.dynamic import UpdateResult

        text = _content(news)
        atomic_write_text(Path(news["destination"]), text)
        _claim(news)
        return UpdateResult(outs={**news, "fingerprint": fingerprint(text)})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        path = Path(id_)
        claims = _claims(path)
        if props.get("owner"):
            (claims / str(props["owner"])).unlink(missing_ok=True)
        if claims.is_dir() and any(claims.iterdir()):
            return  # another project on this context still uses the file
        with contextlib.suppress(OSError):
            claims.rmdir()
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()


class PlacedKubeconfig(Resource, module="npa", name="Kubeconfig"):
    """The kubeconfig of one context placed at ``destination``.

    ``source`` + ``context`` copy that context out of an existing kubeconfig; ``document`` is a
    complete kubeconfig to write as is (a new cluster's, which carries no credential: it
    authenticates through an exec plugin). A copied kubeconfig may hold credentials, so for
    ``source`` the state keeps only the paths and the content's fingerprint.
    """

    destination: pulumi.Output[str]
    fingerprint: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        destination: str,
        context: str,
        fingerprint_: pulumi.Input[str],
        source: str | None = None,
        document: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "destination": destination,
            "context": context,
            "source": source,
            "document": document,
            "fingerprint": fingerprint_,
            # The stack that places it: one claim on a file the context's projects share.
            "owner": f"{pulumi.get_project()}.{pulumi.get_stack()}",
        }
        super().__init__(KubeconfigProvider(), name, props, opts)
