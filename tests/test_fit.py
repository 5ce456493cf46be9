"""`memprobe fit`: the search on peak curves of known shape, then end to end on real compiles."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from conftest import jobs_for
from memprobe.compile import compile_job
from memprobe.measure import Measurement
from memprobe.plan import Shapes
from memprobe.render.fit import _note
from memprobe.search import FitResult, search
from memprobe.targets import resolve_target
from test_cli import memprobe


def _record(peak: int, host: int = 0) -> Measurement:
    return Measurement(model="m", strategy="s", strategy_knobs={}, target="t", platform="tpu", num_devices=1,
                       topology=None, seq_len=1, batch_per_device=1, loss_chunks=1, step="train", temp_bytes=peak,
                       host_temp_bytes=host)


CURVES = {  # peak bytes at batch b: what a compiler might produce, and worse
    "linear": lambda b: 5_000 + 300 * b,
    "steps": lambda b: 5_000 + 300 * b + (b // 7) * 1_500,
    "convex": lambda b: 5_000 + 30 * b * b + 300 * b,
    "concave": lambda b: 5_000 + int(9_000 * math.sqrt(b)),
}


@pytest.mark.parametrize("curve", CURVES)
@pytest.mark.parametrize("budget", [4_000, 5_300, 5_600, 20_000, 77_777, 400_000])
def test_search_finds_the_largest_fitting_batch_in_few_rounds(curve, budget):
    peak = CURVES[curve]
    rounds = []

    def measure(pairs):
        rounds.append(pairs)
        return [_record(peak(b)) for _, b in pairs]

    [s] = search(["s"], budget, 1024, measure)
    truth = max((b for b in range(1, 1025) if peak(b) <= budget), default=0)
    assert s.largest == truth and s.error is None
    # The answer was compiled, and so was the batch after it (unless at the limit).
    assert truth == 0 or s.peaks[truth] <= budget
    assert truth == 1024 or s.peaks[truth + 1] > budget
    assert len(rounds) <= {"linear": 2}.get(curve, 12)
    assert all(len(r) <= 2 for r in rounds)


@pytest.mark.parametrize("refused_from", [2, 6, 9, 40])
def test_sizes_the_compiler_refuses_over_hbm_are_over_not_a_failed_search(refused_from):
    # libtpu refuses some programs over HBM outright ("Invalid TPU program"); memprobe's row
    # then says what the compiler needed. Such a size is over like any other, with no peak:
    # the search goes on around it and answers, compiling no size twice.
    from memprobe.search import StrategySearch

    def refused(b):
        return dataclasses.replace(_record(0), status="refused", needed_bytes=20_000 + 1_000 * b,
                                   error="over HBM: the TPU compiler ... refused the program")

    sizes = []

    def measure(pairs):
        sizes.extend(b for _, b in pairs)
        return [refused(b) if b >= refused_from else _record(5_000 + 300 * b) for _, b in pairs]

    budget = 8_000  # batch 10 fits by the peaks alone
    [s] = search(["s"], budget, 1024, measure)
    assert s.error is None and len(sizes) == len(set(sizes))
    assert s.largest == min(10, refused_from - 1) and s.smallest_over == s.largest + 1
    assert s.over(s.smallest_over) == ["HBM"]
    assert all(s.refused[b] == 20_000 + 1_000 * b for b in s.refused) and (s.largest + 1 in s.refused) == (refused_from <= 11)
    # A saved fit keeps what was refused, and renders it again the same.
    fit = FitResult([s], [_record(1)], budget, "HBM", 1024)
    again = FitResult.from_json(json.loads(json.dumps(fit.to_json())))
    assert again.searches[0].refused == s.refused and again.to_json()["rows"] == fit.to_json()["rows"]
    note = _note(fit, s)
    assert all(f"batch {b} refused by the TPU compiler over HBM (it needed" in note for b in s.refused), note
    assert StrategySearch("s", budget, 4, refused={1: 9}).over(1) == ["HBM"]


@pytest.mark.parametrize("host_budget", [500, 3_000, 9_999, 50_000, 10**9])
@pytest.mark.parametrize("curve", ["linear", "convex"])
def test_a_host_budget_binds_when_the_host_bytes_reach_it_first(curve, host_budget):
    peak, host = CURVES[curve], lambda b: 1_000 * b  # offload: host bytes grow with the batch
    budget, rounds = 77_777, []

    def measure(pairs):
        rounds.append(pairs)
        return [_record(peak(b), host(b)) for _, b in pairs]

    [s] = search(["s"], budget, 1024, measure, host_budget=host_budget)
    truth = max((b for b in range(1, 1025) if peak(b) <= budget and host(b) <= host_budget), default=0)
    assert s.largest == truth and s.error is None and len(rounds) <= 12
    hi = s.smallest_over
    assert hi == truth + 1
    binding = ["HBM"] * (peak(hi) > budget) + ["host RAM"] * (host(hi) > host_budget)
    assert s.over(hi) == binding and binding


def test_a_peak_that_falls_as_the_batch_grows_is_reported_not_hidden():
    gib = 2**30
    peak = {1: 20 * gib, 2: 30 * gib, 7: 28 * gib, 8: 85 * gib}  # what the line through 1 and 2 predicts
    [s] = search(["s"], 80 * gib, 1024, lambda pairs: [_record(peak[b]) for _, b in pairs])
    assert sorted(s.peaks) == [1, 2, 7, 8] and s.largest == 7 and s.smallest_over == 8
    assert s.dips == [(2, 7, "peak")]
    assert _note(FitResult([s], [], 80 * gib, "HBM", 1024), s) == (
        "peak falls from batch 2 to 7 (30.00 > 28.00 GiB): the search assumes it never does")
    # Searching the length, the same steps are attention blocks, and every message says seq.
    [s] = search(["s"], 80 * gib, 256, lambda pairs: [_record(peak[n]) for _, n in pairs], axis="seq", unit=512)
    assert (s.largest, s.value(s.largest), s.value(s.smallest_over)) == (7, 3584, 4096)
    assert _note(FitResult([s], [], 80 * gib, "HBM", 256, axis="seq", unit=512), s) == (
        "peak falls from seq 1024 to 3584 (30.00 > 28.00 GiB): the search assumes it never does")
    # A dip too small for two decimals of GiB (tiny models on v5e) is said in bytes.
    small = {1: 44_871_680, 2: 42_865_152}
    [s] = search(["s"], 80 * 2**20, 1024, lambda pairs: [_record(small.get(b, 10**9)) for _, b in pairs])
    assert _note(FitResult([s], [], 80 * 2**20, "--budget", 1024), s) == (
        "peak falls from batch 1 to 2 (44,871,680 > 42,865,152 bytes): the search assumes it never does")
    failed = dataclasses.replace(_record(0), status="failed", error="timed out")
    [s] = search(["s"], 80 * gib, 256, lambda pairs: [failed for _ in pairs], axis="seq", unit=512)
    assert s.error == "seq 512: timed out" and s.compiles == 2


def test_a_search_that_fails_midway_answers_nothing_and_its_note_says_what_it_saw():
    # Batch 1 and 2 fit, the line through them predicts 50: batch 50 fails, 51 is over. The row
    # once showed batch 2's peak beside "failed", and the JSON answered batch 2.
    from memprobe.render.fit import rows

    gib = 2**30

    def measure(pairs):
        return [dataclasses.replace(_record(0), status="failed", error="boom") if b == 50 else _record(b * gib)
                for _, b in pairs]

    [s] = search(["s"], 50 * gib + gib // 2, 1024, measure)
    assert (s.error, sorted(s.peaks), s.largest, s.smallest_over) == ("batch 50: boom", [1, 2, 51], 2, 51)
    fit = FitResult([s], [_record(gib)], 50 * gib + gib // 2, "HBM", 1024)
    [row] = rows(fit)
    assert row["note"] == "failed: batch 50: boom; before it stopped, batch 2 fit (2.00 GiB) and batch 51 was over the budget"
    shown = ("#", "largest batch", "global batch", "peak GiB", "peak bytes", "% of budget", "next batch",
             "its peak GiB", "host GiB", "next batch over")
    assert {row[c] for c in shown if c in row} == {"-"}
    [js] = fit.to_json()["rows"]
    assert (js["largest_batch"], js["peak_bytes"], js["next_batch"], js["limit_reached"]) == (None, None, None, False)
    assert js["peaks"] == {"1": gib, "2": 2 * gib, "51": 51 * gib} and js["error"] == "batch 50: boom"
    assert fit.answers() == {"s": None}
    # A peak that reads 0.00 GiB (a tiny model) is said in bytes.
    [s] = search(["s"], 50 * 2**20, 1024, lambda pairs: [dataclasses.replace(_record(0), status="failed", error="boom")
                                                         if b == 50 else _record(b * 2**20) for _, b in pairs])
    assert _note(FitResult([s], [], 50 * 2**20, "--budget", 1024), s).endswith(
        "before it stopped, batch 2 fit (2,097,152 bytes) and batch 51 was over the budget")
    # Read back, the same row.
    again = FitResult.from_json(json.loads(json.dumps(fit.to_json())))
    assert rows(again) == [row]


def test_a_dip_across_the_budget_moves_the_search_above_it_and_it_ends():
    # Measured: full-size E2B scan-periods at batch 8 on tpu7x-8 needs 19.15 and 22.56 GiB at
    # seq 512 and 1024, 102.44 GiB at 11776 but 93.20 at 12288. The search once took 12288 as
    # the answer and 11776 as "the next over" below it, and asked for the same lengths forever.
    gib = 2**30
    measured = {1: 19.15, 2: 22.56, 23: 102.44, 24: 93.20}
    rounds = []

    def measure(pairs):
        rounds.append([n for _, n in pairs])
        assert len(rounds) < 20, "the search does not end"
        return [_record(int(measured.get(n, 93.20 + 1.6 * (n - 24)) * gib)) for _, n in pairs]

    [s] = search(["s"], int(94.74 * gib), 48, measure, axis="seq", unit=512)
    assert rounds == [[1, 2], [23, 24], [25, 26]]
    assert (s.value(s.largest), s.value(s.smallest_over)) == (12288, 12800)
    assert s.over_below == [23] and s.dips == [(23, 24, "peak")]
    fit = FitResult([s], [], int(94.74 * gib), "HBM", 48, axis="seq", unit=512)
    assert _note(fit, s) == ("over at seq 11776, below the answer; peak falls from seq 11776 to 12288 "
                             "(102.44 > 93.20 GiB): the search assumes it never does")


BUMPY = {  # peaks that rise and fall: the answer is still compiled on both sides, and found
    "spikes": lambda b: 5_000 + 300 * b + (40_000 if b % 5 == 0 else 0),
    "dips": lambda b: 5_000 + 300 * b - (3_000 if b % 4 == 0 else 0),
    "saw": lambda b: 5_000 + 300 * b + 2_000 * (b % 9),
}


@pytest.mark.parametrize("curve", BUMPY)
@pytest.mark.parametrize("budget", [5_300, 20_000, 77_777, 400_000])
def test_on_a_bumpy_peak_the_search_ends_without_compiling_a_size_twice(curve, budget):
    peak, sizes = BUMPY[curve], []

    def measure(pairs):
        sizes.extend(b for _, b in pairs)
        assert len(sizes) < 100, "the search does not end"
        return [_record(peak(b)) for _, b in pairs]

    [s] = search(["s"], budget, 1024, measure)
    assert len(sizes) == len(set(sizes))
    assert s.largest == 0 or peak(s.largest) <= budget
    assert s.largest == 1024 or (s.smallest_over == s.largest + 1 and peak(s.largest + 1) > budget)
    assert all(n < s.largest and peak(n) > budget for n in s.over_below)


def test_a_strategy_one_target_left_out_is_not_searched_in_the_side_by_side():
    from memprobe.render.fit import sweep_notes, sweep_rows, sweeps

    def fit(target: str, names: list[str]) -> FitResult:
        m = dataclasses.replace(_record(1_000), target=target)
        return FitResult(search(names, 5_000, 4, lambda pairs: [m for _ in pairs]), [m], 5_000, "--budget", 4)

    fits = [fit("v5e", ["offload", "checkpoint"]), fit("cpu", ["checkpoint"])]  # cpu: no host memory
    [(axis, part)] = sweeps(fits)
    cols, rows = sweep_rows(part, axis)
    assert (axis, cols) == ("target", ["strategy", "v5e, 1 device", "cpu, 1 device"])
    assert [(r["strategy"], r["cpu, 1 device"]) for r in rows] == [("offload", "not searched"),
                                                                   ("checkpoint", "4 (0.00 GiB)")]
    assert "not searched: the strategy was not run there" in sweep_notes(part, axis)[0]
    assert "not searched" not in sweep_notes([fits[0], fits[0]], "shape")[0]


def test_fit_on_cpu_answers_with_compiled_batches_on_both_sides_of_the_budget():
    # A budget that unrolled's batch 2 and checkpoint's batch 5 overshoot by several MiB: two
    # rounds of compiles (1 and 2, then either side of checkpoint's predicted crossing).
    budget = 80 * 2**20
    r = memprobe("fit", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--budget", "80MiB",
                 "--strategies", "checkpoint,unrolled", "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["schema"] == "memprobe.fit" and data["budget_bytes"] == budget
    rows = {row["strategy"]: row for row in data["rows"]}
    records = {(m["strategy"], m["batch_per_device"]): m["peak_bytes"]
               for c in data["result"]["comparisons"] for m in c["rows"]}
    for name, row in rows.items():
        b = row["largest_batch"]
        assert b >= 1 and row["next_batch"] == b + 1
        assert row["peak_bytes"] == records[(name, b)] <= budget < records[(name, b + 1)] == row["next_peak_bytes"]
    # checkpoint keeps less per example than unrolled, so more examples fit.
    assert rows["checkpoint"]["largest_batch"] > rows["unrolled"]["largest_batch"]
    assert [row["strategy"] for row in data["rows"]] == ["checkpoint", "unrolled"]
    # The record is of the batch it names: the same compile, made here on its own.
    b = rows["unrolled"]["largest_batch"]
    job = jobs_for("tiny-e2b", resolve_target("cpu", 1), seq=256, batch=b, strategies=["unrolled"])["unrolled"]
    assert job.shapes == Shapes(256, b, job.shapes.loss_chunks)
    assert compile_job(job).peak_bytes == rows["unrolled"]["peak_bytes"]


def test_fit_defaults_to_the_targets_hbm_and_says_when_the_limit_is_reached():
    r = memprobe("fit", "--model", "tiny-e2b", "--target", "v5p", "--devices", "1", "--seq", "512",
                 "--strategies", "checkpoint", "--max-batch", "2", "--format", "markdown")
    assert r.returncode == 0, r.stderr
    assert "within 95.73 GiB per device on v5p:1x1x1" in r.stdout
    assert "the target's HBM as the compiler enforces it" in r.stdout
    [row] = [line for line in r.stdout.splitlines() if line.startswith("| 1 |")]
    assert "| checkpoint | 2 | 2 |" in row and "fits at the search limit (--max-batch 2)" in row


def _cell(row: dict) -> str:
    """A side-by-side cell as a fit's JSON row predicts it: the size found and its peak."""
    return f"{row['largest_batch']} ({row['peak_bytes'] / 2**30:.2f} GiB)" if row["largest_batch"] else "0 (over)"


