"""A sweep: one set of strategies at several shapes (--seq 256,512), each shape its own
comparison, the peaks side by side, and a baseline of it gated shape by shape."""

import dataclasses
import importlib.util
import io
import json
import re
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

import memprobe as api
from memprobe.api import resolve_plans
from memprobe.plan import job_labels, make_plan, sweep
from memprobe.render import Format, render
from memprobe.render.chart import AXES, SWEEP_HEADROOM, render_sweep_chart
from memprobe.render.frame import sweeps
from memprobe.result import Result
from memprobe.strategy import load_catalogue, select
from memprobe.targets import resolve_target
from test_cli import memprobe

REPORTS = Path(__file__).resolve().parent.parent / "reports"
SWEEP = ["--model", "tiny-e2b", "--target", "cpu", "--seq", "256,512", "--batch", "1",
         "--strategies", "unrolled,checkpoint"]


def _plan(seq=256, batch=1):
    return make_plan(model="tiny-e2b", strategies=select(load_catalogue(), ["unrolled", "checkpoint"]),
                     target=resolve_target("cpu", 1), seq_len=seq, batch_per_device=batch)


def compare_to_json(tmp_path: Path, *args: str):
    """`memprobe compare ARGS` written as JSON, with charts at tmp_path/c.png: its outcome
    (exit 0) and the result it wrote."""
    out = tmp_path / "result.json"
    r = memprobe("compare", *args, "--format", "json", "-o", str(out), "--chart", str(tmp_path / "c.png"))
    assert r.returncode == 0, r.stderr
    return r, Result.load(out)


def write_baseline(base: Path, *args: str) -> None:
    """`memprobe baseline ARGS --output BASE`, which must write it."""
    r = memprobe("baseline", *args, "--output", str(base))
    assert r.returncode == 0, r.stderr


def check_with_a_row_lowered(base: Path, comparison: int, row: int):
    """`memprobe check` of the baseline ``base`` with one row set 10% below what it compiles
    to (a regression to catch): that comparison's config, the row, and check's outcome."""
    data = json.loads(base.read_text())
    lowered = data["comparisons"][comparison]["rows"][row]
    lowered["temp_bytes"] -= lowered["peak_bytes"] // 10
    lowered["peak_bytes"] -= lowered["peak_bytes"] // 10
    base.write_text(json.dumps(data))
    return data["comparisons"][comparison]["config"], lowered, memprobe("check", "--baseline", str(base))


def test_a_sweep_plans_every_pair_once_lengths_outer_and_names_each_compile():
    plans = sweep(_plan(), [256, 512, 256], [1, 2])
    assert [(p.shapes.seq_len, p.shapes.batch_per_device) for p in plans] == [(256, 1), (256, 2), (512, 1), (512, 2)]
    assert [p.shapes.loss_chunks for p in plans] == [1, 1, 1, 1]  # each length's own default
    assert job_labels(plans)[:3] == ["unrolled @ 256 x 1", "checkpoint @ 256 x 1", "unrolled @ 256 x 2"]
    assert job_labels(sweep(_plan(), [256, 512], [1]))[2] == "unrolled @ seq 512"
    assert job_labels(sweep(_plan(), [256], [1, 4]))[3] == "checkpoint @ batch 4"
    assert job_labels([_plan()]) == ["unrolled", "checkpoint"]  # no sweep: the strategy alone
    # Plans that differ in more than their shapes (a baseline's): numbered rather than confused.
    assert job_labels([_plan(), _plan()]) == ["unrolled [1]", "checkpoint [1]", "unrolled [2]", "checkpoint [2]"]
    # A shape that is refused is refused before anything compiles, naming its value.
    with pytest.raises(api.BadInput, match="--seq 1000 is not a multiple of the attention block"):
        sweep(_plan(), [256, 1000], [1])
    with pytest.raises(api.BadInput, match="seq: give at least one value"):
        api.compare(model="tiny-e2b", target="cpu", seq=[], batch=1)


