"""Gradient accumulation (--grad-accum): a step of N microbatches run one after another, their
gradients summed before the one update. Measured by real compiles: the deviceless v5p's
figures for what it saves, the CPU backend's for what a step takes and returns."""

import functools
import json

import pytest

import memprobe
from memprobe.compile import compile_job, explain_job
from memprobe.errors import BadInput
from memprobe.plan import Step, make_plan
from memprobe.liveness import Explanation
from memprobe.result import Result, measurement_from_json
from memprobe.strategy import load_catalogue, select
from memprobe.targets import resolve_target


def job(target, seq, batch, grad_accum, step=Step.TRAIN):
    plan = make_plan(model="tiny-e2b", strategies=select(load_catalogue(), ["checkpoint"]), target=target,
                     seq_len=seq, batch_per_device=batch, step=step, grad_accum=grad_accum)
    return plan.jobs()[0]


@functools.cache
def explained():
    """4 microbatches of batch 1 as ``on_tpu(1, 4)``, compiled with the dump files on: the
    measurement and explain's answer, from the one compile both need."""
    return explain_job(job(resolve_target("v5p", 4), 512, 1, 4))


@functools.cache
def on_tpu(batch, grad_accum):
    """tiny E2B, per-layer checkpoint, seq 512 on a deviceless v5p of 4 devices."""
    if (batch, grad_accum) == (1, 4):
        return explained()[0]
    return compile_job(job(resolve_target("v5p", 4), 512, batch, grad_accum))


def test_accumulating_keeps_one_microbatch_live_for_the_same_work():
    whole, accumulated, one = on_tpu(4, 1), on_tpu(1, 4), on_tpu(1, 1)
    assert whole.ok and accumulated.ok and one.ok
    assert (accumulated.grad_accum, whole.grad_accum) == (4, 1)
    # The same examples per step: the same matmuls, and the same arguments (parameters,
    # AdamW state and 4 x 1 x 512 tokens per device in place of 1 x 4 x 512).
    assert accumulated.matmul_flops == whole.matmul_flops == 4 * one.matmul_flops
    assert accumulated.argument_bytes == whole.argument_bytes
    # Activations of one microbatch at a time: the peak falls below the whole batch's, but
    # stays above a step of that one microbatch alone, which keeps no running sum of gradients.
    assert one.peak_bytes < accumulated.peak_bytes < whole.peak_bytes
    assert whole.peak_bytes - accumulated.peak_bytes > 0.2 * (whole.peak_bytes - one.peak_bytes)


def test_explain_names_the_running_sum_of_gradients():
    # The accumulation loop's carry (the running sum, one buffer per parameter) is named after
    # the sum the loop body computes, apart from the forward and backward work.
    m, answer = explained()
    assert m.ok and m.grad_accum == 4
    buffers = Explanation.from_dict(answer).buffers
    summed = [b for b in buffers if b.kind == "gradient accumulation"]
    assert summed and any(b.label == "gradient accumulation add" for b in summed)
    assert sum(b.bytes for b in buffers if b.kind == "other") < 0.01 * sum(b.bytes for b in buffers)


def test_a_grad_step_returns_the_mean_gradients_of_its_microbatches():
    # On one CPU device every array is whole: a grad step's outputs are the loss and one
    # gradient per parameter, with or without accumulation; only the batch argument grows.
    plain = compile_job(job(resolve_target("cpu", 1), 256, 1, 1, Step.GRAD))
    accumulated = compile_job(job(resolve_target("cpu", 1), 256, 1, 3, Step.GRAD))
    assert plain.ok and accumulated.ok and accumulated.optimizer is None
    assert accumulated.output_bytes == plain.output_bytes
    assert accumulated.argument_bytes - plain.argument_bytes == 2 * (3 - 1) * 256 * 4  # tokens, targets: int32
    assert accumulated.matmul_flops == 3 * plain.matmul_flops


@pytest.mark.parametrize("value", [0, -2, True, 1.5, "2"])
def test_a_grad_accum_that_is_not_a_positive_integer_is_refused(value):
    with pytest.raises(BadInput, match=f"--grad-accum must be a positive integer, got {value!r}"):
        memprobe.resolve_plan(model="tiny-e2b", target="cpu", seq=256, batch=1, grad_accum=value)


