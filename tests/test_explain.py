"""`memprobe explain`: the compiler's buffer listing, named in the model's terms."""

import dataclasses
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import jobs_for
from memprobe.compile import explain_job
from memprobe.liveness import (Buffer, Explained, Explanation, diff, explain_dump, name_buffer, parse_assignment,
                               parse_hlo, parse_libtpu_heap, parse_live_range, sweep)
from memprobe.measure import Measurement
from memprobe.model import PRESETS
from memprobe.render.explain import curve_chart, diff_notes, explain_notes, host_frame, host_notes, write
from memprobe.targets import resolve_target

HLO = """ENTRY %main (param.1: f32[4,8]) -> f32[4,8] {
  %param.1 = f32[4,8]{1,0:T(8,128)} parameter(0), metadata={op_name="p[\\'layers\\'][3][\\'mlp\\'][\\'down\\'].value"}
  %fusion.7 = (bf16[2,4,16]{2,1,0:T(8,128)(2,1)}, /*index=1*/f32[4,8]{1,0}) fusion(%param.1), kind=kLoop, metadata={op_name="jit(train_step)/jvp(layer3)/mlp_hidden/dot_general" stack_frame_id=1}
  %copy-start.2 = (f32[4,8]{1,0:S(1)}, f32[4,8]{1,0}, u32[]) copy-start(%fusion.7), cross_program_prefetch_index=0
  ROOT %add.3 = f32[4,8]{1,0} add(%param.1, %param.1), metadata={op_name="jit(train_step)/transpose(jvp(layer12))/attention_out/add"}
}
"""

LIVE = """HloLiveRange (max 10):
  InstructionSequence:
    0:param.1
  BufferLiveRange:
    param.1{}:0-10
    fusion.7{0}:2-5
    fusion.7{1}:3-8
    add.3{}:5-9
    vmem.9{}:4-4
    host.8{}:2-6
  Live ranges at 4 (peak):
    fusion.7{0}: 256 bytes (cumulative: 256 bytes)
    vmem.9{}: 4096 bytes (cumulative: 4352 bytes)
  Stack trace breakdown for peak usage: 4352 bytes
"""

# add.3 updates fusion.7{0} in place (same bytes; its range starts where fusion.7{0}'s ends);
# vmem.9 is on-chip scratch (color 1), not HBM.
ASSIGNMENT = """BufferAssignment:
allocation 0: size 128, page 0, parameter 0, shape |f32[4,8]| at ShapeIndex {}, maybe-live-out:
 value: <1 param.1 @0> (size=128,offset=0): f32[4,8]{1,0}
allocation 1: size 1024, page 0, preallocated-temp:
 value: <2 fusion.7{0} @0> (size=256,offset=512): bf16[2,4,16]{2,1,0}
 value: <3 fusion.7{1} @0> (size=128,offset=0): f32[4,8]{1,0}
 value: <4 add.3 @0> (size=256,offset=512): f32[4,8]{1,0}
allocation 2: size 4096, color 1, page 0, preallocated-temp:
 value: <5 vmem.9 @0> (size=4096,offset=0): f32[32,32]{1,0}
allocation 3: size 512, page 0, constant:
 value: <6 constant.4 @0> (size=512,offset=0): f32[128]{0}
allocation 4: size 2048, color 5, page 0, preallocated-temp:
 value: <7 host.8 @0> (size=2048,offset=0): f32[512]{0:S(5)}
"""


def test_hlo_and_live_ranges_are_read_and_named():
    hlo = parse_hlo(HLO)
    assert hlo.instrs["fusion.7"].shape.startswith("(bf16[2,4,16]")
    length, ranges = parse_live_range(LIVE)
    assert length == 10 and ranges["fusion.7{1}"] == (3, 8) and len(ranges) == 6
    act = name_buffer("fusion.7{0}", 256, hlo)
    assert (act.shape, act.kind, act.layer, act.tensor) == ("bf16[2,4,16]", "forward", 3, "mlp_hidden")
    assert name_buffer("fusion.7{1}", 128, hlo).shape == "f32[4,8]"
    # An async copy has no op name of its own: it is named after what it copies.
    assert name_buffer("copy-start.2{0}", 128, hlo).tensor == "mlp_hidden"
    back = name_buffer("add.3{}", 128, hlo)
    assert (back.kind, back.layer, back.tensor) == ("backward", 12, "attention_out")
    param = name_buffer("param.1{}", 128, hlo)
    assert param.kind == "parameter" and param.label == "p['layers'][*]['mlp']['down'].value"
    # HLO text escapes the quotes of an op name; the name is read back as JAX wrote it, and so
    # is one stored escaped (by an older memprobe) in the cache or a saved JSON.
    assert param.op_name == "p['layers'][3]['mlp']['down'].value"
    stored = Explanation(peak_time=0, program_length=1, peak_live_bytes=128, heap_bytes=0, heap_live_bytes=0,
                         heap_top_bytes=0, fixed_bytes=0, onchip_bytes=0, buffers=[dataclasses.replace(
                             param, op_name="p[\\'layers\\'][3][\\'mlp\\'][\\'down\\'].value")], curve=[])
    assert Explanation.from_dict(stored.to_dict()).buffers[0].label == param.label
    # A layer inside a scan over stacked layers is named by its stack and period position.
    assert act.layer_label == "3" and param.layer_label == "-"
    stacked = dataclasses.replace(act, layer=None, op_name=(
        "jit(train_step)/transpose(jvp())/while/body/layers15-34/position4/mlp_hidden/dot_general"))
    assert stacked.layer_label == "15-34, pos 4"