def _table(text: str, header: str) -> str:
    """The markdown table of ``text`` that starts with ``header``, to the blank line after it."""
    return text[text.index(header):].split("\n\n")[0]


def _fit_json(path, *args, size="batch_per_device"):
    """Runs `memprobe fit` into a JSON file: the result, its rows by strategy, and every
    measurement by (strategy, size)."""
    r = memprobe("fit", *args, "--format", "json", "--output", str(path))
    assert r.returncode == 0, r.stderr
    data = json.loads(path.read_text())
    records = {(m["strategy"], m[size]): m for c in data["result"]["comparisons"] for m in c["rows"]}
    return data, {row["strategy"]: row for row in data["rows"]}, records


def test_fit_with_host_ram_stops_where_offload_fills_the_host(tmp_path):
    # offload puts 640 KiB a batch in host memory, offload-mlp 3.5 MiB at batch 1: with 1 MiB,
    # offload's batch 1 fits and its batch 2 is over, so one round of compiles answers both.
    ram, path = 2**20, tmp_path / "fit.json"
    data, rows, records = _fit_json(path, "--model", "tiny-e2b", "--target", "v5p", "--devices", "1", "--seq",
                                    "512", "--strategies", "offload-mlp,offload", "--host-ram", "1MiB",
                                    "--max-batch", "16")
    assert data["host_ram_bytes"] == ram and data["devices_per_host"] == 1
    assert [row["strategy"] for row in data["rows"]] == ["offload", "offload-mlp"]
    # offload: HBM has room to spare at the next batch; its host bytes are what stop it.
    off = rows["offload"]
    b = off["largest_batch"]
    assert b >= 1 and off["next_batch"] == b + 1 and off["next_over"] == ["host RAM"]
    at, nxt = records[("offload", b)], records[("offload", b + 1)]
    assert 0 < at["host_bytes"] == off["host_bytes"] <= ram < off["next_host_bytes"] == nxt["host_bytes"]
    assert (at["fits"], at["fits_host"], nxt["fits"], nxt["fits_host"]) == (True, True, True, False)
    # offload-mlp puts more in host memory per example: over the host RAM at batch 1 already.
    mlp = rows["offload-mlp"]
    assert mlp["largest_batch"] == 0 and mlp["next_batch"] == 1 and mlp["next_over"] == ["host RAM"]
    assert records[("offload-mlp", 1)]["host_bytes"] > ram
    md = memprobe("report", str(path))
    assert md.returncode == 0, md.stderr
    assert "and 1,048,576 bytes host RAM per host of 1 device on v5p:1x1x1" in md.stdout  # not 0.00 GiB
    assert f"| offload | {b} | {b} |" in md.stdout and "| host RAM |" in md.stdout
    assert "over host RAM at batch 1" in md.stdout and f"at most {ram:,} bytes per device" in md.stdout


