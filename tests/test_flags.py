"""Sanity flags on real compiles: over capacity, and XLA's peak above memprobe's."""

from pathlib import Path

from conftest import jobs_for
from memprobe.compile import compile_job
from memprobe.flags import OVER_CAPACITY, XLA_PEAK_ABOVE, sanity_flags
from memprobe.result import Result
from memprobe.targets import resolve_target

REPORTS = Path(__file__).resolve().parent.parent / "reports"


def test_over_capacity_is_flagged_with_the_figures():
    # A tiny model with a batch far beyond one v5e device's 15.75 GiB: unrolled keeps
    # every activation, about 16 GiB. The compile still finishes (no-crash-on-OOM).
    job = jobs_for("tiny-e2b", resolve_target("v5e", 1), seq=8192, batch=96, strategies=["unrolled"])["unrolled"]
    m = compile_job(job)
    assert m.ok and m.fits is False and m.peak_bytes > m.capacity_bytes
    [flag] = sanity_flags([m])["unrolled"]
    assert flag.kind == OVER_CAPACITY
    assert flag.reason == f"peak {m.peak_bytes / 2**30:.2f} GiB > HBM 15.75 GiB"


def test_xla_peak_above_the_peak_is_flagged_on_the_one_full_size_row_that_shows_it():
    # No small configuration reproduces it, and a full-size E4B compile takes 25 minutes, so
    # this reads the committed full-size results (real compiles, see the README). Only E4B
    # offload-mlp has XLA's peak above argument + output - alias + temp.
    flagged = {}
    for path in sorted(REPORTS.glob("gemma4-*-tpu7x-8.json")) + sorted(REPORTS.glob("gemma4-*-h100-8.json")):
        for group in Result.load(path).comparisons:
            for name, flags in sanity_flags(group).items():
                for f in flags:
                    if f.kind == XLA_PEAK_ABOVE:
                        flagged[(path.name, name)] = (f, next(m for m in group if m.strategy == name))
    assert list(flagged) == [("gemma4-e4b-seq24576-b8-tpu7x-8.json", "offload-mlp")]
    [(flag, m)] = flagged.values()
    assert m.xla_peak_bytes > m.peak_bytes and m.host_bytes > m.peak_bytes
    assert flag.reason == (f"XLA's peak {m.xla_peak_bytes / 2**30:.2f} GiB > peak {m.peak_bytes / 2**30:.2f} GiB, "
                           f"with {m.host_bytes / 2**30:.2f} GiB bound for host memory; "
                           "`memprobe explain` shows what is live in HBM")
