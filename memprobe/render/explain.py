"""`memprobe explain` output: the buffers live at the peak, those in host memory (offload), a
two-strategy diff, the heap curve.

Every format is built from the same frames (``buffers_frame``, ``host_frame``,
``diff_frame``) and notes; the notes split the peak into the buffers live at HBM's busiest
point and the three things that are not (heap gaps, temp placed nowhere, arguments not live
there), name the on-chip memory apart, and set the host allocations beside the host temp.
The chart draws the sampled curves with the peak marked.
"""

from __future__ import annotations

import json
from typing import IO, Any

import pandas as pd

from memprobe.errors import BadInput
from memprobe.liveness import EXPLAIN_SCHEMA, Buffer, Explained, Explanation
from memprobe.measure import GIB, OOM_ALLOCATIONS_KEPT, Measurement
from memprobe.render import DEFAULT_TOP, terminal_width
from memprobe.render.frame import CPU_NOTE, fmt, model_note, title, versions_line
from memprobe.result import measurement_from_json, saved_list

MIB = 1024**2


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / MIB:.2f} MiB"


def to_json(answer: Explained) -> dict[str, Any]:
    """The JSON `memprobe explain --format json` writes: per strategy its measurement, the
    explanation (null where the compile failed) and the split of its peak; the diff where
    both of two were explained."""
    data: dict[str, Any] = {
        "schema": EXPLAIN_SCHEMA, "schema_version": 1, "command": answer.command,
        "strategies": [{"measurement": m.to_dict(), "explanation": e.to_dict() if e else None,
                        "peak_parts": peak_parts(m, e) if e else None} for m, e in answer.answers]}
    pair = answer.diff  # computed on each access: once here
    if pair is not None:
        data["diff"] = pair
    return data


def from_json(data: Any, where: str = "result") -> Explained:
    """Reads what ``to_json`` wrote, for `memprobe report`; anything malformed is refused in
    one line naming what is wrong. The diff and the peak split are worked out again from the
    explanations, as a fresh answer's are."""
    listed = saved_list(data, where, EXPLAIN_SCHEMA, "explain result", "strategies")
    answers = []
    for i, entry in enumerate(listed):
        at = f"{where}: strategies[{i}]"
        if not isinstance(entry, dict):
            raise BadInput(f"{at}: expected an object")
        m = measurement_from_json(entry.get("measurement"), f"{at}.measurement")
        e = entry.get("explanation")
        try:
            answers.append((m, None if e is None else Explanation.from_dict(e)))
        except KeyError as err:
            raise BadInput(f"{at}.explanation: missing field {err}") from None
        except (TypeError, ValueError, AttributeError) as err:
            raise BadInput(f"{at}.explanation: malformed ({type(err).__name__}: {err})") from None
    return Explained(answers, data.get("command"))


def write(answer: Explained, fmt_name: str, file: IO[str], top: int = DEFAULT_TOP, width: int | None = None) -> None:
    """``answer`` as table, markdown or json: the diff first (where there is one), then each
    strategy's buffers live at its peak and, for offload, those in host memory; a failed
    compile is said in a line of its own where its listing would be."""
    if fmt_name == "json":
        file.write(json.dumps(to_json(answer), indent=2) + "\n")
        return
    sections = []
    pair = answer.diff
    if pair is not None:
        (ma, _), (mb, _) = answer.answers
        frame, more = diff_frame(pair, ma.strategy, mb.strategy, top)
        sections.append((frame, diff_heading(ma, mb), more, diff_notes(*answer.answers, answer.command)))
    command = [f"Command: `{answer.command}`"] if answer.command else []
    for m, e in answer.answers:
        if m.refused and m.oom_allocations is not None:  # no program: the compiler's report instead
            frame, more = oom_frame(m, top)
            sections.append((frame, oom_heading(m), more, [*oom_notes(m), *command]))
            continue
        if e is None:
            why = (f"{m.strategy}: {m.error}; the compiler left no buffer assignment to list." if m.refused
                   else f"{m.strategy} failed: {m.error}; nothing to list.")
            sections.append((None, heading(m), "", [why, *command]))
            continue
        frame, more = buffers_frame(m, e, top)
        sections.append((frame, heading(m), more, explain_notes(m, e, answer.command)))
        if e.host_buffers:  # offload: what sits in host memory, apart from HBM
            frame, more = host_frame(e, top)
            sections.append((frame, host_heading(m), more, host_notes(m, e)))
    for frame, head, more, notes in sections:
        if frame is None:
            _write_failure(head, notes, file, fmt_name)
        elif fmt_name == "markdown":
            render_markdown(frame, head, more, notes, file)
        else:
            render_table(frame, head, more, notes, file, width or terminal_width(file))