# A while loop (a layer's backward scan): the body's parameter carries a counter, a value the
# body computes (element 1 of a two-output fusion, "fusion.9#1") and one it passes on as it is;
# the loop starts from a buffer allocated for it to fill. Then the step's own work.
LOOP_HLO = """%body.1 (wide.param.5: (s32[], f32[4,8], f32[4,8])) -> (s32[], f32[4,8], f32[4,8]) {
  %wide.param.5 = (s32[]{:T(128)}, f32[4,8]{1,0}, /*index=2*/f32[4,8]{1,0}) parameter(0)
  %get-tuple-element.1 = s32[]{:T(128)} get-tuple-element(%wide.param.5), index=0
  %get-tuple-element.2 = f32[4,8]{1,0} get-tuple-element(%wide.param.5), index=1
  %get-tuple-element.3 = f32[4,8]{1,0} get-tuple-element(%wide.param.5), index=2
  %fusion.9 = (f32[4,8]{1,0}, f32[4,8]{1,0}) fusion(%get-tuple-element.2), kind=kLoop, metadata={op_name="jit(train_step)/transpose(jvp(layer2))/while/body/mlp_out/add"}
  %add.4 = s32[]{:T(128)} add(%get-tuple-element.1, %get-tuple-element.1)
  ROOT %tuple.6 = (s32[]{:T(128)}, f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(%add.4, %fusion.9#1, %get-tuple-element.3)
}

ENTRY %main (param.1: f32[4,8]) -> f32[4,8] {
  %param.1 = f32[4,8]{1,0} parameter(0), metadata={op_name="p[\\'w\\']"}
  %custom-call.2 = f32[4,8]{1,0} custom-call(), custom_call_target="AllocateBuffer"
  %constant.3.clone..sunk = s32[]{:T(128)} constant(0)
  %loop_broadcast_fusion.5 = (f32[4,8]{1,0}, f32[4,8]{1,0}) fusion(), kind=kLoop, metadata={op_name="broadcast.1063"}
  %tuple.4 = (s32[]{:T(128)}, f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(%constant.3.clone..sunk, %custom-call.2, %loop_broadcast_fusion.5#1)
  %while.5 = (s32[]{:T(128)}, f32[4,8]{1,0}, f32[4,8]{1,0}) while(%tuple.4), condition=%cond.1, body=%body.1, metadata={op_name="jit(train_step)/transpose(jvp(layer2))/while"}
  %constant.7.clone = f32[4,8]{1,0} constant({...})
  %add.8 = f32[4,8]{1,0} add(%param.1, %param.1), metadata={op_name="jit(train_step)/optimizer_update/add"}
  ROOT %add.9 = f32[4,8]{1,0} add(%add.8, %add.8), metadata={op_name="jit(train_step)/grad_accum/while/body/eval_jaxpr/add"}
}
"""


def test_what_a_loop_carries_is_named_after_what_its_body_passes_on():
    hlo = parse_hlo(LOOP_HLO)
    assert hlo.loops["while.5"] == ("add.4", "fusion.9#1", "get-tuple-element.3")
    assert hlo.carries["wide.param.5"] == "while.5" and hlo.inits[("custom-call.2", ())] == ("while.5", 1)

    def named(value):
        b = name_buffer(value, 128, hlo)
        return b.label, b.layer, b.shape

    # The carried value the body computes: its (second) output's name, layer and tensor.
    assert named("wide.param.5{1}") == ("backward mlp_out add", 2, "f32[4,8]")
    # The buffer the loop fills has no source of its own: it is the same carried value.
    assert named("custom-call.2{}") == ("backward mlp_out add", 2, "f32[4,8]")
    # So is element 1 of a fusion that starts the loop, whose op name the compiler made up.
    assert named("loop_broadcast_fusion.5{1}") == ("backward while", 2, "f32[4,8]")
    assert named("loop_broadcast_fusion.5{0}") == ("other loop_broadcast_fusion", None, "f32[4,8]")
    # Passed on unchanged, or a counter: named after the loop itself.
    assert named("wide.param.5{2}") == ("backward while", 2, "f32[4,8]")
    assert named("constant.3.clone..sunk{}")[:2] == ("backward while", 2)
    # No op name anywhere: the opcode, without the compiler's numbering and suffixes.
    assert named("constant.7.clone{}") == ("other constant", None, "f32[4,8]")
    # The step's own work, by the name scopes build.py opens.
    assert named("add.8{}")[0] == "optimizer update add"
    assert named("add.9{}")[0] == "gradient accumulation add"


