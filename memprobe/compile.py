"""Compiles each job and reads the compiler's figures into a ``Measurement``.

``compile_job`` works in the calling process. ``compile_jobs`` runs every job in a fresh
process of its own: libtpu's start-up noise and XLA's logs go to a log file rather than
the user's terminal, host memory is returned after each full-size compile, and a crash or
error in one strategy becomes a failed row while the others still finish.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from memprobe.errors import BadInput
from memprobe.measure import OOM_ALLOCATIONS_KEPT, OVER_HBM, SIZE_UNITS, Allocation, Measurement, in_gib
from memprobe.model_file import is_preset, model_mapping
from memprobe.plan import CompileJob
from memprobe.targets import Target

if TYPE_CHECKING:
    from memprobe.cache import ResultCache

DEFAULT_TIMEOUT_S = 3600.0
_T = TypeVar("_T")
_R = TypeVar("_R")


class Stopped(Exception):
    """A compile given up because the run is being interrupted; it leaves no record."""


def compile_environment(target: Target, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment a compile process needs, set before JAX initialises."""
    env = dict(os.environ if base is None else base)
    env.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # Several compile processes may hold libtpu at once (parallel jobs, tests).
    env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.setdefault("TPU_STDERR_LOG_LEVEL", "3")
    env.setdefault("TPU_MIN_LOG_LEVEL", "3")
    # Deviceless compiles need no TPU runtime; the CPU platform is enough to trace.
    env["JAX_PLATFORMS"] = "cpu"
    # Over HBM the TPU compiler would stop; this flag lets it finish and report the peak.
    flag = "--xla_tpu_no_crash_on_oom=true"
    args = env.get("LIBTPU_INIT_ARGS", "")
    if flag not in args:
        env["LIBTPU_INIT_ARGS"] = f"{args} {flag}".strip()
    if target.platform == "cpu":
        flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={target.num_devices}".strip()
    return env


# The GPU compiler ships in the CUDA plugin; it is recorded for GPU targets only, so TPU
# results (and their cache keys) do not depend on whether the gpu extra is installed.
GPU_PACKAGES = ("jax-cuda12-plugin", "jax-cuda12-pjrt")


def package_versions(packages) -> dict[str, str]:
    """The installed version of each package; those not installed are left out."""
    out = {}
    for pkg in packages:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def versions(platform: str = "tpu") -> dict[str, str]:
    """What a record was compiled with: memprobe, JAX and the target's compiler."""
    compiler = {"tpu": ("libtpu",), "cuda": GPU_PACKAGES}.get(platform, ())
    return package_versions(("memprobe", "jax", "jaxlib", *compiler, "flax", "optax"))


def _base_record(job: CompileJob, **fields) -> Measurement:
    t = job.target
    return Measurement(
        model=job.model.name,
        model_config=None if is_preset(job.model) else model_mapping(job.model),
        strategy=job.strategy.name,
        strategy_knobs=job.strategy.knobs(),
        target=t.name,
        platform=t.platform,
        num_devices=t.num_devices,
        topology=t.topology,
        seq_len=job.shapes.seq_len,
        batch_per_device=job.shapes.batch_per_device,
        loss_chunks=job.shapes.loss_chunks,
        step=job.step.value,
        optimizer=job.optimizer.value if job.optimizer else None,
        param_dtype=job.param_dtype.value,
        grad_accum=job.grad_accum,
        capacity_bytes=t.hbm_bytes,
        versions=versions(t.platform),
        **fields,
    )


def failed_record(job: CompileJob, reason: str) -> Measurement:
    return _base_record(job, status="failed", error=reason)


def _answered(job: CompileJob, reply: dict | str) -> Measurement:
    """The measurement a worker's reply holds: its figures; a program the TPU compiler
    refused over HBM (the bytes it needed, no figures); or why the compile failed."""
    if isinstance(reply, str):
        return failed_record(job, reply)
    if reply["status"] == "refused":
        return _base_record(job, status="refused", error=reply["error"], needed_bytes=reply["needed_bytes"],
                            oom_allocations=reply["oom_allocations"], process_seconds=reply["seconds"])
    m = Measurement.from_dict(reply["measurement"])
    return dataclasses.replace(m, process_seconds=reply["seconds"])


def one_line(text: str, limit: int = 240) -> str:
    """The first informative line of an error, trimmed."""
    for line in str(text).strip().splitlines():
        line = line.strip()
        if line and not line.startswith(("Traceback", "File ", "===")):
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return "unknown error"


