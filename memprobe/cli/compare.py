"""`memprobe compare`: compile every chosen strategy and print the ranked table."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from memprobe.api import resolve_plans
from memprobe.cache import ResultCache
from memprobe.cli import _options as o
from memprobe.cli._output import check_chart, check_writable, command_line, messages, output_format, write_result
from memprobe.compile import DEFAULT_TIMEOUT_S, check_run, compile_jobs, default_host_cap, default_parallel
from memprobe.errors import BadInput
from memprobe.measure import Measurement, host_ram_check, parse_positive_size, with_host_ram
from memprobe.plan import DEFAULT_MODEL, CompileJob, ParamDtype, Plan, Step, job_labels
from memprobe.render import Format, suffix_format
from memprobe.result import Result
from memprobe.targets import target_or_default


def compare(
    seq: o.Seqs = "24576",
    batch: o.Batches = "8",
    model: o.Model = DEFAULT_MODEL,
    target: o.Targets = None,
    devices: o.Devices = None,
    topology: o.Topology = None,
    strategies: o.Strategies = None,
    strategy_file: o.StrategyFile = None,
    strategies_dir: o.StrategiesDir = None,
    loss_chunks: o.LossChunks = None,
    step: o.StepKind = Step.TRAIN,
    optimizer: o.OptimizerKind = None,
    param_dtype: o.ParamDtypeKind = ParamDtype.FP32,
    grad_accum: o.GradAccum = 1,
    timeout: o.Timeout = DEFAULT_TIMEOUT_S,
    jobs: o.Jobs = None,
    no_cache: o.NoCache = False,
    max_host_memory: o.MaxHostMemory = None,
    host_ram: o.HostRam = None,
    devices_per_host: o.DevicesPerHost = None,
    format: o.FormatOpt = None,
    output: o.Output = None,
    chart: o.Chart = None,
) -> int:
    """Compile the train step under each strategy and rank them by per-device peak HBM.

    Figures are the compiler's estimates from memory_analysis(); nothing runs on a device.
    Exit code 1 when any strategy failed to compile (the table still shows the others); a
    program the TPU compiler refused over HBM is an answer (over capacity), not a failure.
    Several lengths or batches (--seq 4096,8192) make a sweep: a table per shape, and one of
    the peaks at every shape. Several targets (--target v5p,h100) do the same: a table per
    target, and the peaks on every target; with several shapes too, each target's sweep.
    """
    plans, notes = plans_from_options(seq, batch, model, target, devices, topology, strategies,
                                      strategy_file, strategies_dir, loss_chunks, step, optimizer,
                                      param_dtype, grad_accum)
    cap = check_run_options(timeout, jobs, max_host_memory)
    # Each target with host memory checked (a cpu column has none to judge; only cpu is refused).
    hosted = [p.target for p in plans if p.target.has_host_memory] or [plans[0].target]
    ram = [host_ram_check(t, host_ram, devices_per_host) for t in dict.fromkeys(hosted)][0]
    check_writable(output)
    format = output_format(format, output, Format, Format.TABLE)
    check_chart(chart, output)
    say(notes)
    measurements = run_plans(plans, timeout, jobs, no_cache, cap)
    if ram is not None:
        measurements = with_host_ram(measurements, ram[0], devices_per_host)
    write_result(Result(measurements, command=command_line()), format, output, chart)
    return 0 if all(m.answered for m in measurements) else 1


def baseline(
    output: Annotated[Path, typer.Option("--output", "-o", help="The baseline JSON file to write.")],
    seq: o.Seqs = "24576",
    batch: o.Batches = "8",
    model: o.Model = DEFAULT_MODEL,
    target: o.Targets = None,
    devices: o.Devices = None,
    topology: o.Topology = None,
    strategies: o.Strategies = None,
    strategy_file: o.StrategyFile = None,
    strategies_dir: o.StrategiesDir = None,
    loss_chunks: o.LossChunks = None,
    step: o.StepKind = Step.TRAIN,
    optimizer: o.OptimizerKind = None,
    param_dtype: o.ParamDtypeKind = ParamDtype.FP32,
    grad_accum: o.GradAccum = 1,
    timeout: o.Timeout = DEFAULT_TIMEOUT_S,
    jobs: o.Jobs = None,
    no_cache: o.NoCache = False,
    max_host_memory: o.MaxHostMemory = None,
) -> int:
    """Compile like `compare` and write the result as a baseline for `memprobe check`.

    Nothing is written when a strategy fails to compile (exit code 1): a baseline must be whole.
    Several lengths or batches (--seq 4096,8192) gate every shape; several targets
    (--target v5p,h100), every target.
    """
    plans, notes = plans_from_options(seq, batch, model, target, devices, topology, strategies,
                                      strategy_file, strategies_dir, loss_chunks, step, optimizer,
                                      param_dtype, grad_accum)
    cap = check_run_options(timeout, jobs, max_host_memory)
    check_writable(output)
    if suffix_format(output) not in (None, "json"):
        raise BadInput(f"--output {output}: a baseline is JSON, which a {output.suffix} file is not; name it .json")
    say(notes)
    measurements = run_plans(plans, timeout, jobs, no_cache, cap)
    result = Result(measurements, command=command_line())
    if not all(m.ok for m in measurements):
        write_result(result, Format.TABLE, None)
        refused = [m.strategy for m in measurements if m.refused]
        why = (f"; the TPU compiler refused {', '.join(dict.fromkeys(refused))} over HBM, leaving no figures to gate"
               if refused else "")
        messages().print(f"memprobe: not writing {output}: a baseline needs every strategy compiled{why}")
        return 1
    write_result(result, Format.JSON, output)
    return 0


def plans_from_options(seq, batch, model, target, devices, topology, strategies, strategy_file,
                       strategies_dir, loss_chunks, step, optimizer, param_dtype,
                       grad_accum) -> tuple[list[Plan], list[str]]:
    """The checked plans of the CLI's options, one per shape of a sweep (--seq 4096,8192) on
    each target (--target v5p,h100), and the notes to say once every option is checked: a
    value named twice, the default offload strategies a target leaves out."""
    notes: list[str] = []
    plans, skipped = resolve_plans(
        seq=int_list(seq, "--seq", notes), batch=int_list(batch, "--batch", notes),
        target=name_list(target_or_default(target, topology), "--target", notes), devices=devices,
        topology=topology, loss_chunks=loss_chunks, model=model, strategies=strategy_names(strategies, notes),
        strategy_files=strategy_file or (), strategies_dirs=strategies_dir or (), step=step,
        optimizer=optimizer, param_dtype=param_dtype, grad_accum=grad_accum)
    return plans, notes + skipped_notes(skipped)


#: What several values of each listed option look like, for its errors.
LIST_EXAMPLES = {"--seq": "4096,8192", "--batch": "4,8", "--target": "v5p,h100"}


def name_list(text: str, option: str, notes: list[str]) -> list[str]:
    """A comma-separated list of target names, in lower case (H100 is h100), each kept once (a
    note in ``notes`` says which were repeated)."""
    def name(part: str) -> str:
        if not part:
            raise ValueError(f"{text!r} has an empty name")
        return part.lower()
    return comma_list(text, option, name, "name", notes)


def int_list(text: str, option: str, notes: list[str]) -> list[int]:
    """A comma-separated list of integers (a sweep's lengths or batches), each kept once (as
    names are); the values' own checks (positive, a multiple of the attention block) come
    with the plan."""
    def integer(part: str) -> int:
        try:
            return int(part)
        except ValueError:
            raise ValueError(f"{part!r} is not an integer") from None
    return comma_list(text, option, integer, "value", notes)


def comma_list(text: str, option: str, parse, what: str, notes: list[str]) -> list:
    """``text`` split at commas, each part parsed (a ValueError saying why it is not one),
    each value kept once."""
    try:
        values = [parse(p.strip()) for p in str(text).split(",")]
    except ValueError as e:
        raise BadInput(f"Invalid value for '{option}': {e} (one {what}, or several separated by commas: "
                       f"{option} {LIST_EXAMPLES[option]})") from None
    notes += repeated(values, option)
    return list(dict.fromkeys(values))


def skipped_notes(skipped: list[tuple[Plan, list[str]]]) -> list[str]:
    """The offload strategies each target's plan leaves out."""
    return [f"skipping {', '.join(names)}: {plan.target.name} has no host memory space to offload to"
            for plan, names in skipped if names]