# tpu7x runs some layout copies on its SparseCores: the copy sits two calls deep, its only
# source the caller's operand, and the async-start passes nothing itself: its async-update
# does. At full size (E2B, seq 24576 x 8) such a copy held 9 GiB of gate/up gradient with no name.
CALL_HLO = """%called_computation.2 (param_0.3: f32[4,8], param_1.3: f32[4,8]) -> f32[4,8] {
  %param_1.3 = f32[4,8]{1,0} parameter(1)
  %param_0.3 = f32[4,8]{1,0} parameter(0)
  ROOT %copy.4 = f32[4,8]{0,1} copy(%param_1.3)
}, execution_thread="sparsecore"

%async_computation.5 (param_0.6: f32[4,8], param_1.6: f32[4,8]) -> f32[4,8] {
  %param_0.6 = f32[4,8]{1,0} parameter(0)
  %param_1.6 = f32[4,8]{1,0} parameter(1)
  ROOT %copy.7.cloned.1 = f32[4,8]{0,1} call(%param_0.6, %param_1.6), to_apply=%called_computation.2
}, execution_thread="sparsecore"

ENTRY %main (param.1: f32[4,8], param.2: f32[4,8]) -> f32[4,8] {
  %param.1 = f32[4,8]{1,0} parameter(0), metadata={op_name="p[\\'w\\']"}
  %param.2 = f32[4,8]{1,0} parameter(1)
  %fusion.8 = f32[4,8]{1,0} fusion(%param.2), kind=kLoop, calls=%fused.9, metadata={op_name="jit(train_step)/transpose(jvp(layer3))/mlp_hidden/mul"}
  %copy.7.cloned.1.call-start = ((), (), (s32[1]{0})) async-start(), async_execution_thread="sparsecore", calls=%async_computation.5
  %copy.7.cloned.1.call-update = ((f32[4,8]{1,0}, f32[4,8]{1,0}), f32[4,8]{0,1}) async-update(%copy.7.cloned.1.call-start, %param.1, %fusion.8)
  %param.3 = f32[4,8]{1,0} parameter(2)
  %all-gather-start.10 = ((f32[4,8]{1,0}), f32[4,8]{1,0}) async-start(%param.3), calls=%elsewhere.11
  %all-gather-done.12 = f32[4,8]{1,0} async-done(%all-gather-start.10)
  ROOT %copy.7.cloned.1.call-done = f32[4,8]{0,1} async-done(%copy.7.cloned.1.call-update)
}
"""


def test_a_copy_in_a_called_computation_is_named_after_what_its_caller_passes():
    hlo = parse_hlo(CALL_HLO)
    # Parameters by their number, not the order printed; the start's operands from its update.
    assert hlo.passes["param_1.3"] == "param_1.6" and hlo.passes["param_1.6"] == "fusion.8"
    b = name_buffer("copy.4{}", 128, hlo)
    assert (b.label, b.layer, b.shape) == ("backward mlp_hidden mul", 3, "f32[4,8]")
    # What the async call returns is that copy too, not its first operand.
    assert hlo.returns["copy.7.cloned.1.call-start"] == "copy.7.cloned.1"
    assert name_buffer("copy.7.cloned.1.call-done{}", 128, hlo).label == "backward mlp_hidden mul"
    # An async call whose computation is not in the text is followed to its operand; with no
    # name there either, its own name without the numbering is all there is to say.
    assert name_buffer("all-gather-done.12{}", 128, hlo).label == "other all-gather-done"


