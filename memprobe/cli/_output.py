"""Where results go: the chosen format, to standard output or a file checked up front."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from rich.console import Console

from memprobe.errors import BadInput
from memprobe.render import Format, render
from memprobe.result import Result


def command_line() -> str:
    """The command as the user typed it, for report footers."""
    return shlex.join(["memprobe", *sys.argv[1:]])


def check_writable(output: Path | None, option: str = "--output") -> None:
    """Refuses an output path that cannot be written, before any compile starts."""
    if output is None:
        return
    if output.is_dir():
        raise BadInput(f"{option} {output}: is a directory")
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.is_dir():
        raise BadInput(f"{option} {output}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (output.exists() and not os.access(output, os.W_OK)):
        raise BadInput(f"{option} {output}: not writable")


def write_result(result: Result, fmt: Format, output: Path | None, chart: Path | None = None) -> None:
    if chart is not None:
        from memprobe.render.chart import render_png

        groups = result.comparisons
        for i, group in enumerate(groups):
            path = chart if len(groups) == 1 else chart.with_name(f"{chart.stem}-{i + 1}{chart.suffix}")
            try:
                path.write_bytes(render_png(group))
            except OSError as e:
                raise BadInput(f"--chart {path}: cannot write ({e.strerror})") from None
            Console(stderr=True).print(f"memprobe: wrote {path}", highlight=False)
    if output is None:
        render(result, fmt, sys.stdout)
        return
    try:
        with output.open("w") as f:
            render(result, fmt, f)
    except OSError as e:
        raise BadInput(f"--output {output}: cannot write ({e.strerror})") from None
    Console(stderr=True).print(f"memprobe: wrote {output}", highlight=False)