def say(notes: list[str]) -> None:
    """Notes on the options (a value named twice, a strategy left out), said once every option
    is checked and the compiles are about to start, never before an error; said once."""
    for note in notes:
        messages().print(f"memprobe: {note}")
    notes.clear()


def check_run_options(timeout: float, jobs: int | None, max_host_memory: str | None) -> int | None:
    """Checks the options of a run; returns the host-memory cap per compile in bytes."""
    check_run(jobs, timeout)
    if max_host_memory is None:
        return default_host_cap()
    return parse_positive_size(max_host_memory, "--max-host-memory")


def run_plans(plans: list[Plan], timeout: float, jobs: int | None, no_cache: bool,
              max_host_bytes: int | None = None) -> list[Measurement]:
    """Compiles (or answers from the cache) every job of ``plans`` in one pool, showing progress
    on stderr."""
    jobs_ = [j for p in plans for j in p.jobs()]
    first = plans[0]
    n = len(first.strategies)
    what = f"{n} strateg{'y' if n == 1 else 'ies'}"
    targets = list(dict.fromkeys(p.target for p in plans))
    shapes = len({p.shapes for p in plans})
    # One plan per target and shape, each target's strategies less the offload ones it skips (no host memory).
    if (len(plans) != len(targets) * shapes
            or any(dataclasses.replace(p, target=first.target, strategies=first.strategies, shapes=first.shapes)
                   != first for p in plans)):  # a baseline's mix
        what = f"{len(jobs_)} compiles of {len(plans)} configurations"
    else:
        what += f" on {len(targets)} targets" if len(targets) > 1 else ""
        what += f" at {shapes} shapes" if shapes > 1 else ""
        what += f" ({len(jobs_)} compiles)" if len(plans) > 1 else ""
        what += (f" for {first.model.name}: {', '.join(t.label for t in targets)}" if len(targets) > 1
                 else f" for {first.model.name} on {first.target.label}")
    return run_jobs(jobs_, what, timeout, jobs, no_cache, max_host_bytes, job_labels(plans))