# A scan of several trips stacks what each trip outputs. Forward, an offloaded layer input
# is written by an async dynamic-update-slice with no op name into a buffer allocated before
# the loop (in host memory); backward, a weight gradient by a fusion whose op name is only
# the scan's stacking. A loop without metadata hands its outputs on by index. (Full-size E2B
# scan-layers-offload at seq 24576 x 8 left 11.25 GiB of host stacks "other custom-call" and
# named 4.71 GiB of stacked gradients after the loop counter's add or the scan's stacking.)
STACK_HLO = """%fused_stack (param_0.1: f32[2,4,8], param_1.1: f32[4,8], param_2.1: s32[]) -> f32[2,4,8] {
  %param_2.1 = s32[]{:T(128)} parameter(2)
  %param_1.1 = f32[4,8]{1,0} parameter(1)
  %param_0.1 = f32[2,4,8]{2,1,0} parameter(0)
  %bitcast.2 = f32[1,4,8]{2,1,0} bitcast(%param_1.1)
  ROOT %dynamic-update-slice.4 = f32[2,4,8]{2,1,0} dynamic-update-slice(%param_0.1, %bitcast.2, %param_2.1, %param_2.1, %param_2.1)
}

%async_stack.5 (param_0.5: f32[2,4,8], param_1.5: f32[1,4,8], param_2.5: s32[]) -> f32[2,4,8] {
  %param_0.5 = f32[2,4,8]{2,1,0:S(5)} parameter(0)
  %param_1.5 = f32[1,4,8]{2,1,0} parameter(1)
  %param_2.5 = s32[]{:T(128)} parameter(2)
  ROOT %dynamic-update-slice.6 = f32[2,4,8]{2,1,0:S(5)} dynamic-update-slice(%param_0.5, %param_1.5, %param_2.5, %param_2.5, %param_2.5)
}

%body.7 (wide.param.7: (s32[], f32[2,4,8], f32[2,4,8])) -> (s32[], f32[2,4,8], f32[2,4,8]) {
  %wide.param.7 = (s32[]{:T(128)}, f32[2,4,8]{2,1,0}, f32[2,4,8]{2,1,0:S(5)}) parameter(0)
  %get-tuple-element.8 = s32[]{:T(128)} get-tuple-element(%wide.param.7), index=0
  %get-tuple-element.9 = f32[2,4,8]{2,1,0} get-tuple-element(%wide.param.7), index=1
  %get-tuple-element.10 = f32[2,4,8]{2,1,0:S(5)} get-tuple-element(%wide.param.7), index=2
  %multiply.11 = f32[4,8]{1,0} multiply(%get-tuple-element.9, %get-tuple-element.9), metadata={op_name="jit(train_step)/jvp()/while/body/eval_jaxpr/layers0-3/position1/reduce_sum"}
  %bitcast.12 = f32[1,4,8]{2,1,0} bitcast(%multiply.11), metadata={op_name="jit(train_step)/jvp()/while/body/jit(dynamic_update_index_in_dim)/broadcast_in_dim"}
  %dynamic-update-slice-start.13 = ((f32[2,4,8]{2,1,0:S(5)}, f32[1,4,8]{2,1,0}, s32[]{:T(128)}), f32[2,4,8]{2,1,0:S(5)}, u32[]{:S(2)}) async-start(%get-tuple-element.10, %bitcast.12, %get-tuple-element.8), calls=%async_stack.5
  %dynamic-update-slice-done.14 = f32[2,4,8]{2,1,0:S(5)} async-done(%dynamic-update-slice-start.13)
  %multiply.18 = f32[4,8]{1,0} multiply(%get-tuple-element.9, %get-tuple-element.9), metadata={op_name="jit(train_step)/transpose(jvp())/while/body/eval_jaxpr/layers0-3/position0/mlp_out/dot_general"}
  %fusion.15 = f32[2,4,8]{2,1,0} fusion(%get-tuple-element.9, %multiply.18, %get-tuple-element.8), kind=kLoop, calls=%fused_stack, metadata={op_name="jit(train_step)/transpose(jvp())/while/body/jit(dynamic_update_index_in_dim)/dynamic_update_slice"}
  %add.16 = s32[]{:T(128)} add(%get-tuple-element.8, %get-tuple-element.8), metadata={op_name="jit(train_step)/jvp()/while/body/add"}
  ROOT %tuple.17 = (s32[]{:T(128)}, f32[2,4,8]{2,1,0}, f32[2,4,8]{2,1,0:S(5)}) tuple(%add.16, %fusion.15, %dynamic-update-slice-done.14)
}

ENTRY %main (param.1: f32[2,4,8]) -> f32[2,4,8] {
  %param.1 = f32[2,4,8]{2,1,0} parameter(0)
  %custom-call.2 = f32[2,4,8]{2,1,0:S(5)} custom-call(), custom_call_target="AllocateBuffer"
  %custom-call.20 = f32[2,4,8]{2,1,0} custom-call(), custom_call_target="AllocateBuffer"
  %copy-start.21 = (f32[2,4,8]{2,1,0:S(1)}, f32[2,4,8]{2,1,0}, u32[]{:S(2)}) copy-start(%custom-call.20)
  %copy-done.22 = f32[2,4,8]{2,1,0:S(1)} copy-done(%copy-start.21)
  %constant.3 = s32[]{:T(128)} constant(0)
  %tuple.4 = (s32[]{:T(128)}, f32[2,4,8]{2,1,0}, f32[2,4,8]{2,1,0:S(5)}) tuple(%constant.3, %copy-done.22, %custom-call.2)
  %while.5 = (s32[]{:T(128)}, f32[2,4,8]{2,1,0}, f32[2,4,8]{2,1,0:S(5)}) while(%tuple.4), condition=%cond.19, body=%body.7
  ROOT %get-tuple-element.6 = f32[2,4,8]{2,1,0} get-tuple-element(%while.5), index=1
}
"""


def test_a_scans_stacks_are_named_after_what_is_stacked():
    hlo = parse_hlo(STACK_HLO)

    def named(value):
        b = name_buffer(value, 256, hlo)
        return b.label, b.layer_label, b.shape

    offloaded = ("forward reduce_sum", "0-3, pos 1", "f32[2,4,8]")
    # The buffer set aside before the loop, and the async write that fills it: the layer
    # input stacked, through the scan's own broadcast (an op name that is no tensor).
    assert named("custom-call.2{}") == offloaded
    assert named("dynamic-update-slice.6{}") == offloaded
    # A loop output, by index, whether read by get-tuple-element or listed as the loop's own:
    # what the body passes on there (the stacking fusion's update), not the loop counter.
    gradient = ("backward mlp_out dot_general", "0-3, pos 0", "f32[2,4,8]")
    assert named("while.5{1}") == gradient
    assert named("get-tuple-element.6{}") == gradient
    assert named("fusion.15{}") == gradient
    # A buffer allocated for the loop but copied (to on-chip memory, on tpu7x) before it
    # starts is that loop's too: read forward through the copies to the loop's start.
    assert named("custom-call.20{}") == gradient


