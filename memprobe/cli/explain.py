"""`memprobe explain`: the buffers live at one strategy's peak, or what separates two."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from memprobe.api import explain_plan, run_explain
from memprobe.cache import ResultCache
from memprobe.cli import _options as o
from memprobe.cli._output import (chart_format, check_chart, check_writable, command_line, messages, output_file,
                                  output_format, write_bytes)
from memprobe.cli import compare
from memprobe.cli.compare import check_run_options
from memprobe.compile import DEFAULT_TIMEOUT_S
from memprobe.liveness import Explained
from memprobe.plan import DEFAULT_MODEL, ParamDtype, Step
from memprobe.render import DEFAULT_TOP, ExplainFormat, check_top


def _two_names(pair: tuple[str, str] | None) -> tuple[str, str] | None:
    """`--diff` takes exactly two values, so `--diff a --model x` reads "--model" as the second
    strategy and click then complains of an "unexpected extra argument (x)", which names
    neither the option nor the mistake."""
    for name in pair or ():
        if name.startswith("-"):
            raise typer.BadParameter(f"takes two strategy names, A B; {name!r} is an option, not a strategy "
                                     f"(e.g. --diff checkpoint scan-checkpoint)")
    return pair


def explain(
    strategy: Annotated[str | None, typer.Option(
        "--strategy", metavar="<name>", help="The strategy to explain.")] = None,
    diff_pair: Annotated[tuple[str, str] | None, typer.Option(
        "--diff", metavar="<A B>", callback=_two_names,
        help="Two strategies, A B: the buffers that account for the difference in peak.")] = None,
    seq: o.Seq = 24576,
    batch: o.Batch = 8,
    model: o.Model = DEFAULT_MODEL,
    target: o.Target = None,
    devices: o.Devices = None,
    topology: o.Topology = None,
    strategy_file: o.StrategyFile = None,
    strategies_dir: o.StrategiesDir = None,
    loss_chunks: o.LossChunks = None,
    step: o.StepKind = Step.TRAIN,
    optimizer: o.OptimizerKind = None,
    param_dtype: o.ParamDtypeKind = ParamDtype.FP32,
    grad_accum: o.GradAccum = 1,
    top: Annotated[int, typer.Option(
        "--top", help="Buffers (or diff groups) to list; the rest are summed.")] = DEFAULT_TOP,
    timeout: o.Timeout = DEFAULT_TIMEOUT_S,
    no_cache: o.NoCache = False,
    max_host_memory: o.MaxHostMemory = None,
    format: Annotated[ExplainFormat | None, o.format_option("table, markdown or json", "table")] = None,
    output: o.Output = None,
    chart: Annotated[Path | None, typer.Option(
        "--chart", help="Also save a chart of the bytes live over program order, the peak marked (PNG; SVG or "
        "PDF for a .svg or .pdf file).")] = None,
) -> int:
    """List what is live at the peak: shape, size, share of the peak and the model tensor of each
    buffer, from the compiler's own buffer assignment and live ranges; for offload strategies
    also what sits in host memory where the most is. For a program the TPU compiler refuses
    over HBM, the largest allocations of its out-of-memory report instead (exit code 0).

    Compiles with the compiler's dump files on, as long as a `compare` compile; the answer is kept in the results cache.
    """
    check_top(top)
    plan = explain_plan(strategy, diff_pair, seq=seq, batch=batch, model=model, target=target, devices=devices,
                        topology=topology, strategy_files=strategy_file or (), strategies_dirs=strategies_dir or (),
                        loss_chunks=loss_chunks, step=step, optimizer=optimizer, param_dtype=param_dtype,
                        grad_accum=grad_accum)
    cap = check_run_options(timeout, None, max_host_memory)
    check_writable(output)
    format = output_format(format, output, ExplainFormat, ExplainFormat.TABLE)
    check_chart(chart, output)
    if not no_cache:
        compare.says_if_unwritable(ResultCache())
    answer = run_explain(plan, timeout_s=timeout, cache=not no_cache, max_host_bytes=cap,
                         on_event=_progress(f"{plan.model.name} on {plan.target.label}", _hints(plan, no_cache)))
    answer = dataclasses.replace(answer, command=command_line())
    _write(answer, format, output, chart, top)
    return 1 if answer.failed else 0


def _hints(plan, no_cache: bool) -> dict[str, str]:
    """Per strategy, what the same work took to compile here before, as `compare` says it
    (a full-size explain compiles for 13-20 minutes); none with --no-cache, as there."""
    jobs = plan.jobs()
    return dict(zip((job.strategy.name for job in jobs),
                    compare.last_time_hints(jobs, None if no_cache else ResultCache())))


def _progress(where: str, hints: dict[str, str]):
    """Progress lines on stderr: a compile with dumps on takes as long as a `compare` one."""
    err = messages()
    said: dict[str, float] = {}

    def on_event(name: str, state: str, seconds: float) -> None:
        hint = f"; {hints[name]}" if hints.get(name) else ""
        if state == "cached":
            err.print(f"memprobe: {name}: from cache")
        elif state == "compiling" and name not in said:
            said[name] = 0.0
            err.print(f"memprobe: {name}: compiling with the compiler's buffer listing on ({where}{hint})",
                      highlight=False)
        elif state == "compiling" and seconds - said[name] >= compare.STILL_EVERY_S:  # as compare's log
            said[name] = seconds
            err.print(f"memprobe: {name}: still compiling ({compare.minutes(seconds)}{hint})", highlight=False)
        elif state in ("done", "refused", "failed"):
            err.print(f"memprobe: {name}: {compare.ENDED.get(state, state)} after {seconds:.0f} s", highlight=False)

    return on_event


def _write(answer: Explained, fmt: ExplainFormat, output: Path | None, chart: Path | None, top: int) -> None:
    from memprobe.render import explain as r  # pandas, once there is an answer to render

    if chart is not None and answer.explained:
        write_bytes(chart, r.curve_chart(answer, chart_format(chart)))
    elif chart is not None:  # every compile failed: say so rather than leave the file missing
        messages().print(f"memprobe: no chart written to {chart}: no strategy was explained")
    with output_file(output) as file:
        r.write(answer, fmt.value, file, top)
