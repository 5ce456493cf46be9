"""Measured vs estimated: run the real train step on a local accelerator and compare.

Three figures per strategy, all per device, all for the same train step (forward,
backward, AdamW update) on one device:

1. the deviceless estimate: memprobe's compile for ``--target`` (h200 by default), exactly
   as ``memprobe compare --target h200 --devices 1`` makes it; or, with ``--estimates``,
   read from such a command's JSON, computed on another machine (the GPU machine lent
   here has another jax and CUDA plugin than memprobe's gpu extra; see docs/benchmarks.md);
2. the on-device compile's own estimate: the same step compiled for the local device,
   ``memory_analysis()`` argument + output - alias + temp;
3. the measurement: parameters, AdamW state and a batch filled with random values on the
   device, one training step run, then ``memory_stats()["peak_bytes_in_use"]``.

Built for a short lease on a GPU (15 minutes, machine start included), so:

- phase 1 compiles every strategy for the device at once (``--jobs`` processes), which
  gives figure 2 and fills a persistent compilation cache;
- phase 2 runs the strategies one after another, each in a fresh process (the device's
  peak counter starts at zero), loading its executable from that cache;
- every finished row is written at once to ``--out`` (``rows.jsonl`` and ``table.md``), so
  a run stopped at its time limit still returns what it measured; ``--budget`` stops all
  work after that many seconds (what was running is marked so).

    .venv/bin/python bench/validate_gpu.py --model tiny-e2b --target cpu --seq 256 --batch 2
    python3 bench/validate_gpu.py --seq 8192 --batch 1 --estimates reports/FILE.json --out DIR

On a machine without an accelerator the measured column reads "n/a (cpu has no
memory_stats)": that is how the tests run this script; the figures need a real GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
# Every built-in strategy, those a user most needs measured first (a run stopped by
# --budget still returns them).
ALL = ("checkpoint,scan-checkpoint,scan-layers,scan-periods,unrolled,offload,scan-layers-offload,"
       "minimal,dots-no-batch,offload-mlp,scan-offload")
ROOT = Path(__file__).resolve().parent.parent


def _job(model: str, strategy: str, seq: int, batch: int):
    import jax

    from memprobe.plan import make_plan
    from memprobe.strategy import load_catalogue, select
    from memprobe.targets import Target

    device = jax.devices()[0]
    platform = "cuda" if device.platform == "gpu" else device.platform  # memprobe's name for it
    target = Target(platform=platform, name=platform, num_devices=1)
    plan = make_plan(model=model, strategies=select(load_catalogue(), [strategy]), target=target,
                     seq_len=seq, batch_per_device=batch)
    return device, plan.jobs()[0]


def _compiled(job, device):
    from memprobe.build import build_step

    step = build_step(job, [device])
    t0 = time.perf_counter()
    compiled = step.lower().compile()
    try:  # an executable loaded from the persistent cache may come without its statistics
        mem = compiled.memory_analysis()
        estimate = int(mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
                       + mem.temp_size_in_bytes) or None
    except Exception:  # noqa: BLE001 - phase 2 needs the executable, not its figures
        estimate = None
    return step, compiled, estimate, time.perf_counter() - t0


def compile_on_device(model: str, strategy: str, seq: int, batch: int) -> dict:
    """Child process, phase 1: the on-device compile's estimate (fills the compilation cache)."""
    device, job = _job(model, strategy, seq, batch)
    _, _, estimate, seconds = _compiled(job, device)
    return {"strategy": strategy, "on_device_estimate": estimate, "compile_s": round(seconds, 1)}