def test_on_tpu7x_what_sparsecores_copy_and_reduce_is_named_too():
    # tpu7x, the default target, hands layout copies and collectives to its SparseCores as
    # async calls. A real compile: all that explain may leave "other" is 512-byte scalars (the
    # compiler's constants, loop counters), and the SparseCores' work is named in the model's terms.
    [job] = jobs_for("tiny-e2b", resolve_target("tpu7x"), seq=512, batch=1, strategies=["checkpoint"]).values()
    m, answer = explain_job(job)
    e = Explanation.from_dict(answer)
    assert m.ok and e.peak_live_bytes > 0
    assert [b for b in e.buffers if b.kind == "other" and b.bytes > 512] == []
    called = [b for b in e.buffers if ".call-" in b.value]  # what the async calls start and finish
    assert called and all(b.kind in ("forward", "backward", "parameter") for b in called), called


def test_on_chip_memory_is_no_part_of_the_peaks_split_and_no_part_goes_negative():
    # A real compile where the buffer assignment's VMEM (about 51 MiB) is more than all of
    # temp beyond the HBM heap and constants (about 11 MiB): counted into temp, as memprobe
    # once did, it made "temp placed nowhere" read -41,775,948 bytes.
    from memprobe.render.explain import ONCHIP_NOTE, peak_parts

    [job] = jobs_for("tiny-e2b", resolve_target("v5e", 4), seq=512, batch=2, strategies=["unrolled"]).values()
    m, answer = explain_job(job)
    e = Explanation.from_dict(answer)
    assert m.ok and e.onchip_bytes > m.temp_bytes - e.heap_bytes - e.fixed_bytes > 0
    parts = peak_parts(m, e)
    assert sum(parts.values()) == m.peak_bytes and min(parts.values()) >= 0, parts
    notes = explain_notes(m, e)
    assert f"Beside it, {ONCHIP_NOTE}: " in "\n".join(notes) and " -" not in notes[2], notes[2]
    # The same small program has XLA's peak above memprobe's (about 58 MiB against 40), and
    # the row is flagged for it, as only E4B offload-mlp is at full size (test_flags).
    from memprobe.flags import XLA_PEAK_ABOVE, sanity_flags

    [flag] = [f for f in sanity_flags([m])["unrolled"] if f.kind == XLA_PEAK_ABOVE]
    assert m.xla_peak_bytes > 1.4 * m.peak_bytes
    assert flag.reason == (f"XLA's peak {m.xla_peak_bytes / 2**30:.2f} GiB > peak {m.peak_bytes / 2**30:.2f} GiB; "
                           "`memprobe explain` shows what is live in HBM")


def test_hbm_live_bytes_leave_out_other_memory_spaces_and_count_a_shared_address_once():
    length, ranges = parse_live_range(LIVE)
    placed = parse_assignment(ASSIGNMENT)
    slots = placed.slots
    # The HBM heap and its values only; VMEM is another space, counted apart, and the
    # host-memory allocation (offload) is neither.
    assert (placed.heap_bytes, placed.onchip_bytes, placed.fixed_bytes) == (1024, 4096, 512)
    assert "vmem.9{}" not in slots and "host.8{}" not in slots
    assert slots["add.3{}"].offset == slots["fusion.7{0}"].offset == 512 and slots["add.3{}"].in_heap
    walk = sweep(ranges, slots, length)
    # At 5, fusion.7{0} ends where add.3 begins, in the same bytes: 512 there, not 768.
    assert walk.live == [128, 128, 384, 512, 512, 512, 512, 512, 512, 384, 128]
    assert (walk.peak_time, sorted(walk.peak_values)) == (3, ["fusion.7{0}", "fusion.7{1}", "param.1{}"])
    assert walk.heap_top == 768  # the highest heap address in use: offset 512 + 256
    # Host memory (offload) is read apart from HBM, the same way.
    assert list(placed.host_slots) == ["host.8{}"] and placed.host_heap_bytes == 2048
    assert sweep(ranges, placed.host_slots, length).live == [0, 0] + [2048] * 5 + [0] * 4