def test_a_sweep_compares_each_shape_and_a_baseline_of_it_gates_each(tmp_path):
    r, result = compare_to_json(tmp_path, *SWEEP, "--seq", "256,512,256")
    # A chart per shape, and the sweep's: each strategy's peak as a line across the shapes.
    assert sorted(p.name for p in tmp_path.glob("c*.png")) == ["c-1.png", "c-2.png", "c-sweep.png"]
    assert matplotlib.image.imread(tmp_path / "c-sweep.png").shape[2] in (3, 4)
    assert "memprobe: 256 named more than once in --seq; measured once" in r.stderr
    assert "measuring 2 strategies at 2 shapes (4 compiles) for tiny-e2b on cpu" in r.stderr
    assert "checkpoint @ seq 512" in r.stderr
    short, long = result.comparisons
    assert [(g[0].seq_len, [m.strategy for m in g]) for g in (short, long)] == [
        (256, ["unrolled", "checkpoint"]), (512, ["unrolled", "checkpoint"])]
    for a, b in zip(short, long):  # twice the tokens: more activations under either strategy,
        assert 0 < a.peak_bytes < b.peak_bytes  # and the same parameters and optimizer state
        assert 0 < b.argument_bytes - a.argument_bytes < a.argument_bytes / 100

    # Side by side, every format: a row per strategy, a column per length, each shape's answer.
    md = io.StringIO()
    render(result, Format.MARKDOWN, md)
    head = md.getvalue().split("\n\n")
    assert head[0] == ("## tiny-e2b train step (per-device batch 1) on cpu, 1 device: peak GiB per device "
                       "at each shape (compiler estimate)")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]] for line in head[1].splitlines()[2:]}
    assert rows == {m.strategy: [f"{m.peak_bytes / 2**30:.2f}", f"{n.peak_bytes / 2**30:.2f}"]
                    for m, n in zip(short, long)}
    assert head[2] == ("- seq 256: lowest peak: checkpoint\n- seq 512: lowest peak: checkpoint\n"
                       "- CPU backend figures: they do not stand for any accelerator.")
    table = io.StringIO()
    render(result, Format.TABLE, table)
    side = table.getvalue()[table.getvalue().index("at each shape"):]
    checkpoint = next(line for line in side.splitlines() if "checkpoint " in line)
    assert f"{short[1].peak_bytes / 2**30:.4f}" in checkpoint and f"{long[1].peak_bytes / 2**30:.4f}" in checkpoint
    page = io.StringIO()
    render(result, Format.HTML, page)
    assert "<th>seq 512</th>" in page.getvalue()

    # A baseline of the sweep: every shape gated, each against its own figures.
    base = tmp_path / "baseline.json"
    write_baseline(base, *SWEEP)
    r = memprobe("check", "--baseline", str(base))
    assert r.returncode == 0 and "4 of 4 within tolerance 2%" in r.stdout, r.stdout + r.stderr
    config, row, r = check_with_a_row_lowered(base, 1, 1)  # checkpoint at 512
    assert (config["seq_len"], row["strategy"]) == (512, "checkpoint")
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("3 of 4 within tolerance 2%; failing: checkpoint (regressed, tiny-e2b seq 512 x 1 on cpu)"
            in r.stdout)


