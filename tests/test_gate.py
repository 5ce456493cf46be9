"""The CI gate end to end: `memprobe baseline` then `memprobe check`, as a CI job runs them."""

import json
from pathlib import Path

import pytest

from test_cli import memprobe

CONFIG = ["--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--batch", "1",
          "--strategies", "unrolled,checkpoint"]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    path = tmp_path_factory.mktemp("gate") / "baseline.json"
    r = memprobe("baseline", *CONFIG, "--output", str(path))
    assert r.returncode == 0, r.stderr
    return path


def _edited(baseline, tmp_path, edit):
    data = json.loads(baseline.read_text())
    edit(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return path


def test_unchanged_recompile_passes_and_writes_step_summary(baseline, tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    r = memprobe("check", "--baseline", str(baseline), "--no-cache", env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 of 2 within tolerance 2%" in r.stdout
    text = summary.read_text()
    assert text.startswith("earlier step\n### memprobe check")
    peaks = {row["strategy"]: row["peak_bytes"] for row in json.loads(baseline.read_text())["comparisons"][0]["rows"]}
    for name, peak in peaks.items():
        [line] = [l for l in text.splitlines() if f"| {name} " in l]
        assert f"{peak:,}" in line and "| ok" in line


def test_baseline_ten_percent_lower_fails_naming_the_strategy(baseline, tmp_path):
    def lower(data):
        row = data["comparisons"][0]["rows"][1]  # checkpoint
        row["temp_bytes"] -= row["peak_bytes"] // 10

    # The baseline given as an argument, like `memprobe report FILE`, is the same gate.
    # A job summary that cannot be written is said, and the exit code stays the verdicts' (it was 2).
    r = memprobe("check", str(_edited(baseline, tmp_path, lower)), env={"GITHUB_STEP_SUMMARY": "/nonexistent/s.md"})
    assert r.returncode == 1
    assert ("memprobe: GITHUB_STEP_SUMMARY /nonexistent/s.md: cannot write (No such file or directory); the verdicts "
            "are not in the job summary") in r.stderr and "error" not in r.stderr
    assert "failing: checkpoint (regressed)" in r.stdout
    [line] = [l for l in r.stdout.splitlines() if l.startswith("│") and "│ checkpoint " in l]
    assert "regressed" in line and "+11.1" in line


def test_the_verdicts_as_json_and_markdown_for_other_ci_systems(baseline, tmp_path):
    def lower(data):
        row = data["comparisons"][0]["rows"][1]  # checkpoint
        row["temp_bytes"] -= row["peak_bytes"] // 10

    edited = _edited(baseline, tmp_path, lower)
    out = tmp_path / "verdicts.json"
    r = memprobe("check", str(edited), "--format", "json", "-o", str(out))
    assert r.returncode == 1, r.stderr  # the exit code is the gate's whatever the format
    assert r.stdout == "" and f"memprobe: wrote {out}" in r.stderr
    answer = json.loads(out.read_text())
    assert answer["schema"] == "memprobe.check" and answer["passed"] is False
    assert answer["summary"].endswith("failing: checkpoint (regressed)")
    from memprobe.api import load

    # The edited baseline's peaks as memprobe reads them (from their parts, temp lowered).
    base_rows = {m.strategy: {"peak_bytes": m.peak_bytes} for m in load(edited).measurements}
    now_rows = {row["strategy"]: row for row in json.loads(baseline.read_text())["comparisons"][0]["rows"]}
    by_name = {v["strategy"]: v for v in answer["verdicts"]}
    assert [by_name[n]["status"] for n in ("unrolled", "checkpoint")] == ["ok", "regressed"]
    for name, v in by_name.items():  # exact bytes: the baseline's, and today's compile (the unedited figures)
        assert v["baseline_peak_bytes"] == base_rows[name]["peak_bytes"]
        assert v["now_peak_bytes"] == now_rows[name]["peak_bytes"]
        assert v["delta_bytes"] == v["now_peak_bytes"] - v["baseline_peak_bytes"]
        assert v["allowed_growth_bytes"] == int(v["baseline_peak_bytes"] * 0.02)
    assert by_name["checkpoint"]["delta_bytes"] > by_name["checkpoint"]["allowed_growth_bytes"]

    md = memprobe("check", str(baseline), "--format", "markdown")
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith("### memprobe check\n\n| configuration ")
    assert "2 of 2 within tolerance 2%" in md.stdout and "┃" not in md.stdout


def _lower_checkpoint(data):
    row = data["comparisons"][0]["rows"][1]  # checkpoint
    row["temp_bytes"] -= row["peak_bytes"] // 10


@pytest.fixture(scope="module")
def saved_verdicts(baseline, tmp_path_factory):
    """check's verdicts saved as JSON, checkpoint's a regression (its baseline lowered 10%)."""
    where = tmp_path_factory.mktemp("verdicts")
    edited = _edited(baseline, where, _lower_checkpoint)
    saved = where / "verdicts.json"
    r = memprobe("check", str(edited), "-o", str(saved))
    assert r.returncode == 1 and json.loads(saved.read_text())["passed"] is False, r.stderr
    return edited, saved


def test_report_renders_saved_verdicts_as_check_printed_them(saved_verdicts):
    # `check --format json` was an archive nothing printed again: `report` refused it, so a
    # later CI job that wanted the markdown for a pull request had to recompile every strategy.
    edited, saved = saved_verdicts
    for fmt in ("table", "markdown", "json"):
        now = memprobe("check", str(edited), "--format", fmt)
        again = memprobe("report", str(saved), "--format", fmt)
        assert (now.returncode, again.returncode) == (1, 0), again.stderr  # the gate's exit is check's
        if fmt == "json":  # the same verdicts; `command` is the line that wrote each
            assert again.stdout == saved.read_text()
            assert {**json.loads(now.stdout), "command": None} == {**json.loads(again.stdout), "command": None}
        else:
            assert again.stdout == now.stdout and "regressed" in again.stdout
    assert memprobe("report", str(saved)).stdout.startswith("### memprobe check\n")  # report's default: markdown


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["verdicts"][0].pop("status"), "verdicts[0]: missing field 'status'"),
    (lambda d: d["verdicts"][1].update(now_peak_bytes="12"),
     "verdicts[1]: now_peak_bytes: expected an integer or null, got '12'"),
    (lambda d: d["verdicts"][0].update(seq_len=True), "verdicts[0]: seq_len: expected an integer, got True"),
    (lambda d: d["verdicts"][0].update(passed=1), "verdicts[0]: passed: expected true or false, got 1"),
    (lambda d: d["verdicts"][0].update(status="sideways"),
     "verdicts[0]: status: 'sideways' is not one of ok, improved, regressed, over budget, host regressed, refused, "
     "failed"),
    (lambda d: d["verdicts"].__setitem__(0, []), "verdicts[0]: expected an object"),
    (lambda d: d.update(verdicts=[]), "verdicts: expected a non-empty list"),
    (lambda d: d.update(schema_version=2), "schema_version 2 is not supported (this memprobe reads 1)"),
    (lambda d: d.pop("summary"), "summary: missing or not a string"),
])
def test_malformed_saved_verdicts_are_one_line_exit_2(saved_verdicts, tmp_path, edit, message):
    _, saved = saved_verdicts
    data = json.loads(saved.read_text())
    edit(data)
    path = tmp_path / "v.json"
    path.write_text(json.dumps(data))
    r = memprobe("report", str(path))
    assert (r.returncode, r.stdout, r.stderr.strip()) == (2, "", f"memprobe: error: {path}: {message}")