def _write_failure(head: str, notes: list[str], file: IO[str], fmt_name: str) -> None:
    if fmt_name == "markdown":
        file.write(f"## {head}\n\n" + "".join(f"- {n}\n" for n in notes) + "\n")
    else:
        file.write(f"{head}\n" + "".join(f"{n}\n" for n in notes) + "\n")


def buffers_frame(m: Measurement, e: Explanation, top: int) -> tuple[pd.DataFrame, str]:
    """The ``top`` largest buffers live at the peak, and a line for the rest."""
    return _listing(e.buffers, m.peak_bytes, "% of peak", top)


def host_frame(e: Explanation, top: int) -> tuple[pd.DataFrame, str]:
    """The ``top`` largest host-memory buffers live where the most host bytes are, and a line
    for the rest; shares are of those bytes."""
    return _listing(e.host_buffers or [], e.host_peak_live_bytes or 0, "% of host live", top)


def _listing(buffers: list[Buffer], whole: int, share: str, top: int) -> tuple[pd.DataFrame, str]:
    rows = [{"#": i + 1, "size": _size(b.bytes), "bytes": f"{b.bytes:,}",
             share: fmt(100 * b.bytes / whole, ".1f", "%") if whole else "-", "shape": b.shape or "?",
             "what": b.label, "layer": b.layer_label, "HLO value": b.value}
            for i, b in enumerate(buffers[:top])]
    rest = buffers[top:]
    rest_bytes = sum(b.bytes for b in rest)
    more = f"{len(rest)} more buffers, {_size(rest_bytes)} ({rest_bytes:,} bytes)" if rest else ""
    return pd.DataFrame(rows), more


def oom_frame(m: Measurement, top: int) -> tuple[pd.DataFrame, str]:
    """The ``top`` largest allocations of the out-of-memory report a refused program left, and a
    line for the rest that its record keeps."""
    listed = m.oom_allocations or []
    rows = [{"#": i + 1, "size": a.size, "block": "heap" if a.heap else "own", "values": a.values,
             "shapes": a.shapes} for i, a in enumerate(listed[:top])]
    rest = len(listed) - top
    return pd.DataFrame(rows), f"{rest} more allocations (--top {len(listed)} lists them)" if rest > 0 else ""


def oom_heading(m: Measurement) -> str:
    return f"Refused over HBM: {m.strategy}, {title(m)}"


def oom_notes(m: Measurement) -> list[str]:
    return [f"{m.strategy}: {m.error}.",
            "The compiler built no program, so there is no buffer assignment or live range to read: "
            "these are the largest allocations of its out-of-memory report, largest first, sizes as it "
            "rounds them. The compiler leaves out the heap's smallest values (under 5% of its total "
            "between them)" + (f"; memprobe keeps the {OOM_ALLOCATIONS_KEPT} largest allocations." if
                               len(m.oom_allocations or []) >= OOM_ALLOCATIONS_KEPT else "."),
            "block: heap, inside the program's temp heap, where the values listed take turns; own, a "
            "block of its own, as each argument gets (a parameter or optimizer state, with the updated "
            "value donated into it: 2 values).",
            "Shapes are per device. To have each buffer named, explain a smaller shape the compiler accepts."]


def peak_parts(m: Measurement, e: Explanation) -> dict[str, int]:
    """The peak, split into the buffers live at HBM's busiest point and the three things that
    are not; each part is a difference of the compiler's own figures, and they sum to the peak.
    On-chip memory (VMEM, SMEM) is no part: it is not HBM, and temp does not hold all of it
    (see ``ONCHIP_NOTE``)."""
    live_outside_heap = e.peak_live_bytes - e.heap_live_bytes  # arguments, outputs, constants live there
    constants = 0 if m.platform in CONSTANTS_BESIDE_TEMP else e.fixed_bytes  # the part of temp they are
    return {"live": e.peak_live_bytes,
            "heap_gaps": e.heap_bytes - e.heap_live_bytes,
            "unplaced_temp": m.temp_bytes - e.heap_bytes - constants,
            "not_live": m.argument_bytes + m.output_bytes - m.alias_bytes + constants - live_outside_heap}


