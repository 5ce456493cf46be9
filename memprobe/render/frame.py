"""What every renderer shares: the comparison as a pandas DataFrame (one row per strategy,
ranked, numbers not strings), its title, the footnotes, and the one way to print a number.

Every renderer formats this frame; none recomputes a figure.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from memprobe.flags import OVER_CAPACITY, OVER_HOST_RAM, VERDICT_FLAGS, sanity_flags
from memprobe.measure import GIB, Measurement, flops_ratio, in_gib
from memprobe.model_file import describe, model_from_mapping
from memprobe.plan import recipe, shape_label
from memprobe.result import SHAPE_FIELDS, TARGET_FIELDS, setting_of

COLUMNS = [
    "rank", "strategy", "peak_gib", "pct_of_hbm", "delta_gib", "temp_gib", "argument_gib",
    "output_gib", "alias_gib", "host_gib", "xla_peak_gib", "fits", "verdict", "flops", "flops_ratio", "flags",
    "other_flags", "flag_reasons", "compile_s", "cached", "error",
]

REFUSED_VERDICT = f"{OVER_CAPACITY} (refused)"
PEAK_FORMULA = "peak = argument + output - alias + temp, per device (compiler estimate)"
CPU_NOTE = "CPU backend figures: they do not stand for any accelerator."
FLOPS_NOTE = ("FLOPs: matmul FLOPs of the traced step (forward, backward with its recompute, "
              "optimizer; loops counted by trip count), relative to the first strategy: what the "
              "memory saved costs in compute. XLA's own cost analysis, which counts each loop body "
              "once, is kept in the JSON as `flops`.")


def fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    """A number for display; "-" where there is none (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "-"
    return format(value, spec) + suffix


def pct(value) -> str:
    """A share of HBM: whole percents, but never "0%" for a peak that is not zero (a tiny
    model's 0.07 GiB is 0.07% of a v5p's HBM, and "0%" would read as nothing)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "-"
    if value == 0 or value >= 0.995:
        return format(value, ".0f") + "%"
    return format(value, ".2f") + "%" if value >= 0.005 else "<0.01%"


def where(m: Measurement) -> str:
    """The slice a record was compiled for, as titles name it."""
    return f"{m.topology or m.target}, {devices(m.num_devices)}"


def step_name(m: Measurement) -> str:
    """"train step", with the parameters' dtype, the update and the gradient accumulation in
    brackets where they are not the default (fp32, AdamW, none); the footer's versions line
    always names them."""
    default = m.param_dtype == "fp32" and m.optimizer in ("adamw", None) and m.grad_accum == 1
    return f"{m.step} step" + ("" if default else f" ({_recipe(m)})")


def _recipe(m: Measurement) -> str:
    return recipe(m.step, m.optimizer, m.param_dtype, m.grad_accum)


def per_microbatch(m: Measurement) -> str:
    """" per microbatch" after a per-device batch where the step accumulates gradients."""
    return " per microbatch" if m.grad_accum > 1 else ""


def title(m: Measurement) -> str:
    return (f"{m.model} {step_name(m)}, seq {m.seq_len} x per-device batch {m.batch_per_device}{per_microbatch(m)} "
            f"on {where(m)}")


# What "fits" asks of the run on a real GPU: JAX's allocator is not given the whole device
# unless told to (its documented default preallocates 75% of the device's memory).
GPU_ALLOCATOR_NOTE = ("On the GPU, JAX's allocator gets 75% of the device's memory by default (in older JAX "
                      "also the most it will use), so a step above about 75% of HBM may need "
                      "XLA_PYTHON_CLIENT_MEM_FRACTION (XLA_CLIENT_MEM_FRACTION in newer JAX) set near 1, "
                      "e.g. 0.95, to run.")


def footnotes(group: list[Measurement], command: str | None = None) -> list[str]:
    """What the figures are, the versions and the exact command: the footer of every format."""
    m0 = group[0]
    out = [f"GiB = 2^30 bytes; {PEAK_FORMULA}.", FLOPS_NOTE,
           "compile s: trace, lower and compile of that strategy when it was measured"
           + (" (some rows answered from the results cache)." if any(m.cached for m in group) else ".")]
    if any(m.refused for m in group):
        out.append(f"{REFUSED_VERDICT}: the TPU compiler ran out of HBM and refused the program; the peak "
                   "shown is the total of its out-of-memory report, with no temp or argument split; "
                   "`memprobe explain` lists the report's largest allocations.")
    if m0.capacity_bytes and m0.platform == "cuda":
        out.append(f"HBM per device: {m0.capacity_bytes / GIB:.2f} GiB ({m0.capacity_bytes:,} bytes), the "
                   "target config's device_memory_size; the GPU compiler does not refuse larger programs.")
        out.append(GPU_ALLOCATOR_NOTE)
        out.append("Attention: memprobe's plain-JAX blockwise attention (no cuDNN or Pallas kernel).")
    elif m0.capacity_bytes:
        # The TPU compiler states its limit in GiB to two decimals; the bytes are that figure's.
        out.append(f"HBM per device: {m0.capacity_bytes / GIB:.2f} GiB, as the compiler enforces it and "
                   f"states it (to 2 decimals; peaks are compared with {m0.capacity_bytes:,} bytes).")
    out += model_note(m0)
    if any(m.ok and m.host_bytes for m in group) or m0.host_ram_bytes is not None:
        out.append(host_note(m0))
    if not m0.stands_for_accelerator:
        out.append(CPU_NOTE)
    out.append(versions_line(m0))
    for line in (command or "").splitlines():  # a merged result keeps each run's command
        out.append(f"Command: `{line}`")
    return out


def model_note(m: Measurement) -> list[str]:
    """A model file's sizes, spelt out (a preset's name says them): for every footer."""
    if m.model_config is None:
        return []
    model = model_from_mapping(m.model, m.model_config, m.model)  # checked when the record was read
    return [f"Model {m.model}: a model file's, {describe(model)}."]


def devices(n: int) -> str:
    """'1 device', '8 devices'."""
    return f"{n} device{'s' if n != 1 else ''}"


def host_note(m: Measurement) -> str:
    """What the host column is, and whether it was checked against a host's RAM."""
    what = ("host GiB: per device, what the compiler puts in host memory (offload: memory_analysis()'s "
            "host figures); not part of the peak")
    if m.host_ram_bytes is None or m.devices_per_host is None:
        return (what + ", and not checked against the host's RAM, which serves every device on that "
                "host (--host-ram checks it).")
    return (what + f". Checked against a host's RAM of {m.host_ram_bytes / GIB:.2f} GiB "
            f"({m.host_ram_bytes:,} bytes, --host-ram) shared by {devices(m.devices_per_host)}: "
            f"a row fits when host GiB x {m.devices_per_host} is at most that.")


