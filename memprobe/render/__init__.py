"""Renderers: one module per output format, each built from one ``Result``."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import IO

from rich.console import Console

from memprobe.errors import BadInput
from memprobe.result import Result


class Format(str, enum.Enum):
    TABLE = "table"
    MARKDOWN = "markdown"
    JSON = "json"
    CSV = "csv"
    HTML = "html"


class ExplainFormat(str, enum.Enum):
    """`memprobe explain`'s formats (see ``render.explain``)."""

    TABLE = "table"
    MARKDOWN = "markdown"
    JSON = "json"


#: Buffers (or diff groups) an `explain` listing shows by default; the rest are summed.
DEFAULT_TOP = 20


def check_top(top: int) -> None:
    """`explain`'s --top: how many buffers (or diff groups) to list."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise BadInput(f"--top must be a positive integer, got {top}")


class FitFormat(str, enum.Enum):
    """`memprobe fit`'s formats (its output is one table, see ``render.fit``)."""

    TABLE = "table"
    MARKDOWN = "markdown"
    JSON = "json"


class CheckFormat(str, enum.Enum):
    """`memprobe check`'s formats, and its saved verdicts' in `report` (see ``render.check``)."""

    TABLE = "table"
    MARKDOWN = "markdown"
    JSON = "json"


class ListFormat(str, enum.Enum):
    """`memprobe targets` and `memprobe strategies`: a table to read, JSON for scripts."""

    TABLE = "table"
    JSON = "json"


class ModelFormat(str, enum.Enum):
    """`memprobe models`: a table, JSON for scripts, or one model written out as a model file."""

    TABLE = "table"
    JSON = "json"
    TOML = "toml"


#: The chart formats, by the file name's suffix (none: PNG).
CHART_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf", "": "png"}
#: The formats an output file's suffix names, for a command given no --format: `-o r.md` is
#: markdown, as `--chart c.svg` is SVG (a rich table with box characters used to land in r.csv).
SUFFIX_FORMATS = {".md": "markdown", ".markdown": "markdown", ".json": "json", ".csv": "csv", ".html": "html",
                  ".htm": "html"}
#: Said in each --format's help.
FROM_SUFFIX = "Without it, an --output file's suffix picks it (.md, .json, .csv, .html)"


def suffix_format(path: Path | None) -> str | None:
    """What a file's suffix names: a format ("markdown", ...), "picture" for a chart's
    suffix, or None (another suffix, none, no file, or standard output, "-")."""
    suffix = path.suffix.lower() if path is not None else ""
    if suffix and suffix in CHART_FORMATS:
        return "picture"
    return SUFFIX_FORMATS.get(suffix)


def terminal_width(file: IO[str], piped: int = 160) -> int:
    """The width to lay a table out in: $COLUMNS when it is set (as for rich's own consoles, and
    as for `less` or a CI log that asks for a width), else the terminal's, else ``piped``
    columns when writing to a pipe or file, so rows stay whole."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return Console(file=file).width if getattr(file, "isatty", lambda: False)() else piped


def render(result: Result, fmt: Format, file: IO[str]) -> None:
    """Writes ``result`` to ``file`` in ``fmt``."""
    # Each format imports only what it needs: JSON needs neither pandas nor matplotlib.
    match fmt:
        case Format.TABLE:
            from memprobe.render import table
            from memprobe.render.frame import sweeps

            groups = result.comparisons
            for group in groups:
                table.render(group, file)
            for sw in sweeps(groups):
                table.render_sweep(sw, table.gib_places(result.measurements), file)
        case Format.MARKDOWN:
            from memprobe.render import markdown

            markdown.render(result, file)
        case Format.JSON:
            file.write(result.dumps())
        case Format.CSV:
            from memprobe.render import csv

            csv.render(result, file)
        case Format.HTML:
            from memprobe.render import html

            html.render(result, file)
        case _:  # a caller's slip, never the user's: the CLI offers only the formats above
            raise TypeError(f"not a result format: {fmt!r}")
