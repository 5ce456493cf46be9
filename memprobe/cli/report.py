"""`memprobe report`: render a saved JSON result in any format, without compiling."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memprobe.cli import _options as o
from memprobe.cli._output import check_writable, write_result
from memprobe.render import Format
from memprobe.result import Result


def report(
    result: Annotated[Path, typer.Argument(help="A JSON result written by --format json or `memprobe baseline`.")],
    format: o.FormatOpt = Format.MARKDOWN,
    output: o.Output = None,
    chart: o.Chart = None,
) -> int:
    """Re-render a saved result (table, markdown, json, csv, html) without recompiling."""
    loaded = Result.load(result)
    check_writable(output)
    check_writable(chart, "--chart")
    write_result(loaded, format, output, chart)
    return 0