def compile_job(job: CompileJob, keep_hlo: bool = False,
                compiler_options: dict | None = None) -> Measurement | tuple[Measurement, str]:
    """Lowers and compiles one job in this process; JAX must already be configured."""
    from memprobe.build import build_step, make_devices
    from memprobe.flops import matmul_flops

    devices = make_devices(job.target)
    t0 = time.perf_counter()
    step = build_step(job, devices)
    traced = step.fn.trace(*step.args)
    lowered = traced.lower()
    t1 = time.perf_counter()
    compiled = lowered.compile(compiler_options) if compiler_options else lowered.compile()
    t2 = time.perf_counter()
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):  # older JAX returned one dict per program
        cost = cost[0] if cost else {}
    hlo = compiled.as_text() or ""
    record = _base_record(
        job,
        argument_bytes=int(mem.argument_size_in_bytes),
        output_bytes=int(mem.output_size_in_bytes),
        alias_bytes=int(mem.alias_size_in_bytes),
        temp_bytes=int(mem.temp_size_in_bytes),
        generated_code_bytes=int(mem.generated_code_size_in_bytes),
        host_argument_bytes=int(mem.host_argument_size_in_bytes),
        host_output_bytes=int(mem.host_output_size_in_bytes),
        host_alias_bytes=int(mem.host_alias_size_in_bytes),
        host_temp_bytes=int(mem.host_temp_size_in_bytes),
        host_generated_code_bytes=int(mem.host_generated_code_size_in_bytes),
        xla_peak_bytes=int(getattr(mem, "peak_memory_in_bytes", 0)) or None,
        flops=float(cost["flops"]) if "flops" in cost else None,
        matmul_flops=matmul_flops(traced.jaxpr),
        lower_seconds=round(t1 - t0, 3),
        compile_seconds=round(t2 - t1, 3),
        parameter_count=step.parameter_count,
        while_loops=len(re.findall(r"\bwhile\(", hlo)),
    )
    return (record, hlo) if keep_hlo else record


def trace_job(job: CompileJob) -> int:
    """Traces one job without compiling it: its matmul FLOPs (seconds, where a compile takes
    minutes). Fills in cache entries written before memprobe counted them."""
    from memprobe.build import build_step, make_devices
    from memprobe.flops import matmul_flops

    step = build_step(job, make_devices(job.target))
    return matmul_flops(step.fn.trace(*step.args).jaxpr)


def explain_job(job: CompileJob, within: str | None = None) -> tuple[Measurement, dict]:
    """Compiles one job with the compiler's dump files on, and reads what is live at the peak.

    The dump goes in a fresh folder under ``within`` (the system's temporary folder if None),
    removed when done. A compile process passes the folder its parent owns, so that a killed
    compile (timeout, Ctrl-C, the host-memory cap) does not leave its dump behind: the
    parent removes that folder however the child ended.
    """
    from memprobe.liveness import explain_dump

    with tempfile.TemporaryDirectory(prefix="memprobe-dump-", dir=within) as dump:
        m = compile_job(job, compiler_options={"xla_dump_to": dump})
        return m, explain_dump(Path(dump)).to_dict()


def libtpu_log_environment(folder: str) -> dict[str, str]:
    """What an explain compile process for a TPU target adds to its environment: libtpu's
    info log (where it accounts for the HBM heap, see ``liveness.parse_libtpu_heap``) goes to
    files in ``folder`` (made here: libtpu writes no log into a folder that is not there),
    never to the terminal (stderr stays at warnings). libtpu writes that log out when the
    process ends (not within 40 s of a compile, even with --logbuflevel=-1), so the parent
    reads it (``read_libtpu_heap``)."""
    os.makedirs(folder, exist_ok=True)
    return {"TPU_MIN_LOG_LEVEL": "0", "TPU_LOG_DIR": folder}


def read_libtpu_heap(folder: str) -> dict | None:
    """libtpu's account of the HBM heap from the info log an ended compile process left in
    ``folder``; None where there is none."""
    from memprobe.liveness import LIBTPU_LOG, parse_libtpu_heap

    try:
        return parse_libtpu_heap(Path(folder, LIBTPU_LOG).read_text(errors="replace"))
    except OSError:
        return None


