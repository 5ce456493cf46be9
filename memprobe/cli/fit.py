"""`memprobe fit`: the largest per-device batch each strategy fits in HBM (or a budget)."""

from __future__ import annotations

from typing import Annotated

import typer

from memprobe.cli import _options as o
from memprobe.cli._output import check_writable, command_line, messages, output_file
from memprobe.cli.compare import check_host_ram, check_run_options, plan_from_options, run_jobs
from memprobe.compile import DEFAULT_TIMEOUT_S
from memprobe.errors import BadInput
from memprobe.fit import FitResult, search
from memprobe.measure import GIB, Measurement, parse_positive_size, with_host_ram
from memprobe.plan import DEFAULT_MODEL, CompileJob, Shapes, Step
from memprobe.render import FitFormat
from memprobe.targets import DEFAULT_TARGET

DEFAULT_MAX_BATCH = 1024


def fit(
    seq: o.Seq = 24576,
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
    max_batch: Annotated[int, typer.Option(
        "--max-batch", help="The largest per-device batch to try.")] = DEFAULT_MAX_BATCH,
    timeout: o.Timeout = DEFAULT_TIMEOUT_S,
    jobs: o.Jobs = None,
    no_cache: o.NoCache = False,
    max_host_memory: o.MaxHostMemory = None,
    host_ram: o.HostRam = None,
    devices_per_host: o.DevicesPerHost = None,
    format: Annotated[FitFormat, typer.Option("--format", help="table, markdown or json.")] = FitFormat.TABLE,
    output: o.Output = None,
) -> int:
    """Find the largest per-device batch at which each strategy's step fits the target's HBM.

    Compiles batch 1 and 2, then the batch the line through them predicts and the one after,
    until a compiled batch fits and the next is over (4 compiles per strategy on a linear peak). With
    --host-ram a batch must also fit its host bytes (offload) in the host's RAM. Every compile is
    cached, so `compare --batch N` afterwards answers at once. Exit code 1 when a strategy's search
    failed (the others are still shown).
    """
    plan = plan_from_options(seq, 1, model, target, devices, topology, strategies, strategy_file,
                             strategies_dir, loss_chunks, step)
    if max_batch < 1:
        raise BadInput(f"--max-batch must be a positive integer, got {max_batch}")
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

    def measure(pairs: list[tuple[str, int]]) -> list[Measurement]:
        nonlocal rounds
        rounds += 1
        batch_jobs = [CompileJob(plan.model, by_name[name], plan.target,
                                 Shapes(plan.shapes.seq_len, batch, plan.shapes.loss_chunks), plan.step)
                      for name, batch in pairs]
        what = (f"{len(pairs)} batch size{'s' if len(pairs) > 1 else ''} for {plan.model.name} on "
                f"{plan.target.label} (round {rounds}, budget {limit / GIB:.2f} GiB)")
        out = run_jobs(batch_jobs, what, timeout, jobs, no_cache, cap,
                       labels=[f"{name} batch {batch}" for name, batch in pairs])
        if ram is not None:
            out = with_host_ram(out, ram, per_host)
        measured.extend(out)
        return out

    result = FitResult([], measured, limit, source, max_batch, command=command_line(), host_ram=ram,
                       devices_per_host=per_host)
    result.searches = search(list(by_name), limit, max_batch, measure, result.host_budget)
    from memprobe.render.fit import render  # pandas, through the shared footnotes

    with output_file(output) as f:
        render(result, format, f)
    failed = [s for s in result.searches if s.error is not None]
    for s in failed:
        messages().print(f"memprobe: {s.strategy}: search stopped: {s.error}")
    return 1 if failed else 0
