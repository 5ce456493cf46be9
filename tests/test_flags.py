"""The over-capacity flag on a real compile that exceeds a device's HBM."""

from conftest import jobs_for
from memprobe.compile import compile_job
from memprobe.flags import OVER_CAPACITY, sanity_flags
from memprobe.targets import resolve_target


def test_over_capacity_is_flagged_with_the_figures():
    # A tiny model with a batch far beyond one v5e device's 15.75 GiB: unrolled keeps
    # every activation, about 16 GiB. The compile still finishes (no-crash-on-OOM).
    job = jobs_for("tiny-e2b", resolve_target("v5e", 1), seq=8192, batch=96, strategies=["unrolled"])["unrolled"]
    m = compile_job(job)
    assert m.ok and m.fits is False and m.peak_bytes > m.capacity_bytes
    [flag] = sanity_flags([m])["unrolled"]
    assert flag.kind == OVER_CAPACITY
    assert flag.reason == f"peak {m.peak_bytes / 2**30:.2f} GiB > HBM 15.75 GiB"