def measure_on_device(model: str, strategy: str, seq: int, batch: int) -> dict:
    """Child process, phase 2: one real training step on the first local device."""
    import jax
    import jax.numpy as jnp

    device, job = _job(model, strategy, seq, batch)
    step, compiled, estimate, seconds = _compiled(job, device)
    # One program fills every argument (a program per array would compile hundreds of times).
    leaves, treedef = jax.tree.flatten(step.args)

    def fill(key):
        out = []
        for k, x in zip(jax.random.split(key, len(leaves)), leaves, strict=True):
            if jnp.issubdtype(x.dtype, jnp.integer):  # tokens, targets, the optimizer's count
                out.append(jax.random.randint(k, x.shape, 0, job.model.vocab_size, x.dtype))
            else:
                out.append((0.02 * jax.random.normal(k, x.shape, jnp.float32)).astype(x.dtype))
        return out

    filled = jax.jit(fill, out_shardings=[x.sharding for x in leaves])(jax.random.key(0))
    args = jax.tree.unflatten(treedef, filled)
    jax.block_until_ready(args)
    before = device.memory_stats() or {}
    t0 = time.perf_counter()
    oom = None
    try:
        jax.block_until_ready(compiled(*args))
    except Exception as e:  # noqa: BLE001 - only running out of memory is a measurement
        oom = out_of_memory(e)
        if oom is None:
            raise
    step_s = time.perf_counter() - t0
    stats = device.memory_stats() or {}
    return {"strategy": strategy, "device": str(device.device_kind), "on_device_estimate": estimate,
            "load_s": round(seconds, 1), "step_s": round(step_s, 3),  # compile, from phase 1's cache
            # The device refused the step: the measurement is "does not fit" (and the peak
            # the allocator reached before it gave up).
            "out_of_memory": oom,
            "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
            # The random fill's own peak; when it is the higher, the step did not set the peak.
            "peak_before_step": before.get("peak_bytes_in_use"),
            "in_use_before_step": before.get("bytes_in_use"), "bytes_limit": stats.get("bytes_limit"),
            "versions": _versions()}


def default_limit() -> dict:
    """Child process, before phase 1: the allocator limit JAX sets on this device when no
    memory-fraction variable is given, which is what a user's own run gets."""
    import jax

    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    return {"device": str(device.device_kind), "bytes_limit": stats.get("bytes_limit")}


def out_of_memory(error: BaseException) -> str | None:
    """The first line of an allocator's refusal, or None for any other error."""
    text = str(error).strip()
    if "RESOURCE_EXHAUSTED" not in text and "Out of memory" not in text:
        return None
    return text.splitlines()[0][:300] if text else None


def _versions() -> dict[str, str]:
    from memprobe.compile import package_versions

    return package_versions(("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax"))


@dataclass
class Estimates:
    """memprobe's deviceless figures for the table: per strategy, the peak (None where its
    compile failed), and the target's HBM that the verdict "fits" is judged against."""

    peaks: dict[str, int | None]
    target: str
    capacity: int | None
    source: str

    def verdict(self, strategy: str) -> str:
        peak = self.peaks.get(strategy)
        if peak is None or self.capacity is None:
            return "-"
        return "fits" if peak <= self.capacity else "does not fit"

    def other_chip(self, device_kind: str | None) -> bool:
        """True where the device is not the chip the estimates were made for (e.g. an H100
        measured against H200 estimates): the ratios then compare two chips' programs."""
        from memprobe.targets import GPU_KINDS

        if not device_kind or self.capacity is None:  # the CPU backend, or no device row yet
            return False
        # A target config is named by a device description, which a GPU reports as its kind
        # in full or in short ("NVIDIA H200" for "NVIDIA H200 141GB HBM3e").
        config = GPU_KINDS.get(self.target, self.target)
        return not (config.startswith(device_kind) or device_kind.startswith(config))


def deviceless_estimates(args) -> Estimates:
    """Per strategy, memprobe's deviceless peak: read from --estimates, else compiled here."""
    if args.estimates:
        from memprobe.errors import BadInput
        from memprobe.result import Result

        try:  # memprobe's own reader: a malformed file is refused in one line
            [group] = Result.load(Path(args.estimates)).comparisons
        except (BadInput, ValueError) as e:
            sys.exit(f"validate_gpu: {e}")
        first = group[0]
        want = {"model": args.model, "seq_len": args.seq, "batch_per_device": args.batch, "num_devices": 1}
        wrong = {k: (getattr(first, k), v) for k, v in want.items() if getattr(first, k) != v}
        if wrong:
            sys.exit(f"validate_gpu: {args.estimates} is for another configuration: {wrong}")
        source = (f"memprobe's {first.target} compile, from {Path(args.estimates).name} "
                  f"({', '.join(f'{k} {v}' for k, v in first.versions.items())})")
    else:
        from memprobe.compile import compile_jobs
        from memprobe.plan import make_plan
        from memprobe.strategy import load_catalogue, select
        from memprobe.targets import resolve_target

        plan = make_plan(model=args.model, strategies=select(load_catalogue(), args.strategies),
                         target=resolve_target(args.target, 1), seq_len=args.seq, batch_per_device=args.batch)
        group = compile_jobs(plan.jobs(), parallel=args.jobs)
        source = f"memprobe's {args.target} compile, run here"
    return Estimates(peaks={m.strategy: (m.peak_bytes if m.ok else None) for m in group},
                     target=group[0].target, capacity=group[0].capacity_bytes, source=source)


