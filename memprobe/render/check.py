"""The gate's verdicts as a table, markdown or JSON: what `memprobe check` prints, and what
`memprobe report` prints again from check's saved JSON (schema ``memprobe.check``).

Everything is built from that JSON's form (``gate.verdicts_json``), so a verdict printed
by `check` and the same verdict re-rendered later from its file read the same.
"""

from __future__ import annotations

import json
import sys
import types
from typing import IO

import pandas as pd
from rich.console import Console
from rich.markup import escape

from memprobe.gate import configuration
from memprobe.measure import GIB
from memprobe.render import terminal_width
from memprobe.render.columns import Column, fitted_table

TITLE = "memprobe check: per-device peak vs baseline (compiler estimate)"

# Left out first on a narrow terminal; the strategy, today's peak, its change and the status stay.
_DROP = {"delta GiB": 1, "baseline GiB": 2, "host baseline bytes": 3, "now bytes": 4, "host now bytes": 5,
         "configuration": 6}


def verdict_frame(entries: list[dict]) -> pd.DataFrame:
    """One row per verdict (``verdicts_json``'s entries): baseline and today's peak in GiB,
    the change, today's exact bytes, the host bytes where any strategy has some, and the
    status (a failed or refused compile's reason in its place)."""
    host = any(e["baseline_host_bytes"] or e["now_host_bytes"] for e in entries)
    rows = []
    for e in entries:
        base, now = e["baseline_peak_bytes"], e["now_peak_bytes"]
        answered = now is not None  # a refused compile still says what it needed
        rows.append({
            "configuration": configuration(types.SimpleNamespace(**e)),
            "strategy": e["strategy"],
            "baseline GiB": f"{base / GIB:.3f}",
            "now GiB": f"{now / GIB:.3f}" if answered else "-",
            "delta GiB": f"{(now - base) / GIB:+.3f}" if answered else "-",
            "delta %": f"{100 * (now - base) / base:+.2f}%" if answered and base else "-",
            "now bytes": f"{now:,}" if answered else "-",
            # exact bytes: offloaded figures are often far below a GiB
            **({"host baseline bytes": f"{e['baseline_host_bytes']:,}",
                "host now bytes": "-" if e["now_host_bytes"] is None else f"{e['now_host_bytes']:,}"} if host else {}),
            "status": (e["error"] if e["status"] == "refused" else f"failed: {e['error']}" if e["status"] == "failed"
                       else e["status"]),
        })
    return pd.DataFrame(rows)


def markdown(data: dict) -> str:
    """The verdicts for a pull-request comment or a CI job summary."""
    return ("### memprobe check\n\n" + verdict_frame(data["verdicts"]).to_markdown(index=False, disable_numparse=True)
            + f"\n\n{data['summary']}\n\n")


def table(data: dict, file: IO[str] | None = None) -> None:
    """The verdicts for a terminal: a failing status in bold red, never a digit cut."""
    frame = verdict_frame(data["verdicts"])
    columns = [Column(col, justify="left" if col in ("configuration", "strategy", "status") else "right",
                      wrap=col in ("configuration", "status"), drop=_DROP.get(col)) for col in frame.columns]
    cells = []
    for row in frame.itertuples(index=False):
        row_cells = [escape(str(c)) for c in row]
        row_cells[-1] = row_cells[-1] if str(row[-1]) in ("ok", "improved") else f"[bold red]{row_cells[-1]}[/]"
        cells.append(row_cells)
    width = terminal_width(file or sys.stdout)
    console = Console(file=file, width=width)
    console.print(fitted_table(TITLE, columns, cells, [], width, full=None))
    # One line however long (it names every failing row and the file judged): a CI log is
    # searched by it, and it was broken at the table's width.
    console.print(data["summary"], markup=False, highlight=False, soft_wrap=True)


def write(data: dict, fmt: str, file: IO[str]) -> None:
    """``data`` (check's JSON form) to ``file`` as "table", "markdown" or "json"."""
    if fmt == "json":
        file.write(json.dumps(data, indent=2) + "\n")
    elif fmt == "markdown":
        file.write(markdown(data))
    else:
        table(data, file)