def test_explain_dump_sizes_host_memory_beside_hbm(tmp_path):
    for suffix, text in (("after_optimizations.txt", HLO), ("after_optimizations-live-range.txt", LIVE),
                         ("after_optimizations-buffer-assignment.txt", ASSIGNMENT)):
        (tmp_path / f"module_0000.jit_train_step.{suffix}").write_text(text)
    e = explain_dump(tmp_path)
    assert (e.peak_time, e.peak_live_bytes) == (3, 512)
    # host.8 (2,048 bytes) is live over 2-6: its most, at 2; live at the HBM peak (3) too;
    # HBM + host at most 512 + 2,048 at one point.
    assert (e.host_peak_live_bytes, e.host_peak_time, e.host_live_bytes, e.combined_peak_bytes) == (2048, 2, 2048, 2560)
    assert e.host_curve == [(t, 2048 if 2 <= t <= 6 else 0) for t in range(11)]  # short: every point kept
    m = Measurement(model="tiny-e2b", strategy="offload", strategy_knobs={}, target="v5p", platform="tpu",
                    num_devices=4, topology="v5p:2x2x1", seq_len=8, batch_per_device=1, loss_chunks=1,
                    step="train", argument_bytes=128, output_bytes=128, alias_bytes=128, temp_bytes=1024, host_temp_bytes=2048)
    [note] = [n for n in explain_notes(m, e) if n.startswith("Host memory")]
    assert "at most 0.00 MiB (2,048 bytes) live (instruction 2)" in note
    assert "together at most 0.00 MiB (2,560 bytes)" in note
    # What sits in host memory is listed apart, named as in HBM, beside the host temp:
    # all of it placed here; what the buffer assignment allocates nowhere is said.
    assert [(b.value, b.bytes, b.shape) for b in e.host_buffers] == [("host.8{}", 2048, "")]
    assert e.host_heap_bytes == 2048
    frame, more = host_frame(e, 5)
    assert frame["% of host live"].tolist() == ["100.0%"] and not more
    placed = "the buffer assignment allocates 0.00 MiB (2,048 bytes) in host memory, all of it placed."
    assert placed in host_notes(m, e)[-1]
    larger = dataclasses.replace(m, host_temp_bytes=3072)
    assert "1,024 bytes) of it the buffer assignment places nowhere." in host_notes(larger, e)[-1]
    smaller = dataclasses.replace(m, host_temp_bytes=1024)
    assert "1,024 bytes) more than the host temp." in host_notes(smaller, e)[-1]
    out = io.StringIO()
    write(Explained([(m, e)]), "markdown", out, 5)
    sections = out.getvalue().split("## ")[1:]
    assert [x.split(":")[0] for x in sections] == ["Live at the peak", "In host memory where the most is live"]
    assert "| 2,048 " in sections[1] and "all of it placed" in sections[1]
    # A diff gives the host side apart from the HBM split.
    none = dataclasses.replace(e, host_peak_live_bytes=0, host_live_bytes=0, combined_peak_bytes=512)
    checkpoint = dataclasses.replace(m, strategy="checkpoint", host_temp_bytes=0)
    assert "Host memory live at most (offload, not HBM): offload - checkpoint +0.00 MiB (+2,048 bytes)." \
        in diff_notes((checkpoint, none), (m, e))
    assert not [n for n in diff_notes((checkpoint, none), (checkpoint, none)) if n.startswith("Host")]
    # An answer stored before memprobe read host memory loads without it, and says nothing of it.
    old = Explanation.from_dict({k: v for k, v in e.to_dict().items()
                                 if not k.startswith(("host", "combined", "names_loops"))})
    assert old.host_peak_live_bytes is None and old.host_curve == [] and old.host_buffers is None
    assert Explanation.from_dict(e.to_dict()) == e  # a fresh answer reads back whole
    assert not [n for n in explain_notes(m, old) if n.startswith("Host memory")]
    # A fresh answer says it named the step's scopes and followed loops; one stored before
    # (a committed report's JSON) does not claim what its names were not made with.
    fresh, before = (next(n for n in explain_notes(m, x) if n.startswith("what: ")) for x in (e, old))
    assert e.names_loops and "what a loop carries" in fresh and "optimizer update" in fresh
    assert not old.names_loops and "loop" not in before and "optimizer update" not in before
    # The chart draws the host curve where there is one, and only then.
    with_host, without = curve_chart([(m, e)]), curve_chart([(m, old)])
    assert with_host[:8] == without[:8] == b"\x89PNG\r\n\x1a\n" and with_host != without


def test_diff_groups_what_differs():
    def exp(*bufs):
        live = sum(b.bytes for b in bufs)
        return Explanation(0, 1, live, live, live, live, 0, 0, list(bufs), [])

    h = Buffer("f{}", 100, "bf16[8]", "jvp(layer1)/mlp_hidden/dot_general", "forward", 1, "mlp_hidden")
    g = Buffer("g{}", 30, "f32[2]", "transpose(jvp(layer1))/attention/dot_general", "backward", 1, "attention")
    rows = diff(exp(h, h, g), exp(g))
    assert [(r["label"], r["delta_bytes"], r["a_count"], r["b_count"]) for r in rows] == [
        ("forward mlp_hidden dot_general", -200, 2, 0)]


@pytest.fixture(scope="module")
def explained(tmp_path_factory):
    """unrolled vs checkpoint on tiny E2B, deviceless v5p: two compiles with dumps, cached."""
    cache = tmp_path_factory.mktemp("cache")
    args = ["--model", "tiny-e2b", "--target", "v5p", "--devices", "4", "--seq", "1024", "--batch", "1"]

    def run(*extra, check=True):
        r = subprocess.run([sys.executable, "-m", "memprobe", "explain", *args, *extra], capture_output=True,
                           text=True, timeout=1200, env={**os.environ, "MEMPROBE_CACHE_DIR": str(cache)})
        assert r.returncode == 0 or not check, r.stderr
        return r

    chart = tmp_path_factory.mktemp("chart") / "heap.png"
    first = run("--diff", "unrolled", "checkpoint", "--format", "json", "--chart", str(chart))
    return json.loads(first.stdout), run, chart