def _child(mode: str, strategy: str | None, args, env: dict[str, str], timeout: float) -> dict:
    cmd = [sys.executable, __file__, mode, *([strategy] if strategy else []), "--model", args.model,
           "--seq", str(args.seq), "--batch", str(args.batch)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=max(timeout, 1), check=False)
    except subprocess.TimeoutExpired:
        return {"strategy": strategy, "error": f"stopped after {timeout:.0f} s (--budget)"}
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()] or ["no output"]
        return {"strategy": strategy, "error": lines[-1][:200]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f} GiB ({n:,} B)"


def _ratio(a: int | None, b: int | None) -> str:
    return f"{a / b:.3f}" if a and b else "-"


def _outcome(r: dict, estimates: Estimates) -> tuple[str, str, bool | None]:
    """The measured cell, the note, and whether the device bore out the deviceless verdict
    (None where nothing was measured or there is no verdict to check)."""
    measured, verdict = r.get("peak_bytes_in_use"), estimates.verdict(r["strategy"])
    limit = r.get("bytes_limit")
    if r.get("error"):
        return _gib(None), f"failed: {r['error']}", None
    timings = f"compile {r.get('compile_s')} s, from cache {r.get('load_s')} s, step {r['step_s']} s"
    if r.get("out_of_memory"):
        cell = f"out of memory (allocator limit {_gib(limit)})"
        note = f"{r['device']}; the device refused the step: {r['out_of_memory']}; {timings}"
        return cell, note, None if verdict == "-" else verdict == "does not fit"
    if measured is None:
        return _gib(None), f"n/a ({r.get('device', '?')} has no memory_stats)", None
    note = f"{r['device']}; {timings}"
    if r.get("peak_before_step") and r["peak_before_step"] >= measured:
        note += "; peak set before the step (random fill)"
    if r.get("phase1_error"):
        note += "; compiled alone after phase 1 failed (rows.jsonl has why)"
    return _gib(measured), note, None if verdict == "-" else verdict == "fits"


