"""`memprobe fit`: the largest per-device batch, or the longest sequence, each strategy fits in
HBM (or a budget)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from memprobe.cli import _options as o
from memprobe.cli._output import check_writable, command_line, messages, output_file
from memprobe.cli.compare import check_run_options, plan_from_options, run_jobs, say_skipped
from memprobe.compile import DEFAULT_TIMEOUT_S
from memprobe.plan import DEFAULT_MODEL, ParamDtype, Step
from memprobe.render import FitFormat
from memprobe.search import DEFAULT_FIT_SEQ as DEFAULT_SEQ
from memprobe.search import DEFAULT_MAX_BATCH, DEFAULT_MAX_SEQ, fit_plan, search_axis
from memprobe.targets import DEFAULT_TARGET


class Axis(str, Enum):
    BATCH = "batch"
    SEQ = "seq"


def fit(
    seq: Annotated[int | None, typer.Option(
        "--seq", help=f"Sequence length, with --vary batch (default {DEFAULT_SEQ}).")] = None,
    batch: Annotated[int | None, typer.Option(
        "--batch", help="Per-device batch, with --vary seq (default 1).")] = None,
    vary: Annotated[Axis, typer.Option(
        "--vary", help="What to search: the per-device batch at --seq, or the sequence length at "
        "--batch (in steps of one attention block, 512 tokens).")] = Axis.BATCH,
    model: o.Model = DEFAULT_MODEL,
    target: o.Target = DEFAULT_TARGET,
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
    budget: Annotated[str | None, typer.Option(
        "--budget", metavar="<size>", help="Per-device memory to fit in, e.g. 85GiB to keep headroom (default: the "
        "target's HBM per device).")] = None,
    max_batch: Annotated[int | None, typer.Option(
        "--max-batch", help=f"The largest per-device batch to try (default {DEFAULT_MAX_BATCH}).")] = None,
    max_seq: Annotated[int | None, typer.Option(
        "--max-seq", help=f"The longest sequence to try, with --vary seq (default {DEFAULT_MAX_SEQ}).")] = None,
    timeout: o.Timeout = DEFAULT_TIMEOUT_S,
    jobs: o.Jobs = None,
    no_cache: o.NoCache = False,
    max_host_memory: o.MaxHostMemory = None,
    host_ram: o.HostRam = None,
    devices_per_host: o.DevicesPerHost = None,
    format: Annotated[FitFormat, typer.Option("--format", help="table, markdown or json.")] = FitFormat.TABLE,
    output: o.Output = None,
) -> int:
    """Find the largest per-device batch (or, with --vary seq, the longest sequence) at which
    each strategy's step fits the target's HBM.

    Compiles batch 1 and 2, then the batch the line through them predicts and the one after,
    until a compiled batch fits and the next is over (4 compiles per strategy on a linear peak);
    --vary seq does the same with the length, one attention block at a time. With --host-ram a
    size must also fit its host bytes (offload) in the host's RAM. Every compile is cached, so
    `compare` afterwards answers at once. Exit code 1 when a strategy's search failed (the
    others are still shown).
    """
    axis, unit, max_n, seq, batch = search_axis(vary.value, seq, batch, max_batch, max_seq, loss_chunks)
    plan, skipped = plan_from_options(seq, batch, model, target, devices, topology, strategies, strategy_file,
                                      strategies_dir, loss_chunks, step, optimizer, param_dtype,
                                      grad_accum)
    cap = check_run_options(timeout, jobs, max_host_memory)
    check_writable(output)
    first = True

    def runner(wanted, labels, what):
        nonlocal first
        if first:  # fit_plan checks --budget and --host-ram before its first round
            say_skipped(plan, skipped)
            first = False
        return run_jobs(wanted, what, timeout, jobs, no_cache, cap, labels=labels)

    result = fit_plan(plan, axis, unit, max_n, runner, budget=budget, host_ram=host_ram,
                      devices_per_host=devices_per_host)
    result.command = command_line()
    from memprobe.render.fit import render  # pandas, through the shared footnotes

    with output_file(output) as f:
        render(result, format, f)
    failed = [s for s in result.searches if s.error is not None]
    for s in failed:
        messages().print(f"memprobe: {s.strategy}: search stopped: {s.error}")
    return 1 if failed else 0

