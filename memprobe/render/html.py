"""A self-contained HTML report: the table (pandas), the flags, the charts inline as SVG (sharp
at any zoom, their words searchable text)."""

from __future__ import annotations

import html
import re
from typing import IO

import pandas as pd

from memprobe.flags import sanity_flags
from memprobe.render import chart, markdown
from memprobe.render.frame import Sweep, answer, footnotes, sweeps, title
from memprobe.result import Result

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px}
td{text-align:right}td:nth-child(2),td:nth-child(12),td:nth-child(13){text-align:left}
.notes{font-size:12px;color:#555}"""


def render(result: Result, file: IO[str]) -> None:
    groups = result.comparisons
    file.write(f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{html.escape(page_title(groups))}</title>"
               f"<style>{_STYLE}</style></head><body>\n")
    charts = 0
    for sw in sweeps(groups):
        file.write(f"<h2>{html.escape(sw.title)}</h2>\n" + _sweep_table(sw)
                   + "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in sw.notes()) + "</ul>\n")
        charts += 1
        file.write(_figure(chart.render_sweep_chart(sw, "svg"), charts, f"peak per strategy at each {sw.axis}"))
    for group in groups:
        file.write(f"<h2>{html.escape(title(group[0]))}</h2>\n")
        file.write(markdown.markdown_frame(group).to_html(index=False, escape=True, border=0))
        a = answer(group)
        if a is not None:
            file.write(f"<p><b>{html.escape(a.label)}: {html.escape(a.strategy)}</b>{html.escape(a.rest)}</p>\n")
        flags = [f for fl in sanity_flags(group).values() for f in fl]
        if flags:
            file.write("<ul>" + "".join(f"<li>{html.escape(f.strategy)}: <b>{html.escape(f.kind)}</b>: "
                                        f"{html.escape(f.reason)}</li>" for f in flags) + "</ul>\n")
        charts += 1
        file.write(_figure(chart.render_chart(group, "svg"), charts, "peak per strategy"))
        file.write("<div class='notes'><ul>" + "".join(
            f"<li>{html.escape(n)}</li>" for n in footnotes(group, result.command)) + "</ul></div>\n")
    file.write("</body></html>\n")


def page_title(groups: list[list]) -> str:
    """What a browser tab or a bookmark shows: the first comparison's title (every page said
    "memprobe report"), and how many more the page holds."""
    more = f" (and {len(groups) - 1} more)" if len(groups) > 1 else ""
    return f"memprobe: {title(groups[0][0])}{more}"


def _figure(svg: bytes, n: int, label: str) -> str:
    """An SVG chart as an element of the page: from its <svg> tag on (no XML prolog), its ids
    (clip paths) prefixed with the chart's number, so that no two charts' ids are the same."""
    text = svg.decode()
    text = re.sub(r'(\bid="|url\(#|href="#)', rf"\g<1>c{n}-", text[text.index("<svg"):])
    return f"<figure role='img' aria-label='{html.escape(label)}'>{text}</figure>\n"


def _sweep_table(sw: Sweep) -> str:
    """A sweep's peaks, a cell over capacity (or failed) in bold."""
    out = pd.DataFrame({"strategy": [html.escape(str(s)) for s in sw.peaks.index]})
    for label in sw.peaks.columns:
        cells = [sw.cell(strategy, label, ".2f") for strategy in sw.peaks.index]
        out[html.escape(label)] = [f"<b>{html.escape(t)}</b>" if marked else html.escape(t) for t, marked in cells]
    return out.to_html(index=False, escape=False, border=0)
