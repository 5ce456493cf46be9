"""Measured vs estimated: run the real train step on a local accelerator and compare.

For each strategy, in a fresh process each (so the device's peak counter starts at zero):

1. the deviceless estimate: memprobe's compile for ``--target`` (h200 by default) with one
   device, exactly as ``memprobe compare`` makes it;
2. the on-device compile's own estimate: the same step compiled for the local device,
   ``memory_analysis()`` peak (argument + output - alias + temp);
3. the measurement: parameters, AdamW state and a batch filled with random values on the
   device, one training step run, then ``memory_stats()["peak_bytes_in_use"]``.

    .venv/bin/python bench/validate_gpu.py                       # gemma4-e2b, seq 1024, batch 1
    .venv/bin/python bench/validate_gpu.py --model tiny-e2b --strategies unrolled,checkpoint

It prints a markdown table (bytes and GiB) and the exact command, for reports/. On a
machine without an accelerator the device column reads "n/a (cpu has no memory_stats)":
that is how this script is tested here; the figures need a real GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GIB = 1024**3


def measure_on_device(model: str, strategy: str, seq: int, batch: int) -> dict:
    """Runs in a child process: one real training step on the first local device."""
    import jax
    import jax.numpy as jnp

    from memprobe.build import build_step
    from memprobe.plan import make_plan
    from memprobe.strategy import load_catalogue, select
    from memprobe.targets import Target

    device = jax.devices()[0]
    target = Target(platform=device.platform, name=device.platform, num_devices=1)
    plan = make_plan(model=model, strategies=select(load_catalogue(), [strategy]), target=target,
                     seq_len=seq, batch_per_device=batch)
    job = plan.jobs()[0]
    step = build_step(job, [device])
    compiled = step.lower().compile()
    mem = compiled.memory_analysis()
    estimate = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes

    keys = iter(jax.random.split(jax.random.key(0), 4096))

    def fill(x):
        if jnp.issubdtype(x.dtype, jnp.integer):  # tokens and targets
            make = lambda k: jax.random.randint(k, x.shape, 0, job.model.vocab_size, x.dtype)  # noqa: E731
        else:
            make = lambda k: (0.02 * jax.random.normal(k, x.shape, jnp.float32)).astype(x.dtype)  # noqa: E731
        return jax.jit(make, out_shardings=x.sharding)(next(keys))

    args = jax.tree.map(fill, step.args)
    jax.block_until_ready(args)
    t0 = time.perf_counter()
    out = compiled(*args)
    jax.block_until_ready(out)
    seconds = time.perf_counter() - t0
    stats = device.memory_stats() or {}
    return {"strategy": strategy, "device": str(device.device_kind), "on_device_estimate": int(estimate),
            "peak_bytes_in_use": stats.get("peak_bytes_in_use"), "step_seconds": round(seconds, 3),
            "bytes_limit": stats.get("bytes_limit")}


def deviceless_estimate(model: str, strategy: str, target: str, seq: int, batch: int) -> int | None:
    from memprobe.compile import compile_isolated
    from memprobe.plan import make_plan
    from memprobe.strategy import load_catalogue, select
    from memprobe.targets import resolve_target

    plan = make_plan(model=model, strategies=select(load_catalogue(), [strategy]),
                     target=resolve_target(target, 1), seq_len=seq, batch_per_device=batch)
    m = compile_isolated(plan.jobs()[0])
    return m.peak_bytes if m.ok else None


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f} GiB ({n:,} B)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma4-e2b")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--target", default="h200", help="the deviceless target to compare with")
    p.add_argument("--strategies", default="unrolled,checkpoint,scan-checkpoint,offload,dots-no-batch,"
                   "minimal,offload-mlp,scan-offload")
    p.add_argument("--one", help=argparse.SUPPRESS)  # child process: measure this strategy
    a = p.parse_args()
    if a.one:
        print(json.dumps(measure_on_device(a.model, a.one, a.seq, a.batch)))
        return
    rows = []
    for strategy in a.strategies.split(","):
        estimate = deviceless_estimate(a.model, strategy, a.target, a.seq, a.batch)
        child = subprocess.run([sys.executable, __file__, "--one", strategy, "--model", a.model,
                                "--seq", str(a.seq), "--batch", str(a.batch)],
                               capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        if child.returncode != 0:
            why = (child.stderr.strip().splitlines() or ["no output"])[-1][:160]
            rows.append((strategy, estimate, None, None, None, f"failed: {why}"))
            continue
        r = json.loads(child.stdout.strip().splitlines()[-1])
        measured = r["peak_bytes_in_use"]
        ratio = f"{measured / estimate:.3f}" if measured and estimate else "-"
        note = r["device"] if measured is not None else f"n/a ({r['device']} has no memory_stats)"
        rows.append((strategy, estimate, r["on_device_estimate"], measured, ratio, note))
    print(f"\n{a.model}, seq {a.seq} x batch {a.batch}, one device; deviceless target {a.target}\n")
    print(f"| strategy | deviceless {a.target} estimate | on-device compile estimate | measured peak_bytes_in_use "
          "| measured / deviceless | device |")
    print("|---|---:|---:|---:|---:|---|")
    for s, est, dev, meas, ratio, note in rows:
        print(f"| {s} | {_gib(est)} | {_gib(dev)} | {_gib(meas)} | {ratio or '-'} | {note} |")
    print(f"\nCommand: `{' '.join(['python', 'bench/validate_gpu.py', *sys.argv[1:]])}`")


if __name__ == "__main__":
    main()
