"""`memprobe strategies`: the catalogue with every knob."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from memprobe.cli import _options as o
from memprobe.render import terminal_width
from memprobe.strategy import load_catalogue


def list_strategies(strategy_file: o.StrategyFile = None, strategies_dir: o.StrategiesDir = None) -> int:
    """List the built-in strategies (and your own files) with all their knobs."""
    t = Table(title="memprobe strategies")
    for col in ("name", "loop", "policy"):
        t.add_column(col, no_wrap=True)  # names are copied into commands: never cut them
    for col in ("save", "offload", "K/V inside", "prevent_cse", "1-trip loop", "period ckpt", "source"):
        t.add_column(col, overflow="fold")
    t.add_column("description", min_width=20, ratio=1)
    for s in load_catalogue(strategy_file or (), strategies_dir or ()).values():
        k = s.knobs()
        t.add_row(s.name, k["loop"], k["policy"], ", ".join(k["save"]) or "-",
                  ", ".join(k["offload"]) or "-", _yn(k["shared_kv_inside"]), _yn(k["prevent_cse"]),
                  _yn(k["trip_count_one"]), _yn(k["checkpoint_period"]), s.source, s.description)
    # Piped or redirected: wide enough that every knob and description stays on its row.
    Console(width=terminal_width(sys.stdout) if sys.stdout.isatty() else 220).print(t)
    return 0


def _yn(flag: bool) -> str:
    return "yes" if flag else "no"
