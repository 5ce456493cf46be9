"""`memprobe strategies`: the catalogue with every knob."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from memprobe.cli import _options as o
from memprobe.render import ListFormat, terminal_width
from memprobe.render.columns import Column, fitted_table, narrowest
from memprobe.strategy import Strategy, load_catalogue


def list_strategies(strategy_file: o.StrategyFile = None, strategies_dir: o.StrategiesDir = None,
                    fmt: Annotated[ListFormat, typer.Option(
                        "--format", help="table, or json: one object per strategy with every knob, for "
                        "scripts.")] = ListFormat.TABLE) -> int:
    """List the built-in strategies (and your own files) with all their knobs."""
    catalogue = load_catalogue(strategy_file or (), strategies_dir or ())
    if fmt is ListFormat.JSON:
        print(json.dumps([{"name": s.name, "description": s.description, "source": s.source, **s.knobs()}
                          for s in catalogue.values()], indent=2))
        return 0
    # Piped or redirected: wide enough that every knob and description stays on its row.
    width = terminal_width(sys.stdout, piped=220)
    print_catalogue(list(catalogue.values()), Console(width=width, highlight=False))
    return 0


def print_catalogue(strategies: list[Strategy], console: Console) -> None:
    """A table of every strategy and knob; on a terminal too narrow for one (names and the
    main knobs are never broken), one block per strategy."""
    # Knob columns go first on a narrow terminal.
    columns = [Column("name", justify="left"), Column("loop", justify="left"), Column("policy", justify="left"),
               Column("save", justify="left", wrap=True), Column("offload", justify="left", wrap=True),
               Column("K/V inside", justify="left", drop=5), Column("prevent_cse", justify="left", drop=2),
               Column("1-trip loop", justify="left", drop=3), Column("period ckpt", justify="left", drop=4),
               Column("source", justify="left", wrap=True, drop=1),
               Column("description", justify="left", wrap=True)]
    rows = []
    for s in strategies:
        k = s.knobs()
        rows.append([s.name, k["loop"], k["policy"], ", ".join(k["save"]) or "-", ", ".join(k["offload"]) or "-",
                     _yn(k["shared_kv_inside"]), _yn(k["prevent_cse"]), _yn(k["trip_count_one"]),
                     _yn(k["checkpoint_period"]), s.source, s.description])
    cells = [[escape(c) for c in row] for row in rows]
    if narrowest(columns, cells) <= console.width:
        console.print(fitted_table("memprobe strategies", columns, cells, [], console.width, full=None))
        return
    console.print("[bold]memprobe strategies[/]")
    for row in cells:
        console.print(f"\n[bold]{row[0]}[/]: {row[-1]}")
        console.print("  " + "; ".join(f"{c.header} {v}" for c, v in zip(columns[1:-1], row[1:-1])))


def _yn(flag: bool) -> str:
    return "yes" if flag else "no"