def _exit_with_parent(parent: int) -> None:
    """Ends this compile process within a second of memprobe's (pid ``parent``) own end,
    however that came (``kill -9``, the out-of-memory killer): the compile runs in a session
    of its own, so nothing else would stop it, and an orphaned full-size compile holds
    gigabytes for minutes. The pid comes from memprobe, since it may be gone already."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="memprobe-parent-watch", daemon=True).start()


def _worker_main(job_path: str, result_path: str, mode: str = "compile", parent: str | None = None) -> int:
    """Entry point of a compile process (``python -m memprobe.compile``): one job, one reply."""
    if parent:
        _exit_with_parent(int(parent))
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    try:
        if mode == "trace":
            reply = {"status": "ok", "matmul_flops": trace_job(job)}
        elif mode == "devices":
            from memprobe.build import make_devices

            make_devices(job.target)
            reply = {"status": "ok"}
        else:
            explanation = None
            if mode == "explain":
                m, explanation = explain_job(job, within=os.path.dirname(os.path.abspath(job_path)))
            else:
                m = compile_job(job)
            import resource  # peak resident memory of this whole compile process, for the record

            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            reply = {"status": "ok", "measurement": dataclasses.replace(m, host_rss_bytes=rss).to_dict(),
                     "explanation": explanation}
    except BadInput as e:  # e.g. a topology libtpu rejects: the user's mistake, not the compile's
        reply = {"status": "bad_input", "error": str(e)}
    except BaseException as e:  # noqa: BLE001 - every failure becomes a row, never a traceback
        import traceback

        traceback.print_exc()
        reply = {"status": "error", "error": f"{type(e).__name__}: {one_line(str(e)) if str(e) else 'no message'}"}
    tmp = result_path + ".part"
    with open(tmp, "w") as f:
        json.dump(reply, f)
    os.replace(tmp, result_path)
    return 0


_GLOG_PREFIX = re.compile(r"^[FEWI]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] ")


def _below_error(line: str) -> bool:
    """An info or warning line of libtpu's log. A warning is never why a compile crashed (a
    suppressed out-of-memory warning mentions an "error" in a program that went on to compile)."""
    return line[:1] in "WI" and bool(_GLOG_PREFIX.match(line))


# What libtpu logs at start-up on a machine without TPUs, whatever is compiled: never a reason.
_STARTUP_NOISE = ("TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE", "Source Location Trace", "libtpu_init_utils")
# Warning- and error-level lines reach a compile process's log (its own file, never the
# user's terminal): they hold what libtpu says before it refuses a program. Running out of
# HBM it logs as an error; running out of vmem, the on-chip memory its kernels work in, only
# as a warning ("Suppressing OOM due to xla_tpu_no_crash_on_oom: ..."), measured with libtpu
# 0.0.50, so error level alone left that refusal a bare "Invalid TPU program".
WORKER_LOG_LEVELS = {"TPU_STDERR_LOG_LEVEL": "1", "TPU_MIN_LOG_LEVEL": "1"}
_TPU_OOM = re.compile(r"Ran out of memory in memory space (\w+)\. Used ([\d.]+)([KMG]) of ([\d.]+)([KMG]) \w+\. "
                      r"Exceeded \w+ capacity by [\d.]+[KMG]")
_OOM_UNITS = {"K": "KiB", "M": "MiB", "G": "GiB"}
_OOM_TOTAL = re.compile(r"^Total bytes: (\d+) ")
# A line of the report: cumulative size (share); size; offset; values; their shapes.
_OOM_ENTRY = re.compile(r"^[\d.]+\w+\(\s*\d+%\);\s*([\d.]+)(\w+);\s*(\d+);\s*(\d+);\s*(.+)$")
_OOM_BLOCK = "cumulative_size;"  # each allocation's listing starts with this header


def _log_lines(log_path: str) -> list[str]:
    try:
        return [l.strip() for l in Path(log_path).read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return []


def _log_reason(log_path: str) -> str:
    """The most telling line a crashed compile left in its log: a failed CHECK first, then
    the compiler's fatal line (XLA's LOG(FATAL) before it aborts: `--seq 100000000000` died on
    signal 6 with "DilatedBound overflow: ..." as its only word, unsaid)."""
    lines = [l for l in _log_lines(log_path)
             if not any(n in l for n in _STARTUP_NOISE) and not _below_error(l)]
    tests = (lambda l: "Check failed" in l, lambda l: l.startswith("F") and bool(_GLOG_PREFIX.match(l)),
             lambda l: "RESOURCE_EXHAUSTED" in l or "MemoryError" in l, lambda l: "Error" in l or "error" in l)
    for test in tests:
        for line in reversed(lines):
            if test(line):
                return one_line(_GLOG_PREFIX.sub("", line))
    return ""


class Oom(NamedTuple):
    """What the TPU compiler logged on running out of device memory: why, in one line; the
    HBM bytes it needed (None when it was not HBM it ran out of, or it logged no report);
    the largest allocations of its report, largest first."""

    why: str
    needed_bytes: int | None
    allocations: list[Allocation]


def compiler_oom(log_path: str, error: str) -> Oom:
    """``error`` with what the TPU compiler logged before it on running out of device memory.
    With --xla_tpu_no_crash_on_oom it goes on to report most such programs' peaks, but
    refuses some ("Invalid TPU program")."""
    lines = _log_lines(log_path)
    found = [(i, m) for i, line in enumerate(lines) if (m := _TPU_OOM.search(line))]
    if not found:
        return Oom(error, None, [])
    # The last error the compiler logged, its report after it: it may repeat the figures in
    # a warning later (no report follows that). Out of vmem, a warning is all there is.
    i, m = ([(i, m) for i, m in found if not _below_error(lines[i])] or found)[-1]
    space, used_number, used_unit, capacity_number, capacity_unit = m.groups()
    used = f"{used_number} {_OOM_UNITS[used_unit]}"
    capacity = f"{capacity_number} {_OOM_UNITS[capacity_unit]}"
    if space != "hbm":
        # Not a size over HBM: a kernel's working set at this shape is too large for the
        # chip's scratch memory (seen: tiny-e2b checkpoint at seq 256 x 130 on v5e:2x2
        # needed 128.66 MiB of vmem's 128.00; batch 128, seq 512 x 131 and one device compiled).
        return Oom(f"out of {space}, not HBM: the TPU compiler needed {used} of the chip's {capacity} of "
                   f"{space}{' (the on-chip memory its kernels work in)' if space == 'vmem' else ''} and "
                   f"refused the program ({error}); this says nothing of HBM, and a neighbouring size may "
                   "compile", None, [])
    exact = next((int(t.group(1)) for line in lines[i + 1: i + 4] if (t := _OOM_TOTAL.match(line))), None)
    needed = exact or round(float(used_number) * SIZE_UNITS[_OOM_UNITS[used_unit].lower()])
    total = f" ({exact:,} bytes)" if exact else ""
    allocations = _oom_allocations(lines[i + 1:])
    largest = (f"; its largest allocation, {allocations[0].size}, held {allocations[0].shapes}"
               if allocations else "")
    why = f"{OVER_HBM}the TPU compiler needed {used}{total} of {capacity} and refused the program ({error}){largest}"
    return Oom(why, needed, allocations)


def _oom_allocations(lines: list[str]) -> list[Allocation]:
    """The report's allocations, largest first: its first listing is the temp heap, where
    values share one block at several offsets; each one after it, a block of its own at
    offset 0 (an argument and the output aliased to it). Sizes stay as the compiler rounds
    them; they order the list and nothing else."""
    found: list[tuple[float, Allocation]] = []
    blocks = 0
    for line in lines:
        if line.startswith(_OOM_BLOCK):
            blocks += 1
        elif (e := _OOM_ENTRY.match(line)) and blocks:
            number, unit, offset, values, shapes = e.groups()
            heap = blocks == 1 or int(offset) > 0
            found.append((float(number) * SIZE_UNITS.get(unit.lower(), 1),
                          Allocation(f"{number} {unit}", int(values), shapes.strip(), heap)))
        elif not (line.startswith(("---", "The rest ")) or blocks == 0):
            break  # past the report
    found.sort(key=lambda f: -f[0])  # stable: the compiler's order among equals
    return [a for _, a in found[:OOM_ALLOCATIONS_KEPT]]


Event = Callable[[int, str, float], None]


def _rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux); 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def default_host_cap() -> int | None:
    """Per compile process: 90% of this machine's memory, so one runaway compile fails its
    own row instead of bringing the machine (and the other rows) down."""
    total = host_memory_bytes()
    return int(total * 0.9) if total else None


def compile_isolated(job: CompileJob, timeout_s: float = DEFAULT_TIMEOUT_S,
                     tick: Callable[[float], None] | None = None,
                     max_host_bytes: int | None = None, stop: threading.Event | None = None) -> Measurement:
    """Compiles ``job`` in a fresh Python process; every way it can fail becomes a failed record.

    The child's stdout and stderr (libtpu's start-up warnings, XLA's logs) go to a log
    file that only serves to explain a failure.
    """
    return _answered(job, _isolated(job, "compile", timeout_s, tick, max_host_bytes, stop))


def trace_isolated(job: CompileJob, timeout_s: float = DEFAULT_TIMEOUT_S,
                   tick: Callable[[float], None] | None = None,
                   max_host_bytes: int | None = None, stop: threading.Event | None = None) -> int | None:
    """``trace_job`` in a fresh process; None when it fails (the figure stays unknown)."""
    reply = _isolated(job, "trace", timeout_s, tick, max_host_bytes, stop)
    return None if isinstance(reply, str) else reply["matmul_flops"]


def check_devices(job: CompileJob, timeout_s: float = 120.0) -> None:
    """Makes ``job``'s devices in a process of its own, as its compile would: a topology that
    libtpu rejects raises ``BadInput`` (one line, exit code 2) before any compile starts,
    instead of in every compile process at once. Any other failure is left to the compiles."""
    _isolated(job, "devices", timeout_s, None, None)


def explain_isolated(job: CompileJob, timeout_s: float = DEFAULT_TIMEOUT_S,
                     tick: Callable[[float], None] | None = None,
                     max_host_bytes: int | None = None,
                     stop: threading.Event | None = None) -> tuple[Measurement, dict | None]:
    """``explain_job`` in a fresh process: the measurement and the explanation (None when the
    compile failed: the measurement says why)."""
    reply = _isolated(job, "explain", timeout_s, tick, max_host_bytes, stop)
    return _answered(job, reply), reply["explanation"] if isinstance(reply, dict) and reply["status"] == "ok" else None


def _isolated(job: CompileJob, mode: str, timeout_s: float, tick: Callable[[float], None] | None,
              max_host_bytes: int | None, stop: threading.Event | None = None) -> dict | str:
    """Runs the worker in ``mode``: its reply (with ``seconds``; status "refused" where the TPU
    compiler refused the program over HBM), or why it failed in one line.

    Raises ``Stopped`` (the process killed) once ``stop`` is set.
    """
    with tempfile.TemporaryDirectory(prefix="memprobe-") as tmp:
        job_path, result_path, log_path = (os.path.join(tmp, n) for n in ("job.pkl", "result.json", "compile.log"))
        with open(job_path, "wb") as f:
            pickle.dump(job, f)
        libtpu_log = os.path.join(tmp, "libtpu-log") if mode == "explain" and job.target.platform == "tpu" else None
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "memprobe.compile", job_path, result_path, mode, str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**compile_environment(job.target), **WORKER_LOG_LEVELS,
                     **(libtpu_log_environment(libtpu_log) if libtpu_log else {})},
                start_new_session=True,
            )
            start = time.monotonic()
            try:
                while proc.poll() is None:
                    if stop is not None and stop.is_set():
                        raise Stopped  # the finally below kills the process
                    elapsed = time.monotonic() - start
                    if tick:
                        tick(elapsed)
                    if elapsed > timeout_s:
                        proc.kill()
                        proc.wait()
                        return f"timed out after {timeout_s:g} s"  # --timeout 0.5: not "0 s"
                    if max_host_bytes and _rss_bytes(proc.pid) > max_host_bytes:
                        proc.kill()
                        proc.wait()
                        return (f"used more than {in_gib(max_host_bytes)[0]} of host memory "
                                "(the --max-host-memory cap)")  # a cap under 0.005 GiB in bytes
                    try:
                        proc.wait(timeout=0.25)
                    except subprocess.TimeoutExpired:
                        pass
            finally:
                if proc.poll() is None:  # interrupted or stopped: leave no compile running
                    proc.kill()
                    proc.wait()
        if os.path.exists(result_path):
            with open(result_path) as f:
                reply = json.load(f)
            seconds = round(time.monotonic() - start, 3)
            if reply["status"] == "ok":
                if libtpu_log and reply.get("explanation"):
                    reply["explanation"]["libtpu_heap"] = read_libtpu_heap(libtpu_log)
                return {**reply, "seconds": seconds}
            if reply["status"] == "bad_input":
                raise BadInput(reply["error"])
            if "Invalid TPU program" in reply["error"]:
                oom = compiler_oom(log_path, reply["error"])
                if oom.needed_bytes is None:
                    return oom.why
                return {"status": "refused", "error": oom.why, "needed_bytes": oom.needed_bytes,
                        "oom_allocations": oom.allocations, "seconds": seconds}
            return reply["error"]
        code = proc.returncode
        why = _log_reason(log_path)
        if code < 0:
            sig = -code
            what = "was killed (SIGKILL; out of host memory?)" if sig == 9 else f"died on signal {sig}"
            return f"compile process {what}" + (f": {why}" if why else "")
        return f"compile process exited with code {code}" + (f": {why}" if why else "")


# A full-size Gemma 4 E2B train-step compile peaked at 8.5 GB of host memory here; leave room.
HOST_BYTES_PER_COMPILE = 10 * 1024**3


def default_parallel(num_jobs: int) -> int:
    """Compiles to run at once: one per core, as many as host memory holds at 10 GiB each."""
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        available = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 1
    return max(1, min(os.cpu_count() or 1, num_jobs, available // HOST_BYTES_PER_COMPILE))


def check_run(jobs: int | None, timeout_s: float) -> None:
    """The options of any run of compiles, refused before the first."""
    if jobs is not None and jobs < 1:
        raise BadInput(f"--jobs must be a positive integer, got {jobs}")
    if not timeout_s > 0:  # nan too: no elapsed time is over it, so it meant no limit without saying so
        raise BadInput(f"--timeout must be a positive number of seconds, got {timeout_s}")


def compile_jobs(jobs: list[CompileJob], *, timeout_s: float = DEFAULT_TIMEOUT_S, parallel: int = 1,
                 on_event: Event | None = None, cache: ResultCache | None = None,
                 max_host_bytes: int | None = None) -> list[Measurement]:
    """Compiles every job in its own process, ``parallel`` at a time; results keep the jobs' order.

    With a ``cache``, a job already measured is answered from it (event ``cached``) and
    every new answer is stored as soon as it finishes. A compile ends with event "done",
    "refused" (the TPU compiler refused the program over HBM) or "failed".
    """
    answered, untraced = {}, set()
    if cache is not None:
        for i, job in enumerate(jobs):
            hit = cache.get(job, compile_environment(job.target))
            if hit is None:
                continue
            answered[i] = hit
            if hit.ok and hit.matmul_flops is None:  # stored before memprobe counted matmul FLOPs
                untraced.add(i)
            elif on_event:
                on_event(i, "cached", 0.0)

    def run(i: int, stop: threading.Event | None = None) -> Measurement:
        if i in untraced:
            if on_event:
                on_event(i, "tracing", 0.0)
            tick = (lambda e: on_event(i, "tracing", e)) if on_event else None
            flops = trace_isolated(jobs[i], timeout_s, tick, max_host_bytes, stop)
            if flops is not None:
                answered[i] = dataclasses.replace(answered[i], matmul_flops=flops)
                cache.put(jobs[i], compile_environment(jobs[i].target), answered[i])
            if on_event:
                on_event(i, "cached", 0.0)
        if i in answered:
            return answered[i]
        if on_event:
            on_event(i, "compiling", 0.0)
        tick = (lambda e: on_event(i, "compiling", e)) if on_event else None
        m = compile_isolated(jobs[i], timeout_s, tick, max_host_bytes, stop)
        if cache is not None:
            cache.put(jobs[i], compile_environment(jobs[i].target), m)
        if on_event:
            on_event(i, "done" if m.ok else m.status, (m.compile_seconds or m.process_seconds or 0.0))
        return m

    if parallel <= 1 or len(jobs) - len(answered) + len(untraced) <= 1:
        return [run(i) for i in range(len(jobs))]
    return map_stoppable(run, range(len(jobs)), parallel)


def map_stoppable(fn: Callable[[_T, threading.Event], _R], items: Iterable[_T], parallel: int) -> list[_R]:
    """``fn(item, stop)`` for each item, ``parallel`` threads at a time; results keep the order.

    When the calling thread is interrupted (Ctrl-C; SIGTERM through the CLI), ``stop`` is
    set: every compile still running is killed within a quarter of a second and the
    interrupt goes on, rather than waiting minutes for the compiles to end. An item that
    fails does not stop the others: their results still reach the cache.
    """
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=parallel)
    try:
        return list(pool.map(lambda item: fn(item, stop), items))
    except (KeyboardInterrupt, SystemExit):
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


if __name__ == "__main__":
    sys.exit(_worker_main(*sys.argv[1:5]))
