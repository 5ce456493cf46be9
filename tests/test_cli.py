"""The command line end to end, as a user runs it: real compiles in isolated processes."""

import csv
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

NOISE = ("TPU_ACCELERATOR_TYPE", "InitGoogle", "E0000", "Traceback", "WARNING")


ROOT = Path(__file__).resolve().parent.parent


def memprobe(*args, timeout=900, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "memprobe", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd)


def test_compare_on_cpu_prints_ranked_table():
    # unrolled named twice: measured once, one row, and the user is told.
    r = memprobe("compare", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--batch", "1",
                 "--strategies", "unrolled,checkpoint,unrolled", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert [row["strategy"] for row in csv.DictReader(io.StringIO(r.stdout))] == ["checkpoint", "unrolled"]
    assert "memprobe: unrolled named more than once in --strategies; measured once" in r.stderr
    assert "measuring 2 strategies" in r.stderr
    r = memprobe("compare", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--batch", "1",
                 "--strategies", "unrolled,checkpoint")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "tiny-e2b train step, seq 256 x per-device batch 1" in out
    assert "unrolled" in out and "checkpoint" in out and "peak GiB" in out
    assert "CPU backend figures: they do not stand for any accelerator." in out
    assert not any(n in r.stdout + r.stderr for n in NOISE)


def test_compare_deviceless_tpu_is_quiet_and_judges_fit():
    r = memprobe("compare", "--model", "tiny-e2b", "--target", "v5p", "--devices", "1", "--seq", "512",
                 "--batch", "1", "--strategies", "checkpoint")
    assert r.returncode == 0, r.stderr
    assert "v5p:1x1x1" in r.stdout and "fits" in r.stdout and "95.73 GiB" in r.stdout
    assert not any(n in r.stdout + r.stderr for n in NOISE), r.stderr
    # The tiny peak is well under 1% of a v5p's HBM: its share reads in hundredths, not "0%".
    saved = memprobe("compare", "--model", "tiny-e2b", "--target", "v5p", "--devices", "1", "--seq", "512",
                     "--batch", "1", "--strategies", "checkpoint", "--format", "json")
    [row] = json.loads(saved.stdout)["comparisons"][0]["rows"]
    share = 100 * row["peak_bytes"] / row["capacity_bytes"]
    assert 0.005 <= share < 1 and f"│ {share:.2f}% │" in r.stdout, r.stdout


def test_timed_out_compile_is_a_failed_row_and_exit_1():
    r = memprobe("compare", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--batch", "1",
                 "--strategies", "checkpoint", "--timeout", "0.5", "--no-cache")
    assert r.returncode == 1
    assert "checkpoint failed: timed out after 0.5 s" in r.stdout  # it said "0 s"


COMPARE_BAD = [
    (["--seq", "-5"], "--seq must be a positive integer, got -5"),
    # Typer's own (pydantic's) words were "Input should be a valid integer, unable to parse ...".
    (["--seq", "abc"], "Invalid value for '--seq': 'abc' is not an integer"),
    (["--seq", "1.5"], "Invalid value for '--seq': '1.5' is not an integer"),
    # A sweep's values are each checked, and all before any compile.
    (["--seq", "512,abc"], "Invalid value for '--seq': 'abc' is not an integer (one value, or several separated by "
                           "commas: --seq 4096,8192)"),
    (["--seq", "512,"], "Invalid value for '--seq': '' is not an integer"),
    (["--seq", "512,1000"], "--seq 1000 is not a multiple of the attention block (512)"),
    (["--seq", "512", "--batch", "1,0"], "--batch must be a positive integer, got 0"),
    (["--batch", "2,1.5"], "Invalid value for '--batch': '1.5' is not an integer (one value, or several separated "
                           "by commas: --batch 4,8)"),
    (["--timeout", "soon"], "Invalid value for '--timeout': 'soon' is not a number"),
    (["--format", "yaml"], "Invalid value for '--format': 'yaml' is not one of 'table', 'markdown', 'json'"),
    (["--batch", "0"], "--batch must be a positive integer, got 0"),
    (["--seq", "1000"], "--seq 1000 is not a multiple of the attention block (512)"),
    # Sizes no compile can take: the compile aborted, or failed with a TypeError.
    (["--seq", "100000000000"], "--seq 100000000000: over 2,147,483,647, the longest sequence whose positions "
                                "JAX's default integer (int32) can number"),
    (["--batch", "99999999999999999999"], "--batch 99999999999999999999: the step's tokens (99999999999999999999 x "
                                          "8 devices x seq 24576) are more than an XLA shape holds "
                                          "(9,223,372,036,854,775,807 elements)"),
    (["--batch", "2000000000000000", "--grad-accum", "4", "--seq", "512"],
     "the step's tokens (2000000000000000 x 8 devices x 4 microbatches x seq 512) are more than"),
    (["--seq", "1024", "--loss-chunks", "3"], "--loss-chunks 3 does not divide --seq 1024"),
    (["--strategies", "fastest"], "unknown strategy 'fastest' (known: unrolled, checkpoint,"),
    (["--strategies", "unrolled,scan-chekpoint"], "unknown strategy 'scan-chekpoint' (did you mean 'scan-checkpoint'?"),
    (["--model", "gemma5"], "unknown model 'gemma5'"),
    (["--target", "v9"], "unknown target 'v9'"),
    (["--target", "h20"], "unknown target 'h20' (did you mean 'h200'? known: tpu7x,"),
    (["--target", "tpu7x", "--devices", "3"], "tpu7x has 2 devices per chip"),
    (["--target", "v5p", "--topology", "v5p:3x3x3", "--model", "tiny-e2b", "--seq", "512"],
     "libtpu rejects the topology 'v5p:3x3x3'"),
    (["--strategy-file", "/nonexistent/mine.toml"], "/nonexistent/mine.toml: strategy file not found"),
    (["--strategies-dir", "/nonexistent"], "/nonexistent: strategies directory not found"),
    (["--strategies-dir", "memprobe"], "memprobe: no strategy files (*.toml) in this strategies directory"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0.0"),
    (["--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
    (["--jobs", "0"], "--jobs must be a positive integer, got 0"),
    (["--max-host-memory", "lots"], "--max-host-memory: 'lots' is not a size like 90GiB"),
    # A number alone was bytes: a 12-byte cap stopped every compile, a budget of 90 fitted nothing.
    (["--max-host-memory", "12"], "--max-host-memory: '12' has no unit: a size like 12GiB or 12GB (12B for bytes)"),
    (["--target", "cpu", "--strategies", "offload"],
     "strategies/offload.toml: offload: target cpu has no host memory space to offload to"),
    (["--output", "/nonexistent/report.md"], "--output /nonexistent/report.md: directory /nonexistent does not exist"),
    (["--chart", "/nonexistent/c.png"], "--chart /nonexistent/c.png: directory /nonexistent does not exist"),
    (["--devices", "0"], "--devices must be a positive integer, got 0"),
    (["--seq", "1024", "--loss-chunks", "0"], "--loss-chunks must be a positive integer, got 0"),
    (["--target", "v5p", "--devices", "6"], "no standard v5p topology has 6 devices"),
    (["--target", "v5p:2x2x1", "--topology", "v5p:4x4x4"], "--target v5p:2x2x1 contradicts --topology v5p:4x4x4"),
    (["--target", "v5p:2x2x1", "--devices", "8"], "--devices 8 contradicts --target v5p:2x2x1 (4 devices)"),
    (["--target", "v5p:3x3x3", "--model", "tiny-e2b", "--seq", "512"], "libtpu rejects the topology 'v5p:3x3x3'"),
    (["--target", "v5p-7"], "--target v5p-7: v5p accelerator types count TensorCores, 2 per device, so 7 is not"),
    (["--target", "v5p-8", "--devices", "8"], "--devices 8 contradicts --target v5p-8 (4 devices)"),
    (["--target", "v5p-8", "--topology", "v5p:2x2x2"], "--target v5p-8 (4 devices) contradicts --topology v5p:2x2x2"),
    # A topology that names its kind is that kind's, never read as the target's ('v5p:v5e:2x2').
    (["--target", "v5p", "--topology", "v5e:2x2"],
     "--topology v5e:2x2 is for v5e, not for --target v5p; leave --target out, or give --target v5e"),
    (["--target", "v5p-8", "--topology", "v5e:2x2"],
     "--topology v5e:2x2 is for v5e, not for --target v5p-8 (a v5p); leave --target out, or give --target v5e"),
    (["--target", "tpu7x", "--topology", "v5p:2x2x1"],
     "--topology v5p:2x2x1 is for v5p, not for --target tpu7x; leave --target out, or give --target v5p"),
    # A kind memprobe does not know was read as the default's: "'tpu7x:v5x:2x2x1' is not a tpu7x topology".
    (["--topology", "v5x:2x2x1"],
     "--topology v5x:2x2x1: unknown TPU kind 'v5x' (did you mean 'v5p'? known: tpu7x, v6e, v5p, v5e, v4)"),
    (["--target", "tpu7x-3"], "--target tpu7x-3: tpu7x has 2 devices per chip, so 3 is not a whole number of chips"),
    (["--target", "v6e-0"], "--target v6e-0: an accelerator type counts TensorCores, at least 1"),
    (["--target", "v5p:2x2x1x1"], "--target: 'v5p:2x2x1x1' is not a v5p topology like v5p:2x2x1"),
    (["--target", "cpu", "--host-ram", "1TiB"], "--host-ram: target cpu has no host memory space to check"),
    (["--host-ram", "1TiB", "--devices-per-host", "16"], "--devices-per-host 16 is more than the 8 devices of tpu7x:2x2x1"),
    (["--optimizer", "adam"], "Invalid value for '--optimizer': 'adam' is not one of 'adamw', 'adafactor', 'lion', 'sgd'"),
    (["--param-dtype", "fp16"], "Invalid value for '--param-dtype': 'fp16' is not one of 'fp32', 'bf16'"),
    (["--step", "grad", "--optimizer", "lion"], "--optimizer lion: a grad step compiles no optimizer update (use --step train)"),
    (["--grad-accum", "0"], "--grad-accum must be a positive integer, got 0"),
    (["--grad-accum", "two"], "Invalid value for '--grad-accum': 'two' is not an integer"),
    (["--model", "nothere.toml"], "nothere.toml: model file not found"),
    (["--model", "strategies/checkpoint.toml"], "strategies/checkpoint.toml: unknown key 'loop'"),
    # A chart is PNG, SVG or PDF by its suffix; a .jpg used to get PNG bytes, after the compiles.
    (["--chart", "peaks.jpg"], "--chart peaks.jpg: a chart is saved as .png, .svg or .pdf, not .jpg"),
    # `-o -` is standard output; `--chart -` wrote a PNG into a file named "-".
    (["--chart", "-"], "--chart -: a chart is written to a file, not to standard output; name one (peaks.png)"),
]
E4B = "reports/gemma4-e4b-seq24576-b8-tpu7x-8.json"
EXPLAINED = "reports/gemma4-e4b-seq24576-b8-tpu7x-8-explain-offload-mlp.json"
FIT = "reports/gemma4-e2b-seq24576-tpu7x-8-fit.json"
REPORT_BAD = [
    ([E4B, "--host-ram", "lots"], "--host-ram: 'lots' is not a size like 90GiB"),
    ([E4B, "--host-ram", "-1TiB"], "--host-ram: '-1TiB' is not a size like 90GiB"),
    ([E4B, "--host-ram", "0GiB"], "--host-ram must be a positive size, got '0GiB'"),
    ([E4B, "--devices-per-host", "4"], "--devices-per-host only applies with --host-ram"),
    ([E4B, "--host-ram", "1TiB", "--devices-per-host", "0"], "--devices-per-host must be a positive integer, got 0"),
    (["/nonexistent.json"], "/nonexistent.json: file not found"),
    ([EXPLAINED, "--format", "csv"], "an explain result renders as table, markdown or json, not csv"),
    ([EXPLAINED, E4B], "an explain result renders on its own, not merged with other results"),
    ([EXPLAINED, "--host-ram", "1TiB"], "--host-ram applies to comparisons, not to an explain result"),
    ([EXPLAINED, "--top", "0"], "--top must be a positive integer, got 0"),
    ([E4B, "--top", "5"], "--top applies to an explain result, not to a comparison"),
    ([E4B, "--chart", "peaks.txt"], "--chart peaks.txt: a chart is saved as .png, .svg or .pdf, not .txt"),
    ([EXPLAINED, "--chart", "heap.jpeg"], "--chart heap.jpeg: a chart is saved as .png, .svg or .pdf, not .jpeg"),
]
EXPLAIN_BAD = [
    ([], "give exactly one of --strategy NAME or --diff A B"),
    (["--strategy", "unrolled", "--diff", "unrolled", "checkpoint"], "give exactly one of"),
    (["--diff", "checkpoint", "checkpoint"], "--diff needs two different strategies"),
    (["--strategy", "fastest"], "unknown strategy 'fastest'"),
    (["--strategy", "unrolled", "--top", "0"], "--top must be a positive integer, got 0"),
    (["--strategy", "unrolled", "--seq", "-1"], "--seq must be a positive integer, got -1"),
    (["--strategy", "unrolled", "--seq", "512,1024"],
     "Invalid value for '--seq': '512,1024' is not an integer (one value here)"),  # compare's sweep is not explain's
    (["--strategy", "unrolled", "--chart", "heap.gif"], "--chart heap.gif: a chart is saved as .png, .svg or .pdf"),
    # --diff takes two values, so the next option would be read as the second strategy.
    (["--diff", "unrolled", "--model", "tiny-e2b"],
     "Invalid value for '--diff': takes two strategy names, A B; '--model' is an option, not a strategy"),
]


@pytest.mark.parametrize("command,args,message", [("compare", *case) for case in COMPARE_BAD]
                         + [("explain", *case) for case in EXPLAIN_BAD]
                         + [("report", *case) for case in REPORT_BAD])
def test_bad_input_is_one_line_and_exit_2(command, args, message):
    # Refused before any compile: a case that is valid after all must not start a full-size one.
    r = memprobe(command, *args, cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("memprobe: error:")]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr


V5P_999 = ("libtpu rejects the topology 'v5p:9x9x9': INVALID_ARGUMENT: Topology layout \"v5p:9x9x9\" is not "
           "divisible by the given (or default) chips_per_host_bounds \"2x2x1\"")
UNKNOWN_NOPE = ("unknown strategy 'nope' (known: unrolled, checkpoint, scan-checkpoint, offload, dots-no-batch, "
                "minimal, offload-mlp, scan-layers, scan-layers-offload, scan-offload, scan-periods)")


@pytest.mark.parametrize("args,error", [
    # cpu drops the default offload strategy; that note only matters for a run that goes ahead.
    (["--target", "cpu", "--seq", "1000"],
     "--seq 1000 is not a multiple of the attention block (512); try 512 or 1024"),
    (["--target", "cpu", "--jobs", "0"], "--jobs must be a positive integer, got 0"),
    (["fit", "--target", "cpu", "--budget", "-1GiB"], "--budget: '-1GiB' is not a size like 90GiB, 96GB or 512MiB"),
    (["fit", "--target", "cpu", "--budget", "90"], "--budget: '90' has no unit: a size like 90GiB or 90GB (90B for bytes)"),
    (["fit", "--target", "cpu"], "target cpu has no HBM capacity to fit in; pass --budget SIZE"),
    # libtpu is asked before the compiles start, so no progress line comes before its answer.
    (["--target", "v5p", "--topology", "9x9x9", "--model", "tiny-e2b", "--seq", "512"], V5P_999),
    (["--target", "v5p:9x9x9", "--model", "tiny-e2b", "--seq", "512"], V5P_999),
    # A value named twice is said only when the run goes ahead, never before an error.
    (["--seq", "512,512", "--target", "cpu,cpu", "--strategies", "checkpoint,checkpoint,nope"], UNKNOWN_NOPE),
    (["fit", "--seq", "512,512", "--target", "cpu,cpu", "--strategies", "checkpoint,checkpoint,nope"], UNKNOWN_NOPE),
    # Without --target, a topology that names its kind picks the target: libtpu is asked for v5p.
    (["--topology", "v5p:9x9x9", "--model", "tiny-e2b", "--seq", "512"], V5P_999),
    (["fit", "--topology", "v5p:9x9x9", "--model", "tiny-e2b", "--seq", "512"], V5P_999),
])
def test_a_refused_plan_says_nothing_before_its_error(args, error):
    r = memprobe(*(args if args[0] == "fit" else ["compare", *args]))
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"memprobe: error: {error}"], r.stderr


@pytest.mark.parametrize("hidden,target,message", [
    # Each package made unimportable, as on a machine without it.
    ("libtpu", "v5p", "--target v5p: needs libtpu, which is not installed"),
    ("jax_plugins.xla_cuda12", "h100", "GPU targets need the JAX CUDA plugin, which is not installed"),
    ("nvidia.cuda_nvcc", "h100", "--target h100: the CUDA compiler tools are not installed"),
])
def test_missing_backend_is_one_line_and_exit_2(hidden, target, message):
    code = (f"import sys; sys.modules[{hidden!r}] = None; from memprobe.cli import main; "
            f"sys.exit(main(['compare', '--target', {target!r}, '--model', 'tiny-e2b', '--seq', '512']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_strategies_and_targets_list_what_exists():
    s = memprobe("strategies")
    assert s.returncode == 0
    for name in ("unrolled", "checkpoint", "scan-checkpoint", "offload", "layer_input", "dots-no-batch",
                 "dots_with_no_batch_dims_saveable", "minimal", "attention_out", "offload-mlp",
                 "mlp_hidden", "scan-offload", "scan-layers", "scan-layers-offload"):
        assert name in s.stdout
    t = memprobe("targets")
    assert t.returncode == 0
    for fragment in ("tpu7x:2x2x1", "94.74", "v5p:2x2x1", "95.73", "v6e:2x2", "31.24", "15.75", "cpu",
                     "tpu7x-8", "v5p-8", "v4-8", "v6e-4"):
        assert fragment in t.stdout
    if importlib.util.find_spec("jax_plugins.xla_cuda12"):  # read from the plugin's target configs
        for fragment in ("h100", "84,942,979,072", "h200", "151,397,597,184", "b200", "191,514,411,008", "a100"):
            assert fragment in t.stdout


def test_models_lists_the_presets_and_checks_a_model_file(tmp_path):
    listed = memprobe("models", "--format", "json")
    assert listed.returncode == 0 and not listed.stderr, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert list(rows) == ["gemma4-e2b", "gemma4-e4b", "tiny-e2b", "tiny-e4b", "small-deep"]
    # The gemma library's counts (test_model checks them from the model's own shapes).
    assert rows["gemma4-e2b"]["parameter_count"] == 4_647_449_891
    assert rows["gemma4-e4b"]["parameter_count"] == 7_518_069_034
    assert rows["gemma4-e2b"]["attention_pattern"] == ["sliding"] * 4 + ["global"]
    assert rows["gemma4-e2b"]["shared_mlp_hidden"] == 12288 and rows["gemma4-e4b"]["shared_mlp_hidden"] == 10240
    # A model file listed beside a preset: its count, and what it changed, in the table.
    path = tmp_path / "e2b-vocab32k.toml"
    path.write_text('base = "gemma4-e2b"\nvocab_size = 32768\n')
    t = memprobe("models", "--model", str(path), "--model", "gemma4-e2b", env={"COLUMNS": "200"})
    assert t.returncode == 0, t.stderr
    [mine] = [line for line in t.stdout.splitlines() if "e2b-vocab32k" in line]
    # 229,376 fewer rows in the embedding (width 1,536) and in the per-layer table (35 x 256).
    assert f"{4_647_449_891 - 229_376 * (1536 + 35 * 256):,}" in mine and "32,768" in mine
    [row] = json.loads(memprobe("models", "--model", str(path), "--format", "json").stdout)
    assert row["source"] == str(path) and row["vocab_size"] == 32768 and row["width"] == 1536
    assert "gemma4-e2b" in t.stdout and "4,647,449,891" in t.stdout
    # Written out in full as a file of its own (its description kept), it is the same model.
    written = memprobe("models", "--model", str(path), "--format", "toml")
    assert written.returncode == 0 and not written.stderr, written.stderr
    (tmp_path / "full.toml").write_text(written.stdout)
    [full] = json.loads(memprobe("models", "--model", str(tmp_path / "full.toml"), "--format", "json").stdout)
    assert {**full, "name": row["name"], "source": row["source"]} == row
    assert f"{row['parameter_count']:,} parameters" in written.stdout
    several = memprobe("models", "--format", "toml")
    assert several.returncode == 2 and several.stderr.strip().startswith(
        "memprobe: error: --format toml writes one model file: name one model with --model"), several.stderr
    path.write_text('base = "gemma4-e2b"\nnum_kv_heads = 3\n')
    bad = memprobe("models", "--model", str(path))
    assert bad.returncode == 2 and bad.stderr.strip() == (
        f"memprobe: error: {path}: num_heads 8 is not a multiple of num_kv_heads 3 (each K/V head serves "
        "a group of query heads)"), bad.stderr


def test_targets_and_strategies_as_json_for_scripts(tmp_path):
    t = memprobe("targets", "--format", "json")
    assert t.returncode == 0 and not t.stderr, t.stderr
    rows = {r["target"]: r for r in json.loads(t.stdout)}
    assert list(rows) == ["tpu7x", "v6e", "v5p", "v5e", "v4", "h100", "h200", "b200", "a100", "b300", "gb200",
                          "gb300", "h100-pcie", "a100-40gb", "rtx-pro-6000", "cpu"]
    assert rows["tpu7x"]["default"] and rows["tpu7x"]["default_topology"] == "tpu7x:2x2x1"
    assert rows["v5p"]["accelerator_type"] == "v5p-8" and rows["v5p"]["devices"] == 4
    assert rows["tpu7x"]["hbm_gib"] == 94.74 and rows["tpu7x"]["hbm_bytes"] == round(94.74 * 2**30)
    assert all(rows[k]["available"] for k in ("tpu7x", "v5p", "cpu"))
    assert rows["cpu"]["hbm_bytes"] is None
    if importlib.util.find_spec("jax_plugins.xla_cuda12"):  # read from the plugin's target configs
        assert rows["h100"]["hbm_bytes"] == 84_942_979_072 and rows["h200"]["hbm_bytes"] == 151_397_597_184
        assert rows["h100"]["available"]
        # A Grace-Blackwell compute tray is the host of 4 GPUs; an HGX node of 8.
        assert (rows["gb200"]["devices_per_host"], rows["b300"]["devices_per_host"]) == (4, 8)
    # Without libtpu the TPU rows are listed, and said not to compile here.
    code = ("import sys; sys.modules['libtpu'] = None; from memprobe.cli import main; "
            "sys.exit(main(['targets', '--format', 'json']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [x["available"] for x in json.loads(r.stdout) if x["platform"] == "tpu"] == [False] * 5

    mine = tmp_path / "save-mlp.toml"
    mine.write_text('description = "checkpoint, MLP hidden kept"\nloop = "checkpoint"\n'
                    'policy = "names"\nsave = ["mlp_hidden"]\n')
    s = memprobe("strategies", "--format", "json", "--strategy-file", str(mine))
    assert s.returncode == 0 and not s.stderr, s.stderr
    listed = {x["name"]: x for x in json.loads(s.stdout)}
    assert {"unrolled", "checkpoint", "scan-checkpoint", "offload", "scan-periods"} <= set(listed)
    assert listed["offload"]["offload"] == ["layer_input"] and listed["offload"]["source"] == "built-in"
    assert listed["scan-checkpoint"]["trip_count_one"] is True
    assert listed["save-mlp"] == {"name": "save-mlp", "description": "checkpoint, MLP hidden kept",
                                 "source": str(mine), "loop": "checkpoint", "policy": "names",
                                 "save": ["mlp_hidden"], "offload": [], "shared_kv_inside": False,
                                 "prevent_cse": True, "trip_count_one": False, "checkpoint_period": False}


def test_piped_tables_take_the_width_columns_asks_for():
    # Piped, a table is 160 columns wide (220 for the catalogue) so that rows stay whole,
    # unless $COLUMNS asks for a width, as it does for rich's own consoles.
    def widest(r):
        assert r.returncode == 0, r.stderr
        return max(len(line) for line in r.stdout.splitlines())

    assert 100 < widest(memprobe("targets")) <= 160  # conftest leaves no COLUMNS to inherit
    assert widest(memprobe("targets", env={"COLUMNS": "100"})) <= 100
    assert widest(memprobe("strategies", env={"COLUMNS": "100"})) <= 100
    assert widest(memprobe("report", E4B, "--format", "table", env={"COLUMNS": "90"}, cwd=ROOT)) <= 90


def test_help_wraps_sentences_to_the_terminal_not_to_the_source():
    # Wide enough that no sentence needs wrapping: a break inside one is the docstring's own.
    wide = {"COLUMNS": "400"}
    r = memprobe("--help", env=wide)
    assert r.returncode == 0
    assert ("Find the largest per-device batch (or, with --vary seq, the longest sequence) at which each "
            "strategy's step fits the target's HBM.") in r.stdout, r.stdout
    r = memprobe("check", "--help", env=wide)
    assert r.returncode == 0
    assert ("Exit 0: every peak and host figure within tolerance, every peak under --max-peak. Exit 1: a "
            "regression, a peak over budget or a failed compile. Exit 2: bad input.") in r.stdout, r.stdout


def test_help_says_what_an_option_takes_not_its_python_type():
    wide = {"COLUMNS": "200"}
    for command in ("compare", "fit", "baseline", "check", "explain"):
        r = memprobe(command, "--help", env=wide)
        assert r.returncode == 0, r.stderr
        assert "list[Path]" not in r.stdout and "str,str" not in r.stdout, r.stdout
        if command != "check":
            assert re.search(r"--strategy-file +<path> ", r.stdout), r.stdout
        for option in {"compare": ("--host-ram", "--max-host-memory"), "fit": ("--budget",),
                       "check": ("--max-peak",)}.get(command, ()):
            assert re.search(option + r" +<size> ", r.stdout), (option, r.stdout)
    r = memprobe("explain", "--help", env=wide)
    assert re.search(r"--diff +<A B> ", r.stdout), r.stdout
    r = memprobe("report", "--help", env=wide)
    assert re.search(r"RESULT +<path>\.\.\. +JSON results", r.stdout), r.stdout


def test_version_names_memprobe_and_its_compilers():
    import importlib.metadata as md

    r = memprobe("--version")
    assert r.returncode == 0 and not r.stderr, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"memprobe {md.version('memprobe')}"
    for pkg in ("jax", "jaxlib", "libtpu"):
        assert f"  {pkg} {md.version(pkg)}" in lines, r.stdout
    assert any(line.startswith("  jax-cuda12-plugin ") for line in lines), r.stdout


@pytest.mark.parametrize("args", [("targets",), ("targets", "--format", "json"), ("--version",)])
def test_a_reader_that_closed_the_pipe_ends_it_quietly_with_141(args):
    # `memprobe targets | head -1` exited 1, the code that says a strategy failed; rich's tables
    # and plain prints meet the closed pipe in different places, so both are tried.
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([sys.executable, "-m", "memprobe", *args], stdout=write, stderr=subprocess.PIPE,
                           text=True, timeout=120)
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (141, ""), r.stderr


def test_output_dash_is_standard_output(tmp_path):
    # `-o -` wrote a file named "-" and printed nothing.
    r = memprobe("report", str(ROOT / "reports" / "baseline-ci.json"), "-o", "-", "--format", "json", cwd=tmp_path,
                 timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schema"] == "memprobe.result"
    assert list(tmp_path.iterdir()) == [] and "wrote" not in r.stderr


def test_the_output_files_suffix_picks_the_format_when_none_is_given(tmp_path):
    # `-o e4b.csv` wrote the terminal table, box characters and all, into the .csv file.
    def written(name, *args):
        r = memprobe("report", E4B, "-o", str(tmp_path / name), *args, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        return (tmp_path / name).read_text()

    def printed(fmt):
        return memprobe("report", E4B, "--format", fmt, cwd=ROOT).stdout

    assert written("e4b.csv") == printed("csv") and written("e4b.csv").startswith("model,target,")
    assert written("e4b.JSON") == printed("json") and json.loads(written("e4b.JSON"))["schema"] == "memprobe.result"
    assert written("e4b.htm") == printed("html") and written("e4b.htm").startswith("<!doctype html>")
    assert written("e4b.txt") == written("e4b.md") == printed("markdown")  # report's default, and .md's
    assert json.loads(written("e4b.result", "--format", "json"))["schema"] == "memprobe.result"  # no format's suffix


@pytest.mark.parametrize("args,message", [
    (["fit", "--model", "tiny-e2b", "--seq", "512", "-o", "answer.csv"],
     "--output answer.csv: the .csv suffix asks for csv, which this command does not write; give --format "
     "(table, markdown or json)"),
    (["explain", "--model", "tiny-e2b", "--seq", "512", "--batch", "1", "--strategy", "checkpoint", "-o", "e.html"],
     "--output e.html: the .html suffix asks for html, which this command does not write; give --format "
     "(table, markdown or json)"),
    (["report", E4B, "-o", "peaks.PNG"],
     "--output peaks.PNG: .PNG is a picture's suffix, and --output writes the result as text; a chart is saved "
     "with --chart peaks.PNG"),
    (["fit", "--model", "tiny-e2b", "--seq", "512", "-o", "answer.svg"],
     "--output answer.svg: .svg is a picture's suffix, and --output writes the result as text"),
    (["baseline", "--model", "tiny-e2b", "--seq", "512", "--batch", "1", "-o", "base.md"],
     "--output base.md: a baseline is JSON, which a .md file is not; name it .json"),
    # `--format json -o e4b.md` wrote JSON into e4b.md (as the library's save() no longer does)
    (["report", E4B, "--format", "json", "-o", "e4b.md"],
     "--output e4b.md: its .md suffix names markdown, but --format json was given; name the file e4b.json, or drop "
     "--format to write markdown"),
    (["compare", "--model", "tiny-e2b", "--seq", "512", "--format", "table", "-o", "peaks.md"],
     "--output peaks.md: its .md suffix names markdown, but --format table was given; name the file peaks.txt, or "
     "drop --format to write markdown"),
    (["fit", "--model", "tiny-e2b", "--seq", "512", "--format", "markdown", "-o", "answer.csv"],
     "--output answer.csv: its .csv suffix names csv, but --format markdown was given; name the file answer.md"),
    (["report", E4B, "--format", "json", "-o", "peaks.png"],
     "--output peaks.png: .png is a picture's suffix, and --output writes the result as text; a chart is saved "
     "with --chart peaks.png"),
    (["report", FIT, "-o", "fit.html"],
     f"{FIT}: a fit result renders as table, markdown or json, not html (from --output's .html suffix; give "
     "--format)"),
])
def test_a_suffix_naming_a_format_the_command_lacks_is_refused_before_compiling(tmp_path, args, message):
    r = memprobe(*args, cwd=tmp_path if args[0] != "report" else ROOT, timeout=120)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.strip() == f"memprobe: error: {message}", r.stderr
    assert "compiling" not in r.stderr and not (tmp_path / args[-1]).exists()


def test_bare_memprobe_prints_its_help_and_no_error():
    # It printed the help, then "memprobe: error: " with nothing after it, exit 2.
    r = memprobe()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "Usage: memprobe [OPTIONS] COMMAND" in r.stdout and "compare" in r.stdout


def test_help_gives_a_flag_no_value():
    # Typer's help gave flags a type column, `--no-cache <bool>`, as if they took a value.
    wide = {"COLUMNS": "200"}
    for command in ("", "compare", "baseline", "fit", "check", "explain", "report", "targets", "strategies",
                    "models"):
        r = memprobe(*command.split(), "--help", env=wide)
        assert r.returncode == 0, r.stderr
        assert "<bool>" not in r.stdout, (command, r.stdout)
        assert re.search(r"--help +-h +Show this message", r.stdout), (command, r.stdout)
        assert memprobe(*command.split(), "-h", env=wide).stdout == r.stdout
    r = memprobe("compare", "--help", env=wide)
    assert re.search(r"--no-cache +Compile every strategy again", r.stdout), r.stdout
    assert re.search(r"--seq +<int>\[,<int>...\] +Sequence length", r.stdout), r.stdout
    for option, takes in (("--model", "<name|file>"), ("--target", "<name>[,<name>...]"), ("--topology", "<topology>"),
                          ("--timeout", "<seconds>")):
        assert re.search(f"{option} +{re.escape(takes)} ", r.stdout), (option, r.stdout)


def test_a_long_compile_says_it_is_still_compiling_in_a_log(tmp_path):
    # A full-size compile is 20 minutes of silence in a CI log without these lines; every
    # STILL_EVERY_S (5 minutes), set to 2 s here so that a tiny compile shows them.
    code = ("import sys, memprobe.cli.compare as c; c.STILL_EVERY_S = 2.0; from memprobe.cli import main; "
            "sys.exit(main(['compare', '--model', 'tiny-e2b', '--target', 'cpu', '--seq', sys.argv[1], "
            "'--batch', '1', '--strategies', 'unrolled', '--format', 'json']))")
    env = {**os.environ, "MEMPROBE_CACHE_DIR": str(tmp_path)}
    for run, seq in (("first", "256"), ("second", "512")):
        r = subprocess.run([sys.executable, "-c", code, seq], capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr
        lines = r.stderr.splitlines()
        still = [i for i, line in enumerate(lines) if line.startswith("memprobe: unrolled: still compiling (")]
        assert still, r.stderr
        start = lines.index(next(line for line in lines if line.startswith("memprobe: unrolled: compiling")))
        done = lines.index(next(line for line in lines if line.startswith("memprobe: unrolled: done after")))
        assert start < still[0] and still[-1] < done, r.stderr
        # The second also says what the nearest compile of the same work took here, the first.
        assert all(("; took " in lines[i] and "here last time, at seq 256 x 1)" in lines[i]) == (run == "second")
                   for i in still), r.stderr


def test_user_strategy_file_runs_end_to_end(tmp_path):
    path = tmp_path / "save-mlp.toml"
    path.write_text('description = "checkpoint, MLP hidden kept"\nloop = "checkpoint"\n'
                    'policy = "names"\nsave = ["mlp_hidden"]\n')
    r = memprobe("compare", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--batch", "1",
                 "--strategies", "checkpoint,save-mlp", "--strategies-dir", str(tmp_path), "--no-cache",
                 "--format", "markdown")
    assert r.returncode == 0, r.stderr
    rows = {line.split("|")[2].strip(): line for line in r.stdout.splitlines() if line.startswith("|")}
    # Keeping the MLP hidden recomputes less than saving nothing: fewer FLOPs, more bytes.
    assert "save-mlp" in rows and "checkpoint" in rows
    assert "--strategies-dir " + str(tmp_path) in r.stdout


def test_a_model_file_runs_end_to_end_and_its_baseline_needs_no_file(tmp_path):
    path = tmp_path / "tiny-v1k.toml"
    path.write_text('description = "tiny-e2b, twice the vocabulary"\nbase = "tiny-e2b"\nvocab_size = 1024\n')
    saved = tmp_path / "base.json"
    r = memprobe("baseline", "--model", str(path), "--target", "cpu", "--seq", "64", "--batch", "1",
                 "--strategies", "unrolled", "--output", str(saved))
    assert r.returncode == 0, r.stderr
    [row] = json.loads(saved.read_text())["comparisons"][0]["rows"]
    assert row["model"] == "tiny-v1k" and row["model_config"]["vocab_size"] == 1024
    assert row["model_config"]["width"] == 128  # the base's, as it is
    # tiny-e2b's parameters, 512 more embedding rows (width 128) and per-layer rows (5 x 16).
    from memprobe.build import parameter_count
    from memprobe.model import PRESETS
    assert row["parameter_count"] == parameter_count(PRESETS["tiny-e2b"]) + 512 * (128 + 5 * 16)
    md = memprobe("report", str(saved), "--format", "markdown")
    assert "- Model tiny-v1k: a model file's, 5 layers, width 128, vocab 1,024," in md.stdout, md.stdout
    ex = memprobe("explain", "--strategy", "unrolled", "--model", str(path), "--target", "cpu", "--seq", "64",
                  "--batch", "1", "--format", "markdown")
    assert ex.returncode == 0, ex.stderr
    assert "- Model tiny-v1k: a model file's, 5 layers, width 128, vocab 1,024," in ex.stdout, ex.stdout
    # The record carries the model: CI can gate it with the file gone, compiling it again.
    path.unlink()
    r = memprobe("check", "--baseline", str(saved), "--no-cache")
    assert r.returncode == 0, r.stderr
    assert "memprobe check: 1 of 1 within tolerance 2%" in r.stdout
    assert "tiny-v1k seq 64 x 1 on cpu" in r.stdout
    # A record whose sizes cannot build a model is refused in one line.
    data = json.loads(saved.read_text())
    data["comparisons"][0]["rows"][0]["model_config"]["num_kv_heads"] = 3
    spoiled = tmp_path / "spoiled.json"
    spoiled.write_text(json.dumps(data))
    r = memprobe("check", "--baseline", str(spoiled))
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "model_config: num_heads 4 is not a multiple of num_kv_heads 3 (each K/V head serves a group of "
        "query heads)"), r.stderr


def test_report_judges_a_saved_result_against_a_hosts_ram():
    # The committed full-size E4B result, re-judged without compiling: offload-mlp's
    # 153.75 GiB per device, times the 8 devices of a tpu7x host, is over 1 TiB.
    r = memprobe("report", E4B, "--host-ram", "1TiB", "--format", "json", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    [comparison] = json.loads(r.stdout)["comparisons"]
    rows = {row["strategy"]: row for row in comparison["rows"]}
    assert rows["offload-mlp"]["fits_host"] is False and rows["offload"]["fits_host"] is True
    assert {row["host_ram_bytes"] for row in rows.values()} == {1024**4}
    assert {row["devices_per_host"] for row in rows.values()} == {8}
    assert [f["kind"] for f in rows["offload-mlp"]["flags"]].count("over host RAM") == 1
    md = memprobe("report", E4B, "--host-ram", "1TiB", "--devices-per-host", "4", cwd=ROOT)
    assert md.returncode == 0, md.stderr
    assert "**over host RAM**" not in md.stdout and "shared by 4 devices" in md.stdout


def _split_result(tmp_path, path, first):
    """A committed result cut in two files: its first ``first`` rows, and the rest."""
    data = json.loads((ROOT / path).read_text())
    [comparison] = data["comparisons"]
    parts = []
    for i, rows in enumerate((comparison["rows"][:first], comparison["rows"][first:])):
        part = {**data, "command": f"memprobe compare --part {i}", "comparisons": [{**comparison, "rows": rows}]}
        parts.append(tmp_path / f"part{i}.json")
        parts[-1].write_text(json.dumps(part))
    return parts


def test_report_saves_an_svg_chart_beside_the_result_it_writes(tmp_path):
    # The chart's format follows its suffix and leaves the result's own format alone (the
    # two once shared a name, and the JSON came out empty).
    out, svg = tmp_path / "e4b.json", tmp_path / "e4b.svg"
    r = memprobe("report", E4B, "--format", "json", "-o", str(out), "--chart", str(svg), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    alone = memprobe("report", E4B, "--format", "json", cwd=ROOT)
    assert json.loads(out.read_text())["comparisons"] == json.loads(alone.stdout)["comparisons"]
    assert svg.read_bytes().startswith(b"<?xml") and b"scan-periods</text>" in svg.read_bytes()


def test_a_chart_and_the_output_in_one_file_are_refused(tmp_path):
    # The html was written over the chart (or the chart over the result) without a word.
    # (A name with a picture's suffix is refused for --output anyway; a chart with none is a PNG.)
    same, spelt_otherwise = tmp_path / "e4b", tmp_path / ".." / tmp_path.name / "e4b"
    r = memprobe("report", E4B, "--format", "html", "-o", str(same), "--chart", str(spelt_otherwise), cwd=ROOT)
    assert (r.returncode, r.stdout) == (2, "") and not same.exists(), r.stderr
    assert r.stderr.strip().endswith("e4b is the --output file too; name two files"), r.stderr


def test_report_does_not_write_markdown_over_the_result_it_reads(tmp_path):
    # `report r.json --format markdown -o r.json` replaced the only copy of the result.
    # (A .json name is refused for markdown anyway; a result kept under another name is not.)
    saved = tmp_path / "r.result"
    saved.write_text((ROOT / E4B).read_text())
    r = memprobe("report", str(saved), "--format", "markdown", "-o", str(saved), cwd=ROOT)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.strip() == (f"memprobe: error: --output {saved} is a result being read: its markdown would "
                                "replace the JSON; name another file")
    assert saved.read_text() == (ROOT / E4B).read_text()
    saved = saved.rename(tmp_path / "r.json")
    again = memprobe("report", str(saved), "-o", str(saved), cwd=ROOT)  # JSON (the suffix's): the same result
    assert again.returncode == 0, again.stderr
    alone = memprobe("report", E4B, "--format", "json", cwd=ROOT)
    assert json.loads(saved.read_text())["comparisons"] == json.loads(alone.stdout)["comparisons"]


def test_report_merges_results_of_one_configuration_into_one_table(tmp_path):
    # Strategies compiled in two runs read as the one comparison they would have made together.
    a, b = _split_result(tmp_path, E4B, 3)
    r = memprobe("report", str(a), str(b), "--format", "json", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    merged = json.loads(r.stdout)
    whole = memprobe("report", E4B, "--format", "json", cwd=ROOT)
    # Flags and FLOPs ratios are recomputed over the merged table, as over the whole one.
    assert merged["comparisons"] == json.loads(whole.stdout)["comparisons"]
    assert merged["command"].splitlines() == ["memprobe compare --part 0", "memprobe compare --part 1"]
    md = memprobe("report", str(a), str(b), cwd=ROOT)
    assert md.returncode == 0, md.stderr
    assert md.stdout.count("- Command: `") == 2 and md.stdout.count("| offload-mlp ") == 1


def _spoil_strategies(d):
    d["strategies"] = []


def _spoil_measurement(d):
    del d["strategies"][0]["measurement"]["seq_len"]


def _spoil_explanation(d):
    del d["strategies"][0]["explanation"]["buffers"]


def _spoil_buffer(d):
    d["strategies"][0]["explanation"]["buffers"][0] = "a buffer"


def _spoil_version(d):
    d["schema_version"] = 7


@pytest.mark.parametrize("spoil,message", [
    (_spoil_strategies, "strategies: expected a non-empty list"),
    (_spoil_measurement, "strategies[0].measurement: missing field 'seq_len'"),
    (_spoil_explanation, "strategies[0].explanation: missing field 'buffers'"),
    (_spoil_buffer, "strategies[0].explanation: malformed (TypeError:"),
    (_spoil_version, "schema_version 7 is not supported (this memprobe reads 1)"),
])
def test_report_refuses_a_malformed_explain_result_in_one_line(tmp_path, spoil, message):
    data = json.loads((ROOT / EXPLAINED).read_text())
    spoil(data)
    path = tmp_path / "spoilt.json"
    path.write_text(json.dumps(data))
    r = memprobe("report", str(path), cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    [line] = [l for l in r.stderr.splitlines() if l.startswith("memprobe: error:")]
    assert line.startswith(f"memprobe: error: {path}: ") and message in line, line


@pytest.mark.parametrize("content,found", [
    ('{"schema": "memprobe.baseline", "schema_version": 1}', "schema 'memprobe.baseline'"),
    ('{"comparisons": []}', 'no "schema" field'),
])
def test_report_names_what_it_renders_when_a_file_is_of_another_kind(tmp_path, content, found):
    # A file of another kind was refused as "not a memprobe result (schema ...)", as if only
    # comparisons rendered.
    path = tmp_path / "other.json"
    path.write_text(content)
    r = memprobe("report", str(path), cwd=ROOT)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.strip() == (f"memprobe: error: {path}: memprobe report cannot render this ({found}; it renders "
                                "'memprobe.result', 'memprobe.fit', 'memprobe.fits', 'memprobe.explain' and "
                                "'memprobe.check')")


def test_report_refuses_a_merge_that_would_hide_or_mix_figures(tmp_path):
    a, b = _split_result(tmp_path, E4B, 3)
    twice = memprobe("report", str(a), str(a), cwd=ROOT)
    assert twice.returncode == 2
    assert ("part0.json: strategy 'unrolled' (gemma4-e4b, seq 24576 x per-device batch 8, tpu7x:2x2x1) "
            f"is in {a} too") in twice.stderr
    other = json.loads(b.read_text())
    other["comparisons"][0]["rows"][0]["versions"]["libtpu"] = "0.0.99"
    b.write_text(json.dumps(other))
    mixed = memprobe("report", str(a), str(b), cwd=ROOT)
    assert mixed.returncode == 2 and len(mixed.stderr.strip().splitlines()) == 1
    assert "libtpu 0.0.99" in mixed.stderr and "libtpu 0.0.50.1" in mixed.stderr
    fit = memprobe("report", FIT, str(a), cwd=ROOT)
    assert fit.returncode == 2 and "a fit result renders on its own" in fit.stderr
