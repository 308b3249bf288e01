"""render: the task files a run launches, written as a whole or not at all.

For the backend ``--infra`` names (SkyPilot YAML for ``k8s/<context>``, the local backend's JSON
for ``local``) and the store ``prepare-run`` fixed for the run, through the same function
``submit`` renders with: what a person reviews is byte for byte what launches.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import itertools
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from npa import __version__
from npa.backends import LOCAL_INFRA, infra_for_context
from npa.backends.base import ExecutionBackend, PullsPinnedImages, ResolvesAccelerators
from npa.core.collector import collector_paused
from npa.core.errors import EXIT_FAILURE, InvalidInput
from npa.core.fsio import DIR_MODE, FILE_MODE, ensure_private_dir, refusals_named
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.core.text import plural
from npa.core.userfiles import read_user_text
from npa.spec.validate import load_workflow, read_spec_text

if TYPE_CHECKING:
    from npa.render.tasks import RenderedTask
    from npa.spec.model import Workflow

INDEX = "render.json"
#: How many task files a render makes before it writes them (about 3 MB of text at 12 KB).
_BATCH = 256


class RenderedFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stage: str
    file: str
    sha256: str


class RenderResult(Result):
    """What was rendered where, for which backend and store, and the diff against an earlier
    render when asked (exit 1 when something differs, as ``diff`` does)."""

    spec: str
    run_id: str
    out_dir: str
    infra: str
    runtime: str
    store: str | None
    store_source: str  # reservation | --store-uri | storage.uri | none
    run_prefix: str | None
    files: list[RenderedFile]
    notes: list[str] = Field(default_factory=list)
    diff_against: str | None = None
    changed: list[str] | None = None
    diff: str | None = None

    def exit_code(self) -> int:
        return EXIT_FAILURE if self.changed else 0

    def text_lines(self) -> list[str]:
        how = "in their images" if self.runtime == "container" else "as host processes"
        files = plural(len(self.files), "task file")
        lines = [
            f"rendered {files} for run {self.run_id} into {self.out_dir}",
            f"  for {self.infra}, stages {how}; prefix {self.run_prefix or '-'} "
            f"({self.store_source})",
        ]
        lines += [f"  {f.file}  sha256:{f.sha256[:12]}  ({f.stage})" for f in self.files]
        lines += [f"  note: {n}" for n in self.notes]
        if self.diff_against is not None:
            if not self.changed:
                lines.append(f"no changes against {self.diff_against} (run ids aside)")
            else:
                lines.append(f"changed against {self.diff_against}: {', '.join(self.changed)}")
                lines += (self.diff or "").rstrip("\n").splitlines()
        return lines


#: What stands for a run's own id when two renders or two runs are compared: every run has
#: its own, in names and prefixes, and that difference is not a change.
RUN_ID_MARK = "<run-id>"


def without_run_id(files: dict[str, str], run_id: str | None) -> dict[str, str]:
    """``files`` with every occurrence of ``run_id`` replaced by :data:`RUN_ID_MARK`."""
    if not run_id:
        return dict(files)
    return {name: text.replace(run_id, RUN_ID_MARK) for name, text in files.items()}


def _read_render(directory: Path) -> tuple[dict[str, str], str | None]:
    """The task files of an earlier render, and the run id it was rendered for."""
    if not directory.is_dir():
        raise InvalidInput(
            f"--diff {directory} is not a directory of rendered tasks (--diff takes the --out "
            "directory of an earlier render)"
        )
    files = {}
    run_id = None
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        text = read_user_text(path, "rendered task")
        if path.name == INDEX:
            with contextlib.suppress(ValueError, AttributeError):
                run_id = json.loads(text).get("run_id")
            continue
        files[path.name] = text
    return files, run_id


def unified_diff(
    old: dict[str, str], new: dict[str, str], old_dir: str, new_dir: str
) -> tuple[list[str], str]:
    """Changed file names and one unified diff covering all of them."""
    changed: list[str] = []
    chunks: list[str] = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before == after:
            continue
        changed.append(name)
        chunks.extend(
            difflib.unified_diff(
                (before or "").splitlines(keepends=True),
                (after or "").splitlines(keepends=True),
                fromfile=f"{old_dir}/{name}" if before is not None else "/dev/null",
                tofile=f"{new_dir}/{name}" if after is not None else "/dev/null",
            )
        )
    return changed, "".join(c if c.endswith("\n") else c + "\n" for c in chunks)


def _write_new_file(directory: Path, name: str, text: str) -> None:
    """Create one file (0600) and write it whole; its descriptor is closed before this
    returns (:func:`_make_durable` makes it durable)."""
    fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        view = memoryview(text.encode("utf-8"))
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _write_new_files(directory: Path, files: Iterable[tuple[str, str]]) -> None:
    """Create every file (0600) in a fresh directory, as ``files`` yields (name, text), and make
    them all durable.

    The directory is swapped in whole afterwards, so the files need no temp-and-rename of their
    own. One file is open at a time, however many stages (holding one per file ran out at
    ``ulimit -n``). ``files`` is drawn :data:`_BATCH` at a time and each batch written before
    the next is drawn, so a lazy ``files`` has at most that many texts alive (making and
    writing each file in turn cost 0.35 s more CPU at 20,000 stages than in batches: each
    step evicts the other's caches). All of them are made durable together
    (:func:`_make_durable`).
    """
    names = []
    items = iter(files)
    while batch := list(itertools.islice(items, _BATCH)):
        for name, text in batch:
            _write_new_file(directory, name, text)
            names.append(name)
    _make_durable(directory, names)


T = TypeVar("T")


def _fixing(items: Iterator[T], fix: Callable[[InvalidInput], None]) -> Iterator[T]:
    """``items``, with ``fix`` given any InvalidInput that making one of them raises."""
    try:
        yield from items
    except InvalidInput as error:
        fix(error)
        raise


def _write_render(
    out: Path,
    tasks: Iterable[RenderedTask],
    index: dict[str, Any],
    kept: dict[str, str] | None,
) -> list[RenderedFile]:
    """Write the task files into a fresh ``out`` as they are made, a batch at a time, each
    batch let go once written (:func:`_write_new_files`; ``kept``, when given, collects the
    texts for a diff), then ``INDEX``: ``index`` with each file's stage and sha256. What was
    written, in plan order."""
    written: list[RenderedFile] = []

    def files() -> Iterator[tuple[str, str]]:
        for task in tasks:
            written.append(RenderedFile(stage=task.stage, file=task.filename, sha256=task.sha256))
            if kept is not None:
                kept[task.filename] = task.text
            yield task.filename, task.text
        index["files"] = {f.file: {"stage": f.stage, "sha256": f.sha256} for f in written}
        yield INDEX, json.dumps(index, indent=2, sort_keys=True) + "\n"

    _replace_dir(out, files())
    return written


def _make_durable(directory: Path, names: Iterable[str]) -> None:
    """Flush the written files to disk before the directory is swapped in: on Linux with one
    ``syncfs`` of their filesystem, elsewhere with an ``fsync`` of each. An fsync per file
    commits the journal once per file: about 0.1 ms of CPU each, 2 s of a 20,000-stage
    render (a 16-thread pool of them overlapped the waiting, not that work)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _syncfs(fd):
            return
    finally:
        os.close(fd)
    for name in names:
        fd = os.open(directory / name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    _fsync_dir(directory)


def _syncfs(fd: int) -> bool:
    """``syncfs(2)`` on the filesystem holding ``fd`` (Linux: it reports the filesystem's
    write-back errors since 5.8); False where there is none. It flushes what else is waiting
    on that filesystem too: the wait, not the CPU, is then shared with other writers."""
    if sys.platform != "linux":
        return False
    import ctypes

    syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
    if syncfs is None:  # a C library without it
        return False
    if syncfs(fd) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_dir(out: Path, files: Iterable[tuple[str, str]]) -> None:
    """Fill a fresh sibling directory, then swap it in: readers see the old render or the new
    one, never a mix, and a failure leaves the old one untouched."""
    if out.exists() and not out.is_dir():
        raise InvalidInput(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / INDEX).is_file():
        raise InvalidInput(
            f"--out {out} is not empty and holds no earlier npa render; refusing to replace it",
            fix="--out " + shlex.quote(f"{out}-render"),  # a new directory
        )
    parent = ensure_private_dir(out.parent.resolve())
    staging = parent / f".{out.name}.tmp-{os.getpid()}"
    old = parent / f".{out.name}.old-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with refusals_named("write the render into", out):
            staging.mkdir(mode=DIR_MODE)  # its parent is made above: a refusal names --out
            os.chmod(staging, DIR_MODE)
            _write_new_files(staging, files)
            if out.exists():
                os.replace(out, old)
            os.replace(staging, out)
            _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old.exists() and not out.exists():
            os.replace(old, out)
        raise
    with contextlib.suppress(OSError):
        shutil.rmtree(old)


@dataclass
class RenderOptions:
    """What ``render`` was asked for, besides the spec, the run and ``--out``."""

    digests_file: Path | None = None
    kube_context: str | None = None  # --context: shorthand for --infra k8s/<context>
    infra: str | None = None
    runtime: str = "auto"
    project: str | None = None
    store_uri: str | None = None
    diff_against: Path | None = None
    image_overrides: Sequence[str] = ()
    image: str | None = None


def _infra(options: RenderOptions, workflow: Workflow, paths: NpaPaths) -> str:
    """The backend to render for: ``--infra``, else SkyPilot on the context every command
    chooses (``choose_context``: ``--context``, the spec's, the project's, current-context);
    an error without a fix when there is none: the caller names the command."""
    if options.infra is not None:
        wanted = (
            infra_for_context(options.kube_context) if options.kube_context is not None else None
        )
        if wanted is not None and options.infra != wanted:
            raise InvalidInput(
                f"--context {options.kube_context} and --infra {options.infra} disagree",
                fix=f"--infra {wanted}",
            )
        return options.infra
    from npa.services.configure import choose_context

    chosen = choose_context(
        options.kube_context,
        project=options.project,
        spec_context=workflow.infrastructure.context,
        paths=paths,
    )
    if chosen is None:
        raise InvalidInput(
            "cannot render: no kube context: set infrastructure.context, pass --context, "
            "configure one (npa configure --context), set a current-context, or render for "
            f"this machine with --infra {LOCAL_INFRA}",
        )
    return infra_for_context(chosen.name)


@collector_paused()  # as render_run
def render_workflow(
    workflow: Workflow,
    run_id: str,
    *,
    kube_context: str | None,
    digests: dict[str, str],
    store_uri: str | None = None,
    verified: dict[str, str] | None = None,
    accelerators: dict[str, str] | None = None,
    project: str | None = None,
    paths: NpaPaths | None = None,
) -> list[RenderedTask]:
    """Every stage's task file for the backend the context selects, in plan order, through
    :func:`~npa.render.tasks.render_run` as ``render`` and ``submit`` do: the pure builder the
    tests and ``bench/`` use. The context is chosen as every command chooses it
    (``choose_context``: ``kube_context``, the spec's, ``project``'s, current-context); the
    store is ``store_uri``, else the spec's. Reads no reservation and asks no cluster.

    ``verified``: pinned references preflight verified, used as they are (see
    :func:`~npa.render.tasks.resolve_images`); ``accelerators``: GPU renames from the cluster's
    node labels; ``paths``: where the backend looks for what provisioning placed (default:
    ``$NPA_HOME``).
    """
    from npa.backends import backend_for_infra
    from npa.plan.model import build_plan
    from npa.render.tasks import check_names, render_run, resolve_images

    paths = paths or NpaPaths.from_env()
    # As given, as render_spec checks them: the store's normal form would hide what is wrong.
    check_names(kube_context, store_uri)
    infra = _infra(RenderOptions(kube_context=kube_context, project=project), workflow, paths)
    store = store_uri or (workflow.storage.uri if workflow.storage else None)
    backend = backend_for_infra(infra, paths)
    images: dict[str, str] = {}
    if isinstance(backend, PullsPinnedImages):
        images = resolve_images(workflow, digests, verified)
    plan = build_plan(workflow, run_id, store_uri=store)
    return render_run(workflow, plan, backend, images=images, accelerators=accelerators)


def _accelerators(
    backend: ExecutionBackend, workflow: Workflow, notes: list[str]
) -> dict[str, str]:
    """The spec's GPU names renamed as ``submit`` renames them, when the cluster can be asked."""
    from npa.services.gates import Admission, GateReport, accelerator_gate

    if not isinstance(backend, ResolvesAccelerators):
        return {}
    wanted = [s.resources.accelerators for s in workflow.stages if s.resources.accelerators]
    if not wanted:
        return {}
    if not backend.can_resolve_accelerators():
        notes.append(
            "accelerator names are the spec's: the cluster cannot be asked (no kubeconfig); "
            "submit renames them to the cluster's node labels"
        )
        return {}
    report = GateReport(Admission(store_uri=""))
    report.admission.workflow = workflow
    accelerator_gate(report, backend)
    if report.failed:
        gate = report.failed[0]
        raise InvalidInput(f"cannot render: {gate.detail}", fix=gate.fix)
    return dict(report.admission.accelerators)


def _render_fix(
    error: InvalidInput,
    path: Path,
    run_id: str,
    out: Path,
    digests_file: Path | None,
    context: str | None,
    store: str | None,
) -> str:
    """The command that renders after all: the same one with the values npa can find
    (``context`` and ``store``: what this render used, if anything)."""
    from npa.adapters.kube import kubeconfig
    from npa.core.paths import context_problem
    from npa.services.configure import resolve_project
    from npa.spec.model import store_uri_problem

    if error.details.get("unpinned"):
        return (
            shlex.join(["npa", "workbench", "workflow", "preflight-images", str(path)])
            + "  # resolves each image to its digest; render then pins them"
        )
    argv = ["npa", "workbench", "workflow", "render", str(path), "--run-id", run_id]
    argv += ["--out", str(out)] + (["--digests", str(digests_file)] if digests_file else [])
    if context is not None and context_problem(str(context)):
        context = None  # refused as a name: the fix offers the kubeconfig's current one
    if context is None:
        try:
            context = kubeconfig.merge(kubeconfig.source_files()).current_context
        except kubeconfig.KubeconfigError:
            context = None
        if context is None:
            return "kubectl config get-contexts -o name  # a context for render --context"
        argv += ["--context", str(context)]
    if store is None or store_uri_problem(str(store)) or not str(store).startswith("s3://"):
        configured = resolve_project(None).value("store") or ""
        if not configured.startswith("s3://"):
            return "npa configure --show  # render needs an s3:// store (--store-uri)"
        argv += ["--store-uri", configured]
    return shlex.join(argv)


@collector_paused()  # the workflow, its plan and every task file stay alive throughout
def render_spec(
    path: Path,
    run_id: str,
    out: Path,
    *,
    digests_file: Path | None = None,
    kube_context: str | None = None,
    infra: str | None = None,
    runtime: str = "auto",
    project: str | None = None,
    store_uri: str | None = None,
    diff_against: Path | None = None,
    image_overrides: Sequence[str] = (),
    image: str | None = None,
    paths: NpaPaths | None = None,
) -> RenderResult:
    """Render a spec into ``out`` (replacing an earlier render there atomically): the task
    files ``submit`` launches for the same run, images and backend, byte for byte.

    Images are chosen as preflight-images chooses them (``image_overrides``, then ``image``,
    then the spec) and pinned from ``digests_file``; preflight's --json output is pinned
    exactly as it verified it."""
    from npa.backends import backend_for_infra, infra_context
    from npa.plan.model import build_plan
    from npa.render.tasks import (
        check_names,
        chosen_workflow,
        load_digests,
        pinned_images,
        render_stream,
    )
    from npa.services.runs import run_store

    options = RenderOptions(
        digests_file=digests_file,
        kube_context=kube_context,
        infra=infra,
        runtime=runtime,
        project=project,
        store_uri=store_uri,
        diff_against=diff_against,
        image_overrides=image_overrides,
        image=image,
    )
    paths = paths or NpaPaths.from_env()
    workflow = load_workflow(path)
    digests = load_digests(options.digests_file) if options.digests_file else None
    workflow = chosen_workflow(workflow, options.image_overrides, options.image, digests)
    name = workflow.metadata.name
    infra = options.infra
    store = options.store_uri

    def _with_fix(error: InvalidInput) -> None:
        if error.fix is None:
            context = infra_context(infra) if infra else options.kube_context
            error.fix = _render_fix(error, path, run_id, out, options.digests_file, context, store)

    try:
        given = infra_context(options.infra) if options.infra else options.kube_context
        # As given: the store's normal form would hide what is wrong with it.
        check_names(given, options.store_uri)
        infra = _infra(options, workflow, paths)
        where = run_store(
            name,
            run_id,
            project=options.project,
            store_uri=options.store_uri,
            spec_store=workflow.storage.uri if workflow.storage else None,
            paths=paths,
        )
        store = where.store
        notes: list[str] = [] if where.source == "reservation" else [where.detail]
        backend = backend_for_infra(infra, paths, runtime=options.runtime)
        images: dict[str, str] = {}
        if isinstance(backend, PullsPinnedImages):
            images = pinned_images(workflow, digests)
        accelerators = _accelerators(backend, workflow, notes)
        plan = build_plan(workflow, run_id, store_uri=where.store)
    except InvalidInput as error:
        _with_fix(error)
        raise
    previous = _read_render(options.diff_against) if options.diff_against is not None else None
    index: dict[str, Any] = {
        "npa_version": __version__,
        "workflow": name,
        "run_id": run_id,
        "infra": infra,
        "runtime": backend.runtime,
        "store": where.store,
        "spec_sha256": hashlib.sha256(read_spec_text(path).encode("utf-8")).hexdigest(),
    }
    stream = render_stream(workflow, plan, backend, images=images, accelerators=accelerators)
    files: dict[str, str] | None = {} if previous is not None else None  # kept for the diff
    written = _write_render(out, _fixing(stream, _with_fix), index, files)
    result = RenderResult(
        spec=str(path),
        run_id=run_id,
        out_dir=str(out),
        infra=infra,
        runtime=backend.runtime,
        store=where.store,
        store_source=where.source,
        run_prefix=plan.run_prefix,
        files=written,
        notes=notes,
    )
    if previous is not None and files is not None and options.diff_against is not None:
        old_files, old_run = previous
        result.changed, result.diff = unified_diff(
            without_run_id(old_files, old_run),
            without_run_id(files, run_id),
            str(options.diff_against),
            str(out),
        )
        result.diff_against = str(options.diff_against)
    return result
