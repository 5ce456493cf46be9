"""A chart (PNG, SVG or PDF) of one comparison: per strategy, a stacked bar of the peak's
parts, with the device's HBM capacity as a horizontal line; and of a sweep, each strategy's
peak as a line across the shapes, with the same capacity line.

Parts, bottom to top: arguments (parameters, optimizer state, the batch), outputs not
aliased to an argument, temporaries (activations, gradients, everything else the step
holds), then host-offloaded bytes, hatched, because they are in host memory and not part
of the HBM peak. The first three add up to the peak memprobe ranks by. A program the TPU
compiler refused over HBM has no parts, only the total it needed: one grey bar, after the
others.
"""

from __future__ import annotations

import io
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402

from memprobe.measure import GIB, Measurement  # noqa: E402
from memprobe.render.frame import Sweep, title  # noqa: E402

plt.rcParams["svg.hashsalt"] = "memprobe"  # an SVG's element ids the same on every save
plt.rcParams["svg.fonttype"] = "none"  # its words kept as text: searchable, and under half the size

#: The save date is left out of each format, so that the same chart saves to the same bytes.
_NO_DATE = {"png": {}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}


def save(fig, fmt: str) -> bytes:
    """``fig`` as the bytes of a ``fmt`` file (png, svg or pdf), then closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, metadata=_NO_DATE[fmt])
    plt.close(fig)
    return buf.getvalue()


# Fixed axes placement, so a reader (and the tests) can find the bars in the image.
AXES = {"left": 0.12, "right": 0.97, "bottom": 0.22, "top": 0.90}
PARTS = (
    ("arguments (params, optimizer state, batch)", "#4c72b0"),
    ("outputs not aliased", "#8172b2"),
    ("temporaries (activations, gradients)", "#dd8452"),
    ("host-offloaded (not HBM)", "#55a868"),
)
REFUSED = ("refused over HBM (the compiler's total, no breakdown)", "#9a9a9a")


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


def render_chart(measurements: list[Measurement], fmt: str = "png") -> bytes:
    """The chart as the bytes of a ``fmt`` file (png, svg or pdf); one bar per strategy that
    compiled, lowest peak first, then those the TPU compiler refused over HBM."""
    ok = sorted((m for m in measurements if m.ok), key=lambda m: m.peak_bytes)
    refused = sorted((m for m in measurements if m.refused), key=lambda m: m.needed_bytes)
    width_in = max(6.0, 1.1 * (len(ok) + len(refused)) + 2.5)
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
    if refused:
        ax.bar([m.strategy for m in refused], [m.needed_bytes / GIB for m in refused], color=REFUSED[1],
               label=REFUSED[0], width=0.6, linewidth=0)
        for i, m in enumerate(refused, start=len(ok)):
            ax.annotate(f"{m.needed_bytes / GIB:.2f}\nrefused", (i, m.needed_bytes / GIB), ha="center",
                        va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    shown = ok + refused
    cap = shown[0].capacity_bytes if shown else None
    top = max([(m.peak_bytes + m.host_bytes) / GIB for m in ok] + [m.needed_bytes / GIB for m in refused],
              default=0.0)
    if cap and cap / GIB <= 3 * top:
        ax.axhline(cap / GIB, color="#c44e52", linestyle="--", linewidth=1.2,
                   label=f"HBM per device {cap / GIB:.2f} GiB")
    elif cap:  # a line far above the bars would flatten them: name it instead
        ax.plot([], [], color="#c44e52", linestyle="--", label=f"HBM per device {cap / GIB:.2f} GiB (off scale)")
    # Headroom above the tallest bar for the legend (a line more with a refused bar).
    ax.set_ylim(0, max(top, cap / GIB if cap and cap / GIB <= 3 * top else 0.0) * (1.6 if refused else 1.45) or 1.0)
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
    return save(fig, fmt)


#: The sweep chart's y axis runs from 0 to this much above the highest peak (or capacity).
SWEEP_HEADROOM = 1.15


def render_sweep_chart(sw: Sweep, fmt: str = "png") -> bytes:
    """A sweep as the bytes of a ``fmt`` file: a line per strategy through its peaks at each
    shape (broken where it was not compiled or failed, a lone point marked), shapes in the
    order of the sweep table, the HBM capacity as a dashed line: where each strategy's line
    crosses it is where it stops fitting. Across targets, points without lines (targets are
    no scale to draw a line along), and each target's capacity as a dash of its own."""
    labels = list(sw.peaks.columns)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(labels) + 4.0), 5.0), dpi=100)
    fig.subplots_adjust(**{**AXES, "right": 0.72})  # the legend to the right of the lines
    colours = plt.get_cmap("tab20").colors  # eleven built-in strategies: more than ten colours
    markers = "osD^v<>ph*X"
    across = sw.axis == "target"
    n = len(sw.peaks.index)
    for k, (strategy, peaks) in enumerate(sw.peaks.iterrows()):
        # Across targets each strategy's points sit side by side within the target's dash.
        shift = 0.5 * (k + 0.5) / n - 0.25 if across else 0.0
        # NaN (not compiled at that shape, or failed) breaks the line rather than bridging it.
        ax.plot([x + shift for x in range(len(labels))], list(peaks), marker=markers[k % len(markers)],
                markersize=6 if across else 4, linewidth=0 if across else 1.4,
                color=colours[(2 * k) % 20 + (k // 10) % 2], label=str(strategy))
    caps = [c / GIB if c else None for c in sw.capacities.values()]
    peaks = sw.peaks.stack().dropna()  # every compile failed: no peak, and no NaN for the axis
    top = max(float(peaks.max()) if len(peaks) else 0.0, *(c or 0.0 for c in caps))
    if across:
        label = "HBM per device"  # in the legend once
        for x, cap in enumerate(caps):
            if cap:
                ax.hlines(cap, x - 0.3, x + 0.3, color="#c44e52", linestyle="--", linewidth=1.2, label=label)
                label = None
    elif caps[0]:
        ax.axhline(caps[0], color="#c44e52", linestyle="--", linewidth=1.2, label=f"HBM per device {caps[0]:.2f} GiB")
    ax.set_ylim(0, top * SWEEP_HEADROOM or 1.0)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlim(-0.5 if across else -0.3, len(labels) - (0.5 if across else 0.7))
    ax.set_ylabel("peak GiB per device (compiler estimate)")
    text, size = fitted_title(sw.title, 0.92 * fig.get_size_inches()[0], 9)
    fig.suptitle(text, fontsize=size)  # over the whole figure: the axes leave room for the legend
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), framealpha=0.9)
    ax.spines[["top", "right"]].set_visible(False)
    return save(fig, fmt)
