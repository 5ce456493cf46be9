"""`memprobe fit` output: the largest batch (or longest sequence) per strategy, as a terminal
table, markdown or JSON, all from one ``FitResult``."""

from __future__ import annotations

import json
from typing import IO

from memprobe.measure import GIB
from memprobe.render import FitFormat
from memprobe.render.frame import (PEAK_FORMULA, devices, fmt, model_note, per_microbatch, step_name, versions_line,
                                   where)
from memprobe.search import FitResult, StrategySearch


NAMES = {  # per axis: the size's column, what it amounts to, the next size's column, its flag
    "batch": ("largest batch", "global batch", "next batch", "--max-batch"),
    "seq": ("longest seq", "tokens per device", "next seq", "--max-seq"),
}


def columns(fit: FitResult) -> tuple[str, ...]:
    size, amount, nxt, _ = NAMES[fit.axis]
    host = ("host GiB", f"{nxt} over") if fit.host_ram is not None else ()
    return ("#", "strategy", size, amount, "peak GiB", "peak bytes", "% of budget", nxt, "its peak GiB",
            *host, "compiles", "note")


def _note(fit: FitResult, s: StrategySearch) -> str:
    if s.error is not None:
        return f"failed: {s.error}"
    notes = []
    if s.largest == 0:
        notes.append(f"over {' and '.join(s.over(1)).replace('HBM', 'the budget')} at {fit.axis} {s.value(1)}")
    elif s.largest >= s.max_n:
        notes.append(f"fits at the search limit ({NAMES[fit.axis][3]} {s.value(s.max_n)})")
    for n, needed in sorted(s.refused.items()):
        notes.append(f"{fit.axis} {s.value(n)} refused by the TPU compiler over HBM (it needed "
                     f"{needed / GIB:.2f} GiB, {needed:,} bytes; no peak reported)")
    if s.over_below:
        below = ", ".join(str(s.value(n)) for n in s.over_below)
        notes.append(f"over at {fit.axis} {below}, below the answer")
    for n1, n2, what in s.dips:
        values = s.peaks if what == "peak" else s.hosts
        notes.append(f"{what} falls from {fit.axis} {s.value(n1)} to {s.value(n2)} ({values[n1] / GIB:.2f} > "
                     f"{values[n2] / GIB:.2f} GiB): the search assumes it never does")
    return "; ".join(notes)


def rows(fit: FitResult) -> list[dict[str, str]]:
    """One display row per strategy, best first."""
    m = fit.measurements[0]  # one configuration: the same slice (and batch, when seq is searched) throughout
    # what one step takes at a size: every microbatch of it, on every device
    per_value = (m.num_devices if fit.axis == "batch" else m.batch_per_device) * m.grad_accum
    size, amount, nxt, _ = NAMES[fit.axis]
    out = []
    for i, s in enumerate(fit.ranked(), 1):
        peak = s.peaks.get(s.largest)
        hi = s.smallest_over
        out.append({
            "#": str(i) if s.error is None else "-",
            "strategy": s.strategy,
            size: str(s.value(s.largest)) if s.error is None else "-",
            amount: str(s.value(s.largest) * per_value) if s.largest and s.error is None else "-",
            "peak GiB": fmt(peak / GIB if peak is not None else None),
            "peak bytes": fmt(peak, ",d"),
            "% of budget": fmt(100 * peak / fit.budget if peak is not None else None, ".0f", "%"),
            nxt: str(s.value(hi)) if hi is not None else "-",
            "its peak GiB": (fmt(s.refused[hi] / GIB) + " refused" if hi in s.refused
                             else fmt(s.peaks[hi] / GIB if hi in s.peaks else None)),
            "host GiB": fmt(s.hosts[s.largest] / GIB if s.largest in s.hosts else None),
            f"{nxt} over": ", ".join(s.over(hi)) if hi is not None else "-",
            "compiles": str(s.compiles),
            "note": _note(fit, s),
        })
    return out


def title(fit: FitResult) -> str:
    m = fit.measurements[0]
    host = (f" and {fit.host_ram / GIB:.2f} GiB host RAM per host of {devices(fit.devices_per_host)}"
            if fit.host_ram is not None else "")
    micro = per_microbatch(m)
    what = (f"seq {m.seq_len}: the largest per-device batch{micro}" if fit.axis == "batch"
            else f"per-device batch {m.batch_per_device}{micro}: the longest sequence")
    return f"{m.model} {step_name(m)}, {what} within {fit.budget / GIB:.2f} GiB per device{host} on {where(m)}"


