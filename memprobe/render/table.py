"""The terminal table: a rich rendering of the comparison frame."""

from __future__ import annotations

import math
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from memprobe.flags import sanity_flags
from memprobe.measure import GIB, Measurement
from memprobe.render import terminal_width
from memprobe.render.columns import Column, fitted_table
from memprobe.render.frame import Sweep, answer, comparison_frame, fmt, footnotes, pct, title


def _verdict(value) -> str:
    if not isinstance(value, str):
        return "-"
    return "[green]fits[/]" if value == "fits" else f"[bold red]{value}[/]"


def caption(measurements: list[Measurement]) -> str:
    lines = [f"{x.strategy} failed: {x.error}" for x in measurements if not x.answered]
    lines += [f"flag on {f}" for fl in sanity_flags(measurements).values() for f in fl]
    return "\n".join(lines + footnotes(measurements))


def gib_places(measurements: list[Measurement]) -> int:
    """Decimals of the table's GiB columns: two, or as many as give the smallest peak three
    significant digits. The terminal table has no bytes column, and a tiny model's peaks of
    0.0343 and 0.0587 GiB would all read 0.03-0.06, their order unexplained."""
    peaks = [m.peak_bytes for m in measurements if m.ok and m.peak_bytes > 0]
    if not peaks:
        return 2
    return max(2, min(6, 2 - math.floor(math.log10(min(peaks) / GIB))))


def build_table(measurements: list[Measurement], width: int = 160) -> Table:
    df = comparison_frame(measurements)
    gib = f".{gib_places(measurements)}f"
    base = measurements[0].strategy
    # Left out first on a narrow terminal: what the peak is made of and how long it took;
    # the rank, strategy, peak and verdict always stay.
    columns = [
        Column("#"), Column("strategy", justify="left"), Column("peak GiB", style="bold"),
        Column("% HBM", drop=8), Column(f"vs {base}", drop=6), Column("temp GiB", drop=4),
        Column("args GiB", drop=1), Column("host GiB", drop=7), Column("XLA peak GiB", drop=2),
        Column(f"FLOPs vs {base}", drop=5), Column("verdict", justify="left", wrap=True),
        Column("compile s", drop=3),
        Column("flags", justify="left", style="yellow", wrap=True, drop=9),  # the verdict's flags left out
    ]
    cells = []
    for row in df.itertuples(index=False):
        if isinstance(row.error, str):
            cells.append(["-", escape(row.strategy), "-", "-", "-", "-", "-", "-", "-", "-",
                          "[bold red]failed[/]", "-", ""])
            continue
        cells.append([
            str(row.rank), escape(row.strategy), fmt(row.peak_gib, gib), pct(row.pct_of_hbm),
            fmt(row.delta_gib, "+" + gib), fmt(row.temp_gib, gib), fmt(row.argument_gib, gib),
            fmt(row.host_gib, gib), fmt(row.xla_peak_gib, gib), fmt(row.flops_ratio, ".2f", "x"), _verdict(row.verdict),
            "cached" if row.cached else fmt(row.compile_s, ".0f"), escape(row.other_flags),
        ])
    return fitted_table(title(measurements[0]), columns, cells, caption(measurements).split("\n"), width)


def render(measurements: list[Measurement], file: IO[str], *, width: int | None = None) -> None:
    """Writes the ranked comparison table to ``file``."""
    width = width or terminal_width(file)
    console = Console(file=file, width=width, soft_wrap=False)
    console.print(build_table(measurements, width))
    a = answer(measurements, gib_places(measurements))
    if a is not None:  # the answer, under the table where the eye lands
        console.print(Text.assemble((f"{a.label}: {a.strategy}", "bold"), a.rest))


def render_sweep(sw: Sweep, places: int, file: IO[str], *, width: int | None = None) -> None:
    """The peaks of a sweep side by side, a row per strategy and a column per shape (or
    target); a cell over capacity is red and says what it is over. On a terminal too narrow
    for every column, the last ones are left out, last first, and the caption names them: a
    peak is never cut or folded (each column also has its own table above, and markdown has
    them all)."""
    width = width or terminal_width(file)
    gib = f".{places}f"
    labels = list(sw.peaks.columns)
    columns = [Column("strategy", justify="left"),
               *(Column(label, wrap=True, drop=None if k == 0 else len(labels) - k) for k, label in enumerate(labels))]
    cells = []
    for strategy in sw.peaks.index:
        cells.append([escape(str(strategy))])
        for label in sw.peaks.columns:
            text, marked = sw.cell(strategy, label, gib)
            cells[-1].append(f"[bold red]{text}[/]" if marked else text)
    console = Console(file=file, width=width, soft_wrap=False)
    console.print(Text(sw.title, style="bold"))
    console.print(fitted_table("", columns, cells, [], width, full="--format markdown"))
    for line in sw.notes():
        console.print(Text(line))