def test_saved_verdicts_render_alone_in_checks_formats(saved_verdicts, baseline, tmp_path):
    _, saved = saved_verdicts
    for args, message in [
        (["--format", "csv"], "check's verdicts render as table, markdown or json, not csv"),
        (["-o", str(tmp_path / "v.html")],
         "check's verdicts render as table, markdown or json, not html (from --output's .html suffix; give --format)"),
        (["--chart", str(tmp_path / "v.png")], "--chart does not apply to check's verdicts"),
        (["--top", "3"], "--top does not apply to check's verdicts"),
        ([str(baseline)], "check's verdicts render on their own, not merged with other results"),
    ]:
        r = memprobe("report", str(saved), *args)
        assert (r.returncode, r.stdout, r.stderr.strip()) == (2, "", f"memprobe: error: {saved}: {message}")


def test_current_judges_a_saved_result_without_compiling(baseline, tmp_path):
    # The gate recompiled every strategy on the machine that gated: with the compiles made
    # in another job (or on a bigger machine), it had to make them all again.
    same = memprobe("check", str(baseline), "--current", str(baseline))
    assert same.returncode == 0, same.stderr
    assert "measuring" not in same.stderr and "compiled" not in same.stderr  # nothing compiles, nothing from cache
    assert same.stdout.rstrip().endswith(f"memprobe check of {baseline}: 2 of 2 within tolerance 2%")

    def changed(data):  # checkpoint 11% above the baseline, and one strategy the baseline lacks
        rows = data["comparisons"][0]["rows"]
        rows[1]["temp_bytes"] += rows[1]["peak_bytes"] // 9
        rows.append({**rows[0], "strategy": "mine"})

    current = _edited(baseline, tmp_path, changed)
    saved = tmp_path / "verdicts.json"
    r = memprobe("check", str(baseline), "--current", str(current), "-o", str(saved))
    assert r.returncode == 1, r.stderr
    assert f"memprobe: {current}: not in the baseline, so not judged: mine (tiny-e2b seq 256 x 1 on cpu)" in r.stderr
    answer = json.loads(saved.read_text())
    assert (answer["current"], answer["passed"]) == (str(current), False)
    assert answer["summary"] == (f"memprobe check of {current}: 1 of 2 within tolerance 2%; failing: checkpoint "
                                 "(regressed)")
    rows = {row["strategy"]: row for row in json.loads(current.read_text())["comparisons"][0]["rows"]}
    by_name = {v["strategy"]: v for v in answer["verdicts"]}
    for name in ("unrolled", "checkpoint"):  # the saved figures, as a recompile's would be judged
        peak = sum(rows[name][k] for k in ("argument_bytes", "output_bytes", "temp_bytes")) - rows[name]["alias_bytes"]
        assert by_name[name]["now_peak_bytes"] == peak
    # Printed again, saying what was judged; on a narrow terminal the summary stays one line
    # (it was broken at the table's width, so a CI log search missed it).
    again = memprobe("report", str(saved), "--format", "table", env={"COLUMNS": "80"}).stdout
    assert any(l.startswith("│") and "checkpoint" in l and "regressed" in l for l in again.splitlines())
    assert again.splitlines()[-1] == answer["summary"] and len(answer["summary"]) > 80


