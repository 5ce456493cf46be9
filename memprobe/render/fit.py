"""`memprobe fit` output: the largest batch (or longest sequence) per strategy, as a terminal
table, markdown or JSON, all from one ``FitResult``; for a sweep (several lengths, or with
--vary seq several batches) each fit's own table, then the answers side by side."""

from __future__ import annotations

import json
from typing import IO

from memprobe.measure import GIB
from memprobe.render import FitFormat
from memprobe.render.columns import Column, fitted_table
from memprobe.render.frame import (CPU_NOTE, PEAK_FORMULA, devices, fmt, model_note, per_microbatch, step_name,
                                   versions_line, where)
from memprobe.search import FitResult, StrategySearch, fits_to_json


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
        out.append(CPU_NOTE)
    out.append(versions_line(m, loss=None if fit.axis == "batch" else f"loss in chunks of {fit.unit} tokens"))
    if fit.command:
        out.append(f"Command: `{fit.command}`")
    return out


def render(fit: FitResult, fmt_: FitFormat, file: IO[str], width: int | None = None) -> None:
    if fmt_ is FitFormat.JSON:
        file.write(json.dumps(fit.to_json(), indent=2) + "\n")
        return
    size, amount, nxt, _ = NAMES[fit.axis]
    left = ("strategy", f"{nxt} over", "note")
    # Left out first on a narrow terminal; the answer, its peak, the next size and the note stay.
    drops = {"compiles": 1, amount: 2, "% of budget": 3, "peak bytes": 4, "its peak GiB": 5, "host GiB": 6,
             f"{nxt} over": 7}
    spec = [Column(c, justify="left" if c in left else "right", style="bold" if c == size else None,
                   wrap=c in ("note", f"{nxt} over"), drop=drops.get(c)) for c in columns(fit)]
    _write(title(fit), spec, rows(fit), footnotes(fit), fmt_, file, width)


def _write(head: str, spec: list[Column], table: list[dict[str, str]], notes: list[str], fmt_: FitFormat,
           file: IO[str], width: int | None, framed: bool = True) -> None:
    """A table of ``table``'s rows under ``head``, its notes below: markdown, or fitted to the
    terminal, ``head`` and notes in the table's frame or (``framed`` False, for a narrow table)
    as lines of their own, the width of the terminal."""
    cols = [c.header for c in spec]
    if fmt_ is FitFormat.MARKDOWN:
        file.write(f"## {head}\n\n")
        file.write("| " + " | ".join(cols) + " |\n")
        file.write("|" + "|".join(":--" if c.justify == "left" else "--:" for c in spec) + "|\n")
        for r in table:
            file.write("| " + " | ".join(r[c].replace("|", "\\|") for c in cols) + " |\n")
        file.write("\n---\n\n" + "".join(f"- {n}\n" for n in notes) + "\n")
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.text import Text

    from memprobe.render import terminal_width

    width = width or terminal_width(file)
    cells = [[escape(r[c]) for c in cols] for r in table]
    console = Console(file=file, width=width, soft_wrap=False)
    if framed:
        console.print(fitted_table(head, spec, cells, notes, width, full="--format markdown"))
        return
    console.print(Text(head, style="bold"))
    console.print(fitted_table("", spec, cells, [], width, full="--format markdown"))
    for line in notes:
        console.print(Text(line))


def fixed_shape(fit: FitResult) -> str:
    """What a fit held fixed, as a sweep names it: "seq 8192" for a batch search, "batch 8"
    for a length search."""
    name, value = fit.held
    return f"{name} {value}"


def sweep_rows(fits: list[FitResult]) -> tuple[list[str], list[dict[str, str]]]:
    """The answers of a sweep side by side: one row per strategy (in the first fit's ranking),
    one column per fixed shape, each cell the size found and its peak."""
    def cell(s: StrategySearch | None) -> str:
        if s is None or s.error is not None:
            return "-"
        if not s.largest:
            return "0 (over)"
        return f"{s.value(s.largest)} ({s.peaks[s.largest] / GIB:.2f} GiB)"

    cols = ["strategy", *(fixed_shape(f) for f in fits)]
    by_fit = [{s.strategy: s for s in f.searches} for f in fits]
    return cols, [{"strategy": first.strategy, **{col: cell(searches.get(first.strategy))
                                                  for col, searches in zip(cols[1:], by_fit)}}
                  for first in fits[0].ranked()]


def sweep_title(fits: list[FitResult]) -> str:
    fit, m = fits[0], fits[0].measurements[0]
    what = (f"the largest per-device batch{per_microbatch(m)} at each length" if fit.axis == "batch"
            else f"the longest sequence at each per-device batch{per_microbatch(m)}")
    return f"{m.model} {step_name(m)} on {where(m)}: {what} within {fit.budget / GIB:.2f} GiB per device"


def sweep_notes(fits: list[FitResult]) -> list[str]:
    size = "largest per-device batch" if fits[0].axis == "batch" else "longest sequence"
    out = [f"Each cell: the {size} that fits at that shape, and its peak GiB per device (compiler estimate); "
           "0 (over): over even at the smallest; -: the search failed. Each shape's table above says more."]
    for command in dict.fromkeys(f.command for f in fits if f.command):  # one, or one per file merged
        out.append(f"Command: `{command}`")
    return out


def render_fits(fits: list[FitResult], fmt_: FitFormat, file: IO[str], width: int | None = None) -> None:
    """One fit as ``render`` writes it; a sweep's fits one after the other, then their answers
    side by side (JSON: every fit in one container)."""
    if fmt_ is FitFormat.JSON:
        file.write(json.dumps(fits_to_json(fits), indent=2) + "\n")
        return
    for fit in fits:
        render(fit, fmt_, file, width)
    if len(fits) > 1:
        cols, table = sweep_rows(fits)
        # On a narrow terminal the last shapes are left out first, and the caption names them.
        spec = [Column("strategy", justify="left"),
                *(Column(c, drop=None if k == 0 else len(cols) - 1 - k) for k, c in enumerate(cols[1:]))]
        _write(sweep_title(fits), spec, table, sweep_notes(fits), fmt_, file, width, framed=False)
