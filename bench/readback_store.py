"""``status`` and ``list --limit 50`` against a store holding 500 runs: whole-process time and
the number of store requests, for two stores that differ only in how many objects each run
holds. The request counts must follow the runs listed, not the objects stored.

moto's S3 server on loopback, with a counting HTTP proxy in front (the same proxy the tests use),
and the real ``npa`` CLI as a subprocess. Prints figures; asserts nothing.

    python bench/readback_store.py [--runs 500] [--objects 10 40] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.procs import free_port  # noqa: E402
from tests.harness.s3 import ACCESS_KEY, REGION, SECRET_KEY  # noqa: E402
from tests.integration.store_proxy import store_proxy  # noqa: E402

BUCKET = "bench"
WORKFLOWS = ("curate", "train", "eval")


def run_id(n: int) -> str:
    return (
        f"2026{1 + n // 2000:02d}{1 + n // 100 % 20:02d}-{n // 60 % 24:02d}{n % 60:02d}00-{n:06x}"
    )


def manifest(workflow: str, rid: str) -> bytes:
    from npa.runs.manifest import RunManifest

    now = "2026-01-01T00:00:00+00:00"
    m = RunManifest(
        project="bench", workflow=workflow, run_id=rid, backend="local", infra="local",
        state="SUCCEEDED", submitted_at=now, updated_at=now, store=f"s3://{BUCKET}/runs",
        prefix=f"{workflow}/{rid}/npa-workflow", spec_sha256="x", source_digest=None,
        plan_digest="x", tasks={}, images={}, job_name=f"npa-{workflow}-{rid}", job_id=1,
    )  # fmt: skip
    return json.dumps(m.model_dump(mode="json")).encode()


def populate(client: Any, prefix: str, runs: int, objects: int) -> list[tuple[str, str]]:
    made = [(WORKFLOWS[n % len(WORKFLOWS)], run_id(n)) for n in range(runs)]

    def one(item: tuple[str, str]) -> None:
        workflow, rid = item
        base = f"{prefix}/{workflow}/{rid}/npa-workflow"
        client.put_object(Bucket=BUCKET, Key=f"{base}/manifest.json", Body=manifest(workflow, rid))
        for i in range(objects - 1):
            client.put_object(Bucket=BUCKET, Key=f"{base}/source/blobs/{i:04d}", Body=b"x" * 64)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, made))
    return made


def timed(
    argv: list[str], env: dict[str, str], proxy: Any, repeat: int
) -> tuple[float, int, dict[str, int]]:
    samples = []
    counts: dict[str, int] = {}
    for _ in range(repeat):
        proxy.counts.clear()
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "npa", *argv], env=env, capture_output=True,
                              text=True, check=False)  # fmt: skip
        samples.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"{argv} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        counts = dict(proxy.counts)
    return statistics.median(samples), sum(counts.values()), counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--objects", type=int, nargs="+", default=[10, 40])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    upstream = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client(
            "s3",
            endpoint_url=upstream,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )
        client.create_bucket(Bucket=BUCKET)
        with store_proxy(upstream) as (endpoint, proxy), tempfile.TemporaryDirectory() as home:
            env = {**os.environ, "NPA_HOME": f"{home}/.npa", "HOME": home,
                   "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                   "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL_S3": endpoint}  # fmt: skip
            print(f"{args.runs} runs across {len(WORKFLOWS)} workflows; median of {args.repeat}")
            head = f"{'objects/run':>11} {'stored':>7} {'command':44} {'seconds':>8}"
            print(f"{head} {'requests':>9}  by method")
            for objects in args.objects:
                prefix = f"runs-{objects}"
                t0 = time.perf_counter()
                made = populate(client, prefix, args.runs, objects)
                fill = time.perf_counter() - t0
                subprocess.run([sys.executable, "-m", "npa", "configure", "--project", "bench",
                                "--store", f"s3://{BUCKET}/{prefix}"], env=env, check=True,
                               capture_output=True)  # fmt: skip
                workflow, newest = max(made, key=lambda m: m[1])
                wf = ["workbench", "workflow"]
                cases = [
                    ("list --limit 50", [*wf, "list", "--project", "bench", "--limit", "50"]),
                    ("list --limit 10", [*wf, "list", "--project", "bench", "--limit", "10"]),
                    ("status RUN (no receipt: store scan)", [*wf, "status", newest]),
                    (
                        "status s3://…/<workflow>/RUN",
                        [*wf, "status", f"s3://{BUCKET}/{prefix}/{workflow}/{newest}"],
                    ),
                ]
                for label, argv in cases:
                    argv = [*argv, "--json"] + (["--project", "bench"] if "status" in argv else [])
                    seconds, total, counts = timed(argv, env, proxy, args.repeat)
                    row = f"{objects:>11} {objects * args.runs:>7} {label:44} {seconds:8.2f}"
                    print(f"{row} {total:>9}  {counts}")
                print(f"{'':>11} (store filled in {fill:.1f}s)")
            t = timed(["--help"], env, proxy, args.repeat)[0]
            print(f"\nfor scale: `npa --help` takes {t:.2f}s as a whole process here")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
