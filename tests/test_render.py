"""Every format renders from one JSON result, and shows the numbers that are in it."""

import functools
import io
import json
import re
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from conftest import jobs_for
from memprobe.compile import compile_job
from memprobe.render import Format, render
from memprobe.render.chart import AXES, PARTS, render_chart
from memprobe.result import Result
from memprobe.targets import resolve_target

STRATEGIES = ("unrolled", "checkpoint", "scan-checkpoint")


@functools.cache
def result_json() -> str:
    """A real comparison (tiny model, CPU backend), saved and read back as JSON."""
    jobs = jobs_for("tiny-e2b", resolve_target("cpu", 1), seq=256, batch=1, strategies=STRATEGIES)
    result = Result([compile_job(j) for j in jobs.values()], command="memprobe compare --test")
    return result.dumps()


def rows() -> dict[str, dict]:
    [comparison] = json.loads(result_json())["comparisons"]
    return {r["strategy"]: r for r in comparison["rows"]}


def rendered(fmt: Format) -> str:
    out = io.StringIO()
    render(Result.from_json(json.loads(result_json())), fmt, out)
    return out.getvalue()


def test_json_round_trips_with_schema_and_versions():
    data = json.loads(result_json())
    assert data["schema"] == "memprobe.result" and data["schema_version"] == 1
    assert data["command"] == "memprobe compare --test"
    again = json.loads(rendered(Format.JSON))
    assert again["comparisons"] == data["comparisons"]
    for r in rows().values():
        assert r["peak_bytes"] == r["argument_bytes"] + r["output_bytes"] - r["alias_bytes"] + r["temp_bytes"]
        assert r["versions"]["jax"].startswith("0.12") and r["strategy_knobs"]["loop"]
    assert rows()["unrolled"]["flops_ratio"] == 1.0


def test_markdown_rows_carry_the_json_figures():
    text = rendered(Format.MARKDOWN)
    lines = {l.split("|")[2].strip(): l for l in text.splitlines() if l.startswith("|") and "---" not in l}
    for name, r in rows().items():
        assert f"{r['peak_bytes'] / 2**30:.2f}" in lines[name]
        assert f"{r['peak_bytes']:,}" in lines[name]
        assert f"{r['flops_ratio']:.2f}x" in lines[name]
    best = min(rows().values(), key=lambda r: r["peak_bytes"])
    # The CPU backend knows no capacity: the answer is the lowest peak, exact.
    assert (f"**Lowest peak: `{best['strategy']}`**, {best['peak_bytes'] / 2**30:.2f} GiB "
            f"({best['peak_bytes']:,} bytes) per device; no capacity known to fit in.") in text
    assert "Command: `memprobe compare --test`" in text and "jax 0.12" in text


def test_csv_has_exact_bytes():
    df = pd.read_csv(io.StringIO(rendered(Format.CSV))).set_index("strategy")
    for name, r in rows().items():
        assert df.loc[name, "peak_bytes"] == r["peak_bytes"]
        assert df.loc[name, "temp_bytes"] == r["temp_bytes"]
        assert df.loc[name, "model"] == "tiny-e2b" and df.loc[name, "seq_len"] == 256


def test_table_shows_each_peak():
    # Tiny CPU peaks are hundredths of a GiB: the terminal table, which has no bytes column,
    # gives them three significant digits (four decimals), where two decimals would read
    # 0.03-0.06 and leave the ranking unexplained. Full-size tables keep two (the narrow-
    # terminal test reads the committed E2B table's peaks at two).
    text = rendered(Format.TABLE)
    peaks = {name: r["peak_bytes"] / 2**30 for name, r in rows().items()}
    assert 0.01 <= min(peaks.values()) < 0.1
    shown = {}
    for name, peak in peaks.items():
        [line] = [l for l in text.splitlines() if l.startswith("│") and f"│ {name} " in l]
        assert re.search(rf"│\s+{peak:.4f} │", line), line
        shown[name] = f"{peak:.4f}"
    assert len(set(shown.values())) == len(shown), shown  # every strategy's peak told apart
    low = min(peaks, key=peaks.get)  # the answer under the table gives it as the table does
    assert f"Lowest peak: {low}, {shown[low]} GiB (" in " ".join(text.split())