def test_results_of_several_shapes_merged_are_set_side_by_side_and_over_capacity_marked():
    """The committed full-size E2B results on tpu7x at 8192 x 1 and 24576 x 8."""
    paths = [REPORTS / "gemma4-e2b-seq24576-b8-tpu7x-8.json", REPORTS / "gemma4-e2b-seq8192-b1-tpu7x-8.json"]
    result = Result([m for p in paths for m in Result.load(p).measurements])
    small, big = sorted(result.comparisons, key=lambda g: g[0].seq_len)
    md = io.StringIO()
    render(result, Format.MARKDOWN, md)
    head = md.getvalue().split("\n\n")
    assert head[0].startswith("## gemma4-e2b train step on tpu7x:2x2x1, 8 devices: peak GiB per device at each shape")
    header = [c.strip() for c in head[1].splitlines()[0].split("|")[1:-1]]
    assert header == ["strategy", "8192 x 1", "24576 x 8"]  # shortest first, whatever the order given
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
             for line in head[1].splitlines()[2:]}
    assert [m.strategy for m in small] == [m.strategy for m in big] == list(cells)
    for s, b in zip(small, big):
        assert s.fits and not b.fits
        assert cells[s.strategy] == [f"{s.peak_bytes / 2**30:.2f}", f"**{b.peak_bytes / 2**30:.2f} over capacity**"]
    assert "- 8192 x 1: cheapest that fits: unrolled" in head[2]
    assert "- 24576 x 8: nothing fits; lowest peak: scan-periods" in head[2]
    # Only some strategies at a third length: the others' cells say they were not compiled.
    third = Result.load(REPORTS / "gemma4-e2b-seq20480-b8-tpu7x-8.json").measurements
    table = io.StringIO()
    render(Result(result.measurements + third), Format.TABLE, table)
    text = table.getvalue()
    assert "-: that strategy was not compiled at that shape." in text
    assert "20480 x 8" in text[text.index("at each shape"):]
    # The sweep chart: the HBM capacity's dashed line where the axis puts 94.74 GiB.
    [sw] = sweeps(result.comparisons)
    img = matplotlib.image.imread(io.BytesIO(render_sweep_chart(sw)))
    red = np.array([0xC4, 0x4E, 0x52]) / 255
    reddish = (np.abs(img[:, :, :3] - red).max(axis=2) < 0.2).sum(axis=1)  # antialiased: two rows
    rows = np.flatnonzero(reddish > img.shape[1] / 4)  # a line across the axes, not the legend's dash
    top = max(m.peak_bytes for g in result.comparisons for m in g) * SWEEP_HEADROOM
    axes = AXES["top"] - AXES["bottom"]
    expected = img.shape[0] * (1 - AXES["bottom"] - axes * small[0].capacity_bytes / top)
    assert len(rows) and all(abs(r - expected) <= 2 for r in rows), (rows, expected)
    page = io.StringIO()
    render(result, Format.HTML, page)
    svgs = re.findall(r"<svg.*?</svg>", page.getvalue(), re.S)  # the sweep's chart and each shape's
    ids = [i for svg in svgs for i in re.findall(r'\bid="([^"]*)"', svg)]
    refs = {r for svg in svgs for r in re.findall(r"url\(#([^)]*)\)", svg)}
    assert len(svgs) == 3 and len(ids) == len(set(ids)) and refs <= set(ids)  # no id twice on the page
    # Every compile of the sweep failed (timed out, say): "failed" cells, and a chart still drawn.
    failed = Result([dataclasses.replace(m, status="failed", error="timed out after 1 s") for m in result.measurements])
    text = io.StringIO()
    render(failed, Format.TABLE, text)
    assert "8192 x 1: nothing compiled" in text.getvalue() and "│   failed │" in text.getvalue()
    assert render_sweep_chart(sweeps(failed.comparisons)[0]).startswith(b"\x89PNG")
    # Results that differ in shape and in target are neither sweep: no side by side.
    other = io.StringIO()
    render(Result(Result.load(paths[0]).measurements
                  + Result.load(REPORTS / "gemma4-e2b-seq8192-b1-h100-8.json").measurements), Format.MARKDOWN, other)
    assert "peak GiB per device" not in other.getvalue().split("\n\n")[0]


