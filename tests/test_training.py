"""The train step's optimizer and parameter dtype (--optimizer, --param-dtype): what each
puts in the step's arguments, measured by real CPU compiles, and how results carry them."""

import functools
import json
import subprocess
import sys

import pytest

import memprobe
from memprobe.compile import compile_job
from memprobe.errors import BadInput
from memprobe.plan import make_plan
from memprobe.result import Result, measurement_from_json
from memprobe.strategy import load_catalogue, select
from memprobe.targets import resolve_target

SEQ, BATCH = 256, 1
BATCH_BYTES = 2 * SEQ * BATCH * 4  # tokens and targets, int32
# (optimizer, param_dtype): the four updates in fp32, and AdamW with bf16 parameters.
RECIPES = [("sgd", "fp32"), ("lion", "fp32"), ("adamw", "fp32"), ("adafactor", "fp32"), ("adamw", "bf16")]


@functools.cache
def measured(optimizer, param_dtype):
    plan = make_plan(model="tiny-e2b", strategies=select(load_catalogue(), ["checkpoint"]),
                     target=resolve_target("cpu", 1), seq_len=SEQ, batch_per_device=BATCH,
                     optimizer=optimizer, param_dtype=param_dtype)
    return compile_job(plan.jobs()[0])


@pytest.mark.parametrize(("optimizer", "param_dtype"), RECIPES)
def test_each_update_keeps_its_state_in_the_step_arguments(optimizer, param_dtype):
    # One device, so every array is whole: the arguments are the parameters, the optimizer's
    # state and the batch, to the byte, up to optax's scalar step counters.
    m = measured(optimizer, param_dtype)
    assert m.ok and m.optimizer == optimizer and m.param_dtype == param_dtype
    params = m.parameter_count * (4 if param_dtype == "fp32" else 2)
    state = m.argument_bytes - BATCH_BYTES - params
    per_parameter = {"sgd": 0, "lion": 1, "adamw": 2}  # moments, each in the parameters' dtype
    if optimizer in per_parameter:
        assert 0 <= state - per_parameter[optimizer] * params < 64, (optimizer, state)
    else:  # Adafactor keeps a row and a column per large matrix, and a whole second moment
        # only for arrays with a dimension under 128 (most of this tiny model's are; measured
        # 21% of the parameters' bytes)
        assert 0 < state < 0.3 * params, state
    # Parameters and state are donated: all of it aliases the updated outputs.
    assert m.argument_bytes - BATCH_BYTES - m.alias_bytes < 64


def test_bf16_parameters_halve_parameters_moments_and_gradients():
    fp32, bf16 = measured("adamw", "fp32"), measured("adamw", "bf16")
    assert bf16.parameter_count == fp32.parameter_count
    assert abs((fp32.argument_bytes - BATCH_BYTES) - 2 * (bf16.argument_bytes - BATCH_BYTES)) < 64
    # The gradients are in the parameters' dtype too, so the temporaries fall as well and
    # the peak by more than the arguments do.
    assert bf16.temp_bytes < fp32.temp_bytes
    assert bf16.peak_bytes < fp32.peak_bytes - (fp32.argument_bytes - bf16.argument_bytes)


def test_a_grad_step_takes_no_optimizer():
    with pytest.raises(BadInput, match="--optimizer lion: a grad step compiles no optimizer update"):
        make_plan(model="tiny-e2b", strategies=select(load_catalogue(), ["checkpoint"]),
                  target=resolve_target("cpu", 1), seq_len=SEQ, batch_per_device=BATCH, step="grad",
                  optimizer="lion")
    plan = make_plan(model="tiny-e2b", strategies=select(load_catalogue(), ["checkpoint"]),
                     target=resolve_target("cpu", 1), seq_len=SEQ, batch_per_device=BATCH, step="grad",
                     param_dtype="bf16")
    assert plan.optimizer is None and plan.jobs()[0].param_dtype.value == "bf16"


@pytest.mark.parametrize(("keywords", "message"), [
    (dict(optimizer="adam"), "optimizer: 'adam' is not one of adamw, adafactor, lion, sgd"),
    (dict(param_dtype="fp16"), "param_dtype: 'fp16' is not one of fp32, bf16"),
])
def test_an_unknown_optimizer_or_dtype_is_refused_by_the_library(keywords, message):
    with pytest.raises(BadInput, match=message):
        memprobe.resolve_plan(model="tiny-e2b", target="cpu", seq=SEQ, batch=BATCH, **keywords)


