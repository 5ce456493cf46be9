"""`memprobe explain`: the buffers live at one strategy's peak, or what separates two."""

from __future__ import annotations

import enum
import json
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from memprobe.cli import _options as o
from memprobe.cli._output import check_writable, command_line, messages, output_file, write_bytes
from memprobe.cli.compare import check_run_options, plan_from_options
from memprobe.compile import (
    DEFAULT_TIMEOUT_S,
    compile_environment,
    default_parallel,
    explain_isolated,
    map_stoppable,
)
from memprobe.errors import BadInput, MemprobeError
from memprobe.explain import Explanation, diff
from memprobe.measure import Measurement
from memprobe.plan import DEFAULT_MODEL, Step
from memprobe.render import terminal_width
from memprobe.targets import DEFAULT_TARGET

SCHEMA = "memprobe.explain"


class ExplainFormat(str, enum.Enum):
    TABLE = "table"
    MARKDOWN = "markdown"
    JSON = "json"


def explain(
    strategy: Annotated[str | None, typer.Option("--strategy", help="The strategy to explain.")] = None,
    diff_pair: Annotated[tuple[str, str] | None, typer.Option(
        "--diff", help="Two strategies, A B: the buffers that account for the difference in peak.")] = None,
    seq: o.Seq = 24576,
    batch: o.Batch = 8,
    model: o.Model = DEFAULT_MODEL,
    target: o.Target = DEFAULT_TARGET,
    devices: o.Devices = None,
    topology: o.Topology = None,
    strategy_file: o.StrategyFile = None,
    strategies_dir: o.StrategiesDir = None,
    loss_chunks: o.LossChunks = None,
    step: o.StepKind = Step.TRAIN,
    top: Annotated[int, typer.Option("--top", help="Buffers (or diff groups) to list; the rest are summed.")] = 20,
    timeout: o.Timeout = DEFAULT_TIMEOUT_S,
    no_cache: o.NoCache = False,
    max_host_memory: o.MaxHostMemory = None,
    format: Annotated[ExplainFormat, typer.Option("--format", help="table, markdown or json.")] = ExplainFormat.TABLE,
    output: o.Output = None,
    chart: Annotated[Path | None, typer.Option(
        "--chart", help="Also save a PNG of the bytes live over program order, the peak marked.")] = None,
) -> int:
    """List what is live at the peak: shape, size, share of the peak and the model tensor of each
    buffer, from the compiler's own buffer assignment and live ranges; for offload strategies
    also what sits in host memory where the most is.

    Compiles with the compiler's dump files on, as long as a `compare` compile; the answer is kept in the results cache.
    """
    if (strategy is None) == (diff_pair is None):
        raise BadInput("give exactly one of --strategy NAME or --diff A B")
    if top < 1:
        raise BadInput(f"--top must be a positive integer, got {top}")
    names = [strategy] if strategy else list(diff_pair)
    if len(set(names)) != len(names):
        raise BadInput(f"--diff needs two different strategies, got {names[0]} twice")
    plan = plan_from_options(seq, batch, model, target, devices, topology, ",".join(names), strategy_file,
                             strategies_dir, loss_chunks, step)
    cap = check_run_options(timeout, None, max_host_memory)
    check_writable(output)
    check_writable(chart, "--chart")
    jobs = plan.jobs()
    # --diff compiles both strategies at once when host memory allows two compiles.
    answers = map_stoppable(lambda job, stop: _explained(job, timeout, cap, no_cache, stop), jobs,
                            default_parallel(len(jobs)))
    _write(answers, format, output, chart, top)
    return 0


def _explained(job, timeout: float, cap: int | None, no_cache: bool,
               stop: threading.Event | None = None) -> tuple[Measurement, Explanation]:
    from memprobe.cache import ResultCache

    err = messages()
    cache = None if no_cache else ResultCache()
    env = compile_environment(job.target)
    hit = cache.get_explained(job, env) if cache else None
    if hit:
        err.print(f"memprobe: {job.strategy.name}: from cache")
        return hit[0], Explanation.from_dict(hit[1])
    err.print(f"memprobe: {job.strategy.name}: compiling with the compiler's buffer listing on "
              f"({job.model.name} on {job.target.label})")
    started = time.monotonic()
    said = [0.0]

    def tick(elapsed: float) -> None:  # a line every five minutes on long compiles
        if elapsed - said[0] >= 300:
            said[0] = elapsed
            err.print(f"memprobe: {job.strategy.name}: still compiling ({elapsed / 60:.0f} min)")

    m, explanation = explain_isolated(job, timeout, tick, cap, stop)
    if not m.ok or explanation is None:
        raise MemprobeError(f"{job.strategy.name}: {m.error or 'no buffer listing'}")
    err.print(f"memprobe: {job.strategy.name}: done after {time.monotonic() - started:.0f} s")
    if cache:
        cache.put_explained(job, env, m, explanation)
    return m, Explanation.from_dict(explanation)


def _write(answers, fmt: ExplainFormat, output: Path | None, chart: Path | None, top: int) -> None:
    from memprobe.render import explain as r

    if chart is not None:
        write_bytes(chart, r.curve_png(answers))
    command = command_line()
    pair = diff(answers[0][1], answers[1][1]) if len(answers) == 2 else None
    with output_file(output) as file:
        if fmt is ExplainFormat.JSON:
            data = {"schema": SCHEMA, "schema_version": 1, "command": command,
                    "strategies": [{"measurement": m.to_dict(), "explanation": e.to_dict(),
                                    "peak_parts": r.peak_parts(m, e)} for m, e in answers]}
            if pair is not None:
                data["diff"] = pair
            file.write(json.dumps(data, indent=2) + "\n")
            return
        sections = []
        if pair is not None:
            (ma, _), (mb, _) = answers
            frame, more = r.diff_frame(pair, ma.strategy, mb.strategy, top)
            sections.append((frame, r.diff_heading(ma, mb), more, r.diff_notes(*answers, command)))
        for m, e in answers:
            frame, more = r.buffers_frame(m, e, top)
            sections.append((frame, r.heading(m), more, r.explain_notes(m, e, command)))
            if e.host_buffers:  # offload: what sits in host memory, apart from HBM
                frame, more = r.host_frame(e, top)
                sections.append((frame, r.host_heading(m), more, r.host_notes(m, e)))
        for frame, heading, more, notes in sections:
            if fmt is ExplainFormat.MARKDOWN:
                r.render_markdown(frame, heading, more, notes, file)
            else:
                r.render_table(frame, heading, more, notes, file, terminal_width(file))
