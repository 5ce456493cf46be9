"""Sanity flags: when a figure in a comparison cannot be taken at face value.

- ``collapsed``: two strategies compiled to byte-identical memory figures, so the
  difference between them did not reach the compiled program (a one-trip scan inlined, a
  policy that saved nothing new).
- ``offload inert``: a strategy asks for offloading but no byte reached host memory.
- ``over capacity``: the per-device peak exceeds the target's HBM, or the TPU compiler
  refused the program over HBM (the reason then gives what it needed).
- ``over host RAM``: the host bytes of all the devices that share one host exceed the RAM
  given with ``--host-ram`` (only then is it checked).
- ``xla peak above``: XLA's own ``peak_memory_in_bytes`` is above the peak memprobe ranks
  by (argument + output - alias + temp), which it normally stays below. Measured on full-size
  E4B ``offload-mlp`` (164.26 GiB against 132.13 GiB, with 153.75 GiB bound for host
  memory): ``memprobe explain`` found 100.70 GiB live in HBM at the busiest point, so
  XLA's figure was not an HBM figure there. The flag sends the reader to ``explain``
  rather than letting the higher number pass for the HBM need.

Flags are computed from measurements alone, at render time, so every format shows the
same ones.
"""

from __future__ import annotations

import dataclasses

from memprobe.measure import OVER_HBM, Measurement, in_gib

COLLAPSED = "collapsed"
OFFLOAD_INERT = "offload inert"
OVER_CAPACITY = "over capacity"
OVER_HOST_RAM = "over host RAM"
VERDICT_FLAGS = (OVER_CAPACITY, OVER_HOST_RAM)  # shown as the verdict, not among the other flags
XLA_PEAK_ABOVE = "xla peak above"


@dataclasses.dataclass(frozen=True)
class Flag:
    strategy: str
    kind: str
    reason: str  # one phrase

    def __str__(self) -> str:
        return f"{self.strategy}: {self.kind}: {self.reason}"


def _memory_figures(m: Measurement) -> tuple[int, ...]:
    return (m.argument_bytes, m.output_bytes, m.alias_bytes, m.temp_bytes, m.host_argument_bytes,
            m.host_output_bytes, m.host_alias_bytes, m.host_temp_bytes)


def sanity_flags(measurements: list[Measurement]) -> dict[str, list[Flag]]:
    """Flags per strategy name (every strategy has an entry, possibly empty)."""
    flags: dict[str, list[Flag]] = {m.strategy: [] for m in measurements}
    ok = [m for m in measurements if m.ok]
    for i, m in enumerate(ok):
        twins = [o.strategy for j, o in enumerate(ok) if j != i and _memory_figures(o) == _memory_figures(m)]
        if twins:
            flags[m.strategy].append(Flag(m.strategy, COLLAPSED, f"same bytes as {', '.join(twins)}"))
        offload = m.strategy_knobs.get("offload") or []
        if offload and m.host_bytes == 0:
            why = "no bytes reached host memory"
            if m.strategy_knobs.get("loop") == "scan-checkpoint" and m.strategy_knobs.get("trip_count_one"):
                why += " (offload names are kept on device inside a one-trip loop)"
            flags[m.strategy].append(Flag(m.strategy, OFFLOAD_INERT, why))
        if m.capacity_bytes and m.peak_bytes > m.capacity_bytes:
            flags[m.strategy].append(Flag(
                m.strategy, OVER_CAPACITY,
                "peak {} > HBM {}".format(*in_gib(m.peak_bytes, m.capacity_bytes))))
        if m.fits_host is False:
            flags[m.strategy].append(Flag(
                m.strategy, OVER_HOST_RAM,
                f"host {in_gib(m.host_bytes)[0]} x {m.devices_per_host} devices per host = "
                "{} > host RAM {}".format(*in_gib(m.host_bytes * m.devices_per_host, m.host_ram_bytes))))
        if m.xla_peak_bytes is not None and m.xla_peak_bytes > m.peak_bytes:
            xla, peak, *host = in_gib(m.xla_peak_bytes, m.peak_bytes, *([m.host_bytes] if m.host_bytes else []))
            why = f"XLA's peak {xla} > peak {peak}" + "".join(f", with {h} bound for host memory" for h in host)
            flags[m.strategy].append(Flag(m.strategy, XLA_PEAK_ABOVE,
                                          why + "; `memprobe explain` shows what is live in HBM"))
    for m in measurements:
        if m.refused:  # no figures to flag; the compiler's own words say how far over
            reason = m.error.removeprefix(OVER_HBM) if m.error else "the TPU compiler refused the program"
            flags[m.strategy].append(Flag(m.strategy, OVER_CAPACITY, reason))
    return flags
