"""Every format renders from one JSON result, and shows the numbers that are in it."""

import functools
import io
import json
import re

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from conftest import jobs_for
from memprobe.compile import compile_job
from memprobe.render import Format, render
from memprobe.render.chart import AXES, PARTS, render_png
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
    assert f"**Lowest peak: `{best['strategy']}`**" in text
    assert "Command: `memprobe compare --test`" in text and "jax 0.12" in text


def test_csv_has_exact_bytes():
    df = pd.read_csv(io.StringIO(rendered(Format.CSV))).set_index("strategy")
    for name, r in rows().items():
        assert df.loc[name, "peak_bytes"] == r["peak_bytes"]
        assert df.loc[name, "temp_bytes"] == r["temp_bytes"]
        assert df.loc[name, "model"] == "tiny-e2b" and df.loc[name, "seq_len"] == 256


def test_table_shows_each_peak():
    text = rendered(Format.TABLE)
    for name, r in rows().items():
        [line] = [l for l in text.splitlines() if l.startswith("│") and f"│ {name} " in l]
        assert f"{r['peak_bytes'] / 2**30:.2f}" in line


def _bars(png: bytes) -> int:
    """Counts the bars in a chart by reading the image back: runs of the bottom segment's
    colour along a pixel row just above the x axis."""
    img = matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3]
    height = img.shape[0]
    y = int(round(height * (1 - AXES["bottom"]))) - 3
    colour = np.array([int(PARTS[0][1][i:i + 2], 16) / 255 for i in (1, 3, 5)])
    hit = np.abs(img[y] - colour).max(axis=1) < 0.02
    return int(np.count_nonzero(hit[1:] & ~hit[:-1]) + hit[0])


def test_chart_has_one_bar_per_strategy():
    result = Result.from_json(json.loads(result_json()))
    assert _bars(render_png(result.measurements)) == 3
    assert _bars(render_png(result.measurements[:2])) == 2


def test_html_embeds_the_chart_and_figures():
    import base64

    text = rendered(Format.HTML)
    for r in rows().values():
        assert f"{r['peak_bytes']:,}" in text
    [png] = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text)
    assert _bars(base64.b64decode(png)) == 3


@pytest.mark.parametrize("text,message", [
    ("[1, 2]", "not a memprobe result (expected a JSON object)"),
    ('{"schema": "other"}', "not a memprobe result (schema 'other')"),
    ('{"schema": "memprobe.result", "schema_version": 9}', "schema_version 9 is not supported"),
    ('{"schema": "memprobe.result", "schema_version": 1, "comparisons": []}', "comparisons: expected a non-empty list"),
])
def test_malformed_results_are_refused(text, message):
    from memprobe.errors import BadInput

    with pytest.raises(BadInput, match=re.escape(message)):
        Result.from_json(json.loads(text))


def test_host_column_is_explained_only_where_a_row_offloads():
    from pathlib import Path

    from memprobe.render.frame import footnotes

    # The committed full-size E2B H100 comparison (real compiles, see the README) offloads
    # 0.05 GiB with `offload`; the tiny CPU comparison offloads nothing.
    [h100] = Result.load(Path(__file__).parent.parent / "reports" / "gemma4-e2b-seq8192-b1-h100-8.json").comparisons
    assert any(m.host_bytes for m in h100)
    [note] = [n for n in footnotes(h100) if n.startswith("host GiB")]
    assert "per device" in note and "not checked against the host's RAM" in note
    [cpu] = Result.from_json(json.loads(result_json())).comparisons
    assert not [n for n in footnotes(cpu) if n.startswith("host GiB")]
