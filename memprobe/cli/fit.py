"""`memprobe fit`: the largest per-device batch, or the longest sequence, each strategy fits in
HBM (or a budget)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from memprobe.cli import _options as o
from memprobe.cli._output import check_writable, command_line, messages, output_file
from memprobe.cli.compare import check_host_ram, check_run_options, plan_from_options, run_jobs
from memprobe.compile import DEFAULT_TIMEOUT_S
from memprobe.errors import BadInput
from memprobe.fit import FitResult, search
from memprobe.measure import GIB, Measurement, parse_positive_size, with_host_ram
from memprobe.model._config import attention_block_size, default_loss_chunks
from memprobe.plan import DEFAULT_MODEL, CompileJob, Shapes, Step
from memprobe.render import FitFormat
from memprobe.targets import DEFAULT_TARGET

DEFAULT_MAX_BATCH = 1024
DEFAULT_MAX_SEQ = 131072  # Gemma 4 small's context length
DEFAULT_SEQ = 24576


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
    budget: Annotated[str | None, typer.Option(
        "--budget", help="Per-device memory to fit in, e.g. 85GiB to keep headroom (default: the "
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
    axis, unit, max_n, seq, batch = _search_axis(vary, seq, batch, max_batch, max_seq, loss_chunks)
    plan = plan_from_options(seq, batch, model, target, devices, topology, strategies, strategy_file,
                             strategies_dir, loss_chunks, step)
    if budget is not None:
        limit, source = parse_positive_size(budget, "--budget"), "--budget"
    elif plan.target.hbm_bytes is None:
        raise BadInput(f"target {plan.target.name} has no HBM capacity to fit in; pass --budget SIZE")
    else:
        limit, source = plan.target.hbm_bytes, "HBM"
    cap = check_run_options(timeout, jobs, max_host_memory)
    ram, per_host = check_host_ram(plan, host_ram, devices_per_host) or (None, None)
    check_writable(output)
    by_name = {s.name: s for s in plan.strategies}
    measured: list[Measurement] = []
    rounds = 0

    def shapes(n: int) -> Shapes:
        if axis == "batch":
            return Shapes(plan.shapes.seq_len, n, plan.shapes.loss_chunks)
        return Shapes(n * unit, plan.shapes.batch_per_device, default_loss_chunks(n * unit))

    def measure(pairs: list[tuple[str, int]]) -> list[Measurement]:
        nonlocal rounds
        rounds += 1
        wanted = [CompileJob(plan.model, by_name[name], plan.target, shapes(n), plan.step) for name, n in pairs]
        sizes = "batch sizes" if axis == "batch" else "sequence lengths"
        what = (f"{len(pairs)} {sizes} for {plan.model.name} on {plan.target.label} "
                f"(round {rounds}, budget {limit / GIB:.2f} GiB)")
        out = run_jobs(wanted, what, timeout, jobs, no_cache, cap,
                       labels=[f"{name} {axis} {n * unit}" for name, n in pairs])
        if ram is not None:
            out = with_host_ram(out, ram, per_host)
        measured.extend(out)
        return out

    result = FitResult([], measured, limit, source, max_n, command=command_line(), host_ram=ram,
                       devices_per_host=per_host, axis=axis, unit=unit)
    result.searches = search(list(by_name), limit, max_n, measure, result.host_budget, axis, unit)
    from memprobe.render.fit import render  # pandas, through the shared footnotes

    with output_file(output) as f:
        render(result, format, f)
    failed = [s for s in result.searches if s.error is not None]
    for s in failed:
        messages().print(f"memprobe: {s.strategy}: search stopped: {s.error}")
    return 1 if failed else 0


def _search_axis(vary: Axis, seq: int | None, batch: int | None, max_batch: int | None, max_seq: int | None,
                 loss_chunks: int | None) -> tuple[str, int, int, int, int]:
    """What the search varies, in which steps and up to where, and the shape it holds fixed:
    (axis, unit, largest n, seq and batch to plan with). Options that belong to the other
    axis are refused rather than ignored."""
    if vary is Axis.BATCH:
        for flag, value in (("--batch", batch), ("--max-seq", max_seq)):
            if value is not None:
                raise BadInput(f"{flag} applies with --vary seq; --vary batch searches the batch at --seq")
        max_n = DEFAULT_MAX_BATCH if max_batch is None else max_batch
        if max_n < 1:
            raise BadInput(f"--max-batch must be a positive integer, got {max_n}")
        return "batch", 1, max_n, DEFAULT_SEQ if seq is None else seq, 1
    for flag, value in (("--seq", seq), ("--max-batch", max_batch), ("--loss-chunks", loss_chunks)):
        if value is not None:
            raise BadInput(f"{flag} does not apply with --vary seq, which searches the length "
                           "(up to --max-seq, the loss in chunks of one attention block)")
    unit = attention_block_size(DEFAULT_MAX_SEQ)
    longest = DEFAULT_MAX_SEQ if max_seq is None else max_seq
    if longest < unit or longest % unit:
        raise BadInput(f"--max-seq must be a positive multiple of the attention block ({unit}), got {longest}")
    return "seq", unit, longest // unit, unit, 1 if batch is None else batch
