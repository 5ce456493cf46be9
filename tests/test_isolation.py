"""One strategy's compile dying must not lose the others' rows."""

import os
import signal
import threading
import time
from pathlib import Path

from conftest import jobs_for
from memprobe.compile import compile_jobs
from memprobe.targets import resolve_target
from test_cli import memprobe


def _compile_children() -> list[int]:
    """This process's compile workers (``python -m memprobe.compile ...``)."""
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
        if ppid == os.getpid() and "memprobe.compile" in cmdline:
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


def test_host_memory_cap_fails_the_row_and_exit_1():
    r = memprobe("compare", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--batch", "1",
                 "--strategies", "unrolled", "--no-cache", "--max-host-memory", "200MiB")
    assert r.returncode == 1
    assert "unrolled failed: used more than 0.20 GiB of host memory (the --max-host-memory cap)" in r.stdout
