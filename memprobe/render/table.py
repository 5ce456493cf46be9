"""The terminal table: a rich rendering of the comparison frame."""

from __future__ import annotations

import math
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memprobe.flags import OVER_CAPACITY, sanity_flags
from memprobe.measure import GIB, Measurement
from memprobe.render.frame import comparison_frame

PEAK_FORMULA = "peak = argument + output - alias + temp, per device (compiler estimate)"
FLOPS_NOTE = ("FLOPs: XLA cost analysis of the compiled step, relative to the first strategy. It "
              "counts each while-loop body once, and the TPU compiler moves different amounts of "
              "work into loops per strategy, so the ratio tracks recompute on small models but "
              "can fall below 1 at full size: read it with the while-loop counts in the JSON.")


def _num(value, fmt: str = "{:.2f}", signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return (("+" if value > 0 else "") if signed else "") + fmt.format(value)


def _fits(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return "[green]fits[/]" if value else "[bold red]over capacity[/]"


def title(m: Measurement) -> str:
    where = f"{m.topology or m.target}, {m.num_devices} device{'s' if m.num_devices > 1 else ''}"
    return (f"{m.model} {m.step} step, seq {m.seq_len} x per-device batch {m.batch_per_device} "
            f"on {where}")


def caption(measurements: list[Measurement]) -> str:
    m = measurements[0]
    lines = [f"{x.strategy} failed: {x.error}" for x in measurements if not x.ok]
    lines += [f"flag on {f}" for fl in sanity_flags(measurements).values() for f in fl]
    lines += [f"GiB = 2^30 bytes; {PEAK_FORMULA}.", FLOPS_NOTE]
    if m.capacity_bytes:
        lines.append(f"HBM per device: {m.capacity_bytes / GIB:.2f} GiB, as the TPU compiler enforces it.")
    if not m.stands_for_accelerator:
        lines.append("CPU backend figures: they do not stand for any accelerator.")
    v = m.versions
    lines.append("jax " + v.get("jax", "?") + ", jaxlib " + v.get("jaxlib", "?")
                 + (f", libtpu {v['libtpu']}" if "libtpu" in v and m.platform == "tpu" else "")
                 + f"; loss in {m.loss_chunks} chunk(s).")
    return "\n".join(lines)


def other_flags(flags: str) -> str:
    """The flags column: the verdict column already says "over capacity"."""
    return ", ".join(f for f in flags.split(", ") if f and f != OVER_CAPACITY)


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
    t.add_column("flags", style="yellow")  # over capacity is the verdict column's
    for row in df.itertuples(index=False):
        if isinstance(row.error, str):
            t.add_row("-", row.strategy, "-", "-", "-", "-", "-", "-", "-", "-",
                      "[bold red]failed[/]", "-", "")
            continue
        t.add_row(
            str(row.rank), row.strategy, _num(row.peak_gib), _num(row.pct_of_hbm, "{:.0f}%"),
            _num(row.delta_gib, signed=True), _num(row.temp_gib), _num(row.argument_gib),
            _num(row.host_gib), _num(row.xla_peak_gib), _num(row.flops_ratio, "{:.2f}x"), _fits(row.fits),
            "cached" if row.cached else _num(row.compile_s, "{:.0f}"), escape(other_flags(row.flags)),
        )
    return t


def terminal_width(file: IO[str]) -> int:
    """The terminal's width; 160 columns when writing to a pipe or file, so rows stay whole."""
    return Console(file=file).width if getattr(file, "isatty", lambda: False)() else 160


def render(measurements: list[Measurement], file: IO[str], *, width: int | None = None) -> None:
    """Writes the ranked comparison table to ``file``."""
    console = Console(file=file, width=width or terminal_width(file), soft_wrap=False)
    console.print(build_table(measurements))

