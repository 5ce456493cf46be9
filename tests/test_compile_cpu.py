"""Real compiles of small configurations on the CPU backend."""

import functools

import pytest

from memprobe.compile import compile_job
from conftest import jobs_for
from memprobe.plan import Step
from memprobe.render.frame import comparison_frame
from memprobe.targets import resolve_target

# The CPU backend has no host memory space, so no offload strategy runs on it.
CPU_STRATEGIES = ("unrolled", "checkpoint", "scan-checkpoint", "dots-no-batch")


@functools.cache
def cpu_results():
    jobs = jobs_for("tiny-e2b", resolve_target("cpu", 2), seq=512, batch=1, strategies=CPU_STRATEGIES)
    return {name: compile_job(job) for name, job in jobs.items()}


@pytest.mark.parametrize("name", CPU_STRATEGIES)
def test_every_strategy_compiles_on_cpu(name):
    m = cpu_results()[name]
    assert m.ok and m.platform == "cpu" and m.num_devices == 2
    assert m.temp_bytes > 0 and m.argument_bytes > 0
    # Parameters and both AdamW moments are donated: arguments alias outputs.
    assert m.alias_bytes > 0.9 * m.argument_bytes
    assert m.peak_bytes == m.argument_bytes + m.output_bytes - m.alias_bytes + m.temp_bytes
    assert m.capacity_bytes is None and m.fits is None and not m.stands_for_accelerator


def test_grad_step_has_no_optimizer_state():
    jobs = jobs_for("tiny-e2b", resolve_target("cpu", 1), seq=256, batch=1, strategies=["checkpoint"],
                 step=Step.GRAD)
    m = compile_job(jobs["checkpoint"])
    train = cpu_results()["checkpoint"]
    # Parameters only (no AdamW moments), nothing donated.
    assert m.alias_bytes == 0
    assert m.argument_bytes < 0.5 * train.argument_bytes * 2


def test_flops_column_grows_with_recompute():
    r = cpu_results()
    df = comparison_frame([r[n] for n in CPU_STRATEGIES]).set_index("strategy")
    ratio = df["flops_ratio"]
    assert ratio["unrolled"] == 1.0
    # Saving the matmul outputs recomputes less than saving nothing.
    assert 1.0 < ratio["dots-no-batch"] < ratio["checkpoint"]
    assert r["checkpoint"].matmul_flops > 1.1 * r["unrolled"].matmul_flops
    # The one-trip scan adds no compute; scan-checkpoint's donor layers also recompute their
    # K/V projections (shared_kv_inside), a sliver more than checkpoint.
    assert 1.0 < r["scan-checkpoint"].matmul_flops / r["checkpoint"].matmul_flops < 1.01
