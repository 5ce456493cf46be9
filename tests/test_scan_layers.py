"""scan-layers: layer parameters stacked by period of the attention pattern, the periods run
as one lax.scan. Same math as the unstacked model, same parameters, a smaller program."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import jobs_for
from memprobe.build import abstract_params, parameter_count
from memprobe.compile import compile_job, explain_job, trace_job
from memprobe.flags import sanity_flags
from memprobe.liveness import Buffer
from memprobe.model import PRESETS, Transformer
from memprobe.model._config import _TINY_SIZES, LayerStack, gemma4_small_config
from memprobe.strategy import load_catalogue
from memprobe.targets import resolve_target

# Tiny sizes, 8 layers of the pattern (sliding, global): two stacks of 2 trips, one on each
# side of the KV-sharing boundary. Both donors (layers 2 and 3) sit in the first stack's
# second trip, and the second stack reads their K/V.
STACKED = gemma4_small_config(name="tiny-stacked", num_layers=8, num_kv_heads=1, num_kv_shared_layers=4,
                              sliding_per_global=1, double_shared_mlp=True, **_TINY_SIZES)


def test_full_size_layouts_stack_every_layer():
    assert PRESETS["gemma4-e2b"].layer_layout() == (LayerStack(0, 5, 3), LayerStack(15, 5, 4))
    assert PRESETS["gemma4-e4b"].layer_layout() == (LayerStack(0, 6, 4), LayerStack(24, 6, 3))
    assert STACKED.layer_layout() == (LayerStack(0, 2, 2), LayerStack(4, 2, 2))
    assert STACKED.donor_layers == {2, 3}


def test_a_side_without_two_whole_periods_stays_single():
    # small-deep: 8 unshared layers of (s, s, s, g) stack as 2 trips; 4 shared ones are one
    # period, and a loop of one trip is no loop.
    assert PRESETS["small-deep"].layer_layout() == (LayerStack(0, 4, 2), 8, 9, 10, 11)
    assert PRESETS["tiny-e2b"].layer_layout() == (0, 1, 2, 3, 4)


def test_stacked_layout_keeps_every_parameter():
    cfg = PRESETS["gemma4-e2b"]
    assert parameter_count(cfg, stacked=True) == parameter_count(cfg) == 4_647_449_891
    _, params = abstract_params(cfg, stacked=True)
    # Position 4 of the second stack: the global layers 19, 24, 29, 34 with doubled MLPs.
    gate_up = params["layers"][1]["positions"][4]["mlp"]["gate_up"]
    assert gate_up.shape == (4, 2, 12288, 1536)


def _loss_and_grads(name, stacked, tokens, targets):
    """Loss and gradients in float64, so that any difference is one of math, not of rounding:
    in float32 the scan's other order of operations alone moves gradients by up to 3e-4 of
    their array's largest value on the CPU backend (a plain scan without remat moves them
    exactly as much); in float64 they agree to 3e-14."""
    model = Transformer(STACKED, rngs=nnx.Rngs(0), activation_dtype=jnp.float64, stacked=stacked)
    runner = load_catalogue()[name].layer_runner()
    graphdef, params = nnx.split(model, nnx.Param)
    params = jax.tree.map(lambda a: a.astype(jnp.float64), params)

    def loss(p):
        return nnx.merge(graphdef, p).loss(tokens, targets, loss_chunks=2, runner=runner)

    return jax.jit(jax.value_and_grad(loss))(params)


def _per_layer(stacked_layers):
    """Stacked layer gradients back in layer order."""
    out = {}
    for item, module in zip(STACKED.layer_layout(), stacked_layers.values()):
        for j, state in module["positions"].items():
            for k in range(item.repeats):
                out[item.layer(k, j)] = jax.tree.map(lambda a, k=k: a[k], state)
    return out


@pytest.mark.parametrize("name", ["scan-layers", "scan-layers-offload", "scan-periods"])
def test_scan_layers_computes_the_same_loss_and_gradients(name):
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 128), 0, STACKED.vocab_size)
    targets = jnp.roll(tokens, -1, axis=1)
    with jax.enable_x64(True):
        ref_loss, ref = _loss_and_grads("unrolled", False, tokens, targets)
        loss, grads = _loss_and_grads(name, True, tokens, targets)
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype("float64")}
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
    layers = _per_layer(grads["layers"])
    assert sorted(layers) == list(range(STACKED.num_layers))
    largest = max(float(np.abs(g).max()) for g in jax.tree.leaves(ref))

    def close(a, b):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12 * largest)

    for i, g in layers.items():
        jax.tree.map(close, g, ref["layers"][i])
    # The donors' K/V weights get gradient from the shared layers that read them.
    assert float(np.abs(layers[3]["attention"]["kv_proj"][...]).max()) > 0
    for key in ("embedding", "ple_table", "ple_model_proj", "final_norm"):
        jax.tree.map(close, grads[key], ref[key])


def tpu_jobs():
    """checkpoint and the scan-layers family for the stacked tiny model on a 4-device v5p."""
    jobs = jobs_for("tiny-e2b", resolve_target("v5p", 4), seq=1024, batch=2,
                    strategies=["checkpoint", "scan-layers", "scan-layers-offload", "scan-periods"])
    return {name: dataclasses.replace(job, model=STACKED) for name, job in jobs.items()}


@functools.cache
def tpu_results():
    """(measurement, optimized HLO) of each; scan-layers-offload's with the dump files on
    instead, as (measurement, explain's answer), since no test reads its HLO."""
    return {name: explain_job(job) if name == "scan-layers-offload" else compile_job(job, keep_hlo=True)
            for name, job in tpu_jobs().items()}


def _hidden_state_bytes(shapes) -> int:
    """One bf16 hidden state of the stacked model, [batch, seq, width], per device."""
    return shapes.batch_per_device * shapes.seq_len * STACKED.width * 2


def _layer_loop_count(hlo: str) -> int:
    """Loops of the train step's own scans (the layer stacks, the loss chunks), forward and
    backward; loops inside a layer (attention's block loops) are named after the layer."""
    return len(re.findall(r' while\(.*op_name="jit\(train_step\)/(?:transpose\()?jvp\(\)\)?/while"', hlo))


def test_scan_layers_compiles_one_body_per_stack():
    r = tpu_results()
    (ck, ck_hlo), (sl, sl_hlo) = r["checkpoint"], r["scan-layers"]
    assert sl.ok and sl.fits and sl.parameter_count == ck.parameter_count
    # Each stack's trips run as one loop forward and one backward, beside the loss's own
    # chunk loops that both programs have...
    assert _layer_loop_count(sl_hlo) == _layer_loop_count(ck_hlo) + 2 * 2
    # ...so the program holds each layer's code once per period, not once per layer.
    instructions = lambda hlo: len(re.findall(r"^\s+\S+ = ", hlo, re.M))
    assert instructions(sl_hlo) < 0.8 * instructions(ck_hlo)
    # The same recomputation as per-layer checkpoint with the donors' K/V inside the
    # boundary, as scan-layers keeps it: the loop's trips are counted, not its body once.
    inside = dataclasses.replace(load_catalogue()["checkpoint"], shared_kv_inside=True)
    job = tpu_jobs()["checkpoint"]
    assert sl.matmul_flops == trace_job(dataclasses.replace(job, strategy=inside)) > ck.matmul_flops
    # Stacked FSDP shards hold the same parameter and optimizer bytes per device.
    assert abs(sl.argument_bytes - ck.argument_bytes) <= 0.01 * ck.argument_bytes


def test_offload_inside_a_scan_of_several_trips_reaches_host_memory():
    # Unlike a kept one-trip loop (scan-offload), a scan of two trips takes the offloaded
    # layer inputs out to host memory as residuals.
    r = tpu_results()
    m = r["scan-layers-offload"][0]
    assert m.host_temp_bytes > 0 and r["scan-layers"][0].host_temp_bytes == 0
    kinds = {n: [f.kind for f in fl] for n, fl in sanity_flags([v[0] for v in r.values()]).items()}
    assert kinds == {"checkpoint": [], "scan-layers": [], "scan-layers-offload": [], "scan-periods": []}


def test_a_scan_of_several_trips_holds_more_host_memory_than_its_layer_inputs():
    # What explain lists in host memory where the most is live: each stack position's
    # inputs of every trip as one stacked residual, bf16[trips, batch, seq, width]...
    m, e = tpu_results()["scan-layers-offload"]
    shapes = tpu_jobs()["scan-layers-offload"].shapes
    row = f"{shapes.batch_per_device},{shapes.seq_len},{STACKED.width}]"
    hidden_state = _hidden_state_bytes(shapes)
    stacks = STACKED.layer_layout()
    stacked = [b for b in e["host_buffers"] if b["shape"] == f"bf16[{stacks[0].repeats},{row}"]
    assert sum(b["bytes"] for b in stacked) == STACKED.num_layers * hidden_state  # all 8 layer inputs
    assert len(stacked) == sum(s.period for s in stacks)
    # Each stack is named in the model's terms, by the stack and position whose inputs it
    # keeps, though only an async dynamic-update-slice with no op name writes it (the old
    # walk followed the buffer being filled back to itself and said "other").
    labels = [Buffer(**b).layer_label for b in stacked]
    assert all(b["kind"] == "forward" for b in stacked), labels
    assert sorted(labels) == sorted(f"{s.layers[0]}-{s.layers[-1]}, pos {p}" for s in stacks for p in range(s.period))
    # In HBM too, nothing the model or the step made is left "other": only 512-byte scalars.
    assert [b for b in e["buffers"] if b["kind"] == "other" and b["bytes"] > 512] == []
    # ...and beside them single layer inputs copied out apart (measured: 2, of the second
    # stack), so the host allocation exceeds the layer inputs (5 MiB against 4)...
    single = [b for b in e["host_buffers"] if b["shape"] == f"bf16[{row}"]
    assert single and e["host_peak_live_bytes"] == sum(b["bytes"] for b in stacked + single)
    assert e["host_heap_bytes"] >= e["host_peak_live_bytes"] > STACKED.num_layers * hidden_state
    # ...and memory_analysis() counts more host temp than the buffer assignment allocates
    # (measured 6.50 MiB against 5.00), which no listing can name.
    assert m.host_temp_bytes > e["host_heap_bytes"]


def test_scan_periods_keeps_one_input_per_trip_for_part_of_a_second_forward():
    r, jobs = tpu_results(), tpu_jobs()
    (sl, sl_hlo), (sp, sp_hlo) = r["scan-layers"], r["scan-periods"]
    assert sp.ok and _layer_loop_count(sp_hlo) == _layer_loop_count(sl_hlo)
    # Between the passes each of the 4 trips keeps its input instead of each of the 8
    # layers; the backward pass of a trip holds its 2 layers' inputs again. At this size
    # that leaves the peak lower by more than one hidden state (measured: 918,464 bytes
    # lower with libtpu 0.0.50, against 524,288 for one bf16 [2, 1024, 128]).
    shapes = jobs["scan-periods"].shapes
    hidden_state = _hidden_state_bytes(shapes)
    assert sl.peak_bytes - sp.peak_bytes >= hidden_state
    # Recomputing a trip's forward reruns every layer of it but the last, whose output the
    # backward pass does not need: here the sliding layer of each (sliding, global) trip,
    # which costs less than the global one (measured: +39.2 GFLOPs against +98.0 GFLOPs
    # for a whole forward of the layers, the difference between scan-layers and unrolled).
    unrolled = trace_job(dataclasses.replace(jobs["checkpoint"], strategy=load_catalogue()["unrolled"]))
    whole_forward = sl.matmul_flops - unrolled
    assert 0 < sp.matmul_flops - sl.matmul_flops < whole_forward / 2
