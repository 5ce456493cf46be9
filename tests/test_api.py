"""memprobe as a library (``import memprobe``): the same plan, compiles and figures as the CLI."""

import io
import json
import subprocess
import sys

import pytest

import memprobe

TINY = dict(model="tiny-e2b", target="cpu", seq=256, batch=1)
FIT = dict(model="tiny-e2b", target="cpu", seq=256)  # the batch is what a fit searches


def test_compare_returns_every_strategys_figures_and_renders_them(tmp_path):
    events = []
    r = memprobe.compare(**TINY, strategies=["unrolled", "checkpoint", "unrolled"],
                         on_event=lambda name, state, s: events.append((name, state)))
    assert [m.strategy for m in r.measurements] == ["unrolled", "checkpoint"]  # asked order, each once
    unrolled, checkpoint = r.measurements
    assert unrolled.ok and checkpoint.ok
    assert 0 < checkpoint.peak_bytes < unrolled.peak_bytes  # remat lowers the peak
    assert checkpoint.peak_bytes == (checkpoint.argument_bytes + checkpoint.output_bytes
                                     - checkpoint.alias_bytes + checkpoint.temp_bytes)
    # Every strategy ends in one final event: from the cache or compiled.
    for name in ("unrolled", "checkpoint"):
        assert [st for n, st in events if n == name][-1] in ("cached", "done"), events

    df = memprobe.frame(r)
    assert list(df["strategy"]) == ["checkpoint", "unrolled"] and list(df["rank"]) == [1, 2]
    assert list(df["peak_bytes"]) == [checkpoint.peak_bytes, unrolled.peak_bytes]
    md = memprobe.report(r, "markdown")
    assert md.startswith("## tiny-e2b train step, seq 256 x per-device batch 1 on cpu, 1 device")
    assert f"{checkpoint.peak_bytes:,}" in md and "CPU backend figures" in md
    out = io.StringIO()
    assert memprobe.report(r, "csv", out) is None and out.getvalue().startswith("model,target,")

    path = tmp_path / "r.json"
    r.save(path)
    again = memprobe.load(path)
    assert [(m.strategy, m.peak_bytes) for m in again.measurements] == [
        ("unrolled", unrolled.peak_bytes), ("checkpoint", checkpoint.peak_bytes)]
    cli = subprocess.run([sys.executable, "-m", "memprobe", "report", str(path), "--format", "markdown"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and cli.stdout == md  # the CLI renders a library result the same
    # save writes JSON: a suffix naming another format is refused, not filled with JSON.
    with pytest.raises(memprobe.BadInput, match=r"r\.md: save writes JSON, not the markdown its \.md suffix names; "
                                                r"memprobe\.report\(result, 'markdown', file=\.\.\.\) writes markdown"):
        r.save(tmp_path / "r.md")
    with pytest.raises(memprobe.BadInput, match=r"not the picture its \.PNG suffix names; `memprobe report "):
        r.save(tmp_path / "r.PNG")
    assert not (tmp_path / "r.md").exists() and not (tmp_path / "r.PNG").exists()
    # A file of another kind is named, with the kinds load reads.
    (tmp_path / "other.json").write_text('{"schema": "memprobe.baseline"}')
    with pytest.raises(memprobe.BadInput, match=r"other\.json: memprobe\.load cannot read this \(schema "
                                                r"'memprobe\.baseline'; it reads 'memprobe\.result', 'memprobe\.fit'"):
        memprobe.load(tmp_path / "other.json")


def test_a_strategy_built_in_code_compiles_like_the_same_strategy_file(tmp_path):
    mine = memprobe.Strategy(name="mine", description="checkpoint, MLP hidden saved",
                             loop=memprobe.Loop.CHECKPOINT, policy=memprobe.Policy.NAMES, save=("mlp_hidden",))
    f = tmp_path / "from-file.toml"
    f.write_text('description = "the same, from a file"\nloop = "checkpoint"\npolicy = "names"\n'
                 'save = ["mlp_hidden"]\n')
    r = memprobe.compare(**TINY, strategies=[mine, "from-file"], strategy_files=[f], cache=False)
    a, b = r.measurements
    assert (a.strategy, b.strategy) == ("mine", "from-file")
    assert a.ok and b.ok and a.peak_bytes == b.peak_bytes > 0 and a.temp_bytes == b.temp_bytes


def test_defaults_leave_out_offload_where_there_is_no_host_memory():
    plan, skipped = memprobe.resolve_plan(**TINY)
    assert [s.name for s in plan.strategies] == ["unrolled", "checkpoint", "scan-checkpoint"]
    assert skipped == ["offload"]
    plan, skipped = memprobe.resolve_plan(**TINY, strategies="all")
    assert "offload" not in [s.name for s in plan.strategies] and "scan-periods" in [s.name for s in plan.strategies]
    assert set(skipped) == {"offload", "offload-mlp", "scan-layers-offload", "scan-offload"}


def test_all_takes_in_your_strategy_files_and_may_stand_in_a_list(tmp_path):
    # "all" silently left out a --strategy-file, and "all,mine" was "unknown strategy 'all'".
    mine, other = tmp_path / "mine.toml", tmp_path / "lib" / "other.toml"
    other.parent.mkdir()
    for f in (mine, other):
        f.write_text('description = "x"\nloop = "checkpoint"\n')
    built_in = [s.name for s in memprobe.resolve_plan(**TINY, strategies="all")[0].strategies]

    def planned(strategies):
        plan, skipped = memprobe.resolve_plan(**TINY, strategies=strategies, strategy_files=[mine],
                                              strategies_dirs=[other.parent])
        return [s.name for s in plan.strategies], skipped

    assert planned("all") == ([*built_in, "mine"], ["offload", "offload-mlp", "scan-layers-offload", "scan-offload"])
    names, skipped = planned(["scan-periods", "all", "other", "checkpoint"])
    assert names == ["scan-periods", *(n for n in built_in if n != "scan-periods"), "mine", "other"]
    assert "offload" in skipped  # brought in by "all": left out on cpu, as "all" alone does
    with pytest.raises(memprobe.BadInput, match="offload: target cpu has no host memory space"):
        planned(["offload", "all"])  # named: the user's wish, refused


def test_a_topology_alone_names_its_target():
    # No target given: the TPU kind the topology names (libtpu is asked for v5e's), else tpu7x.
    plan, _ = memprobe.resolve_plan(model="tiny-e2b", seq=256, batch=1, topology="v5e:2x2")
    assert (plan.target.name, plan.target.topology, plan.target.num_devices) == ("v5e", "v5e:2x2", 4)
    plan, _ = memprobe.resolve_plan(model="tiny-e2b", seq=256, batch=1)
    assert plan.target.topology == "tpu7x:2x2x1"


def test_a_target_written_as_its_vendor_writes_it_is_the_same_target():
    # "unknown target 'V5P-8' (known: ... v5p ...)", and a --topology V5P:2X2X1 alone meant tpu7x.
    def target(**kwargs):
        return memprobe.resolve_plan(model="tiny-e2b", seq=256, batch=1, **kwargs)[0].target

    assert target(target="V5P-8") == target(target="v5p-8") == target(topology="V5P:2X2X1")
    assert (target(target="V5P-8").name, target(target="V5P-8").topology) == ("v5p", "v5p:2x2x1")
    assert target(target="TPU7x") == target(target="tpu7x") and target(target="CPU").name == "cpu"


@pytest.mark.parametrize("kwargs,message", [
    (dict(seq=-1), "--seq must be a positive integer, got -1"),
    (dict(seq=1000), "--seq 1000 is not a multiple of the attention block (512); try 512 or 1024"),
    (dict(strategies="checkpoint"), "give a list of names (or 'all'), not the string 'checkpoint'"),
    (dict(strategies=["fastest"]), "unknown strategy 'fastest'"),
    (dict(strategies=["offload"]), "offload: target cpu has no host memory space to offload to"),
    (dict(target="h900"), "unknown target 'h900'"),
    (dict(model="gemma5"), "unknown model 'gemma5'"),
    (dict(jobs=0), "jobs must be a positive integer, got 0"),
    (dict(timeout_s=0), "--timeout must be a positive number of seconds, got 0"),
    (dict(devices="2"), "--devices must be a positive integer, got '2'"),
    (dict(step="eval"), "step: 'eval' is not one of train, grad"),
])
def test_bad_input_raises_badinput_before_any_compile(kwargs, message):
    with pytest.raises(memprobe.BadInput, match="^.*" + message.replace("(", r"\(").replace(")", r"\)")):
        memprobe.compare(**{**TINY, **kwargs})


def test_a_failed_compile_is_a_row_not_an_exception():
    r = memprobe.compare(**TINY, strategies=["checkpoint"], cache=False, timeout_s=0.5)
    (m,) = r.measurements
    assert not m.ok and m.error.startswith("timed out after")
    assert "checkpoint failed: timed out" in memprobe.report(r, "table")


def test_import_is_light_and_names_are_public():
    code = ("import sys, memprobe; assert 'jax' not in sys.modules and 'pandas' not in sys.modules; "
            "print(sorted(memprobe.__all__)); memprobe.compare; assert 'jax' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for name in ("compare", "frame", "load", "report", "Result", "Strategy", "BadInput"):
        assert repr(name) in r.stdout
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        memprobe.nothing


def test_check_gives_a_verdict_per_strategy_against_a_saved_baseline(tmp_path):
    base = memprobe.compare(**TINY, strategies=["unrolled", "checkpoint"])
    path = tmp_path / "baseline.json"
    base.save(path)
    verdicts = memprobe.check(path)
    assert [(v.base.strategy, v.status, v.passed) for v in verdicts] == [
        ("unrolled", "ok", True), ("checkpoint", "ok", True)]
    assert [v.now.peak_bytes for v in verdicts] == [m.peak_bytes for m in base.measurements]
    # A budget between the two peaks fails only the larger; an int of bytes or a size both do.
    between = (base.measurements[0].peak_bytes + base.measurements[1].peak_bytes) // 2
    for budget in (between, f"{between}B", f"{between / 2**20}MiB"):
        assert [v.status for v in memprobe.check(path, max_peak=budget)] == ["over budget", "ok"]
    with pytest.raises(memprobe.BadInput, match=f"--max-peak: '{between}' has no unit"):  # bytes? GiB?
        memprobe.check(path, max_peak=f"{between}")
    # The baseline's checkpoint 10% lower: now it has regressed.
    data = json.loads(path.read_text())
    row = data["comparisons"][0]["rows"][1]
    row["temp_bytes"] -= row["peak_bytes"] // 10
    path.write_text(json.dumps(data))
    checked = memprobe.check(path, tolerance="5%")
    assert [v.status for v in checked] == ["ok", "regressed"] and not checked.passed
    with pytest.raises(memprobe.BadInput, match="is not a percentage like 2%"):
        memprobe.check(path, tolerance="-3%")
    # The verdicts print and save as `memprobe check` prints and writes them (a bare list
    # before: a script wanting the pull-request markdown had to build it).
    md = memprobe.report(checked, "markdown")
    assert md.startswith("### memprobe check\n") and md.rstrip().endswith("failing: checkpoint (regressed)")
    assert f"| {checked[1].now.peak_bytes:,} " in md and "5%" in md
    saved = tmp_path / "verdicts.json"
    checked.save(saved)
    data = json.loads(saved.read_text())
    assert (data["schema"], data["passed"], data["tolerance"]) == ("memprobe.check", False, "5%")
    assert [v["now_peak_bytes"] for v in data["verdicts"]] == [v.now.peak_bytes for v in checked]
    assert memprobe.report(checked, "json") == saved.read_text()
    with pytest.raises(memprobe.BadInput, match=f"{saved}: check's verdicts, which memprobe.load does not read back"):
        memprobe.load(saved)
    with pytest.raises(memprobe.BadInput, match="unknown format 'csv'"):
        memprobe.report(checked, "csv")
    # A saved result judged instead of a recompile (nothing compiles): the real figures
    # against the lowered baseline, as the recompile judged them.
    judged = memprobe.check(path, current=base, tolerance="5%")
    assert [v.status for v in judged] == ["ok", "regressed"] and judged.current == "current"
    assert [v.now for v in judged] == base.measurements
    assert judged.to_json()["verdicts"] == checked.to_json()["verdicts"]
    with pytest.raises(memprobe.BadInput, match="current: an empty list; give the result files to judge"):
        memprobe.check(path, current=[])
    with pytest.raises(memprobe.BadInput, match="save writes JSON, not the markdown its .md suffix names; "
                                                r"memprobe.report\(checked, 'markdown', file=...\) writes markdown"):
        checked.save(tmp_path / "verdicts.md")


def test_fit_answers_with_a_compiled_size_that_fits_and_the_next_over():
    labels = set()
    r = memprobe.fit(**FIT, budget="100MiB", strategies=["checkpoint"],
                     on_event=lambda label, state, s: labels.add(label))
    b = r.answers()["checkpoint"]
    (s,) = r.searches
    assert b >= 1 and s.peaks[b] <= 100 * 2**20 < s.peaks[b + 1]
    assert {f"checkpoint batch {n}" for n in s.peaks} == labels  # one label per size compiled
    # Each size's figure is that batch's own compile, as compare makes it.
    one = memprobe.compare(**{**TINY, "batch": b}, strategies=["checkpoint"]).measurements[0]
    assert one.peak_bytes == s.peaks[b]


def test_a_fit_saves_loads_and_renders_as_the_cli_renders_it(tmp_path):
    # The search of the test above: from this worker's cache.
    r = memprobe.fit(**FIT, budget="100MiB", strategies=["checkpoint"])
    path = tmp_path / "fit.json"
    r.save(path)
    again = memprobe.load(path)
    assert isinstance(again, memprobe.FitResult) and again.answers() == r.answers()
    assert again.searches[0].peaks == r.searches[0].peaks and again.budget == 100 * 2**20
    md = memprobe.report(r, "markdown")
    assert md == memprobe.report(again, "markdown")
    b = r.answers()["checkpoint"]
    assert f"| checkpoint | {b} |" in md and "within 0.10 GiB" in md
    cli = subprocess.run([sys.executable, "-m", "memprobe", "report", str(path), "--format", "markdown"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and cli.stdout == md, cli.stderr  # the CLI renders a library fit the same
    assert json.loads(memprobe.report(r, "json")) == json.loads(path.read_text())
    # A fit renders as a table, markdown or JSON, as `memprobe fit` writes it; nothing else.
    with pytest.raises(memprobe.BadInput, match=r"unknown format 'csv' \(known: table, markdown, json\)"):
        memprobe.report(r, "csv")
    with pytest.raises(memprobe.BadInput, match=r"fit\.csv: save writes JSON, not the csv its \.csv suffix names; "
                                                r"memprobe\.report\(found, \.\.\.\) writes table or markdown"):
        r.save(tmp_path / "fit.csv")
    with pytest.raises(memprobe.BadInput, match="a list renders as the fits of one sweep"):
        memprobe.report([r, "checkpoint"], "table")
    with pytest.raises(memprobe.BadInput, match=r"fits\[1\]: seq 256 is in fits\[0\] too"):
        memprobe.report([r, again], "table")  # one fit twice is no sweep


@pytest.mark.parametrize("kwargs,message", [
    (dict(vary="width"), "vary: 'width' is not one of batch, seq"),
    (dict(budget=None), "target cpu has no HBM capacity to fit in"),
    (dict(vary="seq"), "--seq does not apply with --vary seq"),  # FIT gives a seq
    (dict(batch=2), "--batch applies with --vary seq"),
    (dict(budget="lots"), "--budget: 'lots' is not a size"),
    (dict(budget=1, host_ram="1TiB"), "--host-ram: target cpu has no host memory space to check"),
])
def test_fit_bad_input_raises_badinput(kwargs, message):
    with pytest.raises(memprobe.BadInput) as e:
        memprobe.fit(**{**FIT, "budget": "100MiB", **kwargs})
    assert message in str(e.value)


def test_explain_lists_what_is_live_at_each_peak_and_what_separates_two():
    from memprobe.render.explain import peak_parts

    events = []
    ex = memprobe.explain(diff=["unrolled", "checkpoint"], **TINY,
                          on_event=lambda name, state, s: events.append((name, state)))
    assert ex.ok and [m.strategy for m, _ in ex.answers] == ["unrolled", "checkpoint"]
    for name in ("unrolled", "checkpoint"):
        assert [st for n, st in events if n == name][-1] in ("cached", "done"), events
    # Dump files on or off, the compiler's figures are the same to the byte.
    compared = memprobe.compare(**TINY, strategies=["unrolled", "checkpoint"])
    assert [m.peak_bytes for m, _ in ex.answers] == [m.peak_bytes for m in compared.measurements]
    for m, e in ex.answers:
        assert e.heap_top_bytes == e.heap_bytes == m.temp_bytes  # the CPU backend's temp is its heap
        assert e.peak_live_bytes == sum(b.bytes for b in e.buffers) <= m.peak_bytes
        parts = peak_parts(m, e)  # constants sit beside the CPU temp: no part is negative
        assert sum(parts.values()) == m.peak_bytes and min(parts.values()) >= 0, parts
    # The groups that differ account for the whole gap in live bytes, the saved forward
    # activations (which checkpoint recomputes) first.
    (_, a), (_, b) = ex.answers
    assert sum(r["delta_bytes"] for r in ex.diff) == b.peak_live_bytes - a.peak_live_bytes < 0
    assert ex.diff[0]["label"] == "forward mlp_hidden dot_general" and ex.diff[0]["delta_bytes"] < 0
    assert ex.explanation("checkpoint") is b

    # The library renders as the CLI prints (the CLI adds its command line), and says CPU.
    md = memprobe.report(ex, "markdown", top=5)
    cli = subprocess.run([sys.executable, "-m", "memprobe", "explain", "--diff", "unrolled", "checkpoint",
                          "--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--batch", "1",
                          "--format", "markdown", "--top", "5"], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert [l for l in cli.stdout.splitlines() if not l.startswith("- Command:")] == md.splitlines()
    assert "Busiest point of device memory" in md and "CPU backend figures" in md and "HBM" not in md
    data = json.loads(memprobe.report(ex, "json"))
    assert [s["measurement"]["peak_bytes"] for s in data["strategies"]] == [m.peak_bytes for m, _ in ex.answers]
    assert data["diff"] == ex.diff


def test_explain_keeps_one_answer_when_the_other_compile_fails(tmp_path):
    memprobe.explain("checkpoint", **TINY)  # now in the results cache
    # Knobs no other test compiles, so the half-second timeout catches its compile.
    slow = memprobe.Strategy(name="slow", description="checkpoint, attention output saved",
                             loop=memprobe.Loop.CHECKPOINT, policy=memprobe.Policy.NAMES, save=("attention_out",))
    ex = memprobe.explain(diff=[slow, "checkpoint"], **TINY, timeout_s=0.5)
    assert not ex.ok and ex.diff is None
    (failed,) = ex.failed
    assert failed.strategy == "slow" and failed.error.startswith("timed out after")
    assert ex.explanation("checkpoint").peak_live_bytes > 0
    md = memprobe.report(ex, "markdown")
    assert "- slow failed: timed out after" in md and "## Live at the peak: checkpoint" in md
    data = json.loads(memprobe.report(ex, "json"))
    assert data["strategies"][0]["explanation"] is None and "diff" not in data
    # The CLI prints the answer it has, and exits 1 for the one it has not.
    f = tmp_path / "slow.toml"
    f.write_text('description = "the same, from a file"\nloop = "checkpoint"\npolicy = "names"\n'
                 'save = ["attention_out"]\n')
    cli = subprocess.run([sys.executable, "-m", "memprobe", "explain", "--diff", "slow", "checkpoint",
                          "--strategy-file", str(f), "--timeout", "0.5", "--model", "tiny-e2b", "--target", "cpu",
                          "--seq", "256", "--batch", "1", "--top", "3", "--format", "markdown"],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 1, cli.stderr
    assert "- slow failed: timed out after" in cli.stdout and "## Live at the peak: checkpoint" in cli.stdout
    assert "memprobe: slow: failed after" in cli.stderr and "Traceback" not in cli.stderr


@pytest.mark.parametrize("kwargs,message", [
    (dict(), "give exactly one of --strategy NAME or --diff A B"),
    (dict(strategy="checkpoint", diff=["unrolled", "checkpoint"]), "give exactly one of --strategy NAME"),
    (dict(diff="checkpoint"), "--diff needs two strategies, A B"),
    (dict(diff=["checkpoint"]), "--diff needs two strategies, A B"),
    (dict(diff=["checkpoint", "checkpoint"]), "--diff needs two different strategies, got checkpoint twice"),
    (dict(strategy="fastest"), "unknown strategy 'fastest'"),
    (dict(strategy="checkpoint", seq=0), "--seq must be a positive integer, got 0"),
])
def test_explain_refuses_bad_input_before_any_compile(kwargs, message):
    with pytest.raises(memprobe.BadInput, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        memprobe.explain(**{**TINY, **kwargs})


def test_an_explain_answer_renders_only_in_its_formats():
    ex = memprobe.Explained([])
    with pytest.raises(memprobe.BadInput, match=r"unknown format 'csv' \(known: table, markdown, json\)"):
        memprobe.report(ex, "csv")
    with pytest.raises(memprobe.BadInput, match="--top must be a positive integer, got 0"):
        memprobe.report(ex, "table", top=0)