def test_results_name_the_accumulation_and_keep_it(tmp_path):
    m = on_tpu(1, 4)
    result = Result([m], command="memprobe compare ... --grad-accum 4")
    text = memprobe.report(result, "markdown")
    assert text.splitlines()[0] == ("## tiny-e2b train step (fp32 parameters, AdamW, gradients accumulated over 4 "
                                    "microbatches), seq 512 x per-device batch 1 per microbatch on v5p:2x2x1, 4 devices")
    assert "train step (fp32 parameters, AdamW, gradients accumulated over 4 microbatches)." in text
    path = tmp_path / "r.json"
    result.save(path)
    saved = json.loads(path.read_text())
    assert saved["comparisons"][0]["config"]["grad_accum"] == 4
    assert memprobe.load(path).measurements[0].grad_accum == 4
    # A step without accumulation reads as before: no brackets, no "per microbatch".
    assert memprobe.report(Result([on_tpu(1, 1)]), "markdown").splitlines()[0] == \
        "## tiny-e2b train step, seq 512 x per-device batch 1 on v5p:2x2x1, 4 devices"


def test_a_row_saved_before_accumulation_existed_reads_as_none_and_a_bad_one_is_refused():
    row = on_tpu(1, 1).to_dict()
    del row["grad_accum"]
    assert measurement_from_json(row, "rows[0]").grad_accum == 1
    for bad in (0, "4", None):
        with pytest.raises(BadInput) as e:
            measurement_from_json({**row, "grad_accum": bad}, "rows[0]")
        assert str(e.value) == f"rows[0]: grad_accum: expected a positive integer, got {bad!r}"


def test_accumulated_and_whole_steps_are_cached_and_compared_apart():
    from memprobe.cache import key_fields

    plain, accumulated = job(resolve_target("cpu", 1), 256, 1, 1), job(resolve_target("cpu", 1), 256, 1, 2)
    assert "grad_accum" not in key_fields(plain, {})  # results cached before the knob still answer
    assert key_fields(accumulated, {})["grad_accum"] == 2
    assert len(Result([on_tpu(1, 1), on_tpu(1, 4)]).comparisons) == 2


def test_check_compiles_a_baseline_again_with_its_accumulation(tmp_path):
    base = memprobe.compare(model="tiny-e2b", target="cpu", seq=256, batch=1, strategies=["checkpoint"],
                            grad_accum=2)
    path = tmp_path / "baseline.json"
    base.save(path)
    [verdict] = memprobe.check(path, cache=False)
    assert verdict.status == "ok" and verdict.now.peak_bytes == verdict.base.peak_bytes
    assert verdict.now.grad_accum == 2
    from memprobe.gate import Tolerance, verdicts_json
    from memprobe.render.check import verdict_frame

    data = verdicts_json([verdict], Tolerance.parse("2%"), None, path)
    assert verdict_frame(data["verdicts"])["configuration"][0] == \
        "tiny-e2b seq 256 x 1 on cpu, train step (fp32 parameters, AdamW, gradients accumulated over 2 microbatches)"
    [entry] = data["verdicts"]
    assert entry["grad_accum"] == 2


def test_fit_searches_the_microbatch_and_counts_every_microbatch_in_the_global_batch():
    from test_cli import memprobe as run

    r = run("fit", "--model", "tiny-e2b", "--target", "cpu", "--seq", "256", "--budget", "1GiB",
            "--strategies", "checkpoint", "--max-batch", "2", "--grad-accum", "3", "--format", "markdown")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == (
        "## tiny-e2b train step (fp32 parameters, AdamW, gradients accumulated over 3 microbatches), seq 256: "
        "the largest per-device batch per microbatch within 1.00 GiB per device on cpu, 1 device")
    [row] = [line for line in r.stdout.splitlines() if line.startswith("| 1 |")]
    assert row.startswith("| 1 | checkpoint | 2 | 6 |")  # 2 examples x 1 device x 3 microbatches
    assert "- global batch = per-device batch x devices x 3 microbatches." in r.stdout


def test_a_long_title_is_wrapped_inside_the_chart():
    # The recipe and the accumulation make a title of about 150 characters, which ran off
    # both sides of a six-inch chart; wrapped, the figure's edges stay blank.
    import io

    import matplotlib.image

    from memprobe.render.chart import render_chart

    pixels = matplotlib.image.imread(io.BytesIO(render_chart([on_tpu(1, 4)])), format="png")
    height, width = pixels.shape[:2]
    band = pixels[: int(0.1 * height), :, :3]  # above the axes, where the title is
    assert band.min() < 0.5  # the title is there
    for edge in (band[:3], band[:, :3], band[:, -3:]):  # the top rows, the left and right columns
        assert edge.min() > 0.99, "the title reaches the figure's edge"