def _bars(png: bytes, colour: str = PARTS[0][1]) -> int:
    """Counts the bars in a chart by reading the image back: runs of the bottom segment's
    colour (or ``colour``) along a pixel row just above the x axis."""
    img = matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3]
    height = img.shape[0]
    y = int(round(height * (1 - AXES["bottom"]))) - 3
    colour = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    hit = np.abs(img[y] - colour).max(axis=1) < 0.02
    return int(np.count_nonzero(hit[1:] & ~hit[:-1]) + hit[0])


def test_chart_has_one_bar_per_strategy():
    result = Result.from_json(json.loads(result_json()))
    assert _bars(render_chart(result.measurements)) == 3
    assert _bars(render_chart(result.measurements[:2])) == 2


def test_chart_saves_as_svg_or_pdf_the_same_bytes_every_time():
    # --chart FILE.svg / FILE.pdf: the same chart in another format, words kept as text in the
    # SVG, and no save date in either, so a committed chart saved again is unchanged.
    result = Result.from_json(json.loads(result_json()))
    svg = render_chart(result.measurements, "svg")
    assert svg.startswith(b"<?xml") and b"<svg" in svg
    for m in result.measurements:
        assert re.search(rb">\s*" + m.strategy.encode() + rb"\s*</text>", svg), m.strategy
    pdf = render_chart(result.measurements, "pdf")
    assert pdf.startswith(b"%PDF") and b"CreationDate" not in pdf
    assert render_chart(result.measurements, "svg") == svg and render_chart(result.measurements, "pdf") == pdf
    assert _bars(render_chart(result.measurements)) == 3  # PNG still the default


def test_html_embeds_the_chart_and_figures():
    # The chart is inline SVG (it was a PNG in base64): the same drawing as --chart FILE.svg,
    # its ids numbered for the page, its words text a reader can search.
    import xml.etree.ElementTree as ET

    text = rendered(Format.HTML)
    m = Result.from_json(json.loads(result_json())).measurements[0]
    assert f"<title>memprobe: {m.model} train step, seq {m.seq_len} x per-device batch {m.batch_per_device} on " in text
    for r in rows().values():
        assert f"{r['peak_bytes']:,}" in text
    [svg] = re.findall(r"<svg.*?</svg>", text, re.S)
    ET.fromstring(svg)  # well-formed
    saved = render_chart(Result.from_json(json.loads(result_json())).measurements, "svg").decode()
    assert svg == re.sub(r'(\bid="|url\(#|href="#)', r"\g<1>c1-", saved[saved.index("<svg"):]).rstrip()
    for name in rows():
        assert re.search(r">\s*" + name + r"\s*</text>", svg), name


@pytest.mark.parametrize("text,message", [
    ("[1, 2]", "not a memprobe result (expected a JSON object)"),
    ('{"schema": "other"}', "not a memprobe result (schema 'other'; expected 'memprobe.result')"),
    ('{"comparisons": []}', "not a memprobe result (no \"schema\" field; expected 'memprobe.result')"),
    ('{"schema": "memprobe.result", "schema_version": 9}', "schema_version 9 is not supported"),
    ('{"schema": "memprobe.result", "schema_version": 1, "comparisons": []}', "comparisons: expected a non-empty list"),
])
def test_malformed_results_are_refused(text, message):
    from memprobe.errors import BadInput

    with pytest.raises(BadInput, match=re.escape(message)):
        Result.from_json(json.loads(text))


def test_a_result_file_that_is_no_utf8_is_refused_in_one_line(tmp_path):
    # A file saved as Latin-1 by an editor was a UnicodeDecodeError traceback.
    from memprobe.errors import BadInput

    path = tmp_path / "r.json"
    path.write_bytes(b'{"schema": "memprobe.result", "command": "caf\xe9"}')
    with pytest.raises(BadInput, match=re.escape(f"{path}: not valid JSON (not UTF-8 text: byte 0xe9 at offset 45)")):
        Result.load(path)


