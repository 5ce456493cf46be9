"""Sanity flags on real compiles: over capacity, and XLA's peak above memprobe's."""

from pathlib import Path

from conftest import jobs_for
from memprobe.compile import compile_job
from memprobe.flags import OVER_CAPACITY, OVER_HOST_RAM, XLA_PEAK_ABOVE, sanity_flags
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
    # A full-size E4B compile takes 25 minutes, so this reads the committed full-size results
    # (real compiles, see docs/findings.md). Only E4B offload-mlp has XLA's peak above
    # argument + output - alias + temp there; a tiny program that has it is in test_explain.
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


def _e4b_full_size():
    # Full-size E4B on tpu7x:2x2x1 (real compiles, see docs/findings.md): offload-mlp puts
    # 153.75 GiB per device in host memory, offload 7.50 GiB, the rest nothing.
    [group] = Result.load(REPORTS / "gemma4-e4b-seq24576-b8-tpu7x-8.json").comparisons
    return group


def test_host_ram_is_judged_for_every_device_on_the_host():
    from memprobe.measure import with_host_ram
    from memprobe.render.frame import comparison_frame, footnotes

    group = _e4b_full_size()
    mlp = next(m for m in group if m.strategy == "offload-mlp")
    need = mlp.host_bytes * 8  # libtpu's tpu7x host: 2x2 chips of 2 devices
    assert need > 1024**4 > 0

    # Exactly enough RAM fits; one byte less does not, and says by how much it is over.
    assert {m.fits_host for m in with_host_ram(group, need)} == {True}
    judged = with_host_ram(group, need - 1)
    over = {m.strategy: m for m in judged if m.fits_host is False}
    assert list(over) == ["offload-mlp"] and over["offload-mlp"].devices_per_host == 8
    [flag] = [f for f in sanity_flags(judged)["offload-mlp"] if f.kind == OVER_HOST_RAM]
    # One byte apart, the two read the same in GiB: they are said in bytes.
    assert flag.reason == f"host 153.75 GiB x 8 devices per host = {need:,} bytes > host RAM {need - 1:,} bytes"

    # The verdict says both things offload-mlp is over; the flags column repeats neither.
    df = comparison_frame(judged).set_index("strategy")
    assert df.loc["offload-mlp", "verdict"] == "over capacity, over host RAM"
    assert df.loc["offload", "verdict"] == "over capacity"
    assert "over host RAM" not in df.loc["offload-mlp", "other_flags"]
    [note] = [n for n in footnotes(judged) if n.startswith("host GiB")]
    assert f"({need - 1:,} bytes, --host-ram) shared by 8 devices" in note

    # Four devices to a host need half as much: 615 GiB fits in 1 TiB.
    assert {m.fits_host for m in with_host_ram(group, 1024**4, devices_per_host=4)} == {True}
    # Without --host-ram nothing is judged, and the note says so.
    assert {m.fits_host for m in group} == {None}
    assert not any(f.kind == OVER_HOST_RAM for fl in sanity_flags(group).values() for f in fl)


def test_host_ram_is_refused_where_it_cannot_apply():
    import pytest

    from memprobe.errors import BadInput
    from memprobe.measure import with_host_ram

    with pytest.raises(BadInput, match="--devices-per-host 16 is more than the 8 devices of tpu7x:2x2x1"):
        with_host_ram(_e4b_full_size(), 1024**4, devices_per_host=16)
    cpu = compile_job(jobs_for("tiny-e2b", resolve_target("cpu", 1), seq=256, batch=1,
                               strategies=["checkpoint"])["checkpoint"])
    with pytest.raises(BadInput, match="no row is for a target with host memory"):
        with_host_ram([cpu], 1024**4)


def test_sizes_said_together_never_read_the_same_in_gib_when_they_differ():
    from memprobe.measure import in_gib

    gib = 2**30
    assert in_gib(90 * gib, 84 * gib + gib // 2) == ["90.00 GiB", "84.50 GiB"]
    assert in_gib(15 * gib) == ["15.00 GiB"] and in_gib(0) == ["0.00 GiB"]
    # Measured: tiny-e2b offload at seq 512 x 2 on v5e:2x2 (`memprobe compare`), XLA's peak over
    # the peak, both about 0.04 GiB, with 1.25 MiB bound for host memory: the flag once read
    # "XLA's peak 0.04 GiB > peak 0.04 GiB, with 0.00 GiB bound for host memory".
    assert in_gib(41_998_336, 40_138_240, 1_310_720) == ["41,998,336 bytes", "40,138,240 bytes", "1,310,720 bytes"]
    assert in_gib(1_310_720) == ["1,310,720 bytes"] and in_gib(1) == ["1 byte"]
    assert in_gib(2 * gib, 2 * gib) == ["2.00 GiB", "2.00 GiB"]  # equal: nothing hidden