def footnotes(fit: FitResult) -> list[str]:
    m = fit.measurements[0]
    budget = (f"Budget: {fit.budget / GIB:.2f} GiB ({fit.budget:,} bytes) per device, "
              + ("the target's HBM as the compiler enforces it." if fit.budget_source == "HBM"
                 else "from --budget."))
    accum = f" x {m.grad_accum} microbatches" if m.grad_accum > 1 else ""
    if fit.axis == "batch":
        search = ("Every batch shown was compiled: the largest batch fits, the next batch is over. The search "
                  "draws the peak's line through batch 1 and 2 and compiles the batch it predicts with the one "
                  "after; compiles counts the batches each strategy needed.")
        amount, thing = f"global batch = per-device batch x devices{accum}.", "batch"
    else:
        search = (f"Every length shown was compiled: the longest fits, the next ({fit.unit} tokens, one attention "
                  f"block, longer) is over. The search draws the peak's line through seq {fit.unit} and "
                  f"{2 * fit.unit} and compiles the length it predicts with the next; compiles counts the "
                  "lengths each strategy needed.")
        amount, thing = f"tokens per device = seq x per-device batch{accum}.", "length"
    out = [f"GiB = 2^30 bytes; {PEAK_FORMULA}.", budget, search, amount]
    if fit.host_ram is not None:
        nxt = NAMES[fit.axis][2]
        out.append(f"Host RAM: {fit.host_ram / GIB:.2f} GiB ({fit.host_ram:,} bytes) per host, shared by "
                   f"{devices(fit.devices_per_host)}: a {thing} fits only if its host bytes (what offload puts in "
                   f"host memory, per device; host GiB) x {fit.devices_per_host} <= the host RAM, i.e. at most "
                   f"{fit.host_budget:,} bytes per device. {nxt} over names the limit the {nxt} broke.")
    out += model_note(m)
    if not m.stands_for_accelerator:
        out.append("CPU backend figures: they do not stand for any accelerator.")
    out.append(versions_line(m, loss=None if fit.axis == "batch" else f"loss in chunks of {fit.unit} tokens"))
    if fit.command:
        out.append(f"Command: `{fit.command}`")
    return out


def render(fit: FitResult, fmt_: FitFormat, file: IO[str], width: int | None = None) -> None:
    if fmt_ is FitFormat.JSON:
        file.write(json.dumps(fit.to_json(), indent=2) + "\n")
        return
    table = rows(fit)
    cols = columns(fit)
    left = ("strategy", f"{NAMES[fit.axis][2]} over", "note")
    if fmt_ is FitFormat.MARKDOWN:
        file.write(f"## {title(fit)}\n\n")
        file.write("| " + " | ".join(cols) + " |\n")
        file.write("|" + "|".join(":--" if c in left else "--:" for c in cols) + "|\n")
        for r in table:
            file.write("| " + " | ".join(r[c].replace("|", "\\|") for c in cols) + " |\n")
        file.write("\n---\n\n" + "".join(f"- {n}\n" for n in footnotes(fit)) + "\n")
        return
    from rich.console import Console
    from rich.markup import escape

    from memprobe.render import terminal_width
    from memprobe.render.columns import Column, fitted_table

    size, amount, nxt, _ = NAMES[fit.axis]
    # Left out first on a narrow terminal; the answer, its peak, the next size and the note stay.
    drops = {"compiles": 1, amount: 2, "% of budget": 3, "peak bytes": 4, "its peak GiB": 5, "host GiB": 6,
             f"{nxt} over": 7}
    spec = [Column(c, justify="left" if c in left else "right", style="bold" if c == size else None,
                   wrap=c in ("note", f"{nxt} over"), drop=drops.get(c)) for c in cols]
    width = width or terminal_width(file)
    t = fitted_table(title(fit), spec, [[escape(r[c]) for c in cols] for r in table], footnotes(fit), width,
                     full="--format markdown")
    Console(file=file, width=width, soft_wrap=False).print(t)
