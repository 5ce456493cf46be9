"""Terminal tables that fit the terminal without hiding a digit.

rich shrinks a table that is wider than the terminal by cutting cells short with an
ellipsis, so on a 100-column terminal a peak of 101.75 GiB read "101…" and a byte count
"96,41…". Here a number or a name is never cut: when the table is too wide, whole columns
are left out, least needed first, and the caption says which (the markdown, CSV and JSON
formats always have every column).
"""

from __future__ import annotations

import dataclasses

from rich.markup import escape
from rich.table import Table
from rich.text import Text


@dataclasses.dataclass(frozen=True)
class Column:
    header: str
    justify: str = "right"
    style: str | None = None
    wrap: bool = False  # prose that may break at spaces (notes, verdicts); anything else never breaks
    drop: int | None = None  # order of leaving out on a narrow terminal, lowest first; None: always shown


def _width(text: str, breaks: bool) -> int:
    """Columns the cell needs: whole, or its longest word when it may break at spaces."""
    plain = Text.from_markup(text).plain
    if breaks:
        return max((Text(word).cell_len for word in plain.split()), default=0)
    return max((Text(line).cell_len for line in plain.splitlines()), default=0)


def _need(column: Column, cells: list[str], whole_header: bool) -> tuple[int, int]:
    """(the least width the column can take without cutting a word, the width it would like)."""
    header = Text(column.header).cell_len
    least = max([header if whole_header else _width(column.header, True),
                 *(_width(cell, column.wrap) for cell in cells)])
    return least, max([least, header, *(_width(cell, False) for cell in cells)])


def _total(widths: list[int]) -> int:
    """A table's width from its columns': padding (2) and a rule (1) each, and the outer edge."""
    return 1 + sum(w + 3 for w in widths)


def narrowest(columns: list[Column], rows: list[list[str]]) -> int:
    """The fewest terminal columns ``fitted_table`` needs without breaking a word: the
    columns that are never left out, headers broken at spaces."""
    return _total([_need(c, [row[i] for row in rows], False)[0] for i, c in enumerate(columns) if c.drop is None])


def fitted_table(title: str, columns: list[Column], rows: list[list[str]], caption: list[str],
                 width: int, full: str | None = "--format markdown or csv") -> Table:
    """A rich table of ``rows`` (cells in rich markup) for a terminal ``width`` columns wide:
    headers on one line where everything fits so; else headers broken at spaces and, while
    it is still too wide, columns with a ``drop`` order left out, lowest first. Every column
    gets a fixed width, so rich never narrows one below its longest word. ``full`` names the
    formats that show every column, for the caption (None: only a wider terminal)."""
    by_column = [[row[i] for row in rows] for i in range(len(columns))]
    whole_needs = [_need(c, cells, True) for c, cells in zip(columns, by_column)]
    broken_needs = [_need(c, cells, False) for c, cells in zip(columns, by_column)]
    shown = list(range(len(columns)))
    whole = _total([whole_needs[i][0] for i in shown]) <= width
    hidden = []
    for _, i in sorted((c.drop, i) for i, c in enumerate(columns) if c.drop is not None):
        if whole or _total([broken_needs[i][0] for i in shown]) <= width:
            break
        shown.remove(i)
        hidden.append(columns[i].header)
    sizes = [(whole_needs if whole else broken_needs)[i] for i in shown]
    widths = [least for least, _ in sizes]
    slack = width - _total(widths)
    # Room left over goes to prose first, so it breaks less, then to headers, so they break less.
    # Among prose columns, first to the one that unfolds the most rows for each column of width
    # it takes: a column of eleven "354.73 over capacity" cells before one with a single such cell.
    def unfolded_per_column(k: int) -> float:
        least, wanted = sizes[k]
        folded = sum(_width(cell, False) > least for cell in by_column[shown[k]])
        return folded / max(1, wanted - least)

    prose = sorted((k for k in range(len(sizes)) if columns[shown[k]].wrap), key=lambda k: -unfolded_per_column(k))
    for k, (least, wanted) in [(k, sizes[k]) for k in prose] + list(enumerate(sizes)):
        extra = max(0, min(slack, wanted - widths[k]))
        widths[k] += extra
        slack -= extra
    where = f"a wider terminal, or {full}," if full else "a wider terminal"
    note = ([f"Left out to fit {width} columns: {', '.join(hidden)} ({where} shows every column)."]
            if hidden else [])
    t = Table(title=title, caption=escape("\n".join(note + caption)), caption_justify="left")
    for k, i in enumerate(shown):
        c = columns[i]
        # Where even this is too wide, a cell folds onto more lines rather than losing characters.
        t.add_column(c.header, justify=c.justify, style=c.style, width=widths[k], overflow="fold")
    for row in rows:
        t.add_row(*(row[i] for i in shown))
    return t
