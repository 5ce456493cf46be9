"""`memprobe report`: render a saved JSON result in any format, without compiling."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from memprobe.cli import _options as o
from memprobe.cli._output import (STDOUT, chart_format, check_chart, check_writable, output_file, output_format,
                                  write_bytes, write_result)
from memprobe.errors import BadInput
from memprobe.gate import CHECK_SCHEMA, verdicts_from_json
from memprobe.measure import parse_host_ram, with_host_ram
from memprobe.liveness import EXPLAIN_SCHEMA
from memprobe.render import DEFAULT_TOP, CheckFormat, ExplainFormat, FitFormat, Format, check_top
from memprobe.result import SCHEMA, Result, read_json
from memprobe.search import FIT_SCHEMA, FITS_SCHEMA, FitResult, fits_from_json, merge_fits


def report(
    results: Annotated[list[Path], typer.Argument(
        help="JSON results written by --format json, `memprobe baseline`, or `memprobe fit`, "
             "`memprobe explain` or `memprobe check` with --format json. Several comparison results "
             "render as one: rows of the same configuration share a table; several fit results as one sweep.",
        metavar="RESULT")],
    format: o.ReportFormatOpt = None,
    output: o.Output = None,
    chart: o.Chart = None,
    host_ram: o.HostRam = None,
    devices_per_host: o.DevicesPerHost = None,
    top: Annotated[int | None, typer.Option(
        "--top", help="For an `explain` result: buffers (or diff groups) to list; the rest are "
                      f"summed. [default: {DEFAULT_TOP}]")] = None,
) -> int:
    """Re-render saved results (table, markdown, json, csv, html) without recompiling, several
    merged into one; with --host-ram, judge offload rows against a host's RAM too. A `fit`
    result renders as table, markdown or json, several of one setting at different lengths as
    one sweep; an `explain` result, or `check`'s verdicts, render on their own."""
    ram = parse_host_ram(host_ram, devices_per_host)
    given, format = format, output_format(format, output, Format, Format.MARKDOWN)
    # A fit or explain result has fewer formats; one it lacks, not given, came from the suffix.
    chosen = "" if given is not None or format is Format.MARKDOWN else \
        f" (from --output's {output.suffix} suffix; give --format)"
    if format is not Format.JSON and output not in (None, STDOUT) and any(
            output.resolve() == path.resolve() for path in results):
        raise BadInput(f"--output {output} is a result being read: its {format.value} would replace the JSON; "
                       "name another file")
    loaded_files, fits = [], []
    for path in results:
        data = read_json(path)
        if isinstance(data, dict) and data.get("schema") in (FIT_SCHEMA, FITS_SCHEMA):
            fits.append((str(path), fits_from_json(data, str(path))))
            continue
        if isinstance(data, dict) and data.get("schema") == EXPLAIN_SCHEMA:
            if len(results) > 1:
                raise BadInput(f"{path}: an explain result renders on its own, not merged with other results")
            return _explain_report(data, path, format, chosen, output, chart, ram,
                                   DEFAULT_TOP if top is None else top)
        if isinstance(data, dict) and data.get("schema") == CHECK_SCHEMA:
            if len(results) > 1:
                raise BadInput(f"{path}: check's verdicts render on their own, not merged with other results")
            return _check_report(data, path, format, chosen, output, chart, ram, top)
        if isinstance(data, dict) and data.get("schema") != SCHEMA:
            found = f"schema {data['schema']!r}" if "schema" in data else 'no "schema" field'
            raise BadInput(f"{path}: memprobe report cannot render this ({found}; it renders {SCHEMA!r}, "
                           f"{FIT_SCHEMA!r}, {FITS_SCHEMA!r}, {EXPLAIN_SCHEMA!r} and {CHECK_SCHEMA!r})")
        if top is not None:
            raise BadInput(f"{path}: --top applies to an explain result, not to a comparison")
        loaded_files.append((str(path), Result.from_json(data, str(path))))
    if fits:
        if loaded_files:
            raise BadInput(f"{fits[0][0]}: a fit result renders on its own or with other fit results, not merged "
                           "with a comparison")
        return _fit_report(merge_fits(fits), fits[0][0], format, chosen, output, chart, ram, top)
    loaded = Result.merge(loaded_files)
    if ram is not None:
        loaded = dataclasses.replace(loaded, measurements=with_host_ram(loaded.measurements, ram,
                                                                        devices_per_host))
    check_writable(output)
    check_chart(chart, output)
    write_result(loaded, format, output, chart)
    return 0


def _fit_report(fits: list[FitResult], path: str, format: Format, chosen: str, output: Path | None,
                chart: Path | None, ram: int | None, top: int | None) -> int:
    """Fit results (one, or the lengths of a sweep) as `memprobe fit` printed them."""
    from memprobe.render.fit import render_fits

    if format.value not in {f.value for f in FitFormat}:
        raise BadInput(f"{path}: a fit result renders as table, markdown or json, not {format.value}{chosen}")
    if chart is not None or ram is not None:
        raise BadInput(f"{path}: --chart and --host-ram apply to comparisons, not to a fit result")
    if top is not None:
        raise BadInput(f"{path}: --top applies to an explain result, not to a fit result")
    check_writable(output)
    with output_file(output) as f:
        render_fits(fits, FitFormat(format.value), f)
    return 0


def _check_report(data: dict, path: Path, format: Format, chosen: str, output: Path | None,
                  chart: Path | None, ram: int | None, top: int | None) -> int:
    """Check's saved verdicts as `memprobe check` printed them. The exit code is the
    rendering's (0), not the gate's: the verdicts were judged when check ran."""
    from memprobe.render import check as r  # pandas, only for verdicts

    if format.value not in {f.value for f in CheckFormat}:
        raise BadInput(f"{path}: check's verdicts render as table, markdown or json, not {format.value}{chosen}")
    for given, option in ((chart, "--chart"), (ram, "--host-ram"), (top, "--top")):
        if given is not None:
            raise BadInput(f"{path}: {option} does not apply to check's verdicts")
    data = verdicts_from_json(data, str(path))
    check_writable(output)
    with output_file(output) as f:
        r.write(data, format.value, f)
    return 0


def _explain_report(data: dict, path: Path, format: Format, chosen: str, output: Path | None,
                    chart: Path | None, ram: int | None, top: int) -> int:
    """An explain answer as `memprobe explain` printed it; --chart draws its heap curve."""
    from memprobe.render import explain as r  # pandas, only for an explain answer

    if format.value not in {f.value for f in ExplainFormat}:
        raise BadInput(f"{path}: an explain result renders as table, markdown or json, not {format.value}{chosen}")
    if ram is not None:
        raise BadInput(f"{path}: --host-ram applies to comparisons, not to an explain result")
    check_top(top)
    answer = r.from_json(data, str(path))
    check_writable(output)
    check_chart(chart, output)
    if chart is not None:
        if not answer.explained:
            raise BadInput(f"{path}: --chart: no strategy here was explained, so there is no curve to draw")
        write_bytes(chart, r.curve_chart(answer, chart_format(chart)))
    with output_file(output) as f:
        r.write(answer, format.value, f, top)
    return 0
