"""`memprobe check`: the CI regression gate (the verdicts are ``memprobe.gate``'s).

Recompiles every configuration in a baseline result (or, with --current, takes a saved
result's figures instead) and compares each strategy's peak, and its host bytes (offload),
with the baseline's: exit 0 when every peak and every host
figure is within tolerance of the baseline and the peaks are under the budget, 1 when
any regresses, exceeds the budget or fails to compile, 2 for bad input (a missing or
malformed baseline, compiler versions that differ from the baseline's).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from memprobe.cli import _options as o
from memprobe.cli._output import check_writable, command_line, messages, output_file, output_format
from memprobe.cli.compare import check_run_options, run_plans
from memprobe.compile import DEFAULT_TIMEOUT_S
from memprobe.errors import BadInput
from memprobe.gate import check_saved, configuration, limits, load_baseline, recheck
from memprobe.render import CheckFormat


def check(
    baseline_file: Annotated[Path | None, typer.Argument(
        help="A baseline written by `memprobe baseline` (or give it as --baseline FILE).",
        metavar="BASELINE", show_default=False)] = None,
    baseline: Annotated[Path | None, typer.Option("--baseline", help="The baseline, as an option.")] = None,
    tolerance: Annotated[str, typer.Option(
        "--tolerance", metavar="<pct|size>",
        help="Allowed growth of a peak, and of the host bytes: relative (2%) or absolute (0.5GiB).")] = "2%",
    max_peak: Annotated[str | None, typer.Option("--max-peak", metavar="<size>", help="A budget no peak may exceed, "
                                                 "e.g. 90GiB.")] = None,
    allow_version_drift: Annotated[bool, typer.Option(
        "--allow-version-drift", help="Judge even when jax, jaxlib or the compiler (libtpu, the CUDA plugin) "
        "differ from the baseline's: this machine's, or with --current, that result's.")] = False,
    current: Annotated[list[Path] | None, typer.Option(
        "--current", metavar="<result>",
        help="Judge this saved result (compare --format json, or baseline) against the baseline instead of "
             "recompiling: for figures compiled in another job or on another machine. Repeatable: the "
             "results of several jobs are judged as one. Nothing compiles; the files must share the "
             "baseline's compiler versions.")] = None,
    timeout: o.Timeout = DEFAULT_TIMEOUT_S,
    jobs: o.Jobs = None,
    no_cache: o.NoCache = False,
    max_host_memory: o.MaxHostMemory = None,
    fmt: Annotated[CheckFormat | None, o.format_option(
        "table (terminal), markdown (a pull-request comment) or json (exact bytes per strategy, for scripts)",
        "table")] = None,
    output: o.Output = None,
) -> int:
    """Recompile a baseline's configurations and fail when a peak (or an offload strategy's host
    bytes) regressed, or a peak exceeds a budget. With --current, judge a saved result instead
    of recompiling.

    Exit 0: every peak and host figure within tolerance, every peak under --max-peak. Exit 1:
    a regression, a peak over budget or a failed compile. Exit 2: bad input. With $GITHUB_STEP_SUMMARY set, the
    table is also appended there as markdown.
    """
    baseline = _one_baseline(baseline_file, baseline)
    tol, budget = limits(tolerance, max_peak)
    current = current or None  # typer gives a repeatable option left out as []
    if current is not None:  # options of a compile, where nothing compiles, would be silently ignored
        given = [name for name, value in (("--timeout", timeout != DEFAULT_TIMEOUT_S), ("--jobs", jobs is not None),
                                          ("--no-cache", no_cache), ("--max-host-memory", max_host_memory is not None))
                 if value]
        if given:
            raise BadInput(f"{given[0]} applies to a recompile, and with --current nothing compiles")
    else:
        cap = check_run_options(timeout, jobs, max_host_memory)
    check_writable(output)
    fmt = output_format(fmt, output, CheckFormat, CheckFormat.TABLE, charts=False)
    if current is not None:
        verdicts = check_saved(baseline, current, tol, budget, allow_version_drift)
        if verdicts.unjudged:
            messages().print(f"memprobe: {verdicts.current}: not in the baseline, so not judged: " + ", ".join(
                f"{m.strategy} ({configuration(m)})" for m in verdicts.unjudged), markup=False)
    else:
        base = load_baseline(baseline, allow_version_drift)
        verdicts = recheck(base, baseline, tol, budget, lambda plans: run_plans(plans, timeout, jobs, no_cache, cap))
    data = verdicts.to_json(command_line())
    from memprobe.render.check import write  # pandas, once the verdicts are in

    with output_file(output) as f:
        write(data, fmt.value, f)
    _write_step_summary(data)
    return 0 if data["passed"] else 1


def _one_baseline(positional: Path | None, option: Path | None) -> Path:
    """`memprobe check FILE` and `memprobe check --baseline FILE` are the same gate."""
    if positional is None and option is None:
        raise BadInput("give the baseline to check against: memprobe check BASELINE (or --baseline BASELINE)")
    if positional is not None and option is not None and positional != option:
        raise BadInput(f"two baselines given, {positional} and --baseline {option}; give one")
    return positional or option


def _write_step_summary(data: dict) -> None:
    """The verdicts' markdown appended to a GitHub Actions job summary, where there is one."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    from memprobe.render.check import markdown

    try:
        with open(path, "a") as f:
            f.write(markdown(data))
    except OSError as e:  # the verdicts are the answer, and were printed: the exit code stays theirs
        messages().print(f"memprobe: GITHUB_STEP_SUMMARY {path}: cannot write ({e.strerror}); the verdicts "
                         "are not in the job summary", markup=False)
