"""The terminal table: a rich rendering of the comparison frame."""

from __future__ import annotations

from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memprobe.flags import sanity_flags
from memprobe.measure import Measurement
from memprobe.render import terminal_width
from memprobe.render.frame import comparison_frame, fmt, footnotes, title


def _verdict(value) -> str:
    if not isinstance(value, str):
        return "-"
    return "[green]fits[/]" if value == "fits" else f"[bold red]{value}[/]"


def caption(measurements: list[Measurement]) -> str:
    lines = [f"{x.strategy} failed: {x.error}" for x in measurements if not x.ok]
    lines += [f"flag on {f}" for fl in sanity_flags(measurements).values() for f in fl]
    return "\n".join(lines + footnotes(measurements))


def build_table(measurements: list[Measurement]) -> Table:
    df = comparison_frame(measurements)
    base = measurements[0].strategy
    t = Table(title=title(measurements[0]), caption=escape(caption(measurements)), caption_justify="left")
    t.add_column("#", justify="right")
    t.add_column("strategy", no_wrap=True)
    t.add_column("peak GiB", justify="right", style="bold")
    t.add_column("% HBM", justify="right")
    t.add_column(f"vs {base}", justify="right")
    t.add_column("temp GiB", justify="right")
    t.add_column("args GiB", justify="right")
    t.add_column("host GiB", justify="right")
    t.add_column("XLA peak GiB", justify="right")
    t.add_column(f"FLOPs vs {base}", justify="right")
    t.add_column("verdict")
    t.add_column("compile s", justify="right")
    t.add_column("flags", style="yellow")  # over capacity or host RAM: the verdict column's
    for row in df.itertuples(index=False):
        if isinstance(row.error, str):
            t.add_row("-", row.strategy, "-", "-", "-", "-", "-", "-", "-", "-",
                      "[bold red]failed[/]", "-", "")
            continue
        t.add_row(
            str(row.rank), row.strategy, fmt(row.peak_gib), fmt(row.pct_of_hbm, ".0f", "%"),
            fmt(row.delta_gib, "+.2f"), fmt(row.temp_gib), fmt(row.argument_gib),
            fmt(row.host_gib), fmt(row.xla_peak_gib), fmt(row.flops_ratio, ".2f", "x"), _verdict(row.verdict),
            "cached" if row.cached else fmt(row.compile_s, ".0f"), escape(row.other_flags),
        )
    return t


def render(measurements: list[Measurement], file: IO[str], *, width: int | None = None) -> None:
    """Writes the ranked comparison table to ``file``."""
    console = Console(file=file, width=width or terminal_width(file), soft_wrap=False)
    console.print(build_table(measurements))

