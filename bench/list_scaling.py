"""Benchmark: ``list --limit 50`` of a project with --runs runs in a store that also holds
--runs runs of another project, on a file store and on moto's S3 server, each beside an anchor
measured in the same run.

Per store it prints the whole-process time of the real CLI (median of --repeat), the store
requests it made (S3: counted by the tests' proxy; file store: counted in process by wrapping
the store), and the anchor: on S3, ``aws s3api list-objects-v2`` of the project's index prefix
(one page of 52 keys) as a whole process, and the same CLI's GETs of the 50 manifests as
a plain boto3 script would do them; on the file store, a plain ``os.scandir`` of the index
folder and reads of the 50 manifests in Python. ``npa --help`` is printed too (the start-up any
command pays). Each process runs in turn with its anchor (A B A B ...); wall and CPU time are
medians, the ratios the medians of the pairs' ratios.
Targets (issue 34): < 0.3 s on a file store, < 1.5 s on moto, at most
1 + 50 + (listing pages) requests. The first list of a store written without an index (the
one-time repair) is timed once as well. Then ``status --cached`` of one of the project's older
runs in the same store, once found through the run index (no receipt) and once through the
receipt submit leaves: the store requests each made (target: 1 to 3 either way). It prints
figures; it is not a test.

    .venv/bin/python bench/list_scaling.py [--runs 10000] [--repeat 5] [--stores file s3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npa.core.layout import (  # noqa: E402
    manifest_key,
    run_index_complete_key,
    run_index_key,
    run_index_prefix,
    run_prefix,
)
from tests.harness.procs import free_port  # noqa: E402
from tests.harness.s3 import ACCESS_KEY, REGION, SECRET_KEY  # noqa: E402
from tests.integration.store_proxy import store_proxy  # noqa: E402

BUCKET = "bench"
ROOT = "runs"
LIMIT = 50
PROJECTS = ("mine", "theirs")


def run_id(n: int) -> str:
    day = f"2026{1 + n // 40000:02d}{1 + n // 1440 % 28:02d}"
    return f"{day}-{n // 60 % 24:02d}{n % 60:02d}00-{n:06x}"


def manifest(project: str, workflow: str, rid: str, store: str) -> bytes:
    from npa.runs.manifest import RunManifest

    now = "2026-01-01T00:00:00+00:00"
    m = RunManifest(
        project=project, workflow=workflow, run_id=rid, backend="local", infra="local",
        state="SUCCEEDED", submitted_at=now, updated_at=now, store=store,
        prefix=run_prefix(workflow, rid), spec_sha256="x", source_digest=None, plan_digest="x",
        tasks={}, images={}, job_name=f"npa-{workflow}-{rid}", job_id=1,
    )  # fmt: skip
    return json.dumps(m.model_dump(mode="json")).encode()


def runs(count: int) -> list[tuple[str, str, str]]:
    """(project, workflow, run id): ``count`` runs of each project, interleaved in time."""
    made = []
    for n in range(2 * count):
        project = PROJECTS[n % 2]
        made.append((project, f"{project}-wf{n % 3}", run_id(n)))
    return made


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


@dataclass
class Paired:
    """Whole-process times of a command and its anchor, run in turn (A B A B ...): medians of
    each, and the median of the pairs' ratios, which stays meaningful when the other load on
    the machine changes during the run. CPU is user + system, steadier than wall when busy."""

    wall: float
    cpu: float
    anchor_wall: float
    anchor_cpu: float
    ratio_wall: float
    ratio_cpu: float


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    fn()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def paired(fn: Callable[[], Any], anchor: Callable[[], Any], repeat: int) -> Paired:
    ours, theirs = [], []
    for _ in range(repeat):
        ours.append(_timed(fn))
        theirs.append(_timed(anchor))
    med = statistics.median
    return Paired(
        wall=med(w for w, _ in ours),
        cpu=med(c for _, c in ours),
        anchor_wall=med(w for w, _ in theirs),
        anchor_cpu=med(c for _, c in theirs),
        ratio_wall=med(a[0] / b[0] for a, b in zip(ours, theirs, strict=True)),
        ratio_cpu=med(
            a[1] / b[1] if b[1] else float("nan") for a, b in zip(ours, theirs, strict=True)
        ),
    )


def paired_rows(label: str, p: Paired, anchor: str, requests: str) -> None:
    """The command beside its anchor: wall, then CPU, each with the paired ratio."""
    row(label, p.wall, anchor, p.anchor_wall, requests, p.ratio_wall)
    row("  CPU time (user + system)", p.cpu, "  CPU time", p.anchor_cpu, "", p.ratio_cpu)


def verdict_under_load(cpu: float, target: float) -> str:
    """The list's own CPU time beside the target: on a loaded machine the wall time is mostly
    waiting for a processor, and the CPU time is the work an idle one would still do (on S3
    the wait for the server comes on top)."""
    return (f"  its CPU time (user + system) {cpu:.3f} s, {cpu / target:.0%} of the target: the "
            "work an idle machine would still do")  # fmt: skip


def cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "npa", *argv], env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc


LIST = ("workbench", "workflow", "list", "--project", "mine", "--limit", str(LIMIT), "--json")


def row(
    label: str, seconds: float, anchor: str, anchor_s: float, requests: str,
    ratio: float | None = None,
) -> None:  # fmt: skip
    if ratio is None:
        ratio = seconds / anchor_s if anchor_s else float("nan")
    print(f"  {label:34} {seconds:7.3f} s   {anchor:38} {anchor_s:7.3f} s  "
          f"x{ratio:6.1f}   {requests}")  # fmt: skip


# --- file store -------------------------------------------------------------------------------


def bench_file(count: int, repeat: int, tmp: Path, env: dict[str, str]) -> None:
    store = tmp / "store"
    uri = store.as_uri()
    made = runs(count)
    runs_made[:] = made
    t0 = time.perf_counter()
    for project, workflow, rid in made:
        path = store / manifest_key(run_prefix(workflow, rid))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(manifest(project, workflow, rid, uri))
    print(f"file store: {len(made)} runs written in {time.perf_counter() - t0:.1f} s")
    for project in PROJECTS:
        cli(env, "configure", "--project", project, "--store", uri)

    # The one-time repair: a store written before the index (no markers at all).
    t0 = time.perf_counter()
    first = json.loads(cli(env, *LIST).stdout)
    repair = time.perf_counter() - t0
    print(f"  first list (repairs the index once): {repair:.2f} s; {first['index_note']}")

    cli(env, "--help")  # bytecode written once, as an installed npa has it
    with_help = paired(lambda: cli(env, *LIST), lambda: cli(env, "--help"), repeat)
    requests = count_file_requests(uri)

    def anchor() -> None:
        folder = store / run_index_prefix("mine")
        names = sorted(e.name for e in os.scandir(folder))[: LIMIT + 1]
        for name in names[1:]:
            rid, workflow = name.split(".", 1)[1].split("@", 1)
            (store / manifest_key(run_prefix(workflow, rid))).read_bytes()

    anchor_s = median_time(anchor, repeat)
    # The same reads as a plain Python process: start-up, a scan of the index, 50 JSON parses.
    plain = (
        "import json, os, sys\n"
        "store, folder = sys.argv[1], sys.argv[2]\n"
        f"names = sorted(e.name for e in os.scandir(folder))[: {LIMIT + 1}]\n"
        "for name in names[1:]:\n"
        "    rid, wf = name.split('.', 1)[1].split('@', 1)\n"
        "    json.loads(open(f'{store}/{wf}/{rid}/npa-workflow/manifest.json', 'rb').read())\n"
    )
    assert manifest_key(run_prefix("w", "r")) == "w/r/npa-workflow/manifest.json"
    plain_argv = [sys.executable, "-c", plain, str(store), str(store / run_index_prefix("mine"))]
    with_plain = paired(
        lambda: cli(env, *LIST), lambda: subprocess.run(plain_argv, check=True), repeat
    )
    print(f"  {'':34} {'npa':>9}   {'anchor':38} {'':9}  {'ratio':>7}   requests")
    paired_rows("list --limit 50 (whole process)", with_help, "npa --help (whole process)",
                requests)  # fmt: skip
    paired_rows("list --limit 50 (whole process)", with_plain,
                "plain python: scandir + 50 json (process)", "")  # fmt: skip
    seconds = statistics.median([with_help.wall, with_plain.wall])
    cpu = statistics.median([with_help.cpu, with_plain.cpu])
    print(
        f"  target: < 0.3 s whole process; {seconds:.3f} s measured "
        f"({'met' if seconds < 0.3 else 'not met'}; load average {os.getloadavg()[0]:.1f})"
    )
    print(verdict_under_load(cpu, 0.3))
    in_process = median_time(lambda: list_in_process(uri), repeat)
    row("list --limit 50 (in process)", in_process, "os.scandir + 50 manifest reads", anchor_s,
        "")  # fmt: skip

    def status_calls(rid: str) -> str:
        import npa.services.locate as locate
        from npa.services.status import status

        return count_store_calls(locate, lambda: status(rid, "mine", cached=True))

    print(status_line(status_calls, uri))


def list_in_process(uri: str) -> None:
    from npa.services.listing import list_runs

    list_runs("mine", limit=LIMIT)


def count_store_calls(module: Any, fn: Callable[[], Any]) -> str:
    """The store calls ``fn`` makes in process through ``module.open_run_store``, counted by
    wrapping the real store."""
    from npa.adapters.storage.base import WrappingStore

    calls: list[str] = []

    class Counting(WrappingStore):
        def _call(self, what: str, fn: Callable[[], Any]) -> Any:
            calls.append(what.split(" ", 2)[1])
            return fn()

    opened = module.open_run_store
    module.open_run_store = lambda *a, **k: Counting(opened(*a, **k))
    try:
        fn()
    finally:
        module.open_run_store = opened
    return f"{len(calls)} ({', '.join(f'{calls.count(c)} {c}' for c in sorted(set(calls)))})"


def count_file_requests(uri: str) -> str:
    """The store calls one in-process list makes."""
    import npa.services.listing as listing

    return count_store_calls(listing, lambda: list_in_process(uri))


def older_run() -> tuple[str, str]:
    """(workflow, run id) of a run of 'mine' from the middle of the store's history."""
    n = 2 * (len(runs_made) // 4)
    project, workflow, rid = runs_made[n]
    assert project == "mine"
    return workflow, rid


runs_made: list[tuple[str, str, str]] = []


def give_receipt(uri: str, workflow: str, rid: str) -> None:
    """The receipt submit leaves in NPA_HOME for the run (its store, its run's prefix)."""
    from npa.core.paths import NpaPaths
    from npa.runs.receipts import Receipt, write_receipt

    now = "2026-01-01T00:00:00+00:00"
    write_receipt(
        NpaPaths.from_env(),
        Receipt(project="mine", project_identity="bench", workflow=workflow, run_id=rid,
                submitted_at=now, store=uri, workflow_prefix=f"{uri}/{run_prefix(workflow, rid)}",
                credentials_source="environment"),
    )  # fmt: skip


def drop_receipt(rid: str) -> None:
    from npa.core.paths import NpaPaths

    NpaPaths.from_env().submission_receipt("mine", rid).unlink()


def status_line(count: Callable[[str], str], uri: str) -> str:
    """``status --cached`` of an older run of 'mine': the requests it made without a receipt
    (the run index finds its workflow) and with one. ``count(run_id)`` runs it and counts."""
    workflow, rid = older_run()
    without = count(rid)
    give_receipt(uri, workflow, rid)
    try:
        with_receipt = count(rid)
    finally:
        drop_receipt(rid)
    return (f"  status --cached of run {rid}: without a receipt {without}; with one "
            f"{with_receipt} (target: 1 to 3 either way)")  # fmt: skip


# --- S3 (moto) ---------------------------------------------------------------------------------


def bench_s3(count: int, repeat: int, env: dict[str, str]) -> None:
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    upstream = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client("s3", endpoint_url=upstream, region_name=REGION,
                              aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY)  # fmt: skip
        client.create_bucket(Bucket=BUCKET)
        made = runs(count)
        runs_made[:] = made
        uri = f"s3://{BUCKET}/{ROOT}"

        def put(item: tuple[str, str, str]) -> None:
            project, workflow, rid = item
            key = f"{ROOT}/{manifest_key(run_prefix(workflow, rid))}"
            client.put_object(Bucket=BUCKET, Key=key, Body=manifest(project, workflow, rid, uri))
            marker = f"{ROOT}/{run_index_key(project, workflow, rid)}"
            client.put_object(Bucket=BUCKET, Key=marker, Body=b"{}")

        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, made))
        for project in PROJECTS:
            key = f"{ROOT}/{run_index_complete_key(project)}"
            client.put_object(Bucket=BUCKET, Key=key, Body=b"{}")
        print(f"moto: {len(made)} runs (manifest and marker each) written in "
              f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
        s3_env = {**env, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                  "AWS_DEFAULT_REGION": REGION}  # fmt: skip
        with store_proxy(upstream) as (endpoint, proxy):
            s3_env["AWS_ENDPOINT_URL_S3"] = endpoint
            for project in PROJECTS:
                cli(s3_env, "configure", "--project", project, "--store", uri)
            cli(s3_env, *LIST)  # warm moto's caches as the anchor's run will find them
            proxy.counts.clear()
            cli(s3_env, *LIST)
            counts = dict(proxy.counts)
            aws = ["aws", "s3api", "list-objects-v2", "--bucket", BUCKET, "--prefix",
                   f"{ROOT}/{run_index_prefix('mine')}", "--max-items", str(LIMIT + 2),
                   "--page-size", str(LIMIT + 2), "--endpoint-url", upstream]  # fmt: skip
            if shutil.which("aws") is None:
                raise SystemExit("the aws CLI is needed for the anchor (pip install awscli)")
            with_aws = paired(
                lambda: cli(s3_env, *LIST),
                lambda: subprocess.run(aws, env=s3_env, capture_output=True, check=True),
                repeat,
            )
            seconds, listing = with_aws.wall, with_aws.anchor_wall
            keys = [
                o["Key"] for o in client.list_objects_v2(
                    Bucket=BUCKET, Prefix=f"{ROOT}/{run_index_prefix('mine')}", MaxKeys=LIMIT + 1
                )["Contents"]
            ][1:]  # fmt: skip

            def gets() -> None:
                def one(key: str) -> None:
                    rid, workflow = key.rsplit("/", 1)[1].split(".", 1)[1].split("@", 1)
                    manifest_at = f"{ROOT}/{manifest_key(run_prefix(workflow, rid))}"
                    client.get_object(Bucket=BUCKET, Key=manifest_at)["Body"].read()

                with ThreadPoolExecutor(16) as pool:
                    list(pool.map(one, keys))

            gets_s = median_time(gets, repeat)

            def status_calls(rid: str) -> str:
                proxy.counts.clear()
                argv = ("workbench", "workflow", "status", rid, "--project", "mine",
                        "--cached", "--json")  # fmt: skip
                cli(s3_env, *argv)
                found = dict(proxy.counts)
                return f"{sum(found.values())} {found}"

            statuses = status_line(status_calls, uri)
        total = sum(counts.values())
        print(f"  {'':34} {'npa':>9}   {'anchor':38} {'':9}  {'ratio':>7}   requests")
        paired_rows("list --limit 50 (whole process)", with_aws,
                    "aws s3api list-objects-v2 (process)", f"{total} {counts}")  # fmt: skip
        row("", seconds, "that + 50 GETs from boto3 (in process)", listing + gets_s, "")
        print(f"  target: < 1.5 s whole process; {seconds:.3f} s measured "
              f"({'met' if seconds < 1.5 else 'not met'}; load average "
              f"{os.getloadavg()[0]:.1f})")  # fmt: skip
        print(verdict_under_load(with_aws.cpu, 1.5))
        print(f"  target: at most 1 + {LIMIT} + pages requests; {total} made")
        print(statuses)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000, help="runs of each project")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--stores", nargs="+", default=["file", "s3"], choices=["file", "s3"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "NPA_HOME": f"{tmp}/.npa", "HOME": tmp,
               "PYTHONPATH": str(REPO)}  # fmt: skip
        # The CLI as installed: pip compiles npa's bytecode, so the processes timed here may
        # write and read it too (without it every run compiles npa's modules again, ~45 ms).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["NPA_HOME"] = env["NPA_HOME"]
        print(f"{args.runs} runs of project 'mine' and {args.runs} of 'theirs' in one store; "
              f"median of {args.repeat}; load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores")  # fmt: skip
        if "file" in args.stores:
            bench_file(args.runs, args.repeat, Path(tmp), env)
        if "s3" in args.stores:
            bench_s3(args.runs, args.repeat, env)


if __name__ == "__main__":
    main()
