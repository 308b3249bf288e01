"""Reading runs back: ``status``, ``list``, ``diff``, ``artifacts``, ``logs``, ``gpus``,
``cancel``, ``load-artifact`` and ``release``. Every RUN argument is a run id or an s3:// /
file:// run prefix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from npa.cli import complete
from npa.cli.apps import workflow_app
from npa.cli.common import ContextFlag, JsonFlag, chosen_context, finish

if TYPE_CHECKING:
    from npa.core.emit import Printable

Opt = typer.Option
Arg = typer.Argument

RunArg = Annotated[
    str, Arg(help="Run id, or its prefix: s3://BUCKET/…/<workflow>/<run>[/npa-workflow].")
]
ProjectOpt = Annotated[
    str | None,
    Opt("--project", help="Project alias (npa configure).", autocompletion=complete.projects),
]
PrefixOpt = Annotated[
    str | None,
    Opt("--workflow-s3-uri", help="The run's prefix, when this shell cannot resolve the store."),
]
ReadTimeoutOpt = Annotated[
    float | None,
    Opt(
        "--read-timeout",
        min=0.1,
        max=3600,
        help="Seconds the store may take to answer before the run is reported unavailable "
        "(default: $NPA_READ_TIMEOUT, else 15).",
    ),
]


def bounded(seconds: float | None, produce: Callable[[], Printable]) -> Callable[[], Printable]:
    """``produce`` with every store read bounded by ``seconds`` (see BoundedStore)."""

    def run() -> Printable:
        from npa.adapters.storage.bounded import read_budget

        with read_budget(seconds):
            return produce()

    return run


@workflow_app.command("status")
def status(
    run: RunArg,
    project: ProjectOpt = None,
    watch: Annotated[bool, Opt("--watch", help="Follow the run to a final state.")] = False,
    interval: Annotated[float, Opt("--interval", min=0.1, help="Seconds between checks.")] = 10.0,
    timeout: Annotated[
        float | None, Opt("--timeout", min=0, help="Stop watching after this many seconds.")
    ] = None,
    heartbeat: Annotated[
        float,
        Opt("--heartbeat", min=1, help="With --watch: say the run is unchanged this often."),
    ] = 30.0,
    cached: Annotated[
        bool, Opt("--cached", help="Store and local records only; marked CACHED, not live.")
    ] = False,
    workflow_s3_uri: PrefixOpt = None,
    read_timeout: ReadTimeoutOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """The run's state from every source that knows it (each listed with its answer).

    The run's state is npa's verdict: a job the backend ended is shown beside it until the
    run's supervisor has checked the outputs and decided any retry. With --watch, every change
    (run state, job state, each stage, why the run waits) is printed as it happens, and a
    heartbeat when nothing changed; with --json each is one JSON object per line, the final
    result last. The watch ends on the verdict. Exit codes: 0 a state was established (with
    --watch: SUCCEEDED), 1 with --watch the run ended failed or cancelled, or its job ended
    with no supervisor on this machine to judge it, 3 NOT_FOUND, 4 VERIFICATION_UNAVAILABLE.
    """

    def produce() -> Printable:
        from npa.core.errors import InvalidInput
        from npa.services import status as service

        if watch and cached:
            raise InvalidInput("--watch follows the live run; --cached never asks it: pick one")
        if not watch:
            return service.status(run, project, cached=cached, workflow_uri=workflow_s3_uri)

        from npa.services.watching import Follower

        follower = Follower(heartbeat=heartbeat)

        def progress(result: service.StatusResult) -> None:
            # Text: one line per change on stderr. --json: one object per line on stdout, as
            # it happens (NDJSON); the final result is the last line.
            for event in follower.see(result):
                if as_json:
                    typer.echo(event.model_dump_json())
                else:
                    typer.echo(event.text(), err=True)

        return service.watch(
            run,
            project,
            interval=interval,
            timeout=timeout,
            workflow_uri=workflow_s3_uri,
            on_poll=progress,
        )

    finish(as_json, bounded(read_timeout, produce), compact=watch)


@workflow_app.command("list")
def list_runs(
    project: ProjectOpt = None,
    limit: Annotated[int, Opt("--limit", min=1, max=10_000, help="Newest N runs.")] = 50,
    read_timeout: ReadTimeoutOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """The project's runs from its store, newest first (no controller or cluster needed)."""

    def produce() -> Printable:
        from npa.services.listing import list_runs as service

        return service(project, limit=limit)

    finish(as_json, bounded(read_timeout, produce))