def test_host_column_is_explained_only_where_a_row_offloads():
    from pathlib import Path

    from memprobe.render.frame import footnotes

    # The committed full-size E2B H100 comparison (real compiles, see docs/findings.md) offloads
    # 0.05 GiB with `offload`; the tiny CPU comparison offloads nothing.
    [h100] = Result.load(Path(__file__).parent.parent / "reports" / "gemma4-e2b-seq8192-b1-h100-8.json").comparisons
    assert any(m.host_bytes for m in h100)
    [note] = [n for n in footnotes(h100) if n.startswith("host GiB")]
    assert "per device" in note and "not checked against the host's RAM" in note
    [cpu] = Result.from_json(json.loads(result_json())).comparisons
    assert not [n for n in footnotes(cpu) if n.startswith("host GiB")]


REPORTS = Path(__file__).resolve().parent.parent / "reports"
ELLIPSIS = "\u2026"


def _shown_columns(text: str) -> str:
    """The header block of a rich table: the lines between the top rule and the one under the headers."""
    lines = text.splitlines()
    top = next(i for i, l in enumerate(lines) if l.startswith("┏"))
    under = next(i for i, l in enumerate(lines) if l.startswith("┡"))
    return " ".join(lines[top + 1:under])


@pytest.mark.parametrize("width", [160, 130, 100, 80, 60])
def test_a_narrow_terminal_loses_whole_columns_never_digits(width):
    """The committed full-size E2B table (11 strategies, 13 columns) on terminals of each width:
    no line wider than the terminal, nothing cut short with an ellipsis, every strategy's
    peak in full on its row, and the caption naming exactly the columns left out."""
    from memprobe.render import table

    result = Result.load(REPORTS / "gemma4-e2b-seq24576-b8-tpu7x-8.json")
    [group] = result.comparisons
    out = io.StringIO()
    table.render(group, out, width=width)
    text = out.getvalue()
    assert max(len(l) for l in text.splitlines()) <= width
    assert ELLIPSIS not in text
    for m in group:  # rank, strategy, peak: the first three cells of the row
        assert re.search(rf"^│\s+\d+ │ {m.strategy}\s+│\s+{m.peak_bytes / 2**30:.2f} │", text, re.M), m.strategy
    headers = _shown_columns(text)
    left_out = re.search(r"Left out to fit \d+ columns: (.*?) \(a wider", " ".join(text.split()))
    hidden = left_out.group(1).split(", ") if left_out else []
    for always in ("strategy", "peak", "verdict"):
        assert always in headers
    for name in ("args", "XLA", "compile", "temp", "FLOPs"):
        shown = name in headers
        assert shown != any(h.startswith(name) for h in hidden), (name, headers, hidden)
    assert (width >= 160) == (not hidden)


@pytest.mark.parametrize("width", [100, 70])
def test_a_narrow_fit_table_keeps_the_answer_and_every_digit(width):
    from memprobe.render import FitFormat
    from memprobe.render.fit import render as render_fit
    from memprobe.search import FitResult

    fit = FitResult.from_json(json.loads((REPORTS / "gemma4-e2b-seq24576-tpu7x-8-fit.json").read_text()))
    out = io.StringIO()
    render_fit(fit, FitFormat.TABLE, out, width=width)
    text = out.getvalue()
    assert max(len(l) for l in text.splitlines()) <= width and ELLIPSIS not in text
    [line] = [l for l in text.splitlines() if "│ scan-checkpoint " in l]
    assert re.search(r"│ scan-checkpoint\s+│\s+6 │", line), line  # the largest batch that fits
    assert "89.79" in line and "103.31" in line  # the answer's peak and the next batch's
    assert "Left out to fit" in text and "--format markdown," in " ".join(text.split())