def _row(**changes):
    row = {**measured("adamw", "fp32").to_dict(), **changes}
    return {k: v for k, v in row.items() if v is not ...}


def test_a_result_saved_before_the_knobs_existed_reads_as_adamw_fp32():
    old = _row(optimizer=..., param_dtype=...)
    m = measurement_from_json(old, "rows[0]")
    assert (m.optimizer, m.param_dtype) == ("adamw", "fp32")
    grad = measurement_from_json({**old, "step": "grad"}, "rows[0]")
    assert (grad.optimizer, grad.param_dtype) == (None, "fp32")


@pytest.mark.parametrize(("changes", "message"), [
    (dict(optimizer="adam"), "rows[0]: optimizer: 'adam' is not one of adamw, adafactor, lion, sgd"),
    (dict(optimizer=None), "rows[0]: optimizer: None is not one of"),
    (dict(param_dtype="int8"), "rows[0]: param_dtype: 'int8' is not one of fp32, bf16"),
    (dict(step="grad", optimizer="sgd"), "rows[0]: optimizer: a grad step has none, got 'sgd'"),
    (dict(step="eval"), "rows[0]: step: 'eval' is not one of train, grad"),
])
def test_a_saved_row_with_a_bad_optimizer_or_dtype_is_refused_in_one_line(changes, message):
    with pytest.raises(BadInput) as e:
        measurement_from_json(_row(**changes), "rows[0]")
    assert str(e.value) == message or str(e.value).startswith(message)


def test_rows_of_other_updates_make_their_own_tables_named_by_their_update(tmp_path):
    result = Result([measured(o, d) for o, d in RECIPES])
    assert len(result.comparisons) == len(RECIPES)
    path = tmp_path / "all.json"
    result.save(path)
    r = subprocess.run([sys.executable, "-m", "memprobe", "report", str(path), "--format", "markdown"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    titles = [line for line in r.stdout.splitlines() if line.startswith("## ")]
    assert titles == [
        "## tiny-e2b train step (fp32 parameters, SGD), seq 256 x per-device batch 1 on cpu, 1 device",
        "## tiny-e2b train step (fp32 parameters, Lion), seq 256 x per-device batch 1 on cpu, 1 device",
        "## tiny-e2b train step, seq 256 x per-device batch 1 on cpu, 1 device",
        "## tiny-e2b train step (fp32 parameters, Adafactor), seq 256 x per-device batch 1 on cpu, 1 device",
        "## tiny-e2b train step (bf16 parameters, AdamW), seq 256 x per-device batch 1 on cpu, 1 device",
    ]
    # The default is named in the footer, where every other knob of the step is.
    assert r.stdout.count("train step (fp32 parameters, AdamW).") == 1
    saved = json.loads(path.read_text())
    assert [c["config"]["optimizer"] for c in saved["comparisons"]] == ["sgd", "lion", "adamw", "adafactor", "adamw"]


def test_check_compiles_a_baseline_again_with_its_own_update(tmp_path):
    # A baseline of SGD with bf16 parameters is rechecked as that, not as the default AdamW
    # (whose arguments are 6x larger and would read as a regression).
    base = memprobe.compare(model="tiny-e2b", target="cpu", seq=SEQ, batch=BATCH, strategies=["checkpoint"],
                            optimizer="sgd", param_dtype="bf16")
    path = tmp_path / "baseline.json"
    base.save(path)
    [verdict] = memprobe.check(path, cache=False)
    assert verdict.status == "ok" and verdict.passed
    assert verdict.now.peak_bytes == verdict.base.peak_bytes
    assert (verdict.now.optimizer, verdict.now.param_dtype) == ("sgd", "bf16")
    # The gate's table and JSON say which update the configuration was compiled with.
    from memprobe.gate import Tolerance, verdicts_json
    from memprobe.render.check import verdict_frame

    data = verdicts_json([verdict], Tolerance.parse("2%"), None, path)
    assert verdict_frame(data["verdicts"])["configuration"][0] == \
        "tiny-e2b seq 256 x 1 on cpu, train step (bf16 parameters, SGD)"
    [entry] = data["verdicts"]
    assert (entry["step"], entry["optimizer"], entry["param_dtype"]) == ("train", "sgd", "bf16")