def test_current_fails_a_strategy_it_lacks_and_keeps_the_versions_rule(baseline, tmp_path):
    lacking = _edited(baseline, tmp_path, lambda d: d["comparisons"][0]["rows"].pop(1))
    r = memprobe("check", str(baseline), "--current", str(lacking), "--format", "markdown")
    assert r.returncode == 1, r.stderr
    assert "| checkpoint | 0.034 " in r.stdout and f"| failed: not in {lacking} |" in r.stdout

    def drift(data):
        for row in data["comparisons"][0]["rows"]:
            row["versions"]["jax"] = "0.11.0"

    # The current result's versions are compared with the baseline's, not this machine's.
    older = _edited(baseline, tmp_path, drift)
    r = memprobe("check", str(baseline), "--current", str(older))
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    jax = json.loads(baseline.read_text())["comparisons"][0]["rows"][0]["versions"]["jax"]
    assert r.stderr.strip() == (f"memprobe: error: {older}: unrolled (tiny-e2b seq 256 x 1 on cpu) was compiled with "
                                f"jax 0.11.0, the baseline's with jax {jax}; pass --allow-version-drift to judge it "
                                "anyway")
    assert memprobe("check", str(baseline), "--current", str(older), "--allow-version-drift").returncode == 0
    assert memprobe("check", str(older), "--current", str(older)).returncode == 0  # this machine's jax is no matter


def test_current_results_of_several_jobs_are_judged_as_one(baseline, tmp_path):
    # A CI pipeline compiles its strategies in parallel jobs: each job's result alone lacks
    # the others' strategies; given together they are the whole comparison.
    data = json.loads(baseline.read_text())
    halves = []
    for i, row in enumerate(data["comparisons"][0]["rows"]):
        part = json.loads(json.dumps(data))
        part["comparisons"][0]["rows"] = [row]
        halves.append(tmp_path / f"job{i}.json")
        halves[-1].write_text(json.dumps(part))
    r = memprobe("check", str(baseline), "--current", str(halves[0]), "--current", str(halves[1]), "--format", "json")
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert answer["summary"] == f"memprobe check of {halves[0]}, {halves[1]}: 2 of 2 within tolerance 2%"
    assert [v["now_peak_bytes"] for v in answer["verdicts"]] == [v["baseline_peak_bytes"] for v in answer["verdicts"]]
    # One job's result twice would hide which figure is judged: refused as `report` refuses it.
    twice = memprobe("check", str(baseline), "--current", str(halves[0]), "--current", str(halves[0]))
    assert (twice.returncode, twice.stdout) == (2, ""), twice.stderr
    assert twice.stderr.strip() == (f"memprobe: error: {halves[0]}: strategy 'unrolled' (tiny-e2b, seq 256 x "
                                    f"per-device batch 1, cpu) is in {halves[0]} too")