def test_a_table_too_wide_even_without_its_optional_columns_folds_cells_rather_than_cut_them():
    from rich.console import Console

    from memprobe.render.columns import Column, fitted_table

    t = fitted_table("t", [Column("strategy", justify="left"), Column("peak bytes"), Column("temp", drop=1)],
                     [["scan-layers-offload", "142,000,478,048", "1"]], [], 24)
    out = io.StringIO()
    Console(file=out, width=24).print(t)
    text = out.getvalue()
    assert ELLIPSIS not in text and "Left out to fit 24 columns: temp" in " ".join(text.split())
    body = [l.strip("│").split("│") for l in text.splitlines() if l.startswith("│")]
    strategy, peak = ("".join(cells[k].strip() for cells in body) for k in (0, 1))
    assert (strategy, peak) == ("scan-layers-offload", "142,000,478,048")  # folded across lines, all there


@pytest.mark.parametrize("width", [220, 100, 60])
def test_the_strategy_catalogue_never_breaks_a_name_or_knob(width):
    from rich.console import Console

    from memprobe.cli.strategies import print_catalogue
    from memprobe.strategy import load_catalogue

    catalogue = load_catalogue()
    out = io.StringIO()
    print_catalogue(list(catalogue.values()), Console(file=out, width=width))
    text = out.getvalue()
    assert max(len(l) for l in text.splitlines()) <= width and ELLIPSIS not in text
    for name, s in catalogue.items():  # each name and its policy whole, on one line
        assert re.search(rf"(^│ |^){re.escape(name)}( +│|:)", text, re.M), name
        assert s.knobs()["policy"] in text
    assert ("┏" in text) == (width == 220)  # a table where it fits, else one block per strategy


def _answer_line(result: Result, fmt: Format) -> str:
    out = io.StringIO()
    render(result, fmt, out)
    return next(l for l in out.getvalue().splitlines()
                if l.startswith(("**Cheapest", "**Nothing", "**Lowest", "Cheapest", "Nothing", "Lowest")))


def test_every_format_answers_which_strategy_to_use():
    """The committed full-size results, each format's one-line answer under the table."""
    import dataclasses

    from memprobe.render.frame import answer

    # E2B at 24576 x 8 on tpu7x: nothing fits; the lowest peak and how far over, to the byte.
    [group] = Result.load(REPORTS / "gemma4-e2b-seq24576-b8-tpu7x-8.json").comparisons
    low = min(group, key=lambda m: m.peak_bytes)
    over = (low.peak_bytes - low.capacity_bytes) / 2**30
    a = answer(group)
    assert (a.label, a.strategy) == ("Nothing fits; lowest peak", "scan-periods")
    assert a.rest.startswith(f", {low.peak_bytes / 2**30:.2f} GiB ({low.peak_bytes:,} bytes) per device, "
                             f"{over:.2f} GiB over the 94.74 GiB of HBM.") and over > 0
    # Eight examples a device: the same step's examples one at a time is named as the way on.
    assert a.rest.endswith("at which each strategy fits; `--batch 1 --grad-accum 8` steps on the same "
                           "examples, one at a time.")
    # At batch 1 there is nothing to split: E4B on one H100 with fp32 AdamW fits under no strategy.
    group = next(g for g in Result.load(REPORTS / "gemma4-e4b-seq8192-b1-h100-1-optimizers.json").comparisons
                 if not any(m.fits for m in g))
    assert group[0].batch_per_device == 1 and answer(group).rest.endswith("at which each strategy fits.")
    # At 8192 x 1 unrolled fits: no remat is the cheapest, the lowest peak is named beside it.
    result = Result.load(REPORTS / "gemma4-e2b-seq8192-b1-tpu7x-8.json")
    [group] = result.comparisons
    a = answer(group)
    assert (a.label, a.strategy) == ("Cheapest that fits", "unrolled") and group[0].strategy == "unrolled"
    assert "the baseline (no recompute)" in a.rest and "lowest peak: scan-offload, 12.74 GiB at 1.26x" in a.rest
    assert _answer_line(result, Format.MARKDOWN).startswith("**Cheapest that fits: `unrolled`**, the baseline")
    assert _answer_line(result, Format.TABLE).startswith("Cheapest that fits: unrolled, the baseline")
    page = io.StringIO()
    render(result, Format.HTML, page)
    assert "<p><b>Cheapest that fits: unrolled</b>, the baseline (no recompute): peak" in page.getvalue()
    # Without unrolled: the fewest matmul FLOPs among those that fit wins (dots-no-batch, which
    # saves the matmuls, at 0.84x checkpoint's), and the lowest peak is named beside it.
    rest = [m for m in group if m.strategy != "unrolled"]
    a = answer(rest)
    assert (a.strategy, rest[0].strategy) == ("dots-no-batch", "checkpoint")
    assert a.strategy == min(rest, key=lambda m: (m.matmul_flops, m.host_bytes, m.peak_bytes)).strategy
    assert ", 0.84x the matmul FLOPs of checkpoint: peak" in a.rest and "lowest peak: scan-offload" in a.rest
    # A budget only the cheap-but-large fits under: it is chosen over the lower peaks.
    checkpoint = next(m for m in group if m.strategy == "checkpoint")
    tight = [dataclasses.replace(m, capacity_bytes=checkpoint.peak_bytes) for m in group]
    fits = [m for m in tight if m.fits]
    a = answer(tight)
    assert a.strategy == min(fits, key=lambda m: (m.matmul_flops, m.host_bytes, m.peak_bytes)).strategy != "unrolled"
    assert f"{(checkpoint.peak_bytes - next(m for m in tight if m.strategy == a.strategy).peak_bytes) / 2**30:.2f} GiB under" in a.rest


