"""CSV: the comparison frame as numbers (GiB as floats, exact bytes as integers), one row per
strategy and configuration, for spreadsheets and scripts."""

from __future__ import annotations

from typing import IO

import pandas as pd

from memprobe.render.frame import comparison_frame
from memprobe.result import Result, config_of


def frame(result: Result) -> pd.DataFrame:
    parts = []
    for group in result.comparisons:
        df = comparison_frame(group)
        by_name = {m.strategy: m for m in group}
        for field in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "host_temp_bytes",
                      "capacity_bytes"):
            df[field] = [getattr(by_name[s], field) for s in df["strategy"]]
        for key, value in reversed(config_of(group[0]).items()):
            df.insert(0, key, value)
        parts.append(df)
    out = pd.concat(parts, ignore_index=True)
    for col in ("peak_bytes", "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
                "host_temp_bytes", "capacity_bytes"):
        out[col] = out[col].astype("Int64")
    return out


def render(result: Result, file: IO[str]) -> None:
    frame(result).to_csv(file, index=False)
