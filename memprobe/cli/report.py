"""`memprobe report`: render a saved JSON result in any format, without compiling."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from memprobe.cli import _options as o
from memprobe.cli._output import check_writable, output_file, write_result
from memprobe.errors import BadInput
from memprobe.measure import with_host_ram
from memprobe.render import FitFormat, Format
from memprobe.result import Result, read_json


def report(
    result: Annotated[Path, typer.Argument(help="A JSON result written by --format json, `memprobe "
                                           "baseline` or `memprobe fit --format json`.")],
    format: o.FormatOpt = Format.MARKDOWN,
    output: o.Output = None,
    chart: o.Chart = None,
    host_ram: o.HostRam = None,
    devices_per_host: o.DevicesPerHost = None,
) -> int:
    """Re-render a saved result (table, markdown, json, csv, html) without recompiling;
    with --host-ram, judge its offload rows against a host's RAM too. A `fit` result renders
    as table, markdown or json."""
    ram = o.host_ram_option(host_ram, devices_per_host)
    data = read_json(result)
    if isinstance(data, dict) and data.get("schema") == "memprobe.fit":
        return _fit_report(data, result, format, output, chart, ram)
    loaded = Result.from_json(data, str(result))
    if ram is not None:
        loaded = dataclasses.replace(loaded, measurements=with_host_ram(loaded.measurements, ram,
                                                                        devices_per_host))
    check_writable(output)
    check_writable(chart, "--chart")
    write_result(loaded, format, output, chart)
    return 0


def _fit_report(data: dict, path: Path, format: Format, output: Path | None, chart: Path | None,
                ram: int | None) -> int:
    from memprobe.fit import FitResult
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
