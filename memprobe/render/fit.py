"""`memprobe fit` output: the largest batch (or longest sequence) per strategy, as a terminal
table, markdown or JSON, all from one ``FitResult``; for a sweep (several lengths, or with
--vary seq several batches) each fit's own table, then the answers side by side."""

from __future__ import annotations

import json
from typing import IO

from memprobe.measure import GIB, in_gib
from memprobe.render import FitFormat
from memprobe.render.columns import Column, fitted_table
from memprobe.render.frame import (CPU_NOTE, GPU_ALLOCATOR_NOTE, PEAK_FORMULA, devices, fmt, model_note,
                                   per_microbatch, step_name, versions_line, where)
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
    if s.failed:  # no answer; what the search had learnt before it stopped, a bound on one
        known = [f"{fit.axis} {s.value(s.largest)} fit ({in_gib(s.peaks[s.largest])[0]})"] if s.largest else []
        hi = s.smallest_over
        if hi is not None:  # "the budget", as the notes below say: a --budget is not HBM
            known.append(f"{fit.axis} {s.value(hi)} was over {' and '.join(s.over(hi)).replace('HBM', 'the budget')}")
        return f"failed: {s.error}" + (f"; before it stopped, {' and '.join(known)}" if known else "")
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
        hi, lo = f"{values[n1] / GIB:.2f}", f"{values[n2] / GIB:.2f}"
        by = f"{hi} > {lo} GiB" if hi != lo else f"{values[n1]:,} > {values[n2]:,} bytes"  # a dip under 0.01 GiB
        notes.append(f"{what} falls from {fit.axis} {s.value(n1)} to {s.value(n2)} ({by}): the search assumes "
                     "it never does")
    return "; ".join(notes)


def rows(fit: FitResult) -> list[dict[str, str]]:
    """One display row per strategy, best first."""
    m = fit.measurements[0]  # one configuration: the same slice (and batch, when seq is searched) throughout
    # what one step takes at a size: every microbatch of it, on every device
    per_value = (m.num_devices if fit.axis == "batch" else m.batch_per_device) * m.grad_accum
    size, amount, nxt, _ = NAMES[fit.axis]
    out = []
    for i, s in enumerate(fit.ranked(), 1):
        # A failed search has no answer: no size, peak or next size (its note says what it saw).
        failed = s.failed
        peak = None if failed else s.peaks.get(s.largest)
        hi = None if failed else s.smallest_over
        out.append({
            "#": "-" if failed else str(i),
            "strategy": s.strategy,
            size: "-" if failed else str(s.value(s.largest)),
            amount: str(s.value(s.largest) * per_value) if s.largest and not failed else "-",
            "peak GiB": fmt(peak / GIB if peak is not None else None),
            "peak bytes": fmt(peak, ",d"),
            "% of budget": fmt(100 * peak / fit.budget if peak is not None else None, ".0f", "%"),
            nxt: str(s.value(hi)) if hi is not None else "-",
            "its peak GiB": (fmt(s.refused[hi] / GIB) + " refused" if hi in s.refused
                             else fmt(s.peaks[hi] / GIB if hi in s.peaks else None)),
            "host GiB": fmt(s.hosts[s.largest] / GIB if s.largest in s.hosts and not failed else None),
            f"{nxt} over": ", ".join(s.over(hi)) if hi is not None else "-",
            "compiles": str(s.compiles),
            "note": _note(fit, s),
        })
    return out


def title(fit: FitResult) -> str:
    m = fit.measurements[0]
    host = (f" and {in_gib(fit.host_ram)[0]} host RAM per host of {devices(fit.devices_per_host)}"
            if fit.host_ram is not None else "")
    micro = per_microbatch(m)
    what = (f"seq {m.seq_len}: the largest per-device batch{micro}" if fit.axis == "batch"
            else f"per-device batch {m.batch_per_device}{micro}: the longest sequence")
    return f"{m.model} {step_name(m)}, {what} within {in_gib(fit.budget)[0]} per device{host} on {where(m)}"


