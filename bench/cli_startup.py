"""Whole-process start-up time of ``npa --help`` against bare Python and ``sky --help``.

Prints the median of several runs of each command, npa's overhead over bare Python (target:
at most 0.25 s) and its ratio to ``sky --help``, then lists any heavy library that
``python -X importtime -m npa --help`` imported (target: none). It also times one small real
command, ``npa configure --show --json`` in a throwaway NPA_HOME: option parsing, the result
model and its output, the floor under every npa command.

    python bench/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = {"sky", "pulumi", "boto3", "botocore", "kubernetes", "pulumi_kubernetes", "pulumi_aws"}
TARGET_OVERHEAD_S = 0.25


def median_seconds(argv: list[str], runs: int, env: dict[str, str] | None = None) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env
        )
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def heavy_imports() -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "npa", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    seen = {
        line.split("|")[-1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    return sorted(seen & HEAVY)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    bindir = Path(sys.executable).parent
    npa = shutil.which("npa", path=str(bindir)) or "npa"
    sky = shutil.which("sky", path=str(bindir))

    # One warm-up of each so the page cache is the same for all three.
    for argv in ([sys.executable, "-c", "pass"], [npa, "--help"]):
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)

    bare = median_seconds([sys.executable, "-c", "pass"], args.runs)
    npa_s = median_seconds([npa, "--help"], args.runs)
    print(f"runs per command:        {args.runs}")
    print(f"python -c pass (anchor): {bare * 1000:8.1f} ms")
    print(f"npa --help:              {npa_s * 1000:8.1f} ms")
    overhead = npa_s - bare
    verdict = "meets" if overhead <= TARGET_OVERHEAD_S else "MISSES"
    print(
        f"npa overhead over python: {overhead * 1000:7.1f} ms "
        f"({verdict} the {TARGET_OVERHEAD_S * 1000:.0f} ms target)"
    )
    with tempfile.TemporaryDirectory(prefix="npa-home-") as home:
        env = {**os.environ, "NPA_HOME": home}
        show = [npa, "configure", "--show", "--json"]
        subprocess.run(show, stdout=subprocess.DEVNULL, check=True, env=env)
        show_s = median_seconds(show, args.runs, env)
    print(f"npa configure --show:    {show_s * 1000:8.1f} ms (a whole small command)")
    if sky:
        subprocess.run([sky, "--help"], stdout=subprocess.DEVNULL, check=True)
        sky_s = median_seconds([sky, "--help"], args.runs)
        print(f"sky --help:              {sky_s * 1000:8.1f} ms")
        print(f"ratio sky/npa:           {sky_s / npa_s:8.1f}x")
    heavy = heavy_imports()
    print(f"heavy imports at --help: {', '.join(heavy) if heavy else 'none'}")
    return 0 if overhead <= TARGET_OVERHEAD_S and not heavy else 1


if __name__ == "__main__":
    sys.exit(main())
