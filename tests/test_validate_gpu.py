"""bench/validate_gpu.py, the measured-vs-estimated script, run here on the CPU backend.

The measured column needs a GPU; what can be checked here is that the script builds and
runs the very program memprobe estimates, writes its rows as they finish, refuses
estimates made for another configuration, tells an allocator's refusal from other errors,
and checks each deviceless verdict against what a device reports.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "validate_gpu.py"


def run(*args, timeout=1200):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False)


def test_on_cpu_the_device_compiles_what_memprobe_estimates_and_each_row_is_written(tmp_path):
    r = run("--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--batch", "2",
            "--strategies", "checkpoint,unrolled", "--jobs", "2", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [row["strategy"] for row in rows] == ["checkpoint", "unrolled"]
    for row in rows:
        # Same compiler, same program: memprobe's estimate and the on-device compile agree
        # to the byte, and the step really ran (on CPU there is no allocator peak to read).
        assert row["deviceless"] == row["on_device_estimate"] > 0
        assert row["step_s"] > 0 and row["peak_bytes_in_use"] is None
    assert rows[1]["on_device_estimate"] > rows[0]["on_device_estimate"]  # unrolled keeps more
    table = (tmp_path / "table.md").read_text()
    assert table.count("n/a (cpu has no memory_stats)") == 2
    assert "JAX's default allocator limit here: n/a" in r.stdout  # probed; the CPU has none
    assert "default allocator limit on this device" not in table
    assert f"{rows[0]['deviceless']:,} B" in table and "Command: `python bench/validate_gpu.py" in table


def test_estimates_for_another_configuration_are_refused():
    estimates = ROOT / "reports" / "gemma4-e2b-seq8192-b1-h200-1.json"
    r = run("--seq", "1024", "--batch", "1", "--estimates", str(estimates), timeout=120)
    assert r.returncode != 0
    assert "is for another configuration" in r.stderr and "seq_len" in r.stderr


def test_the_device_run_covers_every_built_in_strategy():
    # A lent GPU runs the script with its default list: a strategy left out of it would
    # never be measured.
    from memprobe.strategy import load_catalogue

    listed = _script().ALL.split(",")
    assert sorted(listed) == sorted(load_catalogue()) and len(set(listed)) == len(listed)


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("validate_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["validate_gpu"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_running_out_of_device_memory_is_told_from_other_failures():
    # A real allocator refusal (the CPU backend's, for an array of 16 TiB) is a measurement
    # ("does not fit"); any other error is not, and the child process fails on it.
    import jax
    import jax.numpy as jnp

    module = _script()
    with pytest.raises(Exception) as refusal:  # noqa: PT011 - whatever type this jaxlib raises
        jax.block_until_ready(jax.jit(lambda: jnp.ones((2**42,), jnp.float32))())
    assert module.out_of_memory(refusal.value).startswith("RESOURCE_EXHAUSTED: Out of memory")
    assert module.out_of_memory(ValueError("shapes do not match")) is None


def test_the_table_checks_each_deviceless_verdict_against_the_device():
    # The committed one-H100 estimates, and what an H100 reports for two steps: one the
    # estimate says fits ran, one it says does not fit was refused by the allocator.
    module = _script()
    args = module.argparse.Namespace(model="gemma4-e2b", seq=8192, batch=1, target="h100", jobs=1, strategies=[],
                                     estimates=str(ROOT / "reports" / "gemma4-e2b-seq8192-b1-h100-1.json"))
    estimates = module.deviceless_estimates(args)
    assert estimates.target == "h100" and estimates.capacity == 84_942_979_072
    fits = min(estimates.peaks, key=lambda s: estimates.peaks[s])
    over = max(estimates.peaks, key=lambda s: estimates.peaks[s])
    assert estimates.verdict(fits) == "fits" and estimates.verdict(over) == "does not fit"
    device = "NVIDIA H100 80GB HBM3"
    measured = estimates.peaks[fits] + 2**30
    rows = [{"strategy": fits, "device": device, "deviceless": estimates.peaks[fits], "on_device_estimate": measured,
             "peak_bytes_in_use": measured, "step_s": 1.5, "bytes_limit": 82_000_000_000},
            {"strategy": over, "device": device, "deviceless": estimates.peaks[over], "step_s": 0.2,
             "out_of_memory": "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes.",
             "peak_bytes_in_use": 60_000_000_000, "bytes_limit": 82_000_000_000}]
    text = module.table(rows, args, estimates, started=0)
    assert "bore out the deviceless verdict for 2 of 2 strategies" in text
    assert "out of memory (allocator limit 76.37 GiB (82,000,000,000 B))" in text
    assert f"{measured / estimates.peaks[fits]:.3f}" in text and "not the chip" not in text
    assert "default allocator limit" not in text  # not probed: nothing said
    args.jax_default_limit = 64_140_607_488  # JAX's default 75% of an H100's 81,559 MiB
    assert "(no memory-fraction variable set): 59.74 GiB (64,140,607,488 B), 76% of the deviceless capacity" \
        in module.table(rows, args, estimates, started=0)
    # The same rows against the H200's estimates: every step fits there, so the refused
    # one is a verdict not borne out, and the table says the chips differ.
    args.estimates = str(ROOT / "reports" / "gemma4-e2b-seq8192-b1-h200-1.json")
    h200 = module.deviceless_estimates(args)
    text = module.table(rows, args, h200, started=0)
    assert "for 1 of 2 strategies" in text and "fits (**not borne out**)" in text
    assert "is not the chip the estimates are for (h200)" in text
    # An H200 reports its kind in short; an H100 PCIe is not the H100 of the estimates.
    assert not h200.other_chip("NVIDIA H200") and h200.other_chip("NVIDIA H100 80GB HBM3")
    assert not estimates.other_chip(device) and estimates.other_chip("NVIDIA H100 PCIe")