def footnotes(fit: FitResult) -> list[str]:
    m = fit.measurements[0]
    gpu = m.platform == "cuda"
    hbm = ("the target config's device_memory_size (the GPU compiler does not enforce it)." if gpu
           else "the target's HBM as the compiler enforces it.")
    budget = (f"Budget: {fit.budget / GIB:.2f} GiB ({fit.budget:,} bytes) per device, "
              + (hbm if fit.budget_source == "HBM" else "from --budget."))
    accum = f" x {m.grad_accum} microbatches" if m.grad_accum > 1 else ""
    if fit.axis == "batch":
        search = ("Every batch shown was compiled: the largest batch fits and the next batch is over (a row at "
                  "the search limit, --max-batch, has no next batch). The search "
                  "draws the peak's line through batch 1 and 2 and compiles the batch it predicts with the one "
                  "after; compiles counts the batches each strategy needed.")
        amount, thing = f"global batch = per-device batch x devices{accum}.", "batch"
    else:
        search = (f"Every length shown was compiled: the longest fits and the next ({fit.unit} tokens, one "
                  f"attention block, longer) is over (a row at the search limit, --max-seq, has no next length). "
                  f"The search draws the peak's line through seq {fit.unit} and "
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
    if gpu:
        out.append(GPU_ALLOCATOR_NOTE)
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


def target_of(fit: FitResult) -> str:
    """The slice a fit searched on, as titles name it: "h100, 8 devices"."""
    return where(fit.measurements[0])


def at(fit: FitResult, fits: list[FitResult]) -> str:
    """What tells ``fit`` apart among ``fits`` (its target, its fixed shape or both: "h100, 8
    devices, seq 8192"); empty for a fit alone."""
    parts = [target_of(fit)] if len({target_of(f) for f in fits}) > 1 else []
    parts += [fixed_shape(fit)] if len({f.held for f in fits}) > 1 else []
    return ", ".join(parts)


def sweeps(fits: list[FitResult]) -> list[tuple[str, list[FitResult]]]:
    """The fits set side by side, each as (what varies across its columns, "shape" or
    "target", its fits): one where only the fixed shape or only the target varies; where both
    do, one per target across its shapes (a target at one shape alone has none), as
    `compare` sets a sweep on several targets."""
    if len(fits) < 2:
        return []
    targets = list(dict.fromkeys(target_of(f) for f in fits))
    if len(targets) == 1:
        return [("shape", fits)]
    if len({f.held for f in fits}) == 1:
        return [("target", fits)]
    parts = [[f for f in fits if target_of(f) == t] for t in targets]
    return [("shape", part) for part in parts if len(part) > 1]


def sweep_rows(fits: list[FitResult], axis: str = "shape") -> tuple[list[str], list[dict[str, str]]]:
    """The answers of a sweep side by side: one row per strategy (in the first fit's ranking,
    then any that only later fits searched), one column per fixed shape (or per target), each
    cell the size found and its peak."""
    def cell(s: StrategySearch | None) -> str:
        if s is None:
            return "not searched"
        if s.failed:
            return "-"
        if not s.largest:
            return "0 (over)"
        return f"{s.value(s.largest)} ({s.peaks[s.largest] / GIB:.2f} GiB)"

    cols = ["strategy", *((fixed_shape if axis == "shape" else target_of)(f) for f in fits)]
    by_fit = [{s.strategy: s for s in f.searches} for f in fits]
    names = list(dict.fromkeys(s.strategy for f in fits for s in f.ranked()))
    return cols, [{"strategy": name, **{col: cell(searches.get(name)) for col, searches in zip(cols[1:], by_fit)}}
                  for name in names]


def _within(fits: list[FitResult]) -> str:
    """The budget a side-by-side's cells fit: one size, or each target's own HBM."""
    if len({f.budget for f in fits}) == 1:
        return f"{in_gib(fits[0].budget)[0]} per device"
    return "each target's HBM per device"


def sweep_title(fits: list[FitResult], axis: str = "shape") -> str:
    fit, m = fits[0], fits[0].measurements[0]
    size = (f"the largest per-device batch{per_microbatch(m)}" if fit.axis == "batch"
            else "the longest sequence")
    if axis == "target":
        fixed = (f"seq {m.seq_len}" if fit.axis == "batch"
                 else f"per-device batch {m.batch_per_device}{per_microbatch(m)}")
        return f"{m.model} {step_name(m)} at {fixed}: {size} on each target within {_within(fits)}"
    what = (f"{size} at each length" if fit.axis == "batch"
            else f"{size} at each per-device batch{per_microbatch(m)}")
    return f"{m.model} {step_name(m)} on {where(m)}: {what} within {_within(fits)}"


def sweep_notes(fits: list[FitResult], axis: str = "shape") -> list[str]:
    size = "largest per-device batch" if fits[0].axis == "batch" else "longest sequence"
    where_ = "at that shape" if axis == "shape" else "on that target"
    searched = [{s.strategy for s in f.searches} for f in fits]
    missing = ("; not searched: the strategy was not run there (offload, on a target without host memory)"
               if any(names != searched[0] for names in searched) else "")
    out = [f"Each cell: the {size} that fits {where_}, and its peak GiB per device (compiler estimate); "
           f"0 (over): over even at the smallest; -: the search failed{missing}. Each {axis}'s table above "
           "says more."]
    if len({f.budget for f in fits}) > 1:
        def budget(f: FitResult) -> str:
            its = ", its HBM" if f.budget_source == "HBM" else ""
            return f"{target_of(f)} {f.budget / GIB:.2f} GiB ({f.budget:,} bytes{its})"
        out.append("Budgets: " + "; ".join(map(budget, fits)) + ".")
    if any(not f.measurements[0].stands_for_accelerator for f in fits):
        out.append(CPU_NOTE)
    for command in dict.fromkeys(f.command for f in fits if f.command):  # one, or one per file merged
        out.append(f"Command: `{command}`")
    return out


def render_fits(fits: list[FitResult], fmt_: FitFormat, file: IO[str], width: int | None = None) -> None:
    """One fit as ``render`` writes it; a sweep's fits (shapes, targets or both) one after the
    other, then their answers side by side (see ``sweeps``; JSON: every fit in one container)."""
    if fmt_ is FitFormat.JSON:
        file.write(json.dumps(fits_to_json(fits), indent=2) + "\n")
        return
    for fit in fits:
        render(fit, fmt_, file, width)
    for axis, part in sweeps(fits):
        cols, table = sweep_rows(part, axis)
        # On a narrow terminal the last columns are left out first, and the caption names them.
        spec = [Column("strategy", justify="left"),
                *(Column(c, drop=None if k == 0 else len(cols) - 1 - k) for k, c in enumerate(cols[1:]))]
        _write(sweep_title(part, axis), spec, table, sweep_notes(part, axis), fmt_, file, width, framed=False)