def verdict(m: Measurement) -> str | None:
    """The verdict column: fits, or what the row is over (HBM, host RAM or both; "over capacity
    (refused)" where the TPU compiler refused the program); None where nothing is known to
    judge by (no HBM capacity, or the row failed)."""
    if m.refused:
        return REFUSED_VERDICT
    if m.fits is None:
        return None
    over = [what for what, fits in ((OVER_CAPACITY, m.fits), (OVER_HOST_RAM, m.fits_host)) if fits is False]
    return ", ".join(over) or "fits"



@dataclasses.dataclass(frozen=True)
class Answer:
    """The comparison's answer in one sentence: ``label`` and ``strategy`` go in bold, ``rest``
    follows (plain text, no markup; each renderer marks the first two up its own way)."""

    label: str
    strategy: str
    rest: str


def answer(group: list[Measurement], places: int = 2) -> Answer | None:
    """Which strategy to use, as every format states it under its table (compiler estimates):

    - some fit: the one that fits with the fewest matmul FLOPs (the least recompute, equal
      where the FLOPs column shows the same ratio); among equals the one with fewer host bytes
      (offload traffic costs time too), then one without sanity flags, then the lower peak;
      and the lowest peak beside it when that is another strategy;
    - none fits: the lowest peak and how far over it is, and where to look next (``fit``, and
      gradient accumulation where a device holds more than one example at a time);
    - no capacity known (the CPU backend): the lowest peak.
    None when no strategy compiled. Peaks are given to ``places`` decimals, as the table
    above shows them (the terminal table gives a tiny model's more)."""
    ok = sorted((m for m in group if m.ok), key=lambda m: m.peak_bytes)
    # A refused row's peak is the compiler's total: it can be the lowest, never one that fits.
    answered = sorted((m for m in group if m.answered), key=lambda m: m.peak_bytes)
    if not answered:
        return None
    low = answered[0]

    def gib(n: int) -> str:
        return f"{n / GIB:.{places}f}"

    size = (f"{gib(low.peak_bytes)} GiB ({low.peak_bytes:,} bytes) per device"
            + (", refused by the TPU compiler" if low.refused else ""))
    if low.capacity_bytes is None:
        return Answer("Lowest peak", low.strategy, f", {size}; no capacity known to fit in.")
    base = group[0] if group[0].ok else None
    fitting = [m for m in ok if verdict(m) == "fits"]
    if not fitting:
        over = []
        if low.fits is False:
            over.append(f"{in_gib(low.peak_bytes - low.capacity_bytes)[0]} over the "
                        f"{low.capacity_bytes / GIB:.2f} GiB of HBM")
        if low.fits_host is False:
            over.append("its host bytes over the host's RAM")
        split = (f"; `--batch 1 --grad-accum {low.batch_per_device * low.grad_accum}` steps on the same "
                 "examples, one at a time" if low.batch_per_device > 1 else "")
        return Answer("Nothing fits; lowest peak", low.strategy,
                      f", {size}, {' and '.join(over)}. `memprobe fit` finds the largest batch (or, "
                      f"with --vary seq, the longest sequence) at which each strategy fits{split}.")

    # Recompute as the FLOPs column shows it (two decimals: 0.02% apart is the same cost), then
    # host traffic, then a row without sanity flags (an inert offload is not what it says),
    # then the peak.
    ref = base.matmul_flops if base is not None and base.matmul_flops else min(
        (m.matmul_flops for m in ok if m.matmul_flops), default=None)
    flagged = {name for name, fl in sanity_flags(group).items() if any(f.kind not in VERDICT_FLAGS for f in fl)}

    def cost(m: Measurement) -> tuple[float, int, bool, int]:
        recompute = round(m.matmul_flops / ref, 2) if ref and m.matmul_flops else math.inf
        return (recompute, m.host_bytes, m.strategy in flagged, m.peak_bytes)

    cheap = min(fitting, key=cost)
    ratio = flops_ratio(cheap, base)
    if cheap is base:  # the first strategy given, the FLOPs column's 1.00x
        compute = (", the baseline (no recompute)" if cheap.strategy_knobs.get("loop") == "unrolled"
                   else ", the baseline of the FLOPs column")
    elif ratio is not None:
        compute = f", {ratio:.2f}x the matmul FLOPs of {base.strategy}"
    else:
        compute = ""
    head = (cheap.capacity_bytes - cheap.peak_bytes) / GIB
    rest = (f"{compute}: peak {gib(cheap.peak_bytes)} GiB ({cheap.peak_bytes:,} bytes) per device, "
            f"{head:.2f} GiB under the {cheap.capacity_bytes / GIB:.2f} GiB of HBM")
    if gib(low.peak_bytes) != gib(cheap.peak_bytes):  # lower as the table shows it
        low_ratio = flops_ratio(low, base)
        rest += (f"; lowest peak: {low.strategy}, {gib(low.peak_bytes)} GiB"
                 + (f" at {low_ratio:.2f}x" if low_ratio is not None else ""))
    return Answer("Cheapest that fits", cheap.strategy, rest + ".")


