"""bench/validate_gpu.py, the measured-vs-estimated script, run here on the CPU backend.

The measured column needs a GPU; what can be checked here is that the script builds and
runs the very program memprobe estimates, writes its rows as they finish, and refuses
estimates made for another configuration.
"""

import json
import subprocess
import sys
from pathlib import Path

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
    assert f"{rows[0]['deviceless']:,} B" in table and "Command: `python bench/validate_gpu.py" in table


def test_estimates_for_another_configuration_are_refused():
    estimates = ROOT / "reports" / "gemma4-e2b-seq8192-b1-h200-1.json"
    r = run("--seq", "1024", "--batch", "1", "--estimates", str(estimates), timeout=120)
    assert r.returncode != 0
    assert "is for another configuration" in r.stderr and "seq_len" in r.stderr


def test_the_device_run_covers_every_built_in_strategy():
    # A lent GPU runs the script with its default list: a strategy left out of it would
    # never be measured.
    import importlib.util

    from memprobe.strategy import load_catalogue

    spec = importlib.util.spec_from_file_location("validate_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    listed = module.ALL.split(",")
    assert sorted(listed) == sorted(load_catalogue()) and len(set(listed)) == len(listed)
