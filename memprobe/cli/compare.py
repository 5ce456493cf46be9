"""`memprobe compare`: compile every chosen strategy and print the ranked table."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from memprobe.cli import _options as o
from memprobe.compile import DEFAULT_TIMEOUT_S, compile_jobs, default_parallel
from memprobe.errors import BadInput
from memprobe.plan import DEFAULT_MODEL, Step, make_plan
from memprobe.render import table
from memprobe.strategy import DEFAULT_STRATEGIES, load_catalogue, select
from memprobe.targets import DEFAULT_TARGET, resolve_target


def compare(
    seq: o.Seq = 24576,
    batch: o.Batch = 8,
    model: o.Model = DEFAULT_MODEL,
    target: o.Target = DEFAULT_TARGET,
    devices: o.Devices = None,
    topology: o.Topology = None,
    strategies: o.Strategies = None,
    strategy_file: o.StrategyFile = None,
    strategies_dir: o.StrategiesDir = None,
    loss_chunks: o.LossChunks = None,
    step: o.StepKind = Step.TRAIN,
    timeout: o.Timeout = DEFAULT_TIMEOUT_S,
    jobs: o.Jobs = None,
) -> int:
    """Compile the train step under each strategy and rank them by per-device peak HBM.

    Figures are the compiler's estimates from memory_analysis(); nothing runs on a device.
    Exit code 1 when any strategy failed to compile (the table still shows the others).
    """
    catalogue = load_catalogue(strategy_file or (), strategies_dir or ())
    names = [n.strip() for n in strategies.split(",") if n.strip()] if strategies else [
        n for n in DEFAULT_STRATEGIES if n in catalogue]
    if strategy_file and not strategies:
        names += [p.stem for p in strategy_file]
    plan = make_plan(model=model, strategies=select(catalogue, names),
                     target=resolve_target(target, devices, topology), seq_len=seq,
                     batch_per_device=batch, loss_chunks=loss_chunks, step=step)
    if jobs is not None and jobs < 1:
        raise BadInput(f"--jobs must be a positive integer, got {jobs}")
    if timeout <= 0:
        raise BadInput(f"--timeout must be a positive number of seconds, got {timeout}")
    jobs = jobs or default_parallel(len(plan.strategies))
    started = time.monotonic()
    measurements = _compile_with_progress(plan, timeout, jobs)
    Console(stderr=True).print(f"memprobe: {len(measurements)} compiles in "
                               f"{time.monotonic() - started:.0f} s wall time", highlight=False)
    table.render(measurements, sys.stdout)
    return 0 if all(m.ok for m in measurements) else 1


def _compile_with_progress(plan, timeout: float, parallel: int):
    jobs = plan.jobs()
    err = Console(stderr=True)
    progress = Progress(SpinnerColumn(), TextColumn("{task.description:<18}"),
                        TextColumn("{task.fields[state]}"), TimeElapsedColumn(), console=err,
                        transient=False, disable=not err.is_terminal)
    with progress:
        tasks = [progress.add_task(j.strategy.name, start=False, state="waiting", total=1) for j in jobs]
        started = {}

        def on_event(i: int, state: str, elapsed: float) -> None:
            if i not in started:
                started[i] = time.monotonic()
                progress.start_task(tasks[i])
                if not err.is_terminal:  # a log, not a live display: one line per change
                    err.print(f"memprobe: {jobs[i].strategy.name}: compiling", highlight=False)
            if state == "compiling":
                progress.update(tasks[i], state="compiling")
            else:
                progress.update(tasks[i], state=state, completed=1)
                progress.stop_task(tasks[i])
                if not err.is_terminal:
                    took = time.monotonic() - started[i]
                    err.print(f"memprobe: {jobs[i].strategy.name}: {state} after {took:.0f} s", highlight=False)

        err.print(f"memprobe: compiling {len(jobs)} strateg{'y' if len(jobs) == 1 else 'ies'} for "
                  f"{plan.model.name} on {plan.target.label}", highlight=False)
        return compile_jobs(jobs, timeout_s=timeout, parallel=parallel, on_event=on_event)
