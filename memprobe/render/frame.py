"""The comparison as a pandas DataFrame: one row per strategy, ranked, numbers not strings.

Every renderer formats this frame; none recomputes a figure.
"""

from __future__ import annotations

import pandas as pd

from memprobe.flags import sanity_flags
from memprobe.measure import GIB, Measurement

COLUMNS = [
    "rank", "strategy", "peak_gib", "pct_of_hbm", "delta_gib", "temp_gib", "argument_gib",
    "output_gib", "alias_gib", "host_gib", "xla_peak_gib", "fits", "flops", "flops_ratio", "flags", "flag_reasons", "compile_s", "cached",
    "error",
]


def comparison_frame(measurements: list[Measurement]) -> pd.DataFrame:
    """Ranked by peak (lowest first); failed rows last. Deltas and the FLOPs ratio (the
    recompute cost) are against the first measurement given, the baseline strategy, when
    it compiled. ``flags`` names the row's sanity flags ("" when none), ``flag_reasons``
    gives each with its reason."""
    base = measurements[0] if measurements and measurements[0].ok else None
    flags = sanity_flags(measurements)
    rows = []
    for m in measurements:
        row = {"strategy": m.strategy, "error": m.error,
               "flags": ", ".join(f.kind for f in flags[m.strategy]),
               "flag_reasons": "; ".join(f"{f.kind}: {f.reason}" for f in flags[m.strategy]), "cached": m.cached}
        if m.ok:
            row.update(
                peak_gib=m.peak_bytes / GIB,
                pct_of_hbm=(100.0 * m.peak_bytes / m.capacity_bytes) if m.capacity_bytes else None,
                delta_gib=(m.peak_bytes - base.peak_bytes) / GIB if base else None,
                temp_gib=m.temp_bytes / GIB,
                argument_gib=m.argument_bytes / GIB,
                output_gib=m.output_bytes / GIB,
                alias_gib=m.alias_bytes / GIB,
                host_gib=m.host_bytes / GIB,
                xla_peak_gib=(m.xla_peak_bytes / GIB) if m.xla_peak_bytes is not None else None,
                fits=m.fits,
                flops=m.flops,
                flops_ratio=(m.flops / base.flops) if (base and base.flops and m.flops) else None,
                compile_s=(m.compile_seconds or 0.0) + (m.lower_seconds or 0.0),
                peak_bytes=m.peak_bytes,
            )
        rows.append(row)
    df = pd.DataFrame(rows, columns=[*COLUMNS, "peak_bytes"])
    ok = df["error"].isna()
    ranked = df[ok].sort_values("peak_bytes", kind="stable")
    ranked["rank"] = range(1, len(ranked) + 1)
    out = pd.concat([ranked, df[~ok]], ignore_index=True)
    out["rank"] = out["rank"].astype("Int64")
    return out
