"""Where results go: the chosen format, to standard output or a file checked up front."""

from __future__ import annotations

import contextlib
import enum
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from rich.console import Console

from memprobe.errors import BadInput
from memprobe.render import CHART_FORMATS, SUFFIX_FORMATS, Format, render, suffix_format
from memprobe.result import Result


def messages() -> Console:
    """Standard error, for progress and notices: never wrapped (a path stays on one line,
    so logs can be searched and copied), no colour guessed into numbers or paths."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def command_line() -> str:
    """The command as the user typed it, for report footers."""
    return shlex.join(["memprobe", *sys.argv[1:]])


#: The --output that names standard output, as for most tools (it wrote a file named "-").
STDOUT = Path("-")


def check_writable(output: Path | None, option: str = "--output") -> None:
    """Refuses an output path that cannot be written, before any compile starts."""
    if output is None or (output == STDOUT and option == "--output"):
        return
    if output.is_dir():
        raise BadInput(f"{option} {output}: is a directory")
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.is_dir():
        raise BadInput(f"{option} {output}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (output.exists() and not os.access(output, os.W_OK)):
        raise BadInput(f"{option} {output}: not writable")


def output_format(fmt: enum.Enum | None, output: Path | None, formats: type[enum.Enum], default: enum.Enum,
                  charts: bool = True):
    """The --format given; without one, the format the --output file's suffix names, else
    ``default``. A suffix naming a format the command does not write, a picture (the
    command has --chart when ``charts``), or another format than the --format given, is
    refused: the file would hold something else than its name says."""
    name = suffix_format(output)
    if fmt is not None and name not in (None, "picture", fmt.value):
        # `--format json -o r.md` wrote JSON into r.md: one of the two is a slip
        ext = next((s for s, f in SUFFIX_FORMATS.items() if f == fmt.value), ".txt")  # .md, not .markdown
        undo = f", or drop --format to write {name}" if name in {f.value for f in formats} else ""
        raise BadInput(f"--output {output}: its {output.suffix} suffix names {name}, but --format {fmt.value} was "
                       f"given; name the file {output.with_suffix(ext).name}{undo}")
    if fmt is not None and name != "picture":
        return fmt
    if name == "picture":  # a picture was meant; the text would land in it
        hint = f"; a chart is saved with --chart {output.name}" if charts else ""
        raise BadInput(f"--output {output}: {output.suffix} is a picture's suffix, and --output writes the result as "
                       f"text{hint}")
    if name is None:
        return default
    try:
        return formats(name)
    except ValueError:
        known = [f.value for f in formats]
        raise BadInput(f"--output {output}: the {output.suffix} suffix asks for {name}, which this command does not "
                       f"write; give --format ({', '.join(known[:-1])} or {known[-1]})") from None


def chart_format(chart: Path) -> str:
    """The format a --chart path's suffix names; another suffix is refused."""
    if chart.suffix.lower() not in CHART_FORMATS:
        raise BadInput(f"--chart {chart}: a chart is saved as .png, .svg or .pdf, not {chart.suffix}")
    return CHART_FORMATS[chart.suffix.lower()]


def check_chart(chart: Path | None, output: Path | None) -> None:
    """Refuses a --chart path that cannot be written, names a format no chart is saved in or
    is the --output file too (one would overwrite the other), before any compile starts."""
    if chart == STDOUT:
        raise BadInput("--chart -: a chart is written to a file, not to standard output; name one (peaks.png)")
    if chart is not None and output is not None and chart.resolve() == output.resolve():
        raise BadInput(f"--chart {chart} is the --output file too; name two files")
    check_writable(chart, "--chart")
    if chart is not None:
        chart_format(chart)


def write_bytes(path: Path, data: bytes, option: str = "--chart") -> None:
    """Writes a file the user named (a chart), saying so; an OS error is one line."""
    try:
        path.write_bytes(data)
    except OSError as e:
        raise BadInput(f"{option} {path}: cannot write ({e.strerror})") from None
    messages().print(f"memprobe: wrote {path}")


@contextlib.contextmanager
def output_file(output: Path | None) -> Iterator[IO[str]]:
    """Standard output (no --output, or ``-o -``), or the --output file (an OS error is one
    line, success is said)."""
    if output is None or output == STDOUT:
        yield sys.stdout
        return
    try:
        f = output.open("w")
    except OSError as e:
        raise BadInput(f"--output {output}: cannot write ({e.strerror})") from None
    with f:
        yield f
    messages().print(f"memprobe: wrote {output}")


def write_result(result: Result, fmt: Format, output: Path | None, chart: Path | None = None) -> None:
    if chart is not None:
        from memprobe.render.chart import render_chart, render_sweep_chart
        from memprobe.render.frame import sweeps

        groups = result.comparisons
        as_format = chart_format(chart)
        for i, group in enumerate(groups):
            path = chart if len(groups) == 1 else chart.with_name(f"{chart.stem}-{i + 1}{chart.suffix}")
            write_bytes(path, render_chart(group, as_format))
        side_by_side = sweeps(groups)  # the shapes (or targets) side by side: each strategy's peak across them
        for i, sw in enumerate(side_by_side):  # a sweep on several targets: one per target, in table order
            name = f"{chart.stem}-sweep{'' if len(side_by_side) == 1 else f'-{i + 1}'}{chart.suffix}"
            write_bytes(chart.with_name(name), render_sweep_chart(sw, as_format))
    with output_file(output) as f:
        render(result, fmt, f)