def test_a_program_the_tpu_compiler_refused_is_a_row_over_capacity_in_every_format():
    """libtpu refuses some programs over HBM outright; the row is an answer like any over
    capacity: ranked by what the compiler said it needed, its reason among the flags, never
    "failed". The committed E2B 24576 x 8 figures, unrolled's row made such a refusal (its
    test against a real refusal is in test_fit)."""
    import dataclasses

    from memprobe.gate import Tolerance, judge
    from memprobe.render.frame import comparison_frame, sweeps

    [group] = Result.load(REPORTS / "gemma4-e2b-seq24576-b8-tpu7x-8.json").comparisons
    unrolled = group[0]
    needed = unrolled.peak_bytes
    why = (f"over HBM: the TPU compiler needed {needed / 2**30:.2f} GiB ({needed:,} bytes) of 94.74 GiB and "
           "refused the program (JaxRuntimeError: INVALID_ARGUMENT: Invalid TPU program.)")
    empty = {f: 0 for f in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "host_argument_bytes",
                            "host_output_bytes", "host_alias_bytes", "host_temp_bytes")}
    refused = dataclasses.replace(unrolled, status="refused", error=why, needed_bytes=needed, xla_peak_bytes=None,
                                  matmul_flops=None, flops=None, **empty)
    rows = [refused, *group[1:]]
    assert refused.fits is False and not refused.ok
    df = comparison_frame(rows)
    row = df[df["strategy"] == "unrolled"].iloc[0]
    assert row["peak_bytes"] == needed and row["verdict"] == "over capacity (refused)" and not isinstance(row["error"], str)
    assert list(df["rank"]) == list(range(1, len(rows) + 1))  # ranked with the others, by the compiler's total
    assert list(df["peak_bytes"]) == sorted(m.peak_bytes if m.ok else needed for m in rows)
    assert f"over capacity: {why.removeprefix('over HBM: ')}" in row["flag_reasons"]
    result = Result(rows, command="memprobe compare --test")
    again = Result.from_json(json.loads(result.dumps()))  # the refusal survives JSON
    assert again.measurements[0] == refused
    out = {}
    for fmt in (Format.TABLE, Format.MARKDOWN, Format.CSV, Format.HTML):
        text = io.StringIO()
        render(again, fmt, text)
        out[fmt] = text.getvalue()
        assert "failed" not in out[fmt].lower(), fmt
    assert f"flag on unrolled: over capacity: {why.removeprefix('over HBM: ')}" in " ".join(out[Format.TABLE].split())
    assert "**over capacity (refused)**" in out[Format.MARKDOWN]
    assert "over capacity (refused): the TPU compiler ran out of HBM and refused the program" in out[Format.MARKDOWN]
    csv = pd.read_csv(io.StringIO(out[Format.CSV]))
    assert csv.loc[csv["strategy"] == "unrolled", "peak_bytes"].item() == needed
    # The chart: a bar of parts for each compiled row, one grey bar of the total for the refused.
    from memprobe.render.chart import REFUSED

    tiny = Result.from_json(json.loads(result_json())).measurements  # arguments tall enough to count by
    png = render_chart([dataclasses.replace(tiny[0], status="refused", needed_bytes=tiny[0].peak_bytes, **empty), *tiny[1:]])
    assert (_bars(png), _bars(png, REFUSED[1])) == (len(tiny) - 1, 1)
    assert _bars(render_chart(tiny), REFUSED[1]) == 0
    # In a sweep the cell gives the total and says it was refused.
    other = [dataclasses.replace(m, seq_len=20480) for m in group]
    [sw] = sweeps([rows, other])
    label = next(c for c in sw.peaks.columns if "24576" in c)
    assert sw.cell("unrolled", label, ".2f") == (f"{needed / 2**30:.2f} over capacity (refused)", True)
    # The gate fails a configuration the compiler now refuses, and says why rather than "failed".
    from memprobe.gate import verdicts_json
    from memprobe.render.check import verdict_frame

    v = judge(unrolled, refused, Tolerance(relative=0.02), None)
    assert (v.status, v.passed) == ("refused", False)
    [shown] = verdict_frame(verdicts_json([v], Tolerance(relative=0.02), None, "b.json")["verdicts"]).to_dict("records")
    assert (shown["now bytes"], shown["delta GiB"], shown["status"]) == (f"{needed:,}", "+0.000", why)
    [entry] = verdicts_json([v], Tolerance(relative=0.02), None, "b.json")["verdicts"]
    assert (entry["status"], entry["now_peak_bytes"], entry["delta_bytes"], entry["error"]) == ("refused", needed, 0, why)