@pytest.mark.parametrize("width", [160, 100, 72, 60])
def test_a_narrow_terminal_leaves_out_whole_shapes_never_digits(width):
    """The committed full-size E2B results at four shapes side by side, on terminals of each
    width: no line wider than the terminal, no ellipsis, every peak shown whole on its row,
    the smallest shape always there, and the caption naming exactly the shapes left out,
    largest first."""
    from memprobe.render import table

    names = ["seq8192-b1", "seq20480-b8", "seq24576-b7", "seq24576-b8"]
    result = Result([m for n in names for m in Result.load(REPORTS / f"gemma4-e2b-{n}-tpu7x-8.json").measurements])
    [sw] = sweeps(result.comparisons)
    labels = list(sw.peaks.columns)
    assert labels == ["8192 x 1", "20480 x 8", "24576 x 7", "24576 x 8"]
    out = io.StringIO()
    table.render_sweep(sw, 2, out, width=width)
    text = out.getvalue()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width and "\u2026" not in text
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    under = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    left_out = re.search(r"Left out to fit \d+ columns: (.*?) \(a wider", " ".join(text.split()))
    hidden = left_out.group(1).split(", ") if left_out else []
    shown = labels[:len(labels) - len(hidden)]
    assert hidden == labels[len(shown):][::-1] and labels[0] in shown  # the last shape goes first
    assert lines[top].count("┳") == len(shown)  # the strategy column and a column per shape shown
    # Four shapes need 67 columns ("scan-layers-offload", then "capacity" the longest word of
    # a cell): at 60 the last shape goes.
    assert hidden == ([] if width >= 67 else ["24576 x 8"])
    body = lines[under + 1:next(i for i, line in enumerate(lines) if line.startswith("└"))]
    for strategy in sw.peaks.index:
        # A row's first line holds the strategy and each shown shape's peak, whole.
        [row] = [line for line in body if line.startswith(f"│ {strategy} ")]
        cells = [c.strip() for c in row.strip("│").split("│")[1:]]
        for label, cell in zip(shown, cells):
            value = sw.peaks.loc[strategy, label]
            assert cell.split(" ")[0] == ("-" if value != value else f"{value:.2f}"), (strategy, label, cell)
    assert "24576 x 8: nothing fits; lowest peak: scan-periods" in text  # every shape's answer stays


def test_room_short_of_every_cell_goes_first_to_the_column_it_unfolds_most():
    """At 100 columns the four committed E2B shapes cannot all show "over capacity" on one
    line. Every strategy is over at 24576 x 8 and only scan-periods at 24576 x 7, so the room
    there is goes to the former: one row breaks, not eleven (the room went left to right)."""
    from memprobe.render import table

    names = ["seq8192-b1", "seq20480-b8", "seq24576-b7", "seq24576-b8"]
    result = Result([m for n in names for m in Result.load(REPORTS / f"gemma4-e2b-{n}-tpu7x-8.json").measurements])
    [sw] = sweeps(result.comparisons)
    out = io.StringIO()
    table.render_sweep(sw, 2, out, width=100)
    lines = out.getvalue().splitlines()
    body = lines[next(i for i, l in enumerate(lines) if l.startswith("┡")) + 1:
                 next(i for i, l in enumerate(lines) if l.startswith("└"))]
    assert max(len(line) for line in lines) <= 100
    continued = [line for line in body if line.startswith("│ " + " " * 19 + " │")]
    assert len(body) == len(sw.peaks.index) + len(continued) and len(continued) == 1, "\n".join(body)
    assert all(line.rstrip().endswith("over capacity │") for line in body if line not in continued)


GPU = pytest.mark.skipif(importlib.util.find_spec("jax_plugins.xla_cuda12") is None,
                         reason="the gpu extra (JAX CUDA plugin) is not installed: ./scripts/setup.sh --gpu")


