"""`memprobe fit`: the largest per-device batch, or the longest sequence, each strategy fits in
HBM (or a budget)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from memprobe import api
from memprobe.cli import _options as o
from memprobe.cli._output import check_writable, command_line, messages, output_file, output_format
from memprobe.cli.compare import (check_run_options, int_list, name_list, run_jobs, say, skipped_notes,
                                  strategy_names)
from memprobe.compile import DEFAULT_TIMEOUT_S
from memprobe.plan import DEFAULT_MODEL, ParamDtype, Step
from memprobe.render import FitFormat
from memprobe.search import DEFAULT_FIT_SEQ as DEFAULT_SEQ
from memprobe.search import DEFAULT_MAX_BATCH, DEFAULT_MAX_SEQ
from memprobe.targets import target_or_default


class Axis(str, Enum):
    BATCH = "batch"
    SEQ = "seq"


def fit(
    seq: Annotated[str | None, typer.Option(
        "--seq", metavar="<int>[,<int>...]", help=f"Sequence length, with --vary batch (default {DEFAULT_SEQ}); "
        "several, comma-separated, search the batch at each.")] = None,
    batch: Annotated[str | None, typer.Option(
        "--batch", metavar="<int>[,<int>...]", help="Per-device batch, with --vary seq (default 1); several, "
        "comma-separated, search the length at each.")] = None,
    vary: Annotated[Axis, typer.Option(
        "--vary", help="What to search: the per-device batch at --seq, or the sequence length at "
        "--batch (in steps of one attention block, 512 tokens).")] = Axis.BATCH,
    model: o.Model = DEFAULT_MODEL,
    target: Annotated[str | None, typer.Option(
        "--target", metavar="<name>[,<name>...]", help=f"{o.TARGET_NAMES}; several, comma-separated, search on "
        "each, against its own HBM (or --budget), with a table of the answers side by side. "
        f"{o.TARGET_DEFAULT}")] = None,
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
    format: Annotated[FitFormat | None, o.format_option("table, markdown or json", "table")] = None,
    output: o.Output = None,
) -> int:
    """Find the largest per-device batch (or, with --vary seq, the longest sequence) at which
    each strategy's step fits the target's HBM.

    Compiles batch 1 and 2, then the batch the line through them predicts and the one after,
    until a compiled batch fits and the next is over (4 compiles per strategy on a linear peak);
    --vary seq does the same with the length, one attention block at a time. With --host-ram a
    size must also fit its host bytes (offload) in the host's RAM. Several lengths (--seq
    8192,24576; with --vary seq, several batches) search at each, with a table of the answers
    side by side; several targets (--target v5p-8,h100) search on each, the same way (with
    several shapes too, each target's shapes side by side). Every compile is cached, so
    `compare` afterwards answers at once. Exit code 1 when a strategy's search failed (the
    others are still shown).
    """
    cap = check_run_options(timeout, jobs, max_host_memory)
    check_writable(output)
    format = output_format(format, output, FitFormat, FitFormat.TABLE, charts=False)

    def runner(wanted, labels, what):
        return run_jobs(wanted, what, timeout, jobs, no_cache, cap, labels=labels)

    notes: list[str] = []  # said as the first round starts, once every option is checked

    def on_skipped(plan, names):
        notes.extend(skipped_notes([(plan, names)]))
        say(notes)  # and cleared: each later target's plan says only its own

    found = api.fit(vary=vary.value, seq=None if seq is None else int_list(seq, "--seq", notes),
                    batch=None if batch is None else int_list(batch, "--batch", notes), model=model,
                    target=name_list(target_or_default(target, topology), "--target", notes),
                    devices=devices, topology=topology, strategies=strategy_names(strategies, notes),
                    strategy_files=strategy_file or (), strategies_dirs=strategies_dir or (),
                    loss_chunks=loss_chunks, step=step, optimizer=optimizer, param_dtype=param_dtype,
                    grad_accum=grad_accum, budget=budget, max_batch=max_batch, max_seq=max_seq, host_ram=host_ram,
                    devices_per_host=devices_per_host, jobs=jobs, timeout_s=timeout, runner=runner,
                    on_skipped=on_skipped)
    for result in found:
        result.command = command_line()
    from memprobe.render.fit import at, render_fits  # pandas, through the shared footnotes

    with output_file(output) as f:
        render_fits(found, format, f)
    failed = [(at(r, found), s) for r in found for s in r.searches if s.error]
    for where, s in failed:
        messages().print(f"memprobe: {s.strategy}{f' at {where}' if where else ''}: search stopped: {s.error}")
    return 1 if failed else 0