def versions_line(m: Measurement, loss: str | None = None) -> str:
    """The compiler stack a figure came from, and the step's shape knobs (``loss`` in place
    of the row's loss chunks, where rows of several lengths share the line)."""
    v = m.versions
    compiler = {"tpu": ("libtpu",), "cuda": ("jax-cuda12-plugin",)}.get(m.platform, ())
    shown = ("memprobe", "jax", "jaxlib", *compiler)
    return ("Versions: " + ", ".join(f"{k} {v[k]}" for k in shown if k in v)
            + f"; {loss or f'loss in {m.loss_chunks} chunk(s)'}; {m.step} step "
            + f"({_recipe(m)}).")


def comparison_frame(measurements: list[Measurement]) -> pd.DataFrame:
    """Ranked by peak (lowest first; a refused row by what the compiler said it needed, its
    reason among the flags); failed rows last. Deltas and the FLOPs ratio (the
    recompute cost) are against the first measurement given, the baseline strategy, when
    it compiled. ``flags`` names the row's sanity flags ("" when none), ``flag_reasons``
    gives each with its reason, ``other_flags`` all but those the ``verdict`` already says."""
    base = measurements[0] if measurements and measurements[0].ok else None
    flags = sanity_flags(measurements)
    rows = []
    for m in measurements:
        row = {"strategy": m.strategy, "error": m.error,
               "flags": ", ".join(f.kind for f in flags[m.strategy]),
               "other_flags": ", ".join(f.kind for f in flags[m.strategy] if f.kind not in VERDICT_FLAGS),
               "flag_reasons": "; ".join(f"{f.kind}: {f.reason}" for f in flags[m.strategy]), "cached": m.cached}
        if m.answered:  # a refused row too: over HBM by the compiler's own total, no breakdown
            row.update(
                peak_gib=m.peak_bytes / GIB,
                pct_of_hbm=(100.0 * m.peak_bytes / m.capacity_bytes) if m.capacity_bytes else None,
                delta_gib=(m.peak_bytes - base.peak_bytes) / GIB if base else None,
                fits=m.fits,
                verdict=verdict(m),
                peak_bytes=m.peak_bytes,
            )
        if m.refused:  # ranked with the others; its reason is among the flags
            row.update(error=None, compile_s=m.process_seconds)
        if m.ok:
            row.update(
                temp_gib=m.temp_bytes / GIB,
                argument_gib=m.argument_bytes / GIB,
                output_gib=m.output_bytes / GIB,
                alias_gib=m.alias_bytes / GIB,
                host_gib=m.host_bytes / GIB,
                xla_peak_gib=(m.xla_peak_bytes / GIB) if m.xla_peak_bytes is not None else None,
                flops=m.matmul_flops,
                flops_ratio=flops_ratio(m, base),
                compile_s=(m.compile_seconds or 0.0) + (m.lower_seconds or 0.0),
            )
        rows.append(row)
    df = pd.DataFrame(rows, columns=[*COLUMNS, "peak_bytes"])
    ok = df["error"].isna()
    ranked = df[ok].sort_values("peak_bytes", kind="stable")
    ranked["rank"] = range(1, len(ranked) + 1)
    out = pd.concat([ranked, df[~ok]], ignore_index=True)
    out["rank"] = out["rank"].astype("Int64")
    return out


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One set of strategies side by side at several shapes (``--seq 4096,8192``) or on
    several targets (``--target v5p,h100``; ``axis`` says which): ``peaks`` has a row per
    strategy (first-seen order) and a column per shape or target, the peak in GiB (NaN where
    that compile failed or was not made); ``verdicts`` the same cells' verdicts: fits, what
    the peak is over, "failed", "" (no capacity known to judge by) or None (not compiled
    there); ``answers`` each column's answer as its table states it; ``capacities`` each
    column's HBM per device in bytes (None where unknown: the CPU backend)."""

    title: str
    peaks: pd.DataFrame
    verdicts: pd.DataFrame
    answers: dict[str, Answer | None]
    capacities: dict[str, int | None]
    axis: str = "shape"  # or "target"
    cpu: bool = False  # a column is the CPU backend's, whose figures stand for no accelerator

    def cell(self, strategy: str, label: str, spec: str) -> tuple[str, bool]:
        """A cell as text ("12.34", "412.30 over capacity", "failed", "-" where not compiled) and
        whether it is over a capacity or failed (each format marks those its own way)."""
        value, v = self.peaks.loc[strategy, label], self.verdicts.loc[strategy, label]
        if v == "failed":
            return "failed", True
        if isinstance(v, str) and v not in ("fits", ""):
            return f"{fmt(value, spec)} {v}", True
        return fmt(value, spec), False

    def notes(self) -> list[str]:
        """Each column's answer in a line ("seq 8192: cheapest that fits: checkpoint"); across
        targets, each one's HBM; what a "-" cell means where there is one."""
        lines = [f"{label}: {a.label[0].lower()}{a.label[1:]}: {a.strategy}" if a else f"{label}: nothing compiled"
                 for label, a in self.answers.items()]
        if self.axis == "target":
            lines.append("HBM per device: " + "; ".join(
                f"{label}: {cap / GIB:.2f} GiB" if cap else f"{label}: none known"
                for label, cap in self.capacities.items())
                + ". Each column is its own compiler's estimate (libtpu for TPU, XLA's GPU compiler for GPU)"
                + ("; the CPU backend's figures stand for no accelerator." if self.cpu else "."))
        elif self.cpu:  # a shape sweep on cpu
            lines.append(CPU_NOTE)
        if self.verdicts.isna().to_numpy().any():
            there = "on that target" if self.axis == "target" else "at that shape"
            lines.append(f"-: that strategy was not compiled {there}.")
        return lines