def test_fit_counts_a_program_the_tpu_compiler_refuses_over_hbm_as_over(tmp_path):
    # A 3-million-token vocabulary on one v5e device: libtpu runs out of HBM at batch 1 and
    # refuses the program. The search does not stop there: batch 1 is over, and says why.
    model, path = tmp_path / "tiny-v3m.toml", tmp_path / "fit.json"
    model.write_text('description = "tiny-e2b, 3M vocabulary"\nbase = "tiny-e2b"\nvocab_size = 3000000\n')
    data, rows, records = _fit_json(path, "--model", str(model), "--target", "v5e", "--devices", "1", "--seq", "512",
                                    "--strategies", "unrolled", "--max-batch", "1")
    row = rows["unrolled"]
    assert row["error"] is None and (row["largest_batch"], row["next_batch"], row["next_over"]) == (0, 1, ["HBM"])
    assert row["next_peak_bytes"] == row["refused"]["1"] > data["budget_bytes"] == 16_911_433_728
    # The refused row says what libtpu logged before refusing: what it needed, to the byte
    # (over the 15.75 GiB), and its largest allocation, the fp32 logits.
    rec = records[("unrolled", 1)]
    needed = row["refused"]["1"]
    assert (rec["status"], rec["needed_bytes"], rec["fits"], rec["peak_bytes"]) == ("refused", needed, False, needed)
    error = rec["error"]
    assert error.startswith("over HBM: the TPU compiler needed ") and " of 15.75 GiB and refused the program (" in error
    assert f"({row['refused']['1']:,} bytes)" in error and "Invalid TPU program" in error
    assert "held 2×f32[512,3000000]" in error, error
    md = memprobe("report", str(path))
    assert md.returncode == 0, md.stderr
    assert f"batch 1 refused by the TPU compiler over HBM (it needed {needed / 2**30:.2f} GiB" in md.stdout
    assert f"| {needed / 2**30:.2f} refused |" in md.stdout  # the next batch's peak column
    # A refusal is an answer, kept in the cache like a peak: `compare` gives it at once, over
    # capacity by the compiler's total, and exits 0 as for any row over capacity.
    again = memprobe("compare", "--model", str(model), "--target", "v5e", "--devices", "1", "--seq", "512",
                     "--batch", "1", "--strategies", "unrolled", "--format", "markdown")
    assert again.returncode == 0 and "unrolled: from cache" in again.stderr, again.stderr
    [cells] = [[c.strip() for c in line.strip("|").split("|")] for line in again.stdout.splitlines()
               if line.startswith("|") and "| unrolled " in line]
    assert cells[:5] == ["1", "unrolled", f"{needed / 2**30:.2f}", f"{needed:,}", f"{100 * needed / 16_911_433_728:.0f}%"]
    assert "**over capacity (refused)**" in cells and "Failed:" not in again.stdout
    assert f"- `unrolled`: **over capacity**: {error.removeprefix('over HBM: ')}" in again.stdout
    assert "**Nothing fits; lowest peak: `unrolled`**" in again.stdout
    # The record keeps the largest allocations of libtpu's report, largest first: the fp32
    # logits and their gradient in the heap; the 3M x 128 embedding, its two Adam moments
    # (fp32 parameters), each a block of its own, shared with the updated value donated to it.
    listed = [(a["size"], a["values"], a["shapes"], a["heap"]) for a in rec["oom_allocations"]]
    assert listed[0] == ("5.72 GiB", 2, "2×f32[512,3000000]", True) and len(listed) == 20, listed
    assert listed.count(("1.43 GiB", 2, "2×f32[3000000,128]", False)) == 3, listed
    # explain has no buffer assignment to read for it: it lists that report instead, at once
    # from the cache rather than compiling again, and exits 0 (an answer), as compare does.
    asked = ("explain", "--strategy", "unrolled", "--model", str(model), "--target", "v5e", "--devices", "1",
             "--seq", "512", "--batch", "1")
    ex = memprobe(*asked, "--format", "markdown", "--top", "4")
    assert ex.returncode == 0 and "unrolled: from cache" in ex.stderr, ex.stderr
    assert "## Refused over HBM: unrolled," in ex.stdout and f"- unrolled: {error}." in ex.stdout
    assert "| 1   | 5.72 GiB | heap    | 2        | 2×f32[512,3000000] " in ex.stdout, ex.stdout
    assert "16 more allocations (--top 20 lists them)" in ex.stdout
    # Saved as JSON, it renders again the same (but the command line under it).
    saved = tmp_path / "explain.json"
    assert memprobe(*asked, "--format", "json", "-o", str(saved)).returncode == 0
    again = memprobe("report", str(saved), "--top", "4")
    assert again.returncode == 0, again.stderr

    def but_command(text):
        return [line for line in text.splitlines() if not line.startswith("- Command:")]
    assert but_command(again.stdout) == but_command(ex.stdout)