def test_the_widest_activation_is_listed_first_with_its_shape_and_size(explained):
    data, _, _ = explained
    unrolled = data["strategies"][0]
    top = unrolled["explanation"]["buffers"][0]
    cfg = PRESETS["tiny-e2b"]
    # The doubled MLP of a KV-shared layer: gate and up, seq 1024 (per-device batch 1, which
    # the compiler drops from the shape), bf16.
    hidden = cfg.shared_mlp_hidden
    assert top["shape"] == f"bf16[2,1024,{hidden}]" and top["bytes"] == 2 * 1024 * hidden * 2
    assert (top["kind"], top["tensor"]) == ("forward", "mlp_hidden")
    assert top["layer"] >= cfg.num_layers - cfg.num_kv_shared_layers  # a KV-shared layer
    m = unrolled["measurement"]
    assert m["peak_bytes"] == m["argument_bytes"] + m["output_bytes"] - m["alias_bytes"] + m["temp_bytes"]
    for s in data["strategies"]:
        e, m = s["explanation"], s["measurement"]
        # memprobe's reading of the placement reaches exactly the heap the compiler allocated,
        assert e["heap_top_bytes"] == e["heap_bytes"] > 0
        # the marked peak is the curve's highest point and the listing sums to it,
        assert max(p[1] for p in e["curve"]) == e["peak_live_bytes"] == sum(b["bytes"] for b in e["buffers"])
        # and it fits inside the compiler's figures: live heap <= heap <= temp, live <= peak.
        assert e["heap_live_bytes"] <= e["heap_bytes"] <= m["temp_bytes"]
        assert e["peak_live_bytes"] <= m["peak_bytes"]
        # The JSON carries the split of the peak; on TPU every part is there and none is negative.
        assert sum(s["peak_parts"].values()) == m["peak_bytes"] and min(s["peak_parts"].values()) >= 0
        assert e["onchip_bytes"] > 0 and s["peak_parts"]["heap_gaps"] > 0 and "onchip" not in s["peak_parts"]
        # Parameters are named as JAX named them, quotes unescaped, layers collapsed.
        params = [b for b in e["buffers"] if b["kind"] == "parameter"]
        assert params and all("\\" not in b["op_name"] for b in e["buffers"])
        assert any(b["op_name"].startswith("p['layers'][") for b in params)
        # Nearly every byte is named in the model's or the step's terms (what loops carry and
        # the buffers they fill included): under 1% is left "other".
        other = sum(b["bytes"] for b in e["buffers"] if b["kind"] == "other")
        assert other < 0.01 * e["peak_live_bytes"], other


def test_temp_placed_nowhere_is_the_heap_fragmentation_libtpu_logs(explained):
    # libtpu's own log of each compile gives its HBM heap ("HLO temp") and what it calls the
    # heap's fragmentation; memory_analysis()'s temp is the two added, to the log's rounding,
    # so the part of the peak the buffer assignment places nowhere is that fragmentation.
    data, _, _ = explained
    for s in data["strategies"]:
        e, m = s["explanation"], s["measurement"]
        log = e["libtpu_heap"]
        assert log is not None and log["fragmentation_bytes"] > 0
        assert abs(m["temp_bytes"] - log["hlo_temp_bytes"] - log["fragmentation_bytes"]) <= log["rounding_bytes"]
        # its heap is the buffer assignment's, within 1%,
        assert abs(log["hlo_temp_bytes"] - e["heap_bytes"]) <= 0.01 * e["heap_bytes"]
        # and its fragmentation is what the split leaves placed nowhere, to within the constants
        # (which the split takes as part of temp) and the log's rounding.
        assert abs(s["peak_parts"]["unplaced_temp"] - log["fragmentation_bytes"]) <= (e["fixed_bytes"]
                                                                                     + log["rounding_bytes"])


def test_libtpu_heap_is_read_from_the_hbm_block_of_the_last_compile():
    log = """I1208 01:17:01.212219 26971 deepsea_compiler_backend.cc:2305] Program sflag requirement 244B:
    HLO temp             4B (100.0% utilization: Unpadded (4B) Padded (4B), 0.0% fragmentation (0B))
Program hbm requirement 153.81M:
    HLO temp        152.09M (100.0% utilization: Unpadded (136.00M) Padded (136.00M), 10.6% fragmentation (16.09M))
    overlays          1.72M
Program vmem requirement 25.22M:
    HLO temp         10.00M (0.0% utilization: Unpadded (0B) Padded (0B), 100.0% fragmentation (10.00M))
"""
    first = parse_libtpu_heap(log)
    assert first == {"hlo_temp": "152.09M", "fragmentation": "16.09M", "hlo_temp_bytes": round(152.09 * 2**20),
                     "fragmentation_bytes": round(16.09 * 2**20), "rounding_bytes": round(0.02 * 2**20)}
    # A K size comes with one decimal, a byte count with none: the rounding follows what is printed.
    small = parse_libtpu_heap(log.replace("152.09M", "585.6K").replace("(16.09M)", "(4B)"))
    assert (small["hlo_temp_bytes"], small["fragmentation_bytes"], small["rounding_bytes"]) == (
        round(585.6 * 1024), 4, round(0.1 * 1024 + 1))
    later = log + log.replace("153.81M", "81.97G").replace("152.09M", "81.86G").replace("(16.09M)", "(24.29G)")
    assert parse_libtpu_heap(later)["fragmentation"] == "24.29G"  # the last block: this compile's
    assert parse_libtpu_heap(log.split("Program hbm")[0]) is None  # no HBM block, no answer


