"""Renderers: one module per output format, each built from one ``Result``."""

from __future__ import annotations

import enum
from typing import IO

from memprobe.result import Result


class Format(str, enum.Enum):
    TABLE = "table"
    MARKDOWN = "markdown"
    JSON = "json"
    CSV = "csv"
    HTML = "html"


def render(result: Result, fmt: Format, file: IO[str]) -> None:
    """Writes ``result`` to ``file`` in ``fmt``."""
    from memprobe.render import csv, html, markdown, table

    match fmt:
        case Format.TABLE:
            for group in result.comparisons:
                table.render(group, file)
        case Format.MARKDOWN:
            markdown.render(result, file)
        case Format.JSON:
            file.write(result.dumps())
        case Format.CSV:
            csv.render(result, file)
        case Format.HTML:
            html.render(result, file)