def test_fit_vary_seq_finds_the_longest_sequence_in_attention_blocks(tmp_path):
    budget, path = 200 * 2**20, tmp_path / "seqfit.json"
    data, rows, records = _fit_json(path, "--vary", "seq", "--batch", "2", "--max-seq", "16384", "--model",
                                    "tiny-e2b", "--target", "cpu", "--budget", "200MiB", "--strategies",
                                    "unrolled,checkpoint", size="seq_len")
    assert (data["axis"], data["seq_unit"], data["max_seq"]) == ("seq", 512, 16384)
    assert {(m["batch_per_device"], m["loss_chunks"] * 512 == m["seq_len"]) for m in records.values()} == {(2, True)}
    for name, row in rows.items():
        seq = row["largest_seq"]
        assert seq >= 512 and seq % 512 == 0 and row["next_seq"] == seq + 512 and row["next_over"] == ["HBM"]
        assert row["peak_bytes"] == records[(name, seq)]["peak_bytes"] <= budget < records[(name, seq + 512)]["peak_bytes"]
    # Per-layer checkpoints keep less per token, so a longer sequence fits.
    assert rows["checkpoint"]["largest_seq"] > rows["unrolled"]["largest_seq"]
    again = memprobe("report", str(path), "--format", "json")
    assert again.returncode == 0 and again.stdout == path.read_text()
    md = memprobe("report", str(path))
    assert "per-device batch 2: the longest sequence within 0.20 GiB per device on cpu" in md.stdout
    seq = rows["checkpoint"]["largest_seq"]
    assert f"| checkpoint | {seq} | {2 * seq} |" in md.stdout and "loss in chunks of 512 tokens" in md.stdout


