"""memprobe's speed and memory, measured: cold and warm comparisons, per-strategy figures.

    .venv/bin/python bench/bench.py            # small comparison (tiny-e2b, deviceless v5p)
    .venv/bin/python bench/bench.py --full     # also the default full-size comparison (an hour
                                               # or more on a 2-core machine)

For each comparison it runs `memprobe compare` twice with a fresh results cache: cold
(everything compiles) and warm (everything answered from the cache), and prints per
strategy: the compile process's wall time, XLA's compile time, trace+lower time, the
rest (process start-up, imports, reading figures), and the process's peak resident host
memory; then the totals and memprobe's own overhead: the share of the compile processes'
time spent outside XLA's compile. Targets (issue 5): warm re-run <= 2 s, overhead <= 10%
of a cold run, peak host RSS per full-size compile <= 12 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SMALL = ["--model", "tiny-e2b", "--target", "v5p", "--devices", "4", "--seq", "1024", "--batch", "2"]
FULL = ["--seq", "24576", "--batch", "8"]


def run(args: list[str], cache: str) -> tuple[float, dict]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, "-m", "memprobe", "compare", *args, "--format", "json", "--output", out]
    t0 = time.monotonic()
    r = subprocess.run(cmd, env={**os.environ, "MEMPROBE_CACHE_DIR": cache}, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode not in (0, 1):
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{r.stderr}")
    with open(out) as f:
        data = json.load(f)
    os.unlink(out)
    return wall, data


def report(name: str, args: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="memprobe-bench-") as cache:
        cold_wall, cold = run(args, cache)
        warm_wall, warm = run(args, cache)
    rows = cold["comparisons"][0]["rows"]
    print(f"\n## {name}: memprobe compare {' '.join(args)}\n")
    print("| strategy | process wall s | XLA compile s | trace+lower s | other s | peak host RSS GiB |")
    print("|---|---:|---:|---:|---:|---:|")
    proc_total = xla_total = 0.0
    for r in rows:
        proc, xla, low = r.get("process_seconds") or 0.0, r.get("compile_seconds") or 0.0, r.get("lower_seconds") or 0.0
        proc_total += proc
        xla_total += xla
        rss = (r.get("host_rss_bytes") or 0) / 2**30
        print(f"| {r['strategy']} | {proc:.1f} | {xla:.1f} | {low:.1f} | {proc - xla - low:.1f} | {rss:.2f} |")
    cached = sum(bool(r.get("cached")) for r in warm["comparisons"][0]["rows"])
    print(f"\ncold run: {cold_wall:.1f} s wall for {len(rows)} strategies; "
          f"warm re-run: {warm_wall:.2f} s wall ({cached}/{len(rows)} from cache)")
    if proc_total:
        print(f"memprobe overhead (compile-process time outside XLA's compile): "
              f"{proc_total - xla_total:.1f} s of {proc_total:.1f} s = {100 * (proc_total - xla_total) / proc_total:.1f}%")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="also run the full-size default comparison")
    p.add_argument("--jobs", default="2")
    a = p.parse_args()
    report("small", [*SMALL, "--jobs", a.jobs])
    if a.full:
        report("full size (default comparison)", [*FULL, "--jobs", a.jobs])


if __name__ == "__main__":
    main()
