"""Markdown for a pull request or design doc: the ranked table (pandas), the flags, the best
strategy called out, and a footer with versions and the exact command."""

from __future__ import annotations

from typing import IO

import pandas as pd

from memprobe.flags import sanity_flags
from memprobe.measure import Measurement
from memprobe.render.frame import Sweep, answer, comparison_frame, fmt, footnotes, pct, sweeps, title
from memprobe.result import Result


def markdown_frame(measurements: list[Measurement]) -> pd.DataFrame:
    """The comparison frame with display columns, formatted as strings."""
    df = comparison_frame(measurements)
    base = measurements[0].strategy
    out = pd.DataFrame({
        "#": [fmt(r, "d") for r in df["rank"]],
        "strategy": df["strategy"],
        "peak GiB": [fmt(v) for v in df["peak_gib"]],
        "peak bytes": [fmt(v, ",.0f") for v in df["peak_bytes"]],
        "% HBM": [pct(v) for v in df["pct_of_hbm"]],
        f"vs {base} GiB": [fmt(v, "+.2f") for v in df["delta_gib"]],
        "temp GiB": [fmt(v) for v in df["temp_gib"]],
        "args GiB": [fmt(v) for v in df["argument_gib"]],
        "host GiB": [fmt(v) for v in df["host_gib"]],
        "XLA peak GiB": [fmt(v) for v in df["xla_peak_gib"]],
        f"FLOPs vs {base}": [fmt(v, ".2f", "x") for v in df["flops_ratio"]],
        "verdict": [_verdict(v, e) for v, e in zip(df["verdict"], df["error"])],
        "flags": df["other_flags"],
        "compile s": [fmt(v, ".0f") for v in df["compile_s"]],
    })
    return out


def _verdict(value, error) -> str:
    if isinstance(error, str):
        return f"failed: {error}"
    if not isinstance(value, str):
        return "-"
    return "fits" if value == "fits" else f"**{value}**"


def sweep_frame(sw: Sweep) -> pd.DataFrame:
    """A sweep's peaks as display strings: a row per strategy, a column per shape (or target);
    a cell over capacity in bold, saying what it is over."""
    out = pd.DataFrame({"strategy": sw.peaks.index})
    for label in sw.peaks.columns:
        cells = [sw.cell(strategy, label, ".2f") for strategy in sw.peaks.index]
        out[label] = [f"**{text}**" if marked else text for text, marked in cells]
    return out


def render(result: Result, file: IO[str]) -> None:
    groups = result.comparisons
    for sw in sweeps(groups):  # the sweeps first: one table to read (one per target), the detail below
        file.write(f"## {sw.title}\n\n")
        frame = sweep_frame(sw)
        file.write(frame.to_markdown(index=False, disable_numparse=True,
                                     colalign=["left"] + ["right"] * (len(frame.columns) - 1)))
        file.write("\n\n" + "".join(f"- {line}\n" for line in sw.notes()) + "\n")
    for group in groups:
        file.write(f"## {title(group[0])}\n\n")
        frame = markdown_frame(group)
        align = ["left" if c in ("strategy", "verdict", "flags") else "right" for c in frame.columns]
        file.write(frame.to_markdown(index=False, disable_numparse=True, colalign=align))
        file.write("\n\n")
        a = answer(group)
        if a is not None:
            file.write(f"**{a.label}: `{a.strategy}`**{a.rest}\n\n")
        flags = [f for fl in sanity_flags(group).values() for f in fl]
        if flags:
            file.write("Flags:\n\n" + "".join(f"- `{f.strategy}`: **{f.kind}**: {f.reason}\n" for f in flags)
                       + "\n")
        failed = [m for m in group if not m.answered]
        if failed:
            file.write("Failed:\n\n" + "".join(f"- `{m.strategy}`: {m.error}\n" for m in failed) + "\n")
        file.write("---\n\n" + "".join(f"- {n}\n" for n in footnotes(group, result.command)) + "\n")