def test_several_targets_plan_one_comparison_each_at_each_shape():
    plans, skipped = resolve_plans(seq=[256], batch=[1], target=["v5e-4", "cpu", "v5e:2x2"], model="tiny-e2b")
    # v5e-4 and v5e:2x2 are one slice, planned once; cpu has no host memory: no offload there.
    assert [p.target.label for p in plans] == ["v5e:2x2 (4 devices)", "cpu (1 device)"]
    assert [s.name for s in plans[0].strategies] == ["unrolled", "checkpoint", "scan-checkpoint", "offload"]
    assert [s.name for s in plans[1].strategies] == ["unrolled", "checkpoint", "scan-checkpoint"]
    assert [(p.target.name, names) for p, names in skipped] == [("v5e", []), ("cpu", ["offload"])]
    assert job_labels(plans)[3:5] == ["offload @ v5e:2x2 (4 devices)", "unrolled @ cpu (1 device)"]
    # Several targets at several shapes: each target's sweep, targets outer.
    plans, _ = resolve_plans(seq=[256, 512], batch=[1], target=["v5e-4", "cpu"], model="tiny-e2b")
    assert [(p.target.name, p.shapes.seq_len) for p in plans] == [("v5e", 256), ("v5e", 512), ("cpu", 256),
                                                                  ("cpu", 512)]
    assert job_labels(plans)[7] == "offload @ v5e:2x2 (4 devices) @ seq 512"
    with pytest.raises(api.BadInput, match="--topology v5e:2x2 with several targets: name each"):
        resolve_plans(seq=[256], batch=[1], target=["v5e", "cpu"], topology="v5e:2x2", model="tiny-e2b")
    with pytest.raises(api.BadInput, match="unknown target 'v9'"):
        api.compare(model="tiny-e2b", seq=256, batch=1, target=["v5e", "v9"])
    r = memprobe("compare", "--model", "tiny-e2b", "--seq", "256", "--batch", "1", "--target", "v5e,,cpu")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "memprobe: error: Invalid value for '--target': 'v5e,,cpu' has an empty name (one name, or several "
        "separated by commas: --target v5p,h100)"]


@GPU
def test_several_targets_compare_side_by_side_and_a_baseline_of_them_gates_each(tmp_path):
    """A TPU and a GPU target in one run: each its own compiler's figures and capacity, the
    peaks side by side, and a baseline of both gated target by target."""
    args = ["--model", "tiny-e2b", "--seq", "256", "--batch", "1", "--target", "v5e,h100", "--devices", "1",
            "--strategies", "unrolled,checkpoint"]
    r, result = compare_to_json(tmp_path, *args)
    assert ("measuring 2 strategies on 2 targets (4 compiles) for tiny-e2b: v5e:1x1 (1 device), h100 (1 device)"
            in r.stderr)
    assert "checkpoint @ h100 (1 device)" in r.stderr
    assert sorted(p.name for p in tmp_path.glob("c*.png")) == ["c-1.png", "c-2.png", "c-sweep.png"]
    tpu, gpu = result.comparisons
    assert [(g[0].platform, g[0].capacity_bytes, [m.strategy for m in g]) for g in (tpu, gpu)] == [
        ("tpu", 16_911_433_728, ["unrolled", "checkpoint"]), ("cuda", 84_942_979_072, ["unrolled", "checkpoint"])]
    assert "libtpu" in tpu[0].versions and "jax-cuda12-plugin" in gpu[0].versions
    for t, g in zip(tpu, gpu):  # one model: its parameters and optimizer state (padded to the TPU's
        # tiles, a little larger there), and two compilers' own temporaries
        assert 0 <= t.argument_bytes - g.argument_bytes < g.argument_bytes / 100 and t.temp_bytes != g.temp_bytes

    md = io.StringIO()
    render(result, Format.MARKDOWN, md)
    head = md.getvalue().split("\n\n")
    assert head[0] == ("## tiny-e2b train step, seq 256 x per-device batch 1: peak GiB per device on each target "
                       "(compiler estimate)")
    assert [c.strip() for c in head[1].splitlines()[0].split("|")[1:-1]] == [
        "strategy", "v5e:1x1, 1 device", "h100, 1 device"]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]] for line in head[1].splitlines()[2:]}
    assert rows == {t.strategy: [f"{t.peak_bytes / 2**30:.2f}", f"{g.peak_bytes / 2**30:.2f}"]
                    for t, g in zip(tpu, gpu)}
    assert "- HBM per device: v5e:1x1, 1 device: 15.75 GiB; h100, 1 device: 79.11 GiB." in head[2]
    table = io.StringIO()
    render(result, Format.TABLE, table)
    assert "h100, 1 device: cheapest that fits: " in table.getvalue()

    base = tmp_path / "baseline.json"
    write_baseline(base, *args)
    config, row, r = check_with_a_row_lowered(base, 1, 0)  # unrolled on h100
    assert (config["target"], row["strategy"]) == ("h100", "unrolled")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "3 of 4 within tolerance 2%; failing: unrolled (regressed, tiny-e2b seq 256 x 1 on h100" in r.stdout