@pytest.mark.parametrize("args,message", [
    (["--no-cache"], "--no-cache applies to a recompile, and with --current nothing compiles"),
    (["--jobs", "2"], "--jobs applies to a recompile, and with --current nothing compiles"),
    (["--current", "reports/gemma4-e2b-seq24576-h100-8-fit.json"],
     "reports/gemma4-e2b-seq24576-h100-8-fit.json: a fit result, not a result to judge; `memprobe baseline` writes "
     "one (as does compare's --format json)"),
    (["--current", "none.json"], "none.json: file not found"),
])
def test_current_refuses_what_it_cannot_use(baseline, args, message):
    extra = [] if "--current" in args else ["--current", str(baseline)]
    r = memprobe("check", str(baseline), *extra, *args, cwd=Path(__file__).resolve().parent.parent)
    assert (r.returncode, r.stdout, r.stderr.strip()) == (2, "", f"memprobe: error: {message}")


def test_budget_and_absolute_tolerance(baseline):
    r = memprobe("check", "--baseline", str(baseline), "--max-peak", "40MiB", "--tolerance", "0.01GiB")
    # unrolled (about 60 MiB) is over the budget, checkpoint (about 35 MiB) under it.
    assert r.returncode == 1
    assert "failing: unrolled (over budget)" in r.stdout and "checkpoint (" not in r.stdout


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(schema_version=7), "schema_version 7 is not supported"),
    (lambda d: d["comparisons"][0]["rows"][0].pop("strategy"), "rows[0]: missing field 'strategy'"),
    (lambda d: d["comparisons"][0]["rows"][0].update(temp_bytes="lots"), "temp_bytes: expected a byte count"),
    (lambda d: d["comparisons"][0]["rows"][0].update(num_devices="4"), "num_devices: expected an integer, got '4'"),
    (lambda d: d["comparisons"][0]["rows"][0].update(status="sideways"), "status: 'sideways' is not one of ok, refused, failed"),
    (lambda d: d["comparisons"][0]["rows"][0].update(status="refused"),
     "needed_bytes: a refused row needs the bytes the compiler needed, got None"),
    (lambda d: d["comparisons"][0]["rows"][0].update(oom_allocations="lots"), "oom_allocations: expected a list, got 'lots'"),
    (lambda d: d["comparisons"][0]["rows"][0].update(oom_allocations=[{"size": "1 GiB", "values": "2", "shapes": "x",
                                                                       "heap": True}]),
     "oom_allocations[0]: values: expected int, got '2'"),
    (lambda d: [r["versions"].update(jax="0.11.0") for r in d["comparisons"][0]["rows"]],
     "baseline was compiled with jax 0.11.0"),
    (lambda d: d["comparisons"][0]["rows"][0]["strategy_knobs"].update(loop="sideways"),
     "loop: 'sideways' is not one of"),
])
def test_malformed_baseline_is_one_line_exit_2(baseline, tmp_path, edit, message):
    r = memprobe("check", "--baseline", str(_edited(baseline, tmp_path, edit)))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("memprobe: error:")]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("name,kind", [
    ("gemma4-e2b-seq24576-h100-8-fit.json", "a fit result"),
    ("gemma4-e2b-seq24576-b8-tpu7x-8-explain-scan-layers-offload.json", "an explain result"),
])
def test_another_kind_of_memprobe_file_is_named_as_no_baseline(name, kind):
    # It said "not a memprobe result (schema 'memprobe.fit'; ...)", though memprobe wrote it.
    path = Path(__file__).resolve().parent.parent / "reports" / name
    r = memprobe("check", str(path))
    assert r.returncode == 2 and r.stderr.strip() == (f"memprobe: error: {path}: {kind}, not a baseline; `memprobe "
                                                      "baseline` writes one (as does compare's --format json)")


def test_version_drift_can_be_allowed(baseline, tmp_path):
    def drift(data):
        for row in data["comparisons"][0]["rows"]:
            row["versions"]["jax"] = "0.11.0"

    r = memprobe("check", "--baseline", str(_edited(baseline, tmp_path, drift)), "--allow-version-drift")
    assert r.returncode == 0, r.stdout + r.stderr