def run_jobs(jobs: list[CompileJob], what: str, timeout: float, parallel: int | None, no_cache: bool,
             max_host_bytes: int | None = None, labels: list[str] | None = None) -> list[Measurement]:
    """Compiles (or answers from the cache) ``jobs``, showing progress on stderr under
    ``labels`` (default: the strategy names); ``what`` says what they are in the opening line."""
    parallel = parallel or default_parallel(len(jobs))
    started = time.monotonic()
    cache = None if no_cache else ResultCache()
    keeps = cache is not None and says_if_unwritable(cache)
    measurements = _compile_with_progress(jobs, what, labels or [j.strategy.name for j in jobs], timeout,
                                          parallel, cache, max_host_bytes, keeps)
    cached = sum(m.cached for m in measurements)
    messages().print(f"memprobe: {len(measurements) - cached} compiled, {cached} from cache, "
                     f"in {time.monotonic() - started:.0f} s wall time")
    return measurements


def says_if_unwritable(cache: ResultCache) -> bool:
    """Whether ``cache`` keeps what this run compiles; where it cannot, says so before the
    compiles start, once a run (a fit's rounds ask again), though it still answers what it
    holds: writes fail silently, and a run that keeps nothing should not let the user count
    on the same command answering at once."""
    why = cache.unwritable()
    if why is not None and cache.directory not in _SAID_UNWRITABLE:
        _SAID_UNWRITABLE.add(cache.directory)
        messages().print(f"memprobe: results cache {cache.directory} cannot be written ({why}): nothing this "
                         "run compiles will be kept (MEMPROBE_CACHE_DIR names another directory)", highlight=False)
    return why is None


_SAID_UNWRITABLE: set[Path] = set()


def strategy_names(strategies: str | None, notes: list[str]) -> list[str] | str | None:
    """--strategies for ``resolve_plan``: None (the four families), 'all' (every built-in) or
    the names of a comma-separated list, where 'all' may stand too (all,mine); a name given
    twice is noted here, and planned once there."""
    if strategies is None or strategies.strip() == "all":
        return None if strategies is None else "all"
    names = [n.strip() for n in strategies.split(",") if n.strip()]
    notes += repeated(names, "--strategies")
    return names


def repeated(values: list, option: str) -> list[str]:
    """A note of the values of a comma-separated option given more than once (each is
    measured once), or none."""
    twice = [str(v) for v in dict.fromkeys(values) if values.count(v) > 1]
    return [f"{', '.join(twice)} named more than once in {option}; measured once"] if twice else []