def test_a_sweep_on_several_targets_sets_each_targets_shapes_side_by_side(tmp_path):
    """Two lengths on v5e and on the CPU backend: a comparison per target and shape, then each
    target's sweep, judged against its own capacity, a chart each; a baseline gates every row.
    (The CPU compiles at these shapes are the sweep test's: answered from this run's cache.)"""
    args = ["--model", "tiny-e2b", "--seq", "256,512", "--batch", "1", "--target", "v5e,cpu", "--devices", "1",
            "--strategies", "unrolled,checkpoint"]
    r, result = compare_to_json(tmp_path, *args)
    assert ("measuring 2 strategies on 2 targets at 2 shapes (8 compiles) for tiny-e2b: v5e:1x1 (1 device), "
            "cpu (1 device)") in r.stderr
    assert "checkpoint @ v5e:1x1 (1 device) @ seq 512" in r.stderr
    assert sorted(p.name for p in tmp_path.glob("c*.png")) == [
        *(f"c-{i}.png" for i in range(1, 5)), "c-sweep-1.png", "c-sweep-2.png"]
    groups = result.comparisons
    assert [(g[0].platform, g[0].seq_len) for g in groups] == [("tpu", 256), ("tpu", 512), ("cpu", 256), ("cpu", 512)]
    tpu, cpu = sweeps(groups)
    assert (tpu.axis, cpu.axis) == ("shape", "shape")
    assert tpu.title == ("tiny-e2b train step (per-device batch 1) on v5e:1x1, 1 device: peak GiB per device at "
                         "each shape (compiler estimate)")
    for sw, mine in ((tpu, groups[:2]), (cpu, groups[2:])):
        assert list(sw.peaks.columns) == ["seq 256", "seq 512"]
        assert list(sw.capacities.values()) == [mine[0][0].capacity_bytes] * 2
        for label, group in zip(sw.peaks.columns, mine):
            for m in group:
                assert sw.peaks.loc[m.strategy, label] == m.peak_bytes / 2**30
    assert tpu.capacities["seq 256"] == 16_911_433_728 and cpu.capacities["seq 256"] is None
    assert (tpu.notes()[-1], cpu.notes()[-1]) == ("seq 512: cheapest that fits: unrolled",
                                                  "CPU backend figures: they do not stand for any accelerator.")
    md = io.StringIO()
    render(result, Format.MARKDOWN, md)
    headings = [line for line in md.getvalue().splitlines() if line.startswith("## ")]
    assert headings[:2] == [f"## {tpu.title}", f"## {cpu.title}"] and len(headings) == 6  # the sweeps, then each

    base = tmp_path / "baseline.json"
    write_baseline(base, *args)
    config, row, r = check_with_a_row_lowered(base, 3, 0)  # unrolled on cpu at seq 512
    assert (config["target"], config["seq_len"], row["strategy"]) == ("cpu", 512, "unrolled")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "7 of 8 within tolerance 2%; failing: unrolled (regressed, tiny-e2b seq 512 x 1 on cpu" in r.stdout