def table(rows: list[dict], args, estimates: Estimates, started: float) -> str:
    lines = [f"{args.model} train step, seq {args.seq} x batch {args.batch}, one device. Deviceless "
             f"estimates: {estimates.source}. All figures per device; estimates are the compilers', "
             "measured is the device allocator's peak after one step. "
             + (f"The deviceless verdict is the estimate against {estimates.target}'s HBM "
                f"({_gib(estimates.capacity)}); the device bears it out when a step said to fit runs "
                "and one said not to fit runs out of memory." if estimates.capacity else
                f"{estimates.target} has no HBM capacity, so there is no verdict to check."), ""]
    devices = sorted({r["device"] for r in rows if r.get("device")})
    if any(estimates.other_chip(d) for d in devices):
        lines += [f"**The device ({', '.join(devices)}) is not the chip the estimates are for "
                  f"({estimates.target})**: the ratios compare two chips' programs.", ""]
    lines += ["| strategy | deviceless estimate | deviceless verdict | on-device compile estimate "
              "| measured peak_bytes_in_use | measured / deviceless | measured / on-device | note |",
              "|:--|--:|:--|--:|--:|--:|--:|:--|"]
    held = []
    for r in rows:
        cell, note, agrees = _outcome(r, estimates)
        measured = None if r.get("out_of_memory") else r.get("peak_bytes_in_use")
        verdict = estimates.verdict(r["strategy"])
        if agrees is not None:
            held.append(agrees)
            verdict += "" if agrees else " (**not borne out**)"
        lines.append(f"| {r['strategy']} | {_gib(r.get('deviceless'))} | {verdict} "
                     f"| {_gib(r.get('on_device_estimate'))} | {cell} | {_ratio(measured, r.get('deviceless'))} "
                     f"| {_ratio(measured, r.get('on_device_estimate'))} | {note} |")
    versions = next((r["versions"] for r in rows if r.get("versions")), {})
    lines += [""]
    if held:
        lines += [f"The device bore out the deviceless verdict for {sum(held)} of {len(held)} strategies measured.", ""]
    limit = getattr(args, "jax_default_limit", None)
    if limit:
        share = f", {limit / estimates.capacity:.0%} of the deviceless capacity" if estimates.capacity else ""
        lines += [f"JAX's default allocator limit on this device (no memory-fraction variable set): {_gib(limit)}"
                  f"{share}. The steps above ran with XLA_PYTHON_CLIENT_MEM_FRACTION=0.97.", ""]
    lines += [f"On-device stack: {', '.join(f'{k} {v}' for k, v in versions.items()) or 'n/a'}.",
              f"Wall time: {time.monotonic() - started:.0f} s.",
              f"Command: `{' '.join(['python', 'bench/validate_gpu.py', *sys.argv[1:]])}`", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma4-e2b")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--target", default="h200", help="the deviceless target to compare with")
    p.add_argument("--estimates", help="JSON of `memprobe compare --target h200 --devices 1 --format json` "
                   "for the same model, seq and batch, instead of compiling deviceless here")
    p.add_argument("--strategies", default=ALL)
    p.add_argument("--out", type=Path, help="folder for rows.jsonl and table.md, written as rows finish")
    p.add_argument("--budget", type=float, default=86400, help="seconds after which work still running is stopped (its row says so) and none starts")
    p.add_argument("--jobs", type=int, default=4, help="phase 1 compiles at once")
    p.add_argument("--default-limit", action="store_true", help=argparse.SUPPRESS)  # child, before phase 1
    p.add_argument("--compile-one", help=argparse.SUPPRESS)  # child process, phase 1
    p.add_argument("--one", help=argparse.SUPPRESS)  # child process, phase 2
    args = p.parse_args()
    if args.default_limit:
        print(json.dumps(default_limit()))
        return
    if args.compile_one:
        print(json.dumps(compile_on_device(args.model, args.compile_one, args.seq, args.batch)))
        return
    if args.one:
        print(json.dumps(measure_on_device(args.model, args.one, args.seq, args.batch)))
        return

    started = time.monotonic()
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    estimates = deviceless_estimates(args)
    print(f"validate_gpu: deviceless estimates ({estimates.source}) after {time.monotonic() - started:.0f} s", flush=True)

    cache = tempfile.mkdtemp(prefix="validate-gpu-jax-cache-")  # fresh: phase 1 must really compile
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": os.pathsep.join(
               [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           # Phase 1 runs several processes on one device: none may take the memory up front.
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95",
           "JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}

    def left() -> float:
        return args.budget - (time.monotonic() - started)

    # What a user's own run would be let use: JAX's defaults, no memory-fraction variable.
    defaults = {k: v for k, v in env.items() if k not in (
        "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")}
    args.jax_default_limit = _child("--default-limit", None, args, defaults, min(120, left())).get("bytes_limit")
    print(f"validate_gpu: JAX's default allocator limit here: {_gib(args.jax_default_limit)}", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        first = dict(zip(args.strategies, pool.map(
            lambda s: _child("--compile-one", s, args, env, left()), args.strategies), strict=True))
    for s, r in first.items():
        print(f"validate_gpu: compiled {s} on the device: {r.get('compile_s', '-')} s "
              f"{r.get('error', '')}", flush=True)

    rows = []
    for s in args.strategies:
        if left() <= 0:
            r = {"strategy": s, "on_device_estimate": first[s].get("on_device_estimate"),
                 "error": first[s].get("error") or "not run: --budget spent"}
        else:
            # Run even when phase 1 failed: alone on the device (phase 1 ran several compiles
            # at once) it may well compile, and then it measures its own estimate.
            # Alone on the device now: let the allocator have nearly all of it, so that a step
            # the estimate says fits is not refused for want of the 5% phase 1 held back.
            r = _child("--one", s, args, {**env, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.97"}, left())
            # Phase 1's figure first: an executable loaded from the persistent cache may come
            # without its memory statistics; phase 2's own reading is kept beside it.
            r["loaded_estimate"] = r.get("on_device_estimate")
            r["on_device_estimate"] = first[s].get("on_device_estimate") or r["loaded_estimate"]
            r["compile_s"] = first[s].get("compile_s")
            if first[s].get("error"):
                r["phase1_error"] = first[s]["error"]
        r["deviceless"] = estimates.peaks.get(s)
        rows.append(r)
        print(f"validate_gpu: {s}: measured {_gib(r.get('peak_bytes_in_use'))} "
              f"{r.get('out_of_memory') or r.get('error') or ''} ({time.monotonic() - started:.0f} s)", flush=True)
        if args.out:
            with open(args.out / "rows.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
            (args.out / "table.md").write_text(table(rows, args, estimates, started))
    print("\n" + table(rows, args, estimates, started))


if __name__ == "__main__":
    main()