# Why on-chip memory is no part of the peak's split. memprobe once counted it into temp: on
# tiny E2B unrolled at seq 512 x 2 the buffer assignment's VMEM (53,723,648 B on v5e:2x2,
# 21,987,840 on v5p:2x2x1, 61,149,184 on tpu7x:2x2x1) is more than all of temp beyond the
# HBM heap and constants (11,967,488, 16,612,416 and 22,287,200 B), so "temp placed nowhere"
# read -41,775,948 B on v5e. The TPU compiler budgets VMEM apart (it refuses a program out of
# vmem against the chip's 128 MiB on v5e, not against HBM).
ONCHIP_NOTE = "on-chip memory (VMEM, SMEM), not HBM and no part of the peak"


# Where temp leaves the constants out. On TPU they are taken as part of temp, with the heap
# (temp exceeds the two on every TPU program measured). The GPU compiler's temp is its heap
# to the byte (H100: tiny E2B and full-size E2B checkpoint and offload), its constants
# (16,170 bytes at full size) beside it; counting them into temp there read as a few KB of
# negative "unplaced" temp. So does the CPU backend's (tiny E2B at 256 x 1: checkpoint's temp
# is its heap, 15,130,152 B, and its 2,444 B of constants read as -2,444 B of temp placed
# nowhere).
CONSTANTS_BESIDE_TEMP = frozenset({"cuda", "cpu"})


def _memory(m: Measurement) -> str:
    """What the device's memory is called: the CPU backend's is this machine's RAM."""
    return "device memory" if m.platform == "cpu" else "HBM"


PART_NAMES = {"live": "buffers live at the busiest point (the rows)",
              "heap_gaps": "heap space no live value fills there",
              "unplaced_temp": "temp the buffer assignment places nowhere",
              "not_live": "arguments, outputs and constants not live there"}


def _amount(n: int, sign: bool = False) -> str:
    mark = ("+" if n >= 0 else "-") if sign else ("-" if n < 0 else "")
    return f"{mark}{_size(abs(n))} ({n:{'+' if sign else ''},} bytes)"


def _xla_peak_note(m: Measurement, e: Explanation) -> list[str]:
    """XLA's own peak beside what is live: on TPU they agree to a few MB, except under heavy
    host offload (E4B offload-mlp: 63.56 GiB apart), where XLA's is no HBM figure."""
    if m.xla_peak_bytes is None:
        return []
    host = f"; {_amount(m.host_bytes)} bound for host memory" if m.host_bytes else ""
    return [f"XLA's own peak (peak_memory_in_bytes): {_amount(m.xla_peak_bytes)}, "
            f"{_amount(m.xla_peak_bytes - e.peak_live_bytes, sign=True)} against the {_memory(m)} live at the "
            f"busiest point{host}."]


def _host_note(e: Explanation) -> list[str]:
    """Host memory (offload), where the answer has it and a byte is placed there."""
    if not e.host_peak_live_bytes:
        return []
    return [f"Host memory (memory space 5, offload): at most {_amount(e.host_peak_live_bytes)} live "
            f"(instruction {e.host_peak_time:,}), {_amount(e.host_live_bytes)} at the busiest point of HBM; "
            f"HBM and host together at most {_amount(e.combined_peak_bytes)} live at one point."]


def _host_heap_note(m: Measurement, e: Explanation) -> list[str]:
    """What the buffer assignment allocates in host memory beside memory_analysis()'s host
    temp: equal on the offload programs of per-layer loops; a scan of several trips
    (scan-layers-offload) reports more host temp than any allocation holds."""
    if e.host_heap_bytes is None:
        return []
    unplaced = m.host_temp_bytes - e.host_heap_bytes
    rest = (f"{_amount(unplaced)} of it the buffer assignment places nowhere" if unplaced > 0
            else f"{_amount(-unplaced)} more than the host temp" if unplaced < 0 else "all of it placed")
    return [f"Host temp (memory_analysis(), what the host bytes column counts): {_amount(m.host_temp_bytes)}; "
            f"the buffer assignment allocates {_amount(e.host_heap_bytes)} in host memory, {rest}."]


def host_heading(m: Measurement) -> str:
    return f"In host memory where the most is live: {m.strategy}, {title(m)}"


def host_notes(m: Measurement, e: Explanation) -> list[str]:
    return [f"Buffers in host memory (memory space 5, where offload puts them) live at instruction "
            f"{e.host_peak_time:,} of {e.program_length:,}, where the most host bytes are: "
            f"{len(e.host_buffers or []):,} buffers, {_amount(e.host_peak_live_bytes or 0)}. Each is named, as in HBM, "
            "after the instruction that defines the bytes copied out: XLA fuses a layer's input with the first "
            "work of the layer that reads it, so an offloaded layer input mostly carries that layer's number "
            "(layer 0's: the embedding's scaling). A scan's stacked residuals (first dimension: the stack's trips) "
            "are named after the layer input they stack, by the stack's layers and position (15-34, pos 2); "
            "position 0's input is the previous trip's output, so its stack mostly carries the last "
            "position's number.",
            *_host_heap_note(m, e)]


