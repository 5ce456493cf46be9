"""Deviceless NVIDIA GPU targets through the JAX CUDA plugin (the gpu extra)."""

import functools
import importlib.util

import pytest

from conftest import jobs_for
from memprobe.compile import compile_job, explain_job
from memprobe.liveness import Explanation
from memprobe.render.explain import peak_parts
from memprobe.targets import resolve_target

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jax_plugins.xla_cuda12") is None,
    reason="the gpu extra (JAX CUDA plugin) is not installed: ./scripts/setup.sh --gpu")

STRATEGIES = ("unrolled", "checkpoint", "offload")


@functools.cache
def gpu_results():
    """Each strategy compiled once; checkpoint and offload with the dump files on, for ``explain``."""
    jobs = jobs_for("tiny-e2b", resolve_target("h100", 2), seq=1024, batch=1, strategies=STRATEGIES)
    out = {"unrolled": compile_job(jobs["unrolled"])}
    for name in ("checkpoint", "offload"):
        out[name], out[f"{name} explained"] = explain_job(jobs[name])
    return out


def test_h100_capacity_comes_from_the_plugins_target_config():
    t = resolve_target("h100", 8)
    assert (t.platform, t.num_devices, t.hbm_bytes) == ("cuda", 8, 84_942_979_072)
    assert resolve_target("h200").hbm_bytes == 151_397_597_184
    assert resolve_target("b200").hbm_bytes == 191_514_411_008


def test_every_gpu_target_reads_its_capacity_and_host_size_from_the_plugin():
    from memprobe.targets import GPU_KINDS, devices_per_host, gpu_target_configs

    configs = gpu_target_configs()
    for name, description in GPU_KINDS.items():
        t = resolve_target(name, 16)
        assert t.gpu_config == description and t.hbm_bytes > 30 * 2**30 and description in configs
        assert devices_per_host("cuda", name, 16, None) == (4 if name.startswith("gb") else 8)
    assert resolve_target("B300").hbm_bytes == 297_021_865_984  # as the vendors write it
    assert resolve_target("a100-40gb").hbm_bytes < resolve_target("a100").hbm_bytes


def test_the_newest_generation_compiles_deviceless_too():
    # Blackwell Ultra (B300, compute capability 10.3) needs the carried ptxas to know it.
    [m] = jobs_for("tiny-e2b", resolve_target("b300", 1), seq=256, batch=1, strategies=("checkpoint",)).values()
    r = compile_job(m)
    assert r.ok and r.target == "b300" and r.capacity_bytes == 297_021_865_984, r.error
    assert 0 < r.peak_bytes < r.capacity_bytes and r.fits is True


def test_strategies_compile_deviceless_for_h100():
    r = gpu_results()
    for name in STRATEGIES:
        m = r[name]
        assert m.ok and m.platform == "cuda" and m.num_devices == 2, m.error
        assert m.capacity_bytes == 84_942_979_072 and m.fits is True
        assert "jax-cuda12-plugin" in m.versions and "libtpu" not in m.versions
    # Remat shrinks the GPU compiler's temporaries as it does the TPU's.
    assert r["unrolled"].temp_bytes > 1.05 * r["checkpoint"].temp_bytes


def test_offload_reaches_pinned_host_on_gpu():
    r = gpu_results()
    assert r["offload"].host_bytes > 0
    assert r["checkpoint"].host_bytes == 0
    # explain finds the offloaded bytes in host memory (space 5, as on TPU), all live at once:
    # its host peak is the compiler's host temp to the byte.
    e = r["offload explained"]
    assert e["host_peak_live_bytes"] == r["offload"].host_temp_bytes > 0
    # The buffer assignment allocates that much there, and the listing names it all.
    assert e["host_heap_bytes"] == r["offload"].host_temp_bytes
    assert sum(b["bytes"] for b in e["host_buffers"]) == e["host_peak_live_bytes"]
    assert r["checkpoint explained"]["host_buffers"] == []
    assert r["checkpoint explained"]["host_peak_live_bytes"] == 0


def test_explain_reads_the_gpu_compilers_heap():
    r = gpu_results()
    m, e = r["checkpoint"], r["checkpoint explained"]
    # The GPU compiler writes the same buffer assignment and live ranges as the TPU's, and
    # memprobe's reading of them reaches exactly the heap it allocated.
    assert e["heap_top_bytes"] == e["heap_bytes"] > 0
    assert e["heap_live_bytes"] <= e["heap_bytes"] <= m.temp_bytes
    assert e["peak_live_bytes"] == sum(b["bytes"] for b in e["buffers"]) <= m.peak_bytes
    names = {(b["kind"], b["tensor"]) for b in e["buffers"]}
    assert ("backward", "mlp_hidden") in names and any(k == "parameter" for k, _ in names)
    # Loop carries the GPU compiler starts from a fused broadcast are named too: under 1% "other".
    assert sum(b["bytes"] for b in e["buffers"] if b["kind"] == "other") < 0.01 * e["peak_live_bytes"]
    # Its temp is the heap to the byte, constants beside it: every part of the peak's split
    # is >= 0 and none is placed nowhere (no unplaced temp on GPU).
    parts = peak_parts(m, Explanation.from_dict(e))
    assert m.temp_bytes == e["heap_bytes"] and parts["unplaced_temp"] == 0
    assert sum(parts.values()) == m.peak_bytes and min(parts.values()) >= 0