def _compile_with_progress(jobs, what: str, labels: list[str], timeout: float, parallel: int, cache,
                           max_host_bytes=None, keeps: bool = False):
    err = messages()
    progress = Progress(SpinnerColumn(), TextColumn("{task.description:<18}"),
                        TextColumn("{task.fields[state]}"), TimeElapsedColumn(), console=err,
                        transient=False, disable=not err.is_terminal)
    with progress:
        tasks = [progress.add_task(label, start=False, state="waiting", total=1) for label in labels]
        # What each compile took here before, so a run of many minutes says what to expect.
        hints = last_time_hints(jobs, cache)
        started = {}
        said: dict[int, float] = {}  # seconds into each compile of its last "still compiling" line
        finished = []  # measured in this run, so in the cache should the run be stopped

        def on_event(i: int, state: str, elapsed: float) -> None:
            shown = f"{state} ({hints[i]})" if state == "compiling" and hints[i] else state
            if i not in started and state != "cached":
                started[i] = time.monotonic()
                progress.start_task(tasks[i])
                if not err.is_terminal:  # a log, not a live display: one line per change
                    err.print(f"memprobe: {labels[i]}: {shown}", highlight=False)
            if state == "cached":
                progress.update(tasks[i], state="from cache", completed=1)
                progress.stop_task(tasks[i])
                if not err.is_terminal:
                    err.print(f"memprobe: {labels[i]}: from cache", highlight=False)
                return
            if state in ("compiling", "tracing"):  # tracing: a cached entry gets its matmul FLOPs
                progress.update(tasks[i], state=shown)
                # A log gets a line every five minutes, so that a full-size compile (20 min and
                # more) is not a silence a CI runner takes for a hung job.
                if not err.is_terminal and elapsed - said.get(i, 0.0) >= STILL_EVERY_S:
                    said[i] = elapsed
                    err.print(f"memprobe: {labels[i]}: still {state} ({minutes(elapsed)}"
                              f"{'; ' + hints[i] if hints[i] else ''})", highlight=False)
            else:
                if state in ("done", "refused"):
                    finished.append(labels[i])
                shown = ENDED.get(state, state)
                progress.update(tasks[i], state=shown, completed=1)
                progress.stop_task(tasks[i])
                if not err.is_terminal:
                    took = time.monotonic() - started[i]
                    err.print(f"memprobe: {labels[i]}: {shown} after {took:.0f} s", highlight=False)

        err.print(f"memprobe: measuring {what}", highlight=False)
        try:
            return compile_jobs(jobs, timeout_s=timeout, parallel=parallel, on_event=on_event,
                                cache=cache, max_host_bytes=max_host_bytes)
        except KeyboardInterrupt:
            _say_kept(finished, cache is not None, keeps)
            raise


STILL_EVERY_S = 300.0
# How a progress line names a compile's end where its event's name is not plain English.
ENDED = {"refused": "over HBM (refused by the TPU compiler)"}


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"


def last_time_hints(jobs: list[CompileJob], cache: ResultCache | None) -> list[str]:
    """Per job, what the same work took to compile here before; '' where it never ran here
    or there is no cache (--no-cache)."""
    return [_last_time_hint(last) for last in cache.last_times(jobs)] if cache is not None else [""] * len(jobs)


def _last_time_hint(last: tuple[float, int, int] | None) -> str:
    """'took 19 min 40 s here last time, at seq 24576 x 8', or '' when it never ran here."""
    if last is None:
        return ""
    seconds, seq, batch = last
    whole = round(seconds)
    took = f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"
    return f"took {took} here last time, at seq {seq} x {batch}"


def _say_kept(finished: list[str], cached: bool, kept: bool) -> None:
    """On Ctrl-C or SIGTERM: what of a long run is not lost. A full-size compile takes 10-20
    minutes, so a user stopping at minute 30 should know whether to start over."""
    if not finished:
        return
    if kept:
        messages().print(f"memprobe: kept in the results cache: {', '.join(finished)} (the same command "
                         "answers from there)", highlight=False)
    else:
        why = "nothing was kept: the results cache cannot be written" if cached else "--no-cache kept nothing"
        messages().print(f"memprobe: {', '.join(finished)} finished, but {why}", highlight=False)
