"""One strategy's compile dying must not lose the others' rows."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import jobs_for
from memprobe.compile import Stopped, compile_jobs, explain_isolated
from memprobe.targets import resolve_target
from test_cli import memprobe


def _compile_children(parent: int | None = None) -> list[int]:
    """The compile workers (``python -m memprobe.compile ...``) of ``parent`` (this process)."""
    parent = os.getpid() if parent is None else parent
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = next(int(l.split()[1]) for l in status.splitlines() if l.startswith("PPid:"))
        if ppid == parent and "memprobe.compile" in cmdline:
            found.append(int(proc.name))
    return found


def test_a_compile_killed_mid_way_fails_only_its_row():
    jobs = jobs_for("tiny-e2b", resolve_target("cpu", 1), seq=256, batch=1, strategies=["unrolled", "checkpoint"])
    killed = []

    def killer():
        # Wait until both workers run, let them get going, then kill one of them.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(_compile_children()) < 2:
            time.sleep(0.2)
        time.sleep(2)
        pid = min(_compile_children())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    t = threading.Thread(target=killer)
    t.start()
    results = compile_jobs(list(jobs.values()), parallel=2)
    t.join()
    assert killed
    failed = [m for m in results if not m.ok]
    ok = [m for m in results if m.ok]
    assert len(failed) == 1 and len(ok) == 1
    assert failed[0].error.startswith("compile process was killed (SIGKILL")
    assert ok[0].peak_bytes > 0


@pytest.mark.parametrize("cap,said", [("200MiB", "0.20 GiB"), ("1MiB", "1,048,576 bytes")])  # not "0.00 GiB"
def test_host_memory_cap_fails_the_row_and_exit_1(cap, said):
    r = memprobe("compare", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--batch", "1",
                 "--strategies", "unrolled", "--no-cache", "--max-host-memory", cap)
    assert r.returncode == 1
    assert f"unrolled failed: used more than {said} of host memory (the --max-host-memory cap)" in r.stdout


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has stopped running


def _start_two_compiles() -> tuple[subprocess.Popen, list[int]]:
    """``memprobe compare`` compiling two strategies at once, and its two compile workers."""
    # As from a terminal: SIGINT raises KeyboardInterrupt even where this test runs with it
    # ignored (a shell's background job passes SIG_IGN on, and memprobe keeps it so).
    start = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "sys.argv[0] = 'memprobe'; runpy.run_module('memprobe', run_name='__main__')")
    proc = subprocess.Popen(
        [sys.executable, "-c", start, "compare", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256",
         "--batch", "1", "--strategies", "unrolled,checkpoint", "--jobs", "2", "--no-cache"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(children := _compile_children(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(children) == 2, "the two compile workers did not start"
    return proc, children


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_running(p) for p in pids)


@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGINT, 130, "memprobe: interrupted"),
                                                   (signal.SIGTERM, 143, "memprobe: terminated")])
def test_an_interrupt_stops_the_compiles_running_in_parallel(sig, code, said):
    # Ctrl-C, or SIGTERM from `timeout` or a cancelled CI job, while two compiles run at once:
    # memprobe must end at once and take its compiles with it, not wait for them to finish.
    proc, children = _start_two_compiles()
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == said
    assert "Traceback" not in stderr
    assert _gone_within(children, 5), "a compile worker outlived memprobe"


def test_a_compile_ends_soon_after_memprobe_is_killed_outright():
    # SIGKILL (or the out-of-memory killer) leaves memprobe no chance to clean up; each
    # compile worker notices it has lost its parent and ends by itself.
    proc, children = _start_two_compiles()
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone_within(children, 10), "a compile worker kept running after memprobe was killed"


#: unrolled then checkpoint, one at a time, on the CPU backend.
TWO_IN_TURN = [sys.executable, "-m", "memprobe", "compare", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256",
               "--batch", "1", "--strategies", "unrolled,checkpoint", "--jobs", "1"]


def _stopped_at_checkpoint(env) -> list[str]:
    """TWO_IN_TURN sent SIGTERM as its checkpoint compile starts: its stderr lines (the log
    lines of a non-terminal stderr), once it ended with 128 + SIGTERM."""
    proc = subprocess.Popen(TWO_IN_TURN, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    said = []
    for line in proc.stderr:
        said.append(line.rstrip("\n"))
        if line.startswith("memprobe: checkpoint: compiling"):
            proc.send_signal(signal.SIGTERM)
            break
    said += proc.communicate(timeout=30)[1].splitlines()
    assert proc.returncode == 143, said
    return said


def test_a_stopped_run_says_which_results_it_kept(tmp_path):
    # A full-size run takes an hour; one stopped part-way must say what need not be compiled again.
    env = {**os.environ, "MEMPROBE_CACHE_DIR": str(tmp_path)}
    said = _stopped_at_checkpoint(env)
    assert said[-2:] == ["memprobe: kept in the results cache: unrolled (the same command answers from there)",
                         "memprobe: terminated"], said

    again = subprocess.run(TWO_IN_TURN, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "memprobe: unrolled: from cache" in again.stderr
    assert "memprobe: 1 compiled, 1 from cache" in again.stderr
    # The stopped compile never finished here, so nothing is said of how long it takes.
    assert "memprobe: checkpoint: compiling\n" in again.stderr, again.stderr

    # A compile of the same work at other shapes says what it took here last time.
    [unrolled] = [e["measurement"] for e in map(json.loads, map(Path.read_text, tmp_path.glob("*.json")))
                  if e["measurement"]["strategy"] == "unrolled"]
    whole = round(round(unrolled["process_seconds"], 1))  # as recorded, to a tenth
    took = f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"
    longer = [*TWO_IN_TURN[:9], "512", *TWO_IN_TURN[10:]]
    longer[longer.index("unrolled,checkpoint")] = "unrolled"  # the one this asks about
    longer = subprocess.run(longer, capture_output=True, text=True, env=env, timeout=300)
    assert longer.returncode == 0, longer.stderr
    assert f"memprobe: unrolled: compiling (took {took} here last time, at seq 256 x 1)\n" in longer.stderr


def test_a_run_whose_cache_cannot_be_written_says_so_and_claims_nothing_kept(tmp_path):
    # Cache writes fail silently (a result is still a result), so a cache directory that
    # cannot be made is said before the compiles, and a stopped run does not claim to have
    # kept what it finished.
    (tmp_path / "file").write_text("not a directory")
    cache_dir = tmp_path / "file" / "cache"
    said = _stopped_at_checkpoint({**os.environ, "MEMPROBE_CACHE_DIR": str(cache_dir)})
    assert said[0] == (f"memprobe: results cache {cache_dir} cannot be written (Not a directory): nothing this run "
                       "compiles will be kept (MEMPROBE_CACHE_DIR names another directory)"), said
    assert said[-2:] == ["memprobe: unrolled finished, but nothing was kept: the results cache cannot be written",
                         "memprobe: terminated"], said


def test_a_stopped_explain_leaves_no_dump_behind(tmp_path, monkeypatch):
    # An explain writes the compiler's dump files (tens of MB for a tiny model, far more at
    # full size). A compile killed part-way cannot remove them itself, so they must lie in
    # the folder memprobe removes however the compile ended.
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the compile process makes folders
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # and this one
    [job] = jobs_for("tiny-e2b", resolve_target("cpu", 1), seq=512, batch=1, strategies=["unrolled"]).values()
    stop = threading.Event()

    def stop_once_dumping():  # once the compiler has written its first dump file
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(tmp_path.rglob("memprobe-dump-*/*")):
            time.sleep(0.02)
        stop.set()

    t = threading.Thread(target=stop_once_dumping)
    t.start()
    with pytest.raises(Stopped):
        explain_isolated(job, stop=stop)
    t.join()
    assert list(tmp_path.iterdir()) == []


def test_a_compile_the_compiler_aborts_says_the_compilers_last_word():
    # A length memprobe refuses up front (positions past int32), forced into the job: XLA
    # logs one fatal line and aborts. The row used to say only "died on signal 6".
    (job,) = jobs_for("tiny-e2b", resolve_target("tpu7x", None), seq=256, batch=1,
                      strategies=["checkpoint"]).values()
    object.__setattr__(job.shapes, "seq_len", 100_000_000_000)
    (m,) = compile_jobs([job])
    assert m.error == ("compile process died on signal 6: DilatedBound overflow: bound=100000000000 "
                       "dilation=100000000000"), m.error


def test_libtpus_start_up_lines_are_never_a_compile_failures_reason(tmp_path):
    from memprobe.compile import _log_reason, compiler_oom

    log = tmp_path / "compile.log"
    startup = ("E0000 00:00:1796457191.370183   18939 common_lib.cc:860] INVALID_ARGUMENT: Error: unexpected "
               "worker hostname 'WARNING: could not determine TPU worker hostnames or IP addresses' from env var "
               "TPU_WORKER_HOSTNAMES.\n=== Source Location Trace: ===\nlearning/45eac/tfrc/runtime/libtpu_init_utils.cc:370\n")
    log.write_text(startup)
    assert _log_reason(str(log)) == "" and compiler_oom(str(log), "X: Invalid TPU program.") == (
        "X: Invalid TPU program.", None, [])
    # As libtpu logs it: the heap's listing (values at several offsets), then a block of
    # its own per argument, then the traceback; sizes rounded, the heap's smallest left out.
    header = "  cumulative_size;       size;       offset; used_by_n_values; shapes_list\n  ----------\n"
    log.write_text(startup + "E1205 07:53:20.478970   18962 deepsea_compiler_base.cc:3540] XLA:TPU compile permanent "
                   "error. Ran out of memory in memory space hbm. Used 19.89G of 15.75G hbm. Exceeded hbm capacity "
                   "by 4.14G. HLO module: jit_train_step. Memory usage report:\n\nMemory Space: default (color=0)\n"
                   "Total bytes: 21352807936 (19.89GiB)\n" + header +
                   "    5.72GiB( 41%);    5.72GiB;   6155304960;                2; 2×f32[512,3000000]\n"
                   "   11.44GiB( 83%);    5.72GiB;     11304960;   7; bf16[9]\n"
                   "   13.77GiB(100%);  915.55MiB;   1547304960;                1; f32[3000000,80]\n"
                   "   13.79GiB(100%);   512.0KiB;            0;                1; bf16[512,512]\n"
                   "  The rest 1341 values are less than 5% of the total size and not shown.\n\n" + header +
                   "  915.55MiB(100%);  915.55MiB;            0;                2; 2×f32[3000000,80]\n\n" + header +
                   "    1.43GiB(100%);    1.43GiB;            0;                2; 2×f32[3000000,128]\n\n"
                   "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "    1.00GiB(100%);    1.00GiB;            0;                2; not[part,of,the,report]\n")
    assert _log_reason(str(log)).startswith("XLA:TPU compile permanent error. Ran out of memory in memory space hbm.")
    why, needed, allocations = compiler_oom(str(log), "X: Invalid TPU program.")
    assert (why, needed) == (
        "over HBM: the TPU compiler needed 19.89 GiB (21,352,807,936 bytes) of 15.75 GiB and refused the program "
        "(X: Invalid TPU program.); its largest allocation, 5.72 GiB, held 2×f32[512,3000000]", 21_352_807_936)
    # Largest first across the listings (the compiler's order among equals); the heap's own
    # first listing, and any value at an offset, are in the heap.
    assert [(a.size, a.values, a.shapes, a.heap) for a in allocations] == [
        ("5.72 GiB", 2, "2×f32[512,3000000]", True), ("5.72 GiB", 7, "bf16[9]", True),
        ("1.43 GiB", 2, "2×f32[3000000,128]", False), ("915.55 MiB", 1, "f32[3000000,80]", True),
        ("915.55 MiB", 2, "2×f32[3000000,80]", False), ("512.0 KiB", 1, "bf16[512,512]", True)]
    # libtpu logs the shortage again as a warning after the report (libtpu 0.0.50): the
    # error with the report is still the one read.
    with log.open("a") as f:
        f.write("W1206 20:24:36.960927    9422 program_memory_allocator.cc:1340] Suppressing OOM due to "
                "xla_tpu_no_crash_on_oom: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
                "Used 19.89G of 15.75G hbm. Exceeded hbm capacity by 4.14G.\n")
    assert compiler_oom(str(log), "X: Invalid TPU program.")[:2] == (why, needed)
    # Out of another memory space, it is not a size over HBM: a failure, however well explained.
    log.write_text(log.read_text().replace("memory space hbm", "memory space vmem"))
    why, needed, _ = compiler_oom(str(log), "X: Invalid TPU program.")
    assert why.startswith("out of vmem, not HBM: the TPU compiler needed 19.89 GiB of the chip's 15.75 GiB of "
                          "vmem") and needed is None
    # A warning is never a crashed compile's reason, though libtpu's suppressed out-of-memory
    # warnings say "error" (a crash with nothing else logged gives no reason).
    log.write_text(startup + "W1206 20:24:36.960927    9422 program_memory_allocator.cc:1340] Suppressing OOM due "
                   "to xla_tpu_no_crash_on_oom: XLA:TPU compile permanent error. Ran out of memory in memory space "
                   "hbm. Used 19.89G of 15.75G hbm. Exceeded hbm capacity by 4.14G.\n")
    assert _log_reason(str(log)) == ""


def test_a_program_refused_out_of_vmem_says_so_and_is_no_size_over_hbm(tmp_path):
    # Measured with libtpu 0.0.50: tiny-e2b's checkpoint step at seq 256 x 130 on v5e:2x2 runs
    # out of vmem by 676 KiB, and the compiler refuses the program, logging why only as a
    # warning; so does one global layer of it (a fifth of the compile time; one sliding layer
    # compiles). It is a failure of that size (nothing is known of its HBM), in one line.
    model = tmp_path / "one-global.toml"
    model.write_text('base = "tiny-e2b"\nnum_layers = 1\nnum_kv_shared_layers = 0\nattention_pattern = ["global"]\n')
    r = subprocess.run([sys.executable, "-m", "memprobe", "compare", "--model", str(model), "--target", "v5e",
                        "--devices", "4", "--seq", "256", "--batch", "130", "--strategies", "checkpoint",
                        "--no-cache", "--format", "json"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 1, r.stderr
    (row,) = json.loads(r.stdout)["comparisons"][0]["rows"]
    assert row["status"] == "failed" and row.get("needed_bytes") is None
    assert re.fullmatch(r"out of vmem, not HBM: the TPU compiler needed 1\d\d\.\d\d MiB of the chip's 128\.00 MiB "
                        r"of vmem \(the on-chip memory its kernels work in\) and refused the program "
                        r"\(JaxRuntimeError: INVALID_ARGUMENT: Invalid TPU program\.\); this says nothing of "
                        r"HBM, and a neighbouring size may compile", row["error"]), row["error"]
    assert "Traceback" not in r.stderr and "libtpu" not in r.stderr.lower()
