"""Real compiles of small configurations, on the CPU backend and deviceless TPU."""

import dataclasses
import functools

import pytest

from memprobe.compile import compile_job
from memprobe.plan import Step, make_plan
from memprobe.strategy import DEFAULT_STRATEGIES, load_catalogue, select
from memprobe.targets import resolve_target

CATALOGUE = load_catalogue()


def _jobs(model, target, seq, batch, strategies=DEFAULT_STRATEGIES, step=Step.TRAIN):
    plan = make_plan(model=model, strategies=select(CATALOGUE, strategies), target=target,
                     seq_len=seq, batch_per_device=batch, step=step)
    return {j.strategy.name: j for j in plan.jobs()}


@functools.cache
def tpu_results():
    """The four families on a 4-device v5p, tiny E2B-shaped model: compiled once per session."""
    jobs = _jobs("tiny-e2b", resolve_target("v5p", 4), seq=1024, batch=2)
    return {name: compile_job(job, keep_hlo=True) for name, job in jobs.items()}


@functools.cache
def cpu_results():
    jobs = _jobs("tiny-e2b", resolve_target("cpu", 2), seq=512, batch=1)
    return {name: compile_job(job) for name, job in jobs.items()}


@pytest.mark.parametrize("name", DEFAULT_STRATEGIES)
def test_every_strategy_compiles_on_cpu(name):
    m = cpu_results()[name]
    assert m.ok and m.platform == "cpu" and m.num_devices == 2
    assert m.temp_bytes > 0 and m.argument_bytes > 0
    # Parameters and both AdamW moments are donated: arguments alias outputs.
    assert m.alias_bytes > 0.9 * m.argument_bytes
    assert m.peak_bytes == m.argument_bytes + m.output_bytes - m.alias_bytes + m.temp_bytes
    assert m.capacity_bytes is None and m.fits is None and not m.stands_for_accelerator


@pytest.mark.parametrize("name", DEFAULT_STRATEGIES)
def test_every_strategy_compiles_deviceless_for_tpu(name):
    m, _ = tpu_results()[name]
    assert m.ok and m.platform == "tpu" and m.topology == "v5p:2x2x1"
    assert m.capacity_bytes == round(95.73 * 2**30) and m.fits is True
    assert m.flops and m.flops > 0
    assert m.versions["jax"].startswith("0.12") and "libtpu" in m.versions


def test_unrolled_keeps_more_temporaries_than_checkpoint():
    r = tpu_results()
    assert r["unrolled"][0].temp_bytes > 1.05 * r["checkpoint"][0].temp_bytes


def test_scan_checkpoint_keeps_its_one_trip_loops():
    r = tpu_results()
    layers = 5
    scan_loops = r["scan-checkpoint"][0].while_loops
    # A forward and a backward one-trip loop per layer survive on top of the others.
    assert scan_loops >= r["checkpoint"][0].while_loops + 2 * layers
    assert "skip-simplify-while-loops_trip-count-one" in r["scan-checkpoint"][1]


def test_without_the_trip_count_attribute_the_scan_is_inlined():
    s = dataclasses.replace(CATALOGUE["scan-checkpoint"], name="scan-no-attr", trip_count_one=False)
    job = _jobs("tiny-e2b", resolve_target("v5p", 4), seq=1024, batch=2, strategies=["checkpoint"])["checkpoint"]
    m = compile_job(dataclasses.replace(job, strategy=s))
    kept = tpu_results()["scan-checkpoint"][0]
    assert m.while_loops < kept.while_loops


def test_offload_moves_bytes_to_host_on_tpu():
    r = tpu_results()
    assert r["offload"][0].host_temp_bytes > 0
    assert r["checkpoint"][0].host_temp_bytes == 0


def test_grad_step_has_no_optimizer_state():
    jobs = _jobs("tiny-e2b", resolve_target("cpu", 1), seq=256, batch=1, strategies=["checkpoint"],
                 step=Step.GRAD)
    m = compile_job(jobs["checkpoint"])
    train = cpu_results()["checkpoint"]
    # Parameters only (no AdamW moments), nothing donated.
    assert m.alias_bytes == 0
    assert m.argument_bytes < 0.5 * train.argument_bytes * 2
