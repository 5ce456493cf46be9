"""Strategy files: every shipped one loads, bad ones are refused in one line, and no
strategy changes the math of the train step."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memprobe.errors import BadInput
from memprobe.model import PRESETS, Transformer
from memprobe.strategy import DEFAULT_STRATEGIES, builtin_dir, load_catalogue, load_strategy


def test_every_shipped_strategy_file_loads():
    files = sorted(builtin_dir().glob("*.toml"))
    assert {p.stem for p in files} >= set(DEFAULT_STRATEGIES)
    for p in files:
        s = load_strategy(p)
        assert s.name == p.stem and s.description


def test_catalogue_has_at_least_eight_builtins_each_with_every_knob():
    catalogue = load_catalogue()
    assert len(catalogue) >= 8
    for name in ("dots-no-batch", "minimal", "offload-mlp", "scan-offload"):
        assert name in catalogue
    for s in catalogue.values():
        assert list(s.knobs()) == ["loop", "policy", "save", "offload", "shared_kv_inside",
                                   "prevent_cse", "trip_count_one", "checkpoint_period"]
    assert catalogue["minimal"].save == ("query_proj", "key_proj", "value_proj", "attention_out")


def test_offload_across_a_kept_one_trip_loop_is_saved_on_device():
    catalogue = load_catalogue()
    compiled = catalogue["scan-offload"].as_compiled()
    assert compiled.offload == () and compiled.save == ("layer_input",)
    # Where the loop is inlined or absent, offload stays offload.
    assert catalogue["offload"].as_compiled() is catalogue["offload"]
    assert catalogue["offload-mlp"].as_compiled().offload == ("mlp_hidden",)


def test_catalogue_keeps_the_families_first():
    assert list(load_catalogue())[:4] == list(DEFAULT_STRATEGIES)


def test_scan_checkpoint_is_the_reported_fix():
    s = load_catalogue()["scan-checkpoint"]
    assert s.knobs() == {
        "loop": "scan-checkpoint", "policy": "nothing_saveable", "save": [], "offload": [],
        "shared_kv_inside": True, "prevent_cse": True, "trip_count_one": True,
        "checkpoint_period": False,
    }


BAD_FILES = {
    "unknown key": ('description = "x"\nloop = "checkpoint"\ncolour = "red"\n', "unknown key 'colour'"),
    "unknown name": ('description = "x"\nloop = "checkpoint"\npolicy = "names"\nsave = ["mlp_hiden"]\n',
                     "unknown tensor name 'mlp_hiden' (did you mean 'mlp_hidden'? known: layer_input,"),
    "misspelt key": ('description = "x"\nloop = "checkpoint"\npolicy = "names"\nsav = ["mlp_hidden"]\n',
                     "unknown key 'sav' (did you mean 'save'? known: description,"),
    "a name key": ('name = "mine"\ndescription = "x"\nloop = "checkpoint"\n',
                   "unknown key 'name': a strategy file is named by its file name, so this one is 'mine'"),
    "saved and offloaded": ('description = "x"\nloop = "checkpoint"\npolicy = "names"\n'
                            'save = ["layer_input"]\noffload = ["layer_input"]\n',
                            "layer_input both saved and offloaded"),
    "bad loop": ('description = "x"\nloop = "sometimes"\n', "loop: 'sometimes' is not one of"),
    "not toml": ('description = "x\nloop = \n', "not valid TOML"),
    "latin-1": (b'description = "x\xe9"\nloop = "checkpoint"\n',
                "not valid TOML (not UTF-8 text: byte 0xe9 at offset 16)"),
    "wrong type": ('description = "x"\nloop = "checkpoint"\nprevent_cse = "yes"\n',
                   "prevent_cse: expected bool"),
    "unrolled with policy": ('description = "x"\nloop = "unrolled"\npolicy = "dots_saveable"\n',
                             "\"unrolled\" has no checkpoint"),
    "missing loop": ('description = "x"\n', "missing key 'loop'"),
    "period without a scan": ('description = "x"\nloop = "scan-checkpoint"\ncheckpoint_period = true\n',
                              "checkpoint_period: only a scan-layers loop has periods"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_strategy_file_is_refused_naming_file_and_key(tmp_path, case):
    text, message = BAD_FILES[case]
    path = tmp_path / "mine.toml"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    with pytest.raises(BadInput) as e:
        load_strategy(path)
    assert message in str(e.value)
    assert str(path) in str(e.value)
    assert "\n" not in str(e.value)
    assert e.value.exit_code == 2


def test_user_strategy_may_not_shadow_a_builtin(tmp_path):
    (tmp_path / "checkpoint.toml").write_text('description = "mine"\nloop = "checkpoint"\n')
    with pytest.raises(BadInput, match=re.escape("checkpoint.toml: 'checkpoint' is a built-in strategy; the file's "
                                                 "name names the strategy, so rename the file (my-checkpoint.toml)")):
        load_catalogue(extra_dirs=[tmp_path])


def test_one_file_named_twice_is_one_strategy_and_two_files_of_one_name_are_refused(tmp_path):
    # The same file as --strategy-file and in --strategies-dir was "already defined by" itself.
    mine = tmp_path / "mine.toml"
    mine.write_text('description = "mine"\nloop = "checkpoint"\n')
    catalogue = load_catalogue(extra_files=[mine, tmp_path / ".." / tmp_path.name / "mine.toml"], extra_dirs=[tmp_path])
    assert list(catalogue)[-1] == "mine" and str(catalogue["mine"].source) == str(mine)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mine.toml").write_text(mine.read_text())
    with pytest.raises(BadInput, match="other/mine.toml: strategy 'mine' is already defined by .*/mine.toml"):
        load_catalogue(extra_files=[mine, tmp_path / "other" / "mine.toml"])


def _loss_and_grads(strategy_name, model, tokens, targets):
    runner = load_catalogue()[strategy_name].layer_runner()
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p):
        return nnx.merge(graphdef, p).loss(tokens, targets, loss_chunks=2, runner=runner)

    return jax.jit(jax.value_and_grad(loss))(params)


def test_strategies_do_not_change_loss_or_gradients():
    # Real small arrays on the CPU: remat decides what is stored, never what is computed.
    cfg = PRESETS["tiny-e2b"]
    model = Transformer(cfg, rngs=nnx.Rngs(0), activation_dtype=jnp.float32)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 128), 0, cfg.vocab_size)
    targets = jnp.roll(tokens, -1, axis=1)
    ref_loss, ref_grads = _loss_and_grads("unrolled", model, tokens, targets)
    assert np.isfinite(float(ref_loss)) and float(ref_loss) > 0
    assert float(jax.tree.reduce(lambda a, b: a + jnp.sum(jnp.abs(b)), ref_grads, 0.0)) > 0
    largest = max(float(np.abs(g).max()) for g in jax.tree.leaves(ref_grads))
    for name in DEFAULT_STRATEGIES[1:]:
        loss, grads = _loss_and_grads(name, model, tokens, targets)
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
        # Recomputation fuses differently, so float32 sums round differently: allow 1e-4 of
        # each array's scale, far below any change a wrong graph would make, and never less
        # than a millionth of the largest gradient (jax 0.11.2 put 2.8e-9 of rounding on
        # the last layer's layer_scale, whose gradient is 1.9e-9 against a largest of 1.03).
        jax.tree.map(lambda a, b: np.testing.assert_allclose(
            a, b, rtol=1e-3, atol=max(1e-4 * float(np.abs(b).max()), 1e-6 * largest)), grads, ref_grads)