@pytest.mark.parametrize("args,message", [
    (["--max-batch", "0"], "--max-batch must be a positive integer, got 0"),
    (["--budget", "lots"], "--budget: 'lots' is not a size like 90GiB"),
    (["--budget", "0MiB"], "--budget must be a positive size, got '0MiB'"),
    (["--target", "cpu"], "target cpu has no HBM capacity to fit in; pass --budget SIZE"),
    (["--seq", "1000"], "--seq 1000 is not a multiple of the attention block (512)"),
    (["--target", "cpu", "--budget", "1GiB", "--host-ram", "1TiB"], "--host-ram: target cpu has no host memory"),
    (["--devices-per-host", "4"], "--devices-per-host only applies with --host-ram"),
    (["--host-ram", "1TiB", "--devices-per-host", "64"], "--devices-per-host 64 is more than the 8 devices"),
    (["--batch", "8"], "--batch applies with --vary seq; --vary batch searches the batch at --seq"),
    (["--max-seq", "8192"], "--max-seq applies with --vary seq"),
    (["--vary", "seq", "--seq", "8192"], "--seq does not apply with --vary seq, which searches the length"),
    (["--vary", "seq", "--loss-chunks", "4"], "--loss-chunks does not apply with --vary seq"),
    (["--vary", "seq", "--max-seq", "1000"], "--max-seq must be a positive multiple of the attention block (512), got 1000"),
    (["--vary", "seq", "--batch", "0"], "--batch must be a positive integer, got 0"),
    # The largest size a search may reach is checked before its first compile.
    (["--max-batch", "99999999999999999999"], "--max-batch 99999999999999999999: the step's tokens"),
    (["--vary", "seq", "--max-seq", "4294967296"], "--max-seq 4294967296: over 2,147,483,647, the longest sequence"),
    # On several targets, each target's limits are checked before the first one's search starts.
    (["--target", "v5e,cpu"], "target cpu has no HBM capacity to fit in; pass --budget SIZE"),
    (["--target", "v5e,cpu", "--budget", "1GiB", "--host-ram", "1TiB"], "--host-ram: target cpu has no host memory"),
    (["--target", "v5e,,cpu"], "'v5e,,cpu' has an empty name"),
    (["--target", "v5e,h100", "--topology", "v5e:2x2"], "--topology v5e:2x2 with several targets"),
    (["--target", "v5e,v9"], "unknown target 'v9'"),
])
def test_fit_bad_input_is_one_line_and_exit_2(args, message):
    r = memprobe("fit", "--model", "tiny-e2b", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("memprobe: error:")]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "compiling" not in r.stderr and "measuring" not in r.stderr


