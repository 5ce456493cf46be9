"""`memprobe report`: render a saved JSON result in any format, without compiling."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from memprobe.cli import _options as o
from memprobe.cli._output import check_writable, write_result
from memprobe.measure import with_host_ram
from memprobe.render import Format
from memprobe.result import Result


def report(
    result: Annotated[Path, typer.Argument(help="A JSON result written by --format json or `memprobe baseline`.")],
    format: o.FormatOpt = Format.MARKDOWN,
    output: o.Output = None,
    chart: o.Chart = None,
    host_ram: o.HostRam = None,
    devices_per_host: o.DevicesPerHost = None,
) -> int:
    """Re-render a saved result (table, markdown, json, csv, html) without recompiling;
    with --host-ram, judge its offload rows against a host's RAM too."""
    ram = o.host_ram_option(host_ram, devices_per_host)
    loaded = Result.load(result)
    if ram is not None:
        loaded = dataclasses.replace(loaded, measurements=with_host_ram(loaded.measurements, ram,
                                                                        devices_per_host))
    check_writable(output)
    check_writable(chart, "--chart")
    write_result(loaded, format, output, chart)
    return 0