def _host_diff_note(a: tuple[Measurement, Explanation], b: tuple[Measurement, Explanation]) -> list[str]:
    """The host-memory side of a diff, where both answers have it and either uses host memory."""
    (ma, ea), (mb, eb) = a, b
    if ea.host_peak_live_bytes is None or eb.host_peak_live_bytes is None \
            or not (ea.host_peak_live_bytes or eb.host_peak_live_bytes):
        return []
    return [f"Host memory live at most (offload, not HBM): {mb.strategy} - {ma.strategy} "
            f"{_amount(eb.host_peak_live_bytes - ea.host_peak_live_bytes, sign=True)}."]


def _what_note(names_loops: bool) -> str:
    """What the "what" column says; an answer stored before memprobe named the step's scopes and
    followed loops (``names_loops`` False) says only what it did."""
    step = " the optimizer update or gradient accumulation," if names_loops else ""
    loops = "; what a loop carries, what its body passes on (else the loop's)" if names_loops else ""
    return (f"what: forward/backward work (from the JAX op name: jvp/transpose),{step} the model tensor scope "
            "(mlp_hidden, query_proj, ...) and the operation; parameter/optimizer state rows name the "
            f"argument. Buffers whose instruction has no op name take their source's{loops}.")


def _libtpu_heap_note(m: Measurement, e: Explanation) -> list[str]:
    """What libtpu's own log says of the heap, and whether temp is its heap plus its
    fragmentation (to the log's rounding): then the temp placed nowhere is that fragmentation
    counted again (see ``liveness.parse_libtpu_heap``)."""
    log = e.libtpu_heap
    if not log:
        return []
    total = log["hlo_temp_bytes"] + log["fragmentation_bytes"]
    said = (f"libtpu's log of this compile: HLO temp {log['hlo_temp']}, of which it calls {log['fragmentation']} "
            f"fragmentation (K, M, G: KiB, MiB, GiB). ")
    if abs(m.temp_bytes - total) <= log["rounding_bytes"]:
        return [said + f"Temp ({_amount(m.temp_bytes)}) is the two added, to the log's rounding: the fragmentation "
                "is counted a second time. That second count, held by no buffer, is the temp the buffer assignment "
                f"places nowhere (to within the constants' {_amount(e.fixed_bytes)}), and the compiler's fit check "
                "counts it."]
    return [said + f"Those two add up to {_amount(total)}, not to temp ({_amount(m.temp_bytes)}), even to the "
            "log's rounding."]


def explain_notes(m: Measurement, e: Explanation, command: str | None = None) -> list[str]:
    parts = peak_parts(m, e)
    rest = "; ".join(f"{PART_NAMES[k]} {_amount(parts[k])}" for k in ("heap_gaps", "unplaced_temp", "not_live"))
    out = [f"Peak (compiler estimate, per device): {_amount(m.peak_bytes)} = argument + output - alias + temp.",
           f"Busiest point of {_memory(m)}: instruction {e.peak_time:,} of {e.program_length:,}, {len(e.buffers):,} "
           f"buffers live: {_amount(e.peak_live_bytes)}, of which {_amount(e.heap_live_bytes)} in the compiler's "
           f"temporary heap ({_amount(e.heap_bytes)}, as far as its placement of values reaches) and the rest "
           "arguments, outputs and constants.",
           f"The rest of the peak is not a buffer live in {_memory(m)} there: {rest}.",
           *_libtpu_heap_note(m, e),
           *([f"Beside it, {ONCHIP_NOTE}: {_amount(e.onchip_bytes)}."] if e.onchip_bytes else []),
           *_xla_peak_note(m, e),
           *_host_note(e),
           _what_note(e.names_loops)]
    out += model_note(m)
    if not m.stands_for_accelerator:
        out.append(CPU_NOTE)
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