def test_a_saved_fit_result_is_rendered_again_by_report(tmp_path):
    path = tmp_path / "fit.json"
    # The search of test_fit_on_cpu_answers_...: its compiles come from this worker's cache.
    r = memprobe("fit", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--budget", "80MiB",
                 "--strategies", "checkpoint,unrolled", "--format", "json", "--output", str(path))
    assert r.returncode == 0, r.stderr
    again = memprobe("report", str(path), "--format", "json")
    assert again.returncode == 0 and again.stdout == path.read_text()
    md = memprobe("report", str(path))
    assert md.returncode == 0, md.stderr
    for row in json.loads(path.read_text())["rows"]:
        assert f"| {row['strategy']} | {row['largest_batch']} |" in md.stdout
        assert f"{row['peak_bytes']:,}" in md.stdout
    for args, message in [(["--format", "csv"], "a fit result renders as table, markdown or json, not csv"),
                          (["--host-ram", "1TiB"], "--chart and --host-ram apply to comparisons")]:
        bad = memprobe("report", str(path), *args)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "memprobe.fit", "rows": []}')
    bad = memprobe("report", str(broken))
    assert bad.returncode == 2 and "not a memprobe fit result (KeyError: 'budget_bytes')" in bad.stderr


def test_fit_at_several_lengths_is_each_lengths_own_fit_with_the_answers_side_by_side(tmp_path):
    import memprobe as api
    from memprobe.search import FitResult

    # seq 256 is the search of test_fit_on_cpu_answers_...: from this worker's cache.
    args = ("--model", "tiny-e2b", "--target", "cpu", "--budget", "80MiB", "--strategies", "checkpoint,unrolled")
    path = tmp_path / "sweep.json"
    r = memprobe("fit", *args, "--seq", "256,512", "--format", "json", "--output", str(path))
    assert r.returncode == 0, r.stderr
    assert "checkpoint batch 1 @ seq 512" in r.stderr and "at seq 512 (round 1, budget 0.08 GiB)" in r.stderr
    data = json.loads(path.read_text())
    assert (data["schema"], data["axis"], len(data["fits"])) == ("memprobe.fits", "batch", 2)
    # Each length's fit is the fit of that length alone, row for row.
    one = memprobe("fit", *args, "--seq", "256", "--format", "json")
    assert one.returncode == 0 and "0 compiled" in one.stderr, one.stderr
    assert data["fits"][0]["rows"] == json.loads(one.stdout)["rows"]
    rows = [{row["strategy"]: row for row in f["rows"]} for f in data["fits"]]
    assert {m["seq_len"] for c in data["fits"][1]["result"]["comparisons"] for m in c["rows"]} == {512}
    for name in ("checkpoint", "unrolled"):  # twice the length: no more examples fit
        assert rows[1][name]["largest_batch"] <= rows[0][name]["largest_batch"]
    # At 512, unrolled is over even at batch 1; checkpoint still fits some.
    assert rows[1]["unrolled"]["largest_batch"] == 0 < rows[1]["checkpoint"]["largest_batch"]
    # Rendered again: each length's table, then the answers side by side.
    md = memprobe("report", str(path))
    assert md.returncode == 0, md.stderr
    assert "seq 256: the largest per-device batch" in md.stdout and "seq 512: the largest per-device batch" in md.stdout
    assert "## tiny-e2b train step on cpu, 1 device: the largest per-device batch at each length within 0.08 GiB" in md.stdout
    assert md.stdout.index("seq 512: the largest") < md.stdout.index("| strategy | seq 256 | seq 512 |")
    for name in ("checkpoint", "unrolled"):
        assert f"| {name} | {_cell(rows[0][name])} | {_cell(rows[1][name])} |" in md.stdout
    again = memprobe("report", str(path), "--format", "json")
    assert again.returncode == 0 and again.stdout == path.read_text()
    # Fits saved one length at a time merge into the same sweep, shorter first, in any order;
    # the same length twice, or a different budget, is refused in one line.
    alone = {seq: tmp_path / f"fit{seq}.json" for seq in (256, 512)}
    for seq, saved in alone.items():
        assert memprobe("fit", *args, "--seq", str(seq), "--format", "json", "-o", str(saved)).returncode == 0
    merged = memprobe("report", str(alone[512]), str(alone[256]))
    assert merged.returncode == 0, merged.stderr
    header = "| strategy | seq 256 | seq 512 |"
    assert _table(merged.stdout, header) == _table(md.stdout, header)
    twice = memprobe("report", str(alone[256]), str(path))
    assert twice.returncode == 2 and f"{path}: seq 256 is in {alone[256]} too" in twice.stderr
    data = json.loads(alone[512].read_text())
    alone[512].write_text(json.dumps({**data, "budget_bytes": data["budget_bytes"] + 1}))
    other = memprobe("report", str(alone[256]), str(alone[512]))
    assert other.returncode == 2 and "its budget differs from" in other.stderr
    # The same host RAM shared by a different number of devices of the same target: a different search.
    first = json.loads(alone[256].read_text())
    alone[256].write_text(json.dumps({**first, "host_ram_bytes": 2**30, "devices_per_host": 1}))
    alone[512].write_text(json.dumps({**data, "host_ram_bytes": 2**30, "devices_per_host": 2}))
    shared = memprobe("report", str(alone[256]), str(alone[512]))
    assert shared.returncode == 2, shared.stdout
    assert shared.stderr.strip() == (f"memprobe: error: {alone[512]}: its devices per host (2) differ from "
                                     f"{alone[256]}'s (1) on the same target: fit results merge only when they "
                                     "differ in the length, the target or both")
    # The library: a list of lengths gives a list of fits (from the cache), one length a fit.
    found = api.fit(seq=[256, 512], model="tiny-e2b", target="cpu", budget="80MiB", strategies=["checkpoint", "unrolled"])
    assert [f.answers() for f in found] == [{n: r[n]["largest_batch"] for n in r} for r in rows]
    assert isinstance(api.fit(seq=256, model="tiny-e2b", target="cpu", budget="80MiB", strategies=["unrolled"]),
                      FitResult)
    # ... and renders, as a list, as the CLI renders the sweep; its JSON loads back as a list.
    assert _table(api.report(found, "markdown"), header) == _table(md.stdout, header)
    (tmp_path / "found.json").write_text(api.report(found, "json"))
    assert [f.answers() for f in api.load(tmp_path / "found.json")] == [f.answers() for f in found]
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "memprobe.fits", "fits": []}')
    bad = memprobe("report", str(broken))
    assert bad.returncode == 2 and "fits: expected a non-empty list of fit results" in bad.stderr