def sweeps(groups: list[list[Measurement]]) -> list[Sweep]:
    """The comparisons set side by side, where there are several: that differ only in their
    shapes (a sweep, or results of several lengths merged; shortest and smallest first), or
    only in their targets (in the order given), one table; that differ in both (a sweep on
    several targets), a sweep per target, each judged against its own HBM (a target at one
    shape alone has none). Nothing where they differ in more."""
    if len(groups) < 2:
        return []
    firsts = [g[0] for g in groups]
    if all(setting_of(m) == setting_of(firsts[0]) for m in firsts):
        return [s] if (s := _shape_sweep(groups)) else []
    if all(setting_of(m, TARGET_FIELDS) == setting_of(firsts[0], TARGET_FIELDS) for m in firsts):
        return [_target_sweep(groups)]
    if all(setting_of(m, SHAPE_FIELDS + TARGET_FIELDS) == setting_of(firsts[0], SHAPE_FIELDS + TARGET_FIELDS)
           for m in firsts):
        per_target: dict[str, list[list[Measurement]]] = {}
        for g in groups:  # targets in the order given
            per_target.setdefault(where(g[0]), []).append(g)
        return [s for part in per_target.values() if len(part) > 1 and (s := _shape_sweep(part))]
    return []


def _shape_sweep(groups: list[list[Measurement]]) -> Sweep | None:
    """Comparisons that differ only in their shapes side by side, shortest and smallest first;
    None where one shape comes twice (at two loss chunkings: not a sweep)."""
    groups = sorted(groups, key=lambda g: (g[0].seq_len, g[0].batch_per_device))
    seqs = len({g[0].seq_len for g in groups})
    batches = len({g[0].batch_per_device for g in groups})
    labels = [shape_label(g[0].seq_len, g[0].batch_per_device, seqs, batches) for g in groups]
    if len(set(labels)) < len(labels):
        return None
    m = groups[0][0]
    what = f"{m.model} {step_name(m)}"  # and the one length or batch all shapes share
    what += f" (per-device batch {m.batch_per_device}{per_microbatch(m)})" if batches == 1 else ""
    what += f" (seq {m.seq_len})" if seqs == 1 else ""
    return _side_by_side(groups, labels, f"{what} on {where(m)}: peak GiB per device at each shape "
                         "(compiler estimate)", "shape")


