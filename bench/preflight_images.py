"""preflight-images over 50 images on a local registry: concurrent against one at a time.

Starts the CNCF distribution registry on loopback (the same one the tests use), pushes N small
attested images, writes a spec with one tool per image, then times the preflight service with
its default concurrency and with a concurrency of 1, each with a cold verification cache (every
image: manifest HEAD plus manifest and config reads) and once more with a warm cache (manifest
HEAD only). Prints the median of each and the ratio. A figure-printing script, not a test.

On loopback both npa and the registry (which checks a bcrypt password on every request) share
two cores, so the figure mostly measures CPU. ``--rtt-ms`` also runs the comparison through the
tests' token-auth front with that much delay added to every answer, which is what a registry
across a network looks like (Bearer token flow included).

    python bench/preflight_images.py [--images 50] [--runs 3] [--rtt-ms 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from npa.core.paths import NpaPaths  # noqa: E402
from npa.services.images import MAX_CONCURRENCY, preflight  # noqa: E402
from tests.harness.registry import distribution_registry  # noqa: E402
from tests.harness.tools import find_tool  # noqa: E402
from tests.integration.imagespec import push_attested, write_spec  # noqa: E402
from tests.integration.registry_proxy import PROXY_PASSWORD, PROXY_USER, token_proxy  # noqa: E402


def timed(spec: Path, home: Path, concurrency: int, auth: list[str]) -> float:
    start = time.perf_counter()
    result = preflight(spec, registry_auth=auth, concurrency=concurrency, paths=NpaPaths(home))
    elapsed = time.perf_counter() - start
    if result.exit_code() != 0:
        bad = [r for r in result.images if r.status != "ok"]
        raise SystemExit(f"preflight was not all ok: {bad[0].tool}: {bad[0].detail}")
    return elapsed


def tools_at(host: str, repos: list[str]) -> dict[str, dict[str, str]]:
    return {f"tool{i:02d}": {"image": f"{host}/{repo}:v1"} for i, repo in enumerate(repos)}


def compare(name: str, spec: Path, work: Path, auth: list[str], runs: int, images: int) -> None:
    timed(spec, work / f"warmup-{name}", MAX_CONCURRENCY, auth)
    figures: dict[str, list[float]] = {}
    for run in range(runs):
        for label, conc in (("concurrent", MAX_CONCURRENCY), ("sequential", 1)):
            home = work / f"home-{name}-{label}-{run}"
            figures.setdefault(f"{label} cold", []).append(timed(spec, home, conc, auth))
            figures.setdefault(f"{label} warm", []).append(timed(spec, home, conc, auth))
    median = {k: statistics.median(v) for k, v in figures.items()}
    print(f"== {name}: {images} images, median of {runs}, concurrency {MAX_CONCURRENCY} vs 1")
    for key in ("concurrent cold", "sequential cold", "concurrent warm", "sequential warm"):
        per = median[key] / images * 1000
        print(f"   {key:16s} {median[key] * 1000:8.1f} ms  ({per:6.1f} ms per image)")
    for phase in ("cold", "warm"):
        ratio = median[f"sequential {phase}"] / median[f"concurrent {phase}"]
        print(f"   ratio sequential/concurrent ({phase} cache): {ratio:5.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    args = parser.parse_args()

    binary = find_tool("NPA_REGISTRY_BIN", "docker-registry", "registry")
    if binary is None:
        print("docker-registry is not installed; run scripts/bootstrap-tools --only registry")
        return 1
    print(f"cores: {os.cpu_count()} (npa and the registry share them)")
    with tempfile.TemporaryDirectory(prefix="npa-bench-") as tmp:
        work = Path(tmp)
        with distribution_registry(binary, work / "registry") as registry:
            repos = [push_attested(registry, f"b{i:02d}").repository for i in range(args.images)]
            os.environ["NPA_BENCH_REGISTRY_AUTH"] = ":".join(registry.auth)
            spec = write_spec(work / "spec.yaml", tools_at(registry.host, repos))
            auth = [f"{registry.host}=env:NPA_BENCH_REGISTRY_AUTH"]
            compare("loopback registry, Basic auth", spec, work, auth, args.runs, args.images)
            if args.rtt_ms > 0:
                with token_proxy(registry, delay=args.rtt_ms / 1000) as proxy:
                    os.environ["NPA_BENCH_TOKEN_AUTH"] = f"{PROXY_USER}:{PROXY_PASSWORD}"
                    spec = write_spec(work / "spec-rtt.yaml", tools_at(proxy.host, repos))
                    auth = [f"{proxy.host}=env:NPA_BENCH_TOKEN_AUTH"]
                    name = f"token front, {args.rtt_ms:g} ms added per answer"
                    compare(name, spec, work, auth, args.runs, args.images)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