def test_fit_on_several_targets_is_each_targets_own_fit_with_the_answers_side_by_side(tmp_path):
    import memprobe as api

    # The cpu searches at seq 256 and 512, batch 1 and 2, are the earlier tests': from this
    # worker's cache. v5e compiles four; --max-batch 2 keeps its search short (tiny fits there).
    args = ("--model", "tiny-e2b", "--budget", "80MiB", "--strategies", "checkpoint,unrolled", "--devices", "1",
            "--max-batch", "2")
    path = tmp_path / "targets.json"
    r = memprobe("fit", *args, "--seq", "256", "--target", "cpu,v5e", "--format", "json", "--output", str(path))
    assert r.returncode == 0, r.stderr
    assert "checkpoint batch 1 @ v5e:1x1 (1 device): compiling" in r.stderr
    assert "for tiny-e2b on v5e:1x1 (1 device) at seq 256 (round 1, budget 0.08 GiB)" in r.stderr
    data = json.loads(path.read_text())
    assert (data["schema"], data["axis"], len(data["fits"])) == ("memprobe.fits", "batch", 2)
    assert [{m["target"] for c in f["result"]["comparisons"] for m in c["rows"]} for f in data["fits"]] == [
        {"cpu"}, {"v5e"}]
    # Each target's fit is its fit alone, row for row, and answers from the cache.
    alone = {}
    for (target, seq), fit in zip((("cpu", 256), ("v5e", 256)), data["fits"]):
        alone[target, seq] = tmp_path / f"{target}{seq}.json"
        one = memprobe("fit", *args, "--seq", str(seq), "--target", target, "--format", "json", "-o",
                       str(alone[target, seq]))
        assert one.returncode == 0 and "compiling" not in one.stderr, one.stderr
        assert json.loads(alone[target, seq].read_text())["rows"] == fit["rows"]
    for f in data["fits"]:  # every answer compiled and within the budget, the next over (or the limit)
        for row in f["rows"]:
            assert row["peak_bytes"] <= data["fits"][0]["budget_bytes"] == 80 * 2**20
            assert row["limit_reached"] or row["next_peak_bytes"] > 80 * 2**20
    rows = [{row["strategy"]: row for row in f["rows"]} for f in data["fits"]]
    # The CPU backend's temporaries are larger than the TPU compiler's (measured-facts.md): at
    # 80 MiB the cpu fits one example of unrolled, v5e both that --max-batch allows.
    assert rows[0]["unrolled"]["largest_batch"] == 1 and rows[1]["unrolled"]["largest_batch"] == 2
    assert rows[1]["unrolled"]["peak_bytes"] < rows[0]["unrolled"]["next_peak_bytes"]

    # Rendered again: each target's table, then the answers side by side, a column per target.
    md = memprobe("report", str(path))
    assert md.returncode == 0, md.stderr
    head = ("## tiny-e2b train step at seq 256: the largest per-device batch on each target within 0.08 GiB "
            "per device")
    assert md.stdout.index("on v5e:1x1, 1 device\n") < md.stdout.index(head)
    side = md.stdout[md.stdout.index(head):]
    assert "| strategy | cpu, 1 device | v5e:1x1, 1 device |" in side
    for name in ("checkpoint", "unrolled"):
        assert f"| {name} | {_cell(rows[0][name])} | {_cell(rows[1][name])} |" in side
    assert "CPU backend figures: they do not stand for any accelerator." in side and "Budgets:" not in side
    # Saved apart, the targets merge into the same table; with the cpu at seq 512 as well, the
    # cpu's two lengths are set side by side and v5e, at one length, has none.
    merged = memprobe("report", str(alone["cpu", 256]), str(alone["v5e", 256]))
    assert merged.returncode == 0, merged.stderr
    assert _table(merged.stdout[merged.stdout.index(head):], "| strategy | cpu") == _table(side, "| strategy | cpu")
    alone["cpu", 512] = tmp_path / "cpu512.json"
    assert memprobe("fit", *args, "--seq", "512", "--target", "cpu", "--format", "json", "-o",
                    str(alone["cpu", 512])).returncode == 0
    both = memprobe("report", str(alone["v5e", 256]), str(alone["cpu", 512]), str(alone["cpu", 256]))
    assert both.returncode == 0, both.stderr
    assert both.stdout.count("\n| strategy |") == 1 and "| strategy | seq 256 | seq 512 |" in both.stdout
    assert "on cpu, 1 device: the largest per-device batch at each length" in both.stdout
    # v5e first (first given), then the cpu's lengths, shorter first.
    titles = [line for line in both.stdout.splitlines() if line.startswith("## ")]
    assert ["v5e:1x1" in t for t in titles] == [True, False, False, False]
    assert ["seq 256" in titles[1], "seq 512" in titles[2]] == [True, True]
    twice = memprobe("report", str(alone["cpu", 256]), str(path))
    assert twice.returncode == 2 and f"{path}: seq 256 on cpu (1 device) is in {alone['cpu', 256]} too" in twice.stderr
    # The library: a list of targets gives a list of fits (from the cache).
    found = api.fit(seq=256, model="tiny-e2b", target=["cpu", "v5e"], devices=1, budget="80MiB",
                    strategies=["checkpoint", "unrolled"], max_batch=2)
    assert [f.answers() for f in found] == [{n: r[n]["largest_batch"] for n in r} for r in rows]