def test_results_on_several_targets_merged_are_set_side_by_side_each_against_its_own_hbm():
    """The committed full-size E2B results at 8192 x 1 on tpu7x (8 devices), h100 (8) and h200 (1)."""
    names = ["tpu7x-8", "h100-8", "h200-1"]
    result = Result([m for n in names for m in Result.load(REPORTS / f"gemma4-e2b-seq8192-b1-{n}.json").measurements])
    [sw] = sweeps(result.comparisons)
    assert sw.axis == "target"
    assert list(sw.peaks.columns) == ["tpu7x:2x2x1, 8 devices", "h100, 8 devices", "h200, 1 device"]  # as given
    for label, group in zip(sw.peaks.columns, result.comparisons):
        assert sw.capacities[label] == group[0].capacity_bytes
        for m in group:
            assert sw.peaks.loc[m.strategy, label] == m.peak_bytes / 2**30
    # Over capacity is each target's own: 100 GiB is over an H100's HBM, not over an H200's.
    def at_100_gib(m):
        return dataclasses.replace(m, temp_bytes=m.temp_bytes + 100 * 2**30 - m.peak_bytes)

    tpu, h100, h200 = ([at_100_gib(g[0])] for g in result.comparisons)
    [both] = sweeps([tpu, h100, h200])
    assert both.cell("unrolled", "h100, 8 devices", ".2f") == ("100.00 over capacity", True)
    assert both.cell("unrolled", "h200, 1 device", ".2f") == ("100.00", False)
    assert both.cell("unrolled", "tpu7x:2x2x1, 8 devices", ".2f") == ("100.00 over capacity", True)
    # The chart: each target's capacity as a dash of its own, at its own height.
    img = matplotlib.image.imread(io.BytesIO(render_sweep_chart(sw)))
    red = np.array([0xC4, 0x4E, 0x52]) / 255
    reddish = np.abs(img[:, :, :3] - red).max(axis=2) < 0.2
    top = max(max(sw.capacities.values()), max(m.peak_bytes for g in result.comparisons for m in g)) * SWEEP_HEADROOM
    axes = AXES["top"] - AXES["bottom"]
    for cap in sw.capacities.values():
        y = round(img.shape[0] * (1 - AXES["bottom"] - axes * cap / top))
        assert reddish[y - 2:y + 3].sum(axis=1).max() > img.shape[1] / 20, cap  # a dash, not a line across
        assert reddish[y - 2:y + 3].sum(axis=1).max() < img.shape[1] / 2, cap


def test_results_of_two_shapes_on_two_targets_merged_make_a_sweep_per_target():
    """The committed full-size E2B results at 8192 x 1 and 24576 x 8 on tpu7x and on H100 (8
    devices each): each target's shapes side by side, each judged against its own HBM."""
    names = ["seq8192-b1-tpu7x-8", "seq24576-b8-tpu7x-8", "seq8192-b1-h100-8", "seq24576-b8-h100-8"]
    result = Result([m for n in names for m in Result.load(REPORTS / f"gemma4-e2b-{n}.json").measurements])
    tpu, gpu = sweeps(result.comparisons)
    assert [sw.title.split(": ")[0] for sw in (tpu, gpu)] == [
        "gemma4-e2b train step on tpu7x:2x2x1, 8 devices", "gemma4-e2b train step on h100, 8 devices"]
    for sw, (small, big) in ((tpu, result.comparisons[:2]), (gpu, result.comparisons[2:])):
        assert list(sw.peaks.columns) == ["8192 x 1", "24576 x 8"]
        assert set(sw.capacities.values()) == {small[0].capacity_bytes}
        for label, group in (("8192 x 1", small), ("24576 x 8", big)):
            for m in group:
                assert sw.peaks.loc[m.strategy, label] == m.peak_bytes / 2**30
                assert sw.cell(m.strategy, label, ".2f")[1] == (not m.fits)
    # At the original report's shape nothing fits tpu7x's 94.74 GiB; on H100 scan-checkpoint
    # fits 79.11 GiB, where per-layer checkpoint is four times over.
    assert (tpu.answers["24576 x 8"].label, tpu.answers["24576 x 8"].strategy) == ("Nothing fits; lowest peak",
                                                                                    "scan-periods")
    assert (gpu.answers["24576 x 8"].label, gpu.answers["24576 x 8"].strategy) == ("Cheapest that fits",
                                                                                    "scan-checkpoint")
    assert gpu.peaks.loc["checkpoint", "24576 x 8"] > 4 * gpu.peaks.loc["scan-checkpoint", "24576 x 8"]
    md = io.StringIO()
    render(result, Format.MARKDOWN, md)
    assert md.getvalue().startswith(f"## {tpu.title}\n\n")
    assert md.getvalue().index(f"## {gpu.title}") < md.getvalue().index("## gemma4-e2b train step, seq 8192")
