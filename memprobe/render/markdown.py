"""Markdown for a pull request or design doc: the ranked table (pandas), the flags, the best
strategy called out, and a footer with versions and the exact command."""

from __future__ import annotations

from typing import IO

import pandas as pd

from memprobe.flags import sanity_flags
from memprobe.measure import GIB, Measurement
from memprobe.render.frame import comparison_frame
from memprobe.render.table import FLOPS_NOTE, PEAK_FORMULA, other_flags, title
from memprobe.result import Result


def _fmt(value, spec: str) -> str:
    return "-" if value is None or pd.isna(value) else format(value, spec)


def markdown_frame(measurements: list[Measurement]) -> pd.DataFrame:
    """The comparison frame with display columns, formatted as strings."""
    df = comparison_frame(measurements)
    base = measurements[0].strategy
    out = pd.DataFrame({
        "#": [_fmt(r, "d") if not pd.isna(r) else "-" for r in df["rank"]],
        "strategy": df["strategy"],
        "peak GiB": [_fmt(v, ".2f") for v in df["peak_gib"]],
        "peak bytes": [_fmt(v, ",.0f") for v in df["peak_bytes"]],
        "% HBM": [_fmt(v, ".0f") + ("%" if not pd.isna(v) else "") for v in df["pct_of_hbm"]],
        f"vs {base} GiB": [_fmt(v, "+.2f") for v in df["delta_gib"]],
        "temp GiB": [_fmt(v, ".2f") for v in df["temp_gib"]],
        "args GiB": [_fmt(v, ".2f") for v in df["argument_gib"]],
        "host GiB": [_fmt(v, ".2f") for v in df["host_gib"]],
        "XLA peak GiB": [_fmt(v, ".2f") for v in df["xla_peak_gib"]],
        f"FLOPs vs {base}": [_fmt(v, ".2f") + ("x" if not pd.isna(v) else "") for v in df["flops_ratio"]],
        "verdict": [_verdict(f, e) for f, e in zip(df["fits"], df["error"])],
        "flags": [other_flags(f or "") for f in df["flags"]],
        "compile s": [_fmt(v, ".0f") for v in df["compile_s"]],
    })
    return out


def _verdict(fits, error) -> str:
    if isinstance(error, str):
        return f"failed: {error}"
    if fits is None or pd.isna(fits):
        return "-"
    return "fits" if fits else "**over capacity**"


def best(group: list[Measurement]) -> Measurement | None:
    ok = sorted((m for m in group if m.ok), key=lambda m: m.peak_bytes)
    return ok[0] if ok else None


def notes(group: list[Measurement], command: str | None) -> list[str]:
    """The footer: what the figures are, versions, the exact command."""
    m0 = group[0]
    out = [f"GiB = 2^30 bytes; {PEAK_FORMULA}.", FLOPS_NOTE,
           "compile s: trace, lower and compile of that strategy when it was measured"
           + (" (some rows answered from the results cache)." if any(m.cached for m in group) else ".")]
    if m0.capacity_bytes:
        out.append(f"HBM per device: {m0.capacity_bytes / GIB:.2f} GiB ({m0.capacity_bytes:,} bytes), "
                   "as the compiler enforces it.")
    if not m0.stands_for_accelerator:
        out.append("CPU backend figures: they do not stand for any accelerator.")
    v = m0.versions
    out.append("Versions: " + ", ".join(f"{k} {v[k]}" for k in ("memprobe", "jax", "jaxlib", "libtpu")
                                        if k in v and (k != "libtpu" or m0.platform == "tpu"))
               + f"; loss in {m0.loss_chunks} chunk(s); {m0.step} step.")
    if command:
        out.append(f"Command: `{command}`")
    return out


def render(result: Result, file: IO[str]) -> None:
    for group in result.comparisons:
        file.write(f"## {title(group[0])}\n\n")
        frame = markdown_frame(group)
        align = ["left" if c in ("strategy", "verdict", "flags") else "right" for c in frame.columns]
        file.write(frame.to_markdown(index=False, disable_numparse=True, colalign=align))
        file.write("\n\n")
        b = best(group)
        if b is not None:
            verdict = {True: "fits", False: "over capacity", None: "no capacity known"}[b.fits]
            file.write(f"**Lowest peak: `{b.strategy}`**, {b.peak_bytes / GIB:.2f} GiB "
                       f"({b.peak_bytes:,} bytes) per device; {verdict}.\n\n")
        flags = [f for fl in sanity_flags(group).values() for f in fl]
        if flags:
            file.write("Flags:\n\n" + "".join(f"- `{f.strategy}`: **{f.kind}**: {f.reason}\n" for f in flags)
                       + "\n")
        failed = [m for m in group if not m.ok]
        if failed:
            file.write("Failed:\n\n" + "".join(f"- `{m.strategy}`: {m.error}\n" for m in failed) + "\n")
        file.write("---\n\n" + "".join(f"- {n}\n" for n in notes(group, result.command)) + "\n")