def diff_notes(a: tuple[Measurement, Explanation], b: tuple[Measurement, Explanation],
               command: str | None = None) -> list[str]:
    (ma, ea), (mb, eb) = a, b
    gap = mb.peak_bytes - ma.peak_bytes
    pa, pb = peak_parts(ma, ea), peak_parts(mb, eb)
    split = "; ".join(f"{PART_NAMES[k]} {_amount(pb[k] - pa[k], sign=True)}" for k in PART_NAMES)
    onchip = ([f"Beside it, {ONCHIP_NOTE}: {mb.strategy} - {ma.strategy} "
               f"{_amount(eb.onchip_bytes - ea.onchip_bytes, sign=True)}."]
              if ea.onchip_bytes or eb.onchip_bytes else [])
    out = [f"Peak {mb.strategy} - {ma.strategy}: {_amount(gap, sign=True)}, compiler estimates per device.",
           f"Of the difference: {split}.", *onchip,
           *_host_diff_note(a, b),
           "Rows: buffers live at each strategy's busiest point, grouped by what they are and their shape, "
           "largest difference first.", *model_note(ma), versions_line(ma)]
    if command:
        out.append(f"Command: `{command}`")
    return out


# Left out first on a narrow terminal: the compiler's value names, then exact bytes, shares,
# layers and counts; the rank, size, shape and what the buffer is always stay.
_DROP = {"HLO value": 1, "bytes": 2, "% of peak": 3, "% of host live": 3, "layer": 4, "values": 2}


def render_table(frame: pd.DataFrame, heading: str, more: str, notes: list[str], file: IO[str],
                 width: int) -> None:
    from rich.console import Console
    from rich.markup import escape

    from memprobe.render.columns import Column, fitted_table

    left = ("shape", "shapes", "block", "what", "layer", "HLO value")
    columns = [Column(str(col), justify="left" if col in left else "right", wrap=col in ("what", "layer", "shapes"),
                      drop=_DROP.get(str(col), 5 if str(col).startswith("count ") else None))
               for col in frame.columns]
    cells = [[escape(str(v)) for v in row] for row in frame.itertuples(index=False)]
    t = fitted_table(heading, columns, cells, ([more] if more else []) + notes, width,
                     full="--format markdown or json")
    Console(file=file, width=width, soft_wrap=False).print(t)


def render_markdown(frame: pd.DataFrame, heading: str, more: str, notes: list[str], file: IO[str]) -> None:
    file.write(f"## {heading}\n\n")
    file.write(frame.to_markdown(index=False, disable_numparse=True) if len(frame) else "(nothing)")
    file.write("\n\n" + (f"{more}\n\n" if more else "") + "---\n\n" + "".join(f"- {n}\n" for n in notes) + "\n")


def heading(m: Measurement) -> str:
    return f"Live at the peak: {m.strategy}, {title(m)}"


def curve_chart(series: list[tuple[Measurement, Explanation]] | Explained, fmt: str = "png") -> bytes:
    """HBM bytes live over program order, one line per strategy, the busiest point marked; a
    dashed level at each strategy's peak (compiler estimate): the gap between the two is
    memory reserved but not holding a live buffer. Host memory (offload), where a strategy
    uses it, is a dotted line of its own."""
    from memprobe.render.chart import fitted_title, plt, save  # matplotlib, set up for files only

    if isinstance(series, Explained):
        series = series.explained
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=110)
    for m, e in series:
        xs = [p[0] / max(1, e.program_length) for p in e.curve]
        line, = ax.plot(xs, [p[1] / GIB for p in e.curve], label=f"{m.strategy}: {_memory(m)} live")
        ax.axhline(m.peak_bytes / GIB, color=line.get_color(), linestyle="--", linewidth=0.9,
                   label=f"{m.strategy}: peak, compiler estimate ({m.peak_bytes / GIB:.2f} GiB)")
        px = e.peak_time / max(1, e.program_length)
        ax.axvline(px, color=line.get_color(), linestyle=":", linewidth=1)
        ax.annotate(f"busiest: {_size(e.peak_live_bytes)} live", (px, e.peak_live_bytes / GIB),
                    textcoords="offset points", xytext=(4, 4), fontsize=8, color=line.get_color())
        if e.host_curve:  # offload: host memory beside HBM, dotted, never added to it
            ax.plot([p[0] / max(1, e.program_length) for p in e.host_curve], [p[1] / GIB for p in e.host_curve],
                    color=line.get_color(), linestyle=(0, (1, 1.5)), linewidth=1.2,
                    label=f"{m.strategy}: host memory live (offload, not HBM; at most "
                          f"{_size(e.host_peak_live_bytes)})")
    ax.set_xlabel("program order (fraction of the scheduled instruction sequence)")
    ax.set_ylabel("GiB per device (compiler's buffer assignment)")
    ax.set_ylim(bottom=0)
    text, size = fitted_title(title(series[0][0]), 10, 10)
    ax.set_title(text, fontsize=size)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save(fig, fmt)
