#!/usr/bin/env python3
"""Benchmark: `npa ... stage-source` against `aws s3 sync` on the same moto S3 server.

    .venv/bin/python bench/stage_vs_s3sync.py [--repeat 3] [--files 1225] [--megabytes 50]

Generates a deterministic source tree (default 1,225 files, ~50 MB), starts one moto server
on 127.0.0.1, and times, as command-line processes (each pays its own start-up):

- first upload:      npa stage-source of a fresh run   vs  aws s3 sync to a fresh prefix
- unchanged re-run:  the same command again             vs  the same sync again

Requests are counted on the server (moto's request log, the same instrument for both tools),
and npa's once more with a botocore ``before-send`` hook on an in-process staging, as a cross
check. awscli pins its own botocore, so it lives in a throwaway venv under .bench/ (created on
first use, from PyPI), never in the project venv.

Prints figures; it is not a test and asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
AWS_VENV = BENCH_DIR / "awscli-venv"
BUCKET = "npa-bench"
SPEC = "apiVersion: npa/v1\nkind: Workflow\nmetadata:\n  name: bench-flow\n"

sys.path.insert(0, str(REPO))


def ensure_awscli() -> Path:
    aws = AWS_VENV / "bin" / "aws"
    if not aws.exists():
        print(f"creating {AWS_VENV} with awscli from PyPI ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(AWS_VENV)], check=True)
        pip = AWS_VENV / "bin" / "pip"
        subprocess.run([str(pip), "install", "--quiet", "awscli"], check=True)
    return aws


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
            name, size = f"mod_{i:04d}.py", max(1, int(w * scale))
        path = root.joinpath(*parts, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            name = f"dup_{i:04d}.py"
            path = path.with_name(name)
        path.write_bytes(rng.randbytes(size))
        total += size
    (root / "spec.yaml").write_text(SPEC)
    count = sum(1 for p in root.rglob("*") if p.is_file())
    return count, total + len(SPEC)


class RequestLog(logging.Handler):
    """Counts requests from moto's (werkzeug's) access log, by HTTP method."""

    LINE = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d+)')

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


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed, proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--files", type=int, default=1225)
    ap.add_argument("--megabytes", type=float, default=50.0)
    ap.add_argument(
        "--jobs", type=int, default=None, help="npa --jobs (default: npa's own; awscli uses 10)"
    )
    args = ap.parse_args()

    aws = ensure_awscli()
    aws_version = subprocess.run([str(aws), "--version"], capture_output=True, text=True).stdout
    work = Path(tempfile.mkdtemp(prefix="run-", dir=BENCH_DIR))
    tree = work / "tree"
    n_files, n_bytes = generate_tree(tree, args.files, args.megabytes)
    print(f"tree: {n_files} files, {n_bytes / 1e6:.1f} MB at {tree}")
    print(f"awscli: {aws_version.strip()}")

    from moto.server import ThreadedMotoServer

    from tests.harness.procs import free_port
    from tests.harness.s3 import ACCESS_KEY, REGION, SECRET_KEY

    log = RequestLog()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(log)
    werkzeug.setLevel(logging.INFO)
    werkzeug.propagate = False

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_CONFIG_FILE": str(work / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(work / "no-aws-credentials"),
        "NPA_HOME": str(work / "npa-home"),
        "PYTHONPATH": str(REPO),
    }
    try:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        ).create_bucket(Bucket=BUCKET)
        npa = [sys.executable, "-m", "npa"]
        spec = str(tree / "spec.yaml")
        timed([*npa, "configure", "--project", "bench", "--store", f"s3://{BUCKET}/npa"], env)
        log.take()

        rows: dict[str, list[float]] = collections.defaultdict(list)
        requests: dict[str, dict[str, int]] = {}
        for rep in range(args.repeat):
            _, prep = timed(
                [*npa, "workbench", "workflow", "prepare-run", spec, "--project", "bench"], env
            )
            run_id = prep.stdout.strip()
            stage = [*npa, "workbench", "workflow", "stage-source", spec, "--project", "bench",
                     "--run-id", run_id, "--source", str(tree), "--json"]  # fmt: skip
            if args.jobs:
                stage += ["--jobs", str(args.jobs)]
            sync = [str(aws), "s3", "sync", str(tree), f"s3://{BUCKET}/aws-{rep}/",
                    "--endpoint-url", endpoint, "--only-show-errors"]  # fmt: skip
            # Alternate which tool goes first, so neither always meets a warmer server.
            order = [("npa", stage), ("aws", sync)]
            if rep % 2:
                order.reverse()
            for phase in ("first", "rerun"):
                for tool, argv in order:
                    log.take()
                    elapsed, proc = timed(argv, env)
                    rows[f"{tool} {phase}"].append(elapsed)
                    requests[f"{tool} {phase}"] = log.take()
                    if tool == "npa":
                        summary = json.loads(proc.stdout)
                        rows[f"npa {phase} in-command"].append(summary["seconds"])
                        want = summary["blobs"] if phase == "first" else 0
                        if summary["uploaded"] != want:
                            raise SystemExit(f"npa {phase} uploaded {summary['uploaded']}")

        hook_counts = in_process_hook_count(tree, endpoint, env, args.jobs)
    finally:
        server.stop()

    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\nmedian of {args.repeat} runs, wall-clock seconds per command (with process start-up)")
    print(f"{'':18}{'npa stage-source':>18}{'aws s3 sync':>14}")
    for phase in ("first", "rerun"):
        print(f"{phase + ' upload' if phase == 'first' else 'unchanged re-run':18}"
              f"{med['npa ' + phase]:>18.2f}{med['aws ' + phase]:>14.2f}")  # fmt: skip
    print(
        "(npa's own staging time, without process start-up and store client set-up: "
        f"first {med['npa first in-command']:.2f}s, re-run {med['npa rerun in-command']:.2f}s)"
    )
    print(
        f"\nfirst upload:     npa/aws time ratio = {med['npa first'] / med['aws first']:.2f} "
        "(<= 1.0 means npa is no slower)"
    )
    print(
        f"unchanged re-run: aws/npa time ratio = {med['aws rerun'] / med['npa rerun']:.2f} "
        "(npa is this many times faster)"
    )
    print("\nrequests seen by the server (last repetition), by method:")
    for key in ("npa first", "aws first", "npa rerun", "aws rerun"):
        counts = requests[key]
        print(f"  {key:10} total {sum(counts.values()):5}  {counts}")
    print("\nnpa requests counted by a botocore before-send hook (in-process staging):")
    for key, counts in hook_counts.items():
        print(f"  {key:10} total {sum(counts.values()):5}  {counts}")
    print(f"\nraw seconds: {json.dumps({k: [round(x, 3) for x in v] for k, v in rows.items()})}")
    shutil.rmtree(work, ignore_errors=True)


def in_process_hook_count(
    tree: Path, endpoint: str, env: dict[str, str], jobs: int | None
) -> dict[str, dict[str, int]]:
    """Stage once more in-process to count npa's requests at the client, per operation."""
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    from npa.adapters.storage import open_store
    from npa.adapters.storage.s3 import S3Store
    from npa.runs.staging import default_jobs, stage_source

    jobs = jobs or default_jobs()

    store = open_store(f"s3://{BUCKET}/hook", endpoint_url=endpoint, region="us-east-1",
                       max_connections=jobs + 4)  # fmt: skip
    assert isinstance(store, S3Store)
    counts: collections.Counter[str] = collections.Counter()

    def count(model: object, **_: object) -> None:
        counts[getattr(model, "name", "?")] += 1

    store.client.meta.events.register("before-call.s3.*", count)
    out: dict[str, dict[str, int]] = {}
    for phase in ("first", "rerun"):
        stage_source(store, tree, "bench-flow/hook/npa-workflow", jobs=jobs)
        out[f"npa {phase}"] = dict(sorted(counts.items()))
        counts.clear()
    return out


if __name__ == "__main__":
    main()