@workflow_app.command("diff")
def diff(
    run_a: Annotated[str, Arg(metavar="RUN_A", help="A submitted run: its id or its prefix.")],
    run_b: Annotated[str, Arg(metavar="RUN_B", help="Another submitted run.")],
    project: ProjectOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """What two submitted runs launched differently: their task files and images, run ids
    aside. Exit 1 when anything differs, as diff does."""

    def produce() -> Printable:
        from npa.services.rundiff import diff_runs

        return diff_runs(run_a, run_b, project)

    finish(as_json, produce)


@workflow_app.command("artifacts")
def artifacts(
    run: RunArg,
    project: ProjectOpt = None,
    stage: Annotated[str | None, Opt("--stage", help="Only this stage.")] = None,
    workflow_s3_uri: PrefixOpt = None,
    read_timeout: ReadTimeoutOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Declared outputs against what the store holds; missing or zero-byte ones fail (exit 1)."""

    def produce() -> Printable:
        from npa.services.artifacts import artifacts as service

        return service(run, project, stage=stage, workflow_uri=workflow_s3_uri)

    finish(as_json, bounded(read_timeout, produce))


@workflow_app.command("logs")
def logs(
    run: RunArg,
    stage: Annotated[str, Opt("--stage", help="The stage whose logs to show.")],
    project: ProjectOpt = None,
    follow: Annotated[
        bool, Opt("--follow", help="Stream the live log until the job ends.")
    ] = False,
    cached: Annotated[
        bool, Opt("--cached", help="The store only; never contact the backend.")
    ] = False,
    workflow_s3_uri: PrefixOpt = None,
    read_timeout: ReadTimeoutOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """A stage's logs; --json states which sources were tried and what "empty" means."""

    def produce() -> Printable:
        from npa.services.logs import logs as service

        return service(
            run,
            project,
            stage=stage,
            follow=follow,
            cached=cached,
            workflow_uri=workflow_s3_uri,
            emit=None if as_json else typer.echo,
        )

    finish(as_json, bounded(read_timeout, produce))


@workflow_app.command("gpus")
def gpus(
    spec: Annotated[
        Path | None, Opt("--spec", help="Check which stages fit, and the remap submit applies.")
    ] = None,
    context: ContextFlag = None,
    as_json: JsonFlag = False,
) -> None:
    """Per node: GPU label name, allocatable and requestable GPUs."""

    def produce() -> Printable:
        from npa.services.gpus import gpus as service

        chosen = chosen_context(context, ["npa", "workbench", "workflow", "gpus"], spec=spec)
        return service(chosen, spec=spec)

    finish(as_json, produce)


@workflow_app.command("cancel")
def cancel(
    run: RunArg,
    project: ProjectOpt = None,
    workflow_s3_uri: PrefixOpt = None,
    read_timeout: ReadTimeoutOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Cancel the run's job by its id (never by name). Repeat-safe."""

    def produce() -> Printable:
        from npa.services.cancel import cancel as service

        return service(run, project, workflow_uri=workflow_s3_uri)

    finish(as_json, bounded(read_timeout, produce))


@workflow_app.command("load-artifact")
def load_artifact(
    run: RunArg,
    destination: Annotated[
        str, Opt("--destination", help="Directory, file:// or s3:// URI to load into.")
    ],
    project: ProjectOpt = None,
    workflow_s3_uri: PrefixOpt = None,
    read_timeout: ReadTimeoutOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Copy the final stages' outputs of a fully succeeded run. Never relaunches anything."""

    def produce() -> Printable:
        from npa.services.artifacts import load_artifact as service

        return service(run, project, destination=destination, workflow_uri=workflow_s3_uri)

    finish(as_json, bounded(read_timeout, produce))


@workflow_app.command("report")
def report(
    run: RunArg,
    project: ProjectOpt = None,
    out: Annotated[
        Path | None,
        Opt("--out", help="The page to write (default: ./npa-report-RUN_ID.html)."),
    ] = None,
    open_page: Annotated[
        bool, Opt("--open", help="Open the page in the default browser once it is written.")
    ] = False,
    watch: Annotated[
        bool,
        Opt(
            "--watch",
            help="Rewrite the page as the run moves, until it is final; the page "
            "reloads itself meanwhile.",
        ),
    ] = False,
    interval: Annotated[float, Opt("--interval", min=0.1, help="Seconds between checks.")] = 10.0,
    timeout: Annotated[
        float | None, Opt("--timeout", min=0, help="Stop watching after this many seconds.")
    ] = None,
    cached: Annotated[
        bool, Opt("--cached", help="Store and local records only; the page says CACHED.")
    ] = False,
    workflow_s3_uri: PrefixOpt = None,
    read_timeout: ReadTimeoutOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """One self-contained HTML page of the run (stages, timeline, outputs, failed logs, next
    commands, and the sources it was read from); it fetches nothing. Exit codes as status: 4
    when the run could not be read (no page is written when its store does not answer) or
    parts of the page are missing, 3 NOT_FOUND; with --watch, 1 when the run ended failed."""

    def produce() -> Printable:
        from npa.core.errors import InvalidInput
        from npa.services import report as service

        if watch and cached:
            raise InvalidInput("--watch follows the live run; --cached never asks it: pick one")
        opened: list[str] = []

        def on_write(result: service.ReportResult) -> None:
            if open_page and not opened:
                opened.append(result.path)
                _open_in_browser(result.path)
            if not as_json:
                state = "final" if result.final else "not final"
                typer.echo(f"page {result.pages_written}: {result.state} ({state})", err=True)

        if watch:
            return service.watch_report(
                run, project, out=out, interval=interval, timeout=timeout,
                workflow_uri=workflow_s3_uri, on_write=on_write,
                say=lambda line: typer.echo(line, err=True),
            )  # fmt: skip
        result = service.report(run, project, out=out, cached=cached, workflow_uri=workflow_s3_uri)
        if open_page:
            _open_in_browser(result.path)
        return result

    finish(as_json, bounded(read_timeout, produce), compact=watch)


def _open_in_browser(path: str) -> None:
    import webbrowser

    if not webbrowser.open(Path(path).as_uri()):
        typer.echo(f"no browser could be started here; open {path} yourself", err=True)


@workflow_app.command("release")
def release(
    project: ProjectOpt = None,
    context: ContextFlag = None,
    read_timeout: ReadTimeoutOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Remove the Secrets of the project's ended runs on a cluster; keep those of runs still
    going or whose state npa cannot tell. Repeat-safe; exit 4 when a removal was refused."""

    def produce() -> Printable:
        from npa.services.release import release as service

        chosen = chosen_context(context, ["npa", "workbench", "workflow", "release"],
                                project=project)  # fmt: skip
        return service(project, chosen)

    finish(as_json, bounded(read_timeout, produce))