def test_a_failed_compile_ends_that_search_with_its_first_reason_and_exit_1():
    # The default strategies: offload is left out on cpu (said before the first round).
    r = memprobe("fit", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--budget", "100MiB",
                 "--timeout", "0.5", "--no-cache", "--format", "json")
    assert r.returncode == 1
    rows = json.loads(r.stdout)["rows"]
    assert sorted(row["strategy"] for row in rows) == ["checkpoint", "scan-checkpoint", "unrolled"]
    for row in rows:
        assert row["error"].startswith("batch 1: timed out after") and row["compiles"] == 2
    lines = r.stderr.splitlines()
    skipping = lines.index("memprobe: skipping offload: cpu has no host memory space to offload to")
    assert skipping < lines.index(next(line for line in lines if "search stopped" in line))
    assert "memprobe: checkpoint: search stopped: batch 1: timed out" in r.stderr


@pytest.mark.parametrize(("name", "strategy"), [("gemma4-e2b-seq24576-tpu7x-8-fit", "scan-checkpoint"),
                                              ("gemma4-e2b-seq24576-h100-8-fit", "checkpoint"),
                                              ("gemma4-e2b-b8-tpu7x-8-seqfit", "scan-checkpoint"),
                                              ("gemma4-e2b-b8-tpu7x-8-seqfit-scan-periods", "scan-periods")])
def test_the_committed_full_size_fit_reports_render_again_from_their_json(name, strategy):
    reports = Path(__file__).resolve().parent.parent / "reports"
    r = memprobe("report", str(reports / f"{name}.json"), "--format", "markdown")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (reports / f"{name}.md").read_text()
    data = json.loads((reports / f"{name}.json").read_text())
    axis = data.get("axis", "batch")  # the batch search was saved before fit named its axis
    [row] = [row for row in data["rows"] if row["strategy"] == strategy]
    assert row["peak_bytes"] <= data["budget_bytes"] < row["next_peak_bytes"]
    assert row[f"next_{axis}"] - row[f"largest_{axis}"] == (512 if axis == "seq" else 1)
    # A length under the answer can be over (scan-periods: seq 11776), and the row says which.
    assert all(row["peaks"][str(v)] > data["budget_bytes"] for v in row.get("over_below", []))
    assert row.get("over_below", []) == ([11776] if strategy == "scan-periods" else [])


def test_the_committed_full_size_fits_on_tpu7x_and_h100_merge_into_one_side_by_side():
    reports = Path(__file__).resolve().parent.parent / "reports"
    names = ("gemma4-e2b-seq24576-tpu7x-8-fit", "gemma4-e2b-seq24576-h100-8-fit")
    r = memprobe("report", *(str(reports / f"{n}.json") for n in names), "--format", "markdown")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (reports / "gemma4-e2b-seq24576-tpu7x-8-h100-8-fit.md").read_text()
    data = [json.loads((reports / f"{n}.json").read_text()) for n in names]
    rows = [{row["strategy"]: row for row in d["rows"]} for d in data]
    side = r.stdout[r.stdout.index("## gemma4-e2b train step at seq 24576: the largest per-device batch on each "
                                   "target within each target's HBM per device"):]
    assert "| strategy | tpu7x:2x2x1, 8 devices | h100, 8 devices |" in side
    for name in ("scan-checkpoint", "checkpoint"):  # every answer here is at least batch 1
        assert all(r[name]["largest_batch"] for r in rows)
        assert f"| {name} | {_cell(rows[0][name])} | {_cell(rows[1][name])} |" in side
    budgets = [d["budget_bytes"] for d in data]
    assert f"tpu7x:2x2x1, 8 devices 94.74 GiB ({budgets[0]:,} bytes, its HBM)" in side
    assert f"h100, 8 devices 79.11 GiB ({budgets[1]:,} bytes, its HBM)" in side
    # Each answer is compiled and fits its own HBM, the next batch over it.
    for d, by in zip(data, rows):
        assert all(row["peak_bytes"] <= d["budget_bytes"] < row["next_peak_bytes"] for row in by.values())
    # On H100 the one-trip scan fits 8 examples to tpu7x's 6; plain per-layer checkpoint fits 5
    # there (1 on tpu7x), and its next batch jumps to 2.9 times its peak: the GPU scheduler then
    # keeps the backward passes of many layers in flight at once (see docs/findings.md).
    assert [by["scan-checkpoint"]["largest_batch"] for by in rows] == [6, 8]
    assert [by["checkpoint"]["largest_batch"] for by in rows] == [1, 5]
    h100 = rows[1]["checkpoint"]
    assert h100["next_peak_bytes"] > 2.5 * h100["peak_bytes"]
