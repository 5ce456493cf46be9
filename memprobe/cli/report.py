"""`memprobe report`: render a saved JSON result in any format, without compiling."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from memprobe.cli import _options as o
from memprobe.cli._output import check_writable, output_file, write_result
from memprobe.errors import BadInput
from memprobe.measure import parse_host_ram, with_host_ram
from memprobe.render import FitFormat, Format
from memprobe.result import Result, read_json


def report(
    results: Annotated[list[Path], typer.Argument(
        help="JSON results written by --format json, `memprobe baseline` or `memprobe fit --format "
             "json`. Several comparison results render as one: rows of the same configuration "
             "share a table.", metavar="RESULT")],
    format: o.FormatOpt = Format.MARKDOWN,
    output: o.Output = None,
    chart: o.Chart = None,
    host_ram: o.HostRam = None,
    devices_per_host: o.DevicesPerHost = None,
) -> int:
    """Re-render saved results (table, markdown, json, csv, html) without recompiling, several
    merged into one; with --host-ram, judge offload rows against a host's RAM too. A `fit`
    result renders on its own, as table, markdown or json."""
    ram = parse_host_ram(host_ram, devices_per_host)
    loaded_files = []
    for path in results:
        data = read_json(path)
        if isinstance(data, dict) and data.get("schema") == "memprobe.fit":
            if len(results) > 1:
                raise BadInput(f"{path}: a fit result renders on its own, not merged with other results")
            return _fit_report(data, path, format, output, chart, ram)
        loaded_files.append((str(path), Result.from_json(data, str(path))))
    loaded = Result.merge(loaded_files)
    if ram is not None:
        loaded = dataclasses.replace(loaded, measurements=with_host_ram(loaded.measurements, ram,
                                                                        devices_per_host))
    check_writable(output)
    check_writable(chart, "--chart")
    write_result(loaded, format, output, chart)
    return 0


def _fit_report(data: dict, path: Path, format: Format, output: Path | None, chart: Path | None,
                ram: int | None) -> int:
    from memprobe.search import FitResult
    from memprobe.render.fit import render

    if format.value not in {f.value for f in FitFormat}:
        raise BadInput(f"{path}: a fit result renders as table, markdown or json, not {format.value}")
    if chart is not None or ram is not None:
        raise BadInput(f"{path}: --chart and --host-ram apply to comparisons, not to a fit result")
    fit = FitResult.from_json(data, str(path))
    check_writable(output)
    with output_file(output) as f:
        render(fit, FitFormat(format.value), f)
    return 0
