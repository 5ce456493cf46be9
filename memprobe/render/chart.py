"""A PNG chart of one comparison: per strategy, a stacked bar of the peak's parts, with the
device's HBM capacity as a horizontal line.

Parts, bottom to top: arguments (parameters, optimizer state, the batch), outputs not
aliased to an argument, temporaries (activations, gradients, everything else the step
holds), then host-offloaded bytes, hatched, because they are in host memory and not part
of the HBM peak. The first three add up to the peak memprobe ranks by.
"""

from __future__ import annotations

import io
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402

from memprobe.measure import GIB, Measurement  # noqa: E402
from memprobe.render.frame import title  # noqa: E402

# Fixed axes placement, so a reader (and the tests) can find the bars in the image.
AXES = {"left": 0.12, "right": 0.97, "bottom": 0.22, "top": 0.90}
PARTS = (
    ("arguments (params, optimizer state, batch)", "#4c72b0"),
    ("outputs not aliased", "#8172b2"),
    ("temporaries (activations, gradients)", "#dd8452"),
    ("host-offloaded (not HBM)", "#55a868"),
)


def fitted_title(text: str, width_in: float, fontsize: float, max_lines: int = 2) -> tuple[str, float]:
    """``text`` broken into lines no wider than ``width_in`` inches, and the font size that
    keeps it to ``max_lines`` (down to 7 pt): a title naming the step's recipe and its
    accumulation ran past both sides of a six-inch chart and was cut off."""
    while True:
        chars = int(width_in * 72 / (0.55 * fontsize))  # points across over an average glyph's width
        lines = textwrap.wrap(text, chars, break_on_hyphens=False)
        if len(lines) <= max_lines or fontsize <= 7:
            return "\n".join(lines), fontsize
        fontsize -= 1


def _parts(m: Measurement) -> list[float]:
    return [m.argument_bytes / GIB, (m.output_bytes - m.alias_bytes) / GIB, m.temp_bytes / GIB,
            m.host_bytes / GIB]


def render_png(measurements: list[Measurement]) -> bytes:
    """The chart as PNG bytes; one bar per strategy that compiled, lowest peak first."""
    ok = sorted((m for m in measurements if m.ok), key=lambda m: m.peak_bytes)
    width_in = max(6.0, 1.1 * len(ok) + 2.5)
    fig, ax = plt.subplots(figsize=(width_in, 5.0), dpi=100)
    fig.subplots_adjust(**AXES)
    names = [m.strategy for m in ok]
    bottoms = [0.0] * len(ok)
    for k, (label, colour) in enumerate(PARTS):
        values = [_parts(m)[k] for m in ok]
        ax.bar(names, values, bottom=bottoms, color=colour, label=label, width=0.6, linewidth=0,
               hatch="//" if k == 3 else None, edgecolor="white" if k == 3 else None)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for i, m in enumerate(ok):  # the HBM peak, written above the whole stack
        label = f"{m.peak_bytes / GIB:.2f}" + (f"\n+{m.host_bytes / GIB:.2f} host" if m.host_bytes else "")
        ax.annotate(label, (i, (m.peak_bytes + m.host_bytes) / GIB), ha="center", va="bottom",
                    fontsize=8, xytext=(0, 2), textcoords="offset points")
    cap = ok[0].capacity_bytes if ok else None
    top = max((m.peak_bytes + m.host_bytes) / GIB for m in ok) if ok else 0.0
    if cap and cap / GIB <= 3 * top:
        ax.axhline(cap / GIB, color="#c44e52", linestyle="--", linewidth=1.2,
                   label=f"HBM per device {cap / GIB:.2f} GiB")
    elif cap:  # a line far above the bars would flatten them: name it instead
        ax.plot([], [], color="#c44e52", linestyle="--", label=f"HBM per device {cap / GIB:.2f} GiB (off scale)")
    # Headroom above the tallest bar for the legend.
    ax.set_ylim(0, max(top, cap / GIB if cap and cap / GIB <= 3 * top else 0.0) * 1.45 or 1.0)
    ax.set_ylabel("GiB per device (compiler estimate)")
    # Centred near the figure's middle, a title may span most of the figure, not only the axes;
    # two lines still fit above them.
    text, size = fitted_title(title(measurements[0]), 0.92 * width_in, 9)
    ax.set_title(text, fontsize=size)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    for lbl in ax.get_xticklabels():
        lbl.set_horizontalalignment("right")
    ax.legend(fontsize=7, loc="upper right", framealpha=0.9)
    ax.spines[["top", "right"]].set_visible(False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