def _target_sweep(groups: list[list[Measurement]]) -> Sweep:
    """Comparisons that differ only in their targets side by side, in the order given."""
    m = groups[0][0]
    heading = (f"{m.model} {step_name(m)}, seq {m.seq_len} x per-device batch {m.batch_per_device}"
               f"{per_microbatch(m)}: peak GiB per device on each target (compiler estimate)")
    return _side_by_side(groups, [where(g[0]) for g in groups], heading, "target")  # each another slice


def _side_by_side(groups: list[list[Measurement]], labels: list[str], heading: str, axis: str) -> Sweep:
    """The peaks and verdicts of ``groups``, a column each under ``labels``."""
    strategies = list(dict.fromkeys(m.strategy for g in groups for m in g))
    peaks = pd.DataFrame(math.nan, index=strategies, columns=labels)
    verdicts = pd.DataFrame(None, index=strategies, columns=labels, dtype=object)
    for label, group in zip(labels, groups):
        for m in group:
            if m.answered:
                peaks.loc[m.strategy, label] = m.peak_bytes / GIB
            verdicts.loc[m.strategy, label] = (verdict(m) or "") if m.answered else "failed"
    return Sweep(heading, peaks, verdicts, {label: answer(g) for label, g in zip(labels, groups)},
                 {label: g[0].capacity_bytes for label, g in zip(labels, groups)}, axis,
                 any(not g[0].stands_for_accelerator for g in groups))