def test_diff_puts_the_difference_on_the_saved_activations(explained):
    data, _, chart = explained
    a, b = (s["measurement"]["peak_bytes"] for s in data["strategies"])
    assert a > b
    kept = sum(-r["delta_bytes"] for r in data["diff"] if r["label"].startswith("forward") and r["delta_bytes"] < 0)
    # Forward activations that unrolled keeps and checkpoint recomputes explain most of the gap.
    assert kept >= 0.75 * (a - b)
    assert data["diff"][0]["label"] == "forward mlp_hidden dot_general"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_second_explain_answers_from_the_cache(explained):
    data, run, _ = explained
    r = run("--strategy", "unrolled", "--format", "markdown", "--top", "3")
    assert "unrolled: from cache" in r.stderr
    top = data["strategies"][0]["explanation"]["buffers"][0]
    assert f"{top['bytes']:,}" in r.stdout and top["shape"] in r.stdout
    assert "more buffers" in r.stdout
    # XLA's own peak is set beside the HBM live at the busiest point, to the byte.
    m, e = data["strategies"][0]["measurement"], data["strategies"][0]["explanation"]
    line = next(x for x in r.stdout.splitlines() if "XLA's own peak (peak_memory_in_bytes)" in x)
    assert f"({m['xla_peak_bytes']:,} bytes)" in line
    assert f"({m['xla_peak_bytes'] - e['peak_live_bytes']:+,} bytes) against the HBM live" in line
    # The cached answer keeps libtpu's account of the heap, and the notes say what it shows.
    assert "libtpu's log of this compile: HLO temp " in r.stdout and "counted a second time" in r.stdout
    # Like every export, the markdown names the compiler stack it came from.
    assert f"libtpu {data['strategies'][0]['measurement']['versions']['libtpu']}" in r.stdout


def test_an_explain_at_other_shapes_says_what_the_same_work_took_here(explained):
    # A full-size explain compiles for 13-20 minutes; like compare, it says up front what the
    # same work took here before. A one-second timeout stops this one once it has said so.
    data, run, _ = explained
    r = run("--strategy", "unrolled", "--seq", "512", "--timeout", "1", check=False)
    assert r.returncode == 1 and "memprobe: unrolled: failed after" in r.stderr, r.stderr
    whole = round(round(data["strategies"][0]["measurement"]["process_seconds"], 1))  # as recorded
    took = f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"
    assert (f"memprobe: unrolled: compiling with the compiler's buffer listing on (tiny-e2b on v5p:2x2x1 (4 devices); "
            f"took {took} here last time, at seq 1024 x 1)") in r.stderr, r.stderr


def _without_command(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("- Command: ")]


def test_report_renders_a_saved_answer_as_explain_printed_it(explained, tmp_path):
    # An answer saved as JSON renders later, without a compile, to what `explain` prints; the
    # command under it stays the one that made the figures.
    data, run, _ = explained
    saved, chart = tmp_path / "answer.json", tmp_path / "again.png"
    saved.write_text(json.dumps(data))
    printed = run("--diff", "unrolled", "checkpoint", "--format", "markdown", "--top", "3").stdout
    r = subprocess.run([sys.executable, "-m", "memprobe", "report", str(saved), "--top", "3", "--chart", str(chart)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _without_command(r.stdout) == _without_command(printed)
    assert "more buffers" in r.stdout and "more groups" in r.stdout  # --top 3 reached the listings
    assert f"- Command: `{data['command']}`" in r.stdout and "--format json" in data["command"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


REPORTS = Path(__file__).resolve().parent.parent / "reports"


@pytest.mark.parametrize("saved", sorted(REPORTS.glob("*-explain-*.json")), ids=lambda p: p.stem)
def test_committed_explain_reports_render_from_their_json(saved):
    # Each committed explain report is what `memprobe report` makes of the JSON beside it, at
    # the --top its command asked for: the markdown and the figures cannot drift apart.
    committed = saved.with_suffix(".md").read_text()
    top = re.search(r"--top (\d+)", committed)
    r = subprocess.run([sys.executable, "-m", "memprobe", "report", str(saved), "--format", "markdown",
                        "--top", top.group(1) if top else "20"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _without_command(r.stdout) == _without_command(committed)


def test_a_chart_of_nothing_explained_is_said_not_left_missing(tmp_path):
    # Every compile timed out: nothing to draw, and the user is told so rather than finding no file.
    mine, chart = tmp_path / "slow.toml", tmp_path / "heap.png"
    mine.write_text('description = "checkpoint, attention output saved"\nloop = "checkpoint"\n'
                    'policy = "names"\nsave = ["attention_out"]\n')
    r = subprocess.run([sys.executable, "-m", "memprobe", "explain", "--strategy", "slow", "--strategy-file", str(mine),
                        "--timeout", "0.5", "--no-cache", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256",
                        "--batch", "1", "--chart", str(chart)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert f"memprobe: no chart written to {chart}: no strategy was explained" in r.stderr
    assert "slow failed: timed out after" in r.stdout and not chart.exists()
