"""`memprobe explain`: the compiler's buffer listing, named in the model's terms."""

import json
import os
import subprocess
import sys

import pytest

from memprobe.explain import Buffer, Explanation, diff, name_buffer, parse_hlo, parse_live_range
from memprobe.model import PRESETS

HLO = """ENTRY %main (param.1: f32[4,8]) -> f32[4,8] {
  %param.1 = f32[4,8]{1,0:T(8,128)} parameter(0), metadata={op_name="p['layers'][3]['mlp']['down'].value"}
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
  Live ranges at 4 (peak):
    fusion.7{0}: 256 bytes (cumulative: 256 bytes)
    param.1{}: 128 bytes (cumulative: 384 bytes)
  Stack trace breakdown for peak usage: 384 bytes
"""


def test_hlo_and_live_ranges_are_read_and_named():
    hlo = parse_hlo(HLO)
    assert hlo["fusion.7"][0].startswith("(bf16[2,4,16]")
    peak, length, live, ranges = parse_live_range(LIVE)
    assert (peak, length, live) == (4, 10, [("fusion.7{0}", 256), ("param.1{}", 128)])
    assert ranges["fusion.7{1}"] == (3, 8)
    act = name_buffer("fusion.7{0}", 256, hlo)
    assert (act.shape, act.kind, act.layer, act.tensor) == ("bf16[2,4,16]", "forward", 3, "mlp_hidden")
    assert name_buffer("fusion.7{1}", 128, hlo).shape == "f32[4,8]"
    # An async copy has no op name of its own: it is named after what it copies.
    assert name_buffer("copy-start.2{0}", 128, hlo).tensor == "mlp_hidden"
    back = name_buffer("add.3{}", 128, hlo)
    assert (back.kind, back.layer, back.tensor) == ("backward", 12, "attention_out")
    param = name_buffer("param.1{}", 128, hlo)
    assert param.kind == "parameter" and param.label == "p['layers'][*]['mlp']['down'].value"


def test_diff_groups_what_differs():
    def exp(*bufs):
        return Explanation(0, 1, sum(b.bytes for b in bufs), list(bufs), [])

    h = Buffer("f{}", 100, "bf16[8]", "jvp(layer1)/mlp_hidden/dot_general", "forward", 1, "mlp_hidden")
    g = Buffer("g{}", 30, "f32[2]", "transpose(jvp(layer1))/attention/dot_general", "backward", 1, "attention")
    rows = diff(exp(h, h, g), exp(g))
    assert [(r["label"], r["delta_bytes"], r["a_count"], r["b_count"]) for r in rows] == [
        ("forward mlp_hidden dot_general", -200, 2, 0)]


@pytest.fixture(scope="module")
def explained(tmp_path_factory):
    """unrolled vs checkpoint on tiny E2B, deviceless v5p: two compiles with dumps, cached."""
    cache = tmp_path_factory.mktemp("cache")
    args = ["--model", "tiny-e2b", "--target", "v5p", "--devices", "4", "--seq", "1024", "--batch", "2"]

    def run(*extra):
        r = subprocess.run([sys.executable, "-m", "memprobe", "explain", *args, *extra], capture_output=True,
                           text=True, timeout=1200, env={**os.environ, "MEMPROBE_CACHE_DIR": str(cache)})
        assert r.returncode == 0, r.stderr
        return r

    chart = tmp_path_factory.mktemp("chart") / "heap.png"
    first = run("--diff", "unrolled", "checkpoint", "--format", "json", "--chart", str(chart))
    return json.loads(first.stdout), run, chart


def test_the_widest_activation_is_listed_first_with_its_shape_and_size(explained):
    data, _, _ = explained
    unrolled = data["strategies"][0]
    top = unrolled["explanation"]["buffers"][0]
    cfg = PRESETS["tiny-e2b"]
    # The doubled MLP of a KV-shared layer: gate and up, per-device batch 2, seq 1024, bf16.
    hidden = cfg.shared_mlp_hidden
    assert top["shape"] == f"bf16[2,2,1024,{hidden}]" and top["bytes"] == 2 * 2 * 1024 * hidden * 2
    assert (top["kind"], top["tensor"]) == ("forward", "mlp_hidden")
    assert top["layer"] >= cfg.num_layers - cfg.num_kv_shared_layers  # a KV-shared layer
    m = unrolled["measurement"]
    assert m["peak_bytes"] == m["argument_bytes"] + m["output_bytes"] - m["alias_bytes"] + m["temp_bytes"]
    assert unrolled["explanation"]["peak_live_bytes"] <= m["peak_bytes"]


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
    # Like every export, the markdown names the compiler stack it came from.
    assert f"libtpu {data['strategies'][0]['measurement']['versions']['libtpu']}" in r.stdout