def test_gpu_reports_say_what_jax_lets_a_step_use_and_tpu_reports_do_not():
    # A GPU's "fits" is against the whole device; JAX's allocator gets 75% of it unless told
    # otherwise. Every GPU footer says so (compare and fit), no TPU or CPU footer does, and a
    # GPU fit's budget is not called one "the compiler enforces".
    from memprobe.render.fit import footnotes as fit_footnotes
    from memprobe.render.frame import GPU_ALLOCATOR_NOTE, footnotes
    from memprobe.search import FitResult

    [h100] = Result.load(REPORTS / "gemma4-e2b-seq8192-b1-h100-1.json").comparisons
    [tpu] = Result.load(REPORTS / "gemma4-e2b-seq8192-b1-tpu7x-8.json").comparisons
    [cpu] = Result.from_json(json.loads(result_json())).comparisons
    assert GPU_ALLOCATOR_NOTE in footnotes(h100) and "XLA_PYTHON_CLIENT_MEM_FRACTION" in GPU_ALLOCATOR_NOTE
    assert GPU_ALLOCATOR_NOTE not in footnotes(tpu) and GPU_ALLOCATOR_NOTE not in footnotes(cpu)
    gpu_fit, tpu_fit = (FitResult.from_json(json.loads((REPORTS / f"gemma4-e2b-seq24576-{t}-8-fit.json").read_text()))
                        for t in ("h100", "tpu7x"))
    assert GPU_ALLOCATOR_NOTE in fit_footnotes(gpu_fit) and GPU_ALLOCATOR_NOTE not in fit_footnotes(tpu_fit)
    assert "the GPU compiler does not enforce it" in " ".join(fit_footnotes(gpu_fit))
    assert "the target's HBM as the compiler enforces it" in " ".join(fit_footnotes(tpu_fit))
