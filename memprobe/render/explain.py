"""`memprobe explain` output: the buffers live at the peak, a two-strategy diff, the heap curve.

Every format is built from the same frames (``buffers_frame``, ``diff_frame``); the chart
draws the sampled heap curve with the peak marked.
"""

from __future__ import annotations

import io
from typing import IO, Any

import pandas as pd

from memprobe.explain import Explanation
from memprobe.measure import GIB, Measurement
from memprobe.render.frame import fmt, title, versions_line

MIB = 1024**2


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / MIB:.2f} MiB"


def buffers_frame(m: Measurement, e: Explanation, top: int) -> tuple[pd.DataFrame, str]:
    """The ``top`` largest buffers live at the peak, and a line for the rest."""
    rows = [{"#": i + 1, "size": _size(b.bytes), "bytes": f"{b.bytes:,}",
             "% of peak": fmt(100 * b.bytes / m.peak_bytes, ".1f", "%"), "shape": b.shape or "?",
             "what": b.label, "layer": "-" if b.layer is None else str(b.layer), "HLO value": b.value}
            for i, b in enumerate(e.buffers[:top])]
    rest = e.buffers[top:]
    rest_bytes = sum(b.bytes for b in rest)
    more = f"{len(rest)} more buffers, {_size(rest_bytes)} ({rest_bytes:,} bytes)" if rest else ""
    return pd.DataFrame(rows), more


def explain_notes(m: Measurement, e: Explanation, command: str | None = None) -> list[str]:
    out = [f"Peak (compiler estimate, per device): {m.peak_bytes / GIB:.2f} GiB ({m.peak_bytes:,} bytes) = "
           f"argument + output - alias + temp.",
           f"The compiler's live ranges put its heap peak at instruction {e.peak_time} of "
           f"{e.program_length}, with {len(e.buffers)} buffers live: {e.peak_live_bytes / GIB:.2f} GiB "
           f"({e.peak_live_bytes:,} bytes). The rest of the peak is memory its heap listing does not "
           "cover (padding between buffers, other memory spaces, scratch).",
           "what: forward/backward work (from the JAX op name: jvp/transpose), the model tensor scope "
           "(mlp_hidden, query_proj, ...) and the operation; parameter/optimizer state rows name the "
           "argument. Buffers whose instruction has no op name take their source's."]
    out.append(versions_line(m))
    if command:
        out.append(f"Command: `{command}`")
    return out


def diff_frame(rows: list[dict[str, Any]], a: str, b: str, top: int) -> tuple[pd.DataFrame, str]:
    shown = [{"#": i + 1, f"{b} - {a}": ("+" if r["delta_bytes"] > 0 else "-") + _size(abs(r["delta_bytes"])),
              "bytes": f"{r['delta_bytes']:+,}", "what": r["label"], "shape": r["shape"] or "?",
              f"count {a}": r["a_count"], f"count {b}": r["b_count"]}
             for i, r in enumerate(rows[:top])]
    rest = rows[top:]
    rest_bytes = sum(r["delta_bytes"] for r in rest)
    more = (f"{len(rest)} more groups, {'+' if rest_bytes > 0 else '-'}{_size(abs(rest_bytes))} "
            f"({rest_bytes:+,} bytes)") if rest else ""
    return pd.DataFrame(shown), more


def diff_heading(a: Measurement, b: Measurement) -> str:
    return f"{b.strategy} vs {a.strategy} at the peak: {title(a)}"


def diff_notes(a: Measurement, b: Measurement, command: str | None = None) -> list[str]:
    gap = b.peak_bytes - a.peak_bytes
    out = [f"Peak {b.strategy} - {a.strategy}: {gap / GIB:+.2f} GiB ({gap:+,} bytes), compiler estimates "
           "per device.",
           "Rows: buffers live at each strategy's peak, grouped by what they are and their shape, "
           "largest difference first.", versions_line(a)]
    if command:
        out.append(f"Command: `{command}`")
    return out


def render_table(frame: pd.DataFrame, heading: str, more: str, notes: list[str], file: IO[str],
                 width: int) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=heading, caption=escape("\n".join(([more] if more else []) + notes)), caption_justify="left")
    for col in frame.columns:
        t.add_column(str(col), justify="left" if col in ("shape", "what", "HLO value") else "right",
                     no_wrap=col in ("shape", "HLO value"))
    for row in frame.itertuples(index=False):
        t.add_row(*(escape(str(v)) for v in row))
    Console(file=file, width=width, soft_wrap=False).print(t)


def render_markdown(frame: pd.DataFrame, heading: str, more: str, notes: list[str], file: IO[str]) -> None:
    file.write(f"## {heading}\n\n")
    file.write(frame.to_markdown(index=False, disable_numparse=True) if len(frame) else "(nothing)")
    file.write("\n\n" + (f"{more}\n\n" if more else "") + "---\n\n" + "".join(f"- {n}\n" for n in notes) + "\n")


def heading(m: Measurement) -> str:
    return f"Live at the peak: {m.strategy}, {title(m)}"


def curve_png(series: list[tuple[Measurement, Explanation]]) -> bytes:
    """Bytes live over program order, one line per strategy, each peak marked."""
    from memprobe.render.chart import plt  # matplotlib, set up for files only

    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=110)
    for m, e in series:
        xs = [t / max(1, e.program_length) for t, _ in e.curve]
        line, = ax.plot(xs, [v / GIB for _, v in e.curve], label=f"{m.strategy} (peak {m.peak_bytes / GIB:.2f} GiB)")
        px = e.peak_time / max(1, e.program_length)
        ax.axvline(px, color=line.get_color(), linestyle=":", linewidth=1)
        ax.annotate(f"peak: {e.peak_live_bytes / GIB:.2f} GiB live", (px, e.peak_live_bytes / GIB),
                    textcoords="offset points", xytext=(4, 4), fontsize=8, color=line.get_color())
    ax.set_xlabel("program order (fraction of the scheduled instruction sequence)")
    ax.set_ylabel("GiB live (compiler's live ranges)")
    ax.set_title(title(series[0][0]), fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