def test_missing_baseline_and_bad_tolerance(tmp_path):
    r = memprobe("check", "--baseline", str(tmp_path / "none.json"))
    assert r.returncode == 2 and "none.json: file not found" in r.stderr
    r = memprobe("check", "--baseline", str(tmp_path / "none.json"), "--tolerance", "lots")
    assert r.returncode == 2 and "--tolerance: 'lots' is not a percentage like 2% or a size like 0.5GiB" in r.stderr
    # 2 meant as 2% was a gate of 2 bytes; nan% was a traceback.
    r = memprobe("check", "--baseline", str(tmp_path / "none.json"), "--tolerance", "2")
    assert r.returncode == 2 and r.stderr.strip() == ("memprobe: error: --tolerance: '2' has no unit: a percentage "
                                                      "like 2%, or a size like 2GiB (2B for bytes)")
    r = memprobe("check", "--baseline", str(tmp_path / "none.json"), "--tolerance", "nan%")
    assert r.returncode == 2 and r.stderr.strip() == "memprobe: error: --tolerance: 'nan%' is not a percentage like 2%"
    # A budget of nothing failed every strategy "under 0.00 GiB" after recompiling them all.
    r = memprobe("check", "--baseline", str(tmp_path / "none.json"), "--max-peak", "0GiB")
    assert r.returncode == 2 and r.stderr.strip() == "memprobe: error: --max-peak must be a positive size, got '0GiB'"
    r = memprobe("check")
    assert r.returncode == 2 and r.stderr.strip() == ("memprobe: error: give the baseline to check against: "
                                                      "memprobe check BASELINE (or --baseline BASELINE)")
    r = memprobe("check", "a.json", "--baseline", "b.json")
    assert r.returncode == 2 and "two baselines given, a.json and --baseline b.json; give one" in r.stderr
    r = memprobe("check", "a.json", "--format", "json", "-o", "/nonexistent/v.json")
    assert r.returncode == 2 and r.stderr.strip() == ("memprobe: error: --output /nonexistent/v.json: "
                                                      "directory /nonexistent does not exist")
    r = memprobe("check", "a.json", "--format", "yaml")
    assert r.returncode == 2 and "Invalid value for '--format': 'yaml' is not one of" in r.stderr


def test_host_bytes_that_grew_fail_the_gate_though_the_peak_held(tmp_path):
    # Offload trades HBM for host memory, so a gate on the peak alone would pass a change that
    # doubles what a strategy puts in host RAM. Tiny E2B on a deviceless v5p: offload puts its
    # layer inputs in host memory; the check answers from the cache the baseline filled.
    path = tmp_path / "offload.json"
    config = ["--model", "tiny-e2b", "--target", "v5p", "--devices", "1", "--seq", "512", "--batch", "1",
              "--strategies", "checkpoint,offload"]
    r = memprobe("baseline", *config, "--output", str(path))
    assert r.returncode == 0, r.stderr
    rows = {row["strategy"]: row for row in json.loads(path.read_text())["comparisons"][0]["rows"]}
    assert rows["offload"]["host_temp_bytes"] > 0 and rows["checkpoint"]["host_bytes"] == 0

    same = memprobe("check", "--baseline", str(path))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "host now bytes" in same.stdout and "2 of 2 within tolerance 2%" in same.stdout

    def less_host(data):
        row = next(r for r in data["comparisons"][0]["rows"] if r["strategy"] == "offload")
        row["host_temp_bytes"] -= row["host_temp_bytes"] // 10  # now about 11% above it

    r = memprobe("check", "--baseline", str(_edited(path, tmp_path, less_host)))
    assert r.returncode == 1, r.stdout
    assert "failing: offload (host regressed)" in r.stdout and "checkpoint (" not in r.stdout
    # Saved, the verdicts print again with their host columns.
    saved = tmp_path / "verdicts.json"
    edited = _edited(path, tmp_path, less_host)
    assert memprobe("check", str(edited), "--format", "json", "-o", str(saved)).returncode == 1
    assert memprobe("report", str(saved), "--format", "table").stdout == r.stdout
    # An absolute tolerance above the difference lets it pass.
    diff = rows["offload"]["host_temp_bytes"] // 10
    loose = memprobe("check", "--baseline", str(_edited(path, tmp_path, less_host)), "--tolerance", f"{diff + 1}B")
    assert loose.returncode == 0, loose.stdout
