"""The model matches the published Gemma 4 small architecture; attention is exact and blockwise."""

import dataclasses
import math
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memprobe.build import abstract_params, parameter_count
from memprobe.errors import BadInput
from memprobe.model import (
    CHECKPOINT_NAMES,
    PRESETS,
    AttentionKind,
    blockwise_attention,
    default_loss_chunks,
    reference_attention,
)
from memprobe.model_file import KEY_HELP, describe, is_preset, load_model_file, model_mapping, model_toml
from memprobe.plan import resolve_model
from memprobe.strategy import CHECKPOINT_NAMES as STRATEGY_NAMES


def _layer_params(cfg, i):
    model = nnx.eval_shape(lambda: __import__("memprobe.model", fromlist=["Transformer"]).Transformer(
        cfg, rngs=nnx.Rngs(0)))
    _, state = nnx.split(model.layers[i], nnx.Param)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(state))


def test_parameter_counts_equal_the_gemma_library():
    # Text-only models of the official `gemma` 4.0.1 library, counted from shapes alone.
    assert parameter_count(PRESETS["gemma4-e2b"]) == 4_647_449_891
    assert parameter_count(PRESETS["gemma4-e4b"]) == 7_518_069_034


@pytest.mark.parametrize("layer,count", [(0, 36_184_065), (4, 43_262_465), (15, 64_495_617), (19, 71_574_017)])
def test_e2b_layer_parameter_counts(layer, count):
    assert _layer_params(PRESETS["gemma4-e2b"], layer) == count


def test_e2b_structure():
    cfg = PRESETS["gemma4-e2b"]
    kinds = [cfg.attention_kind(i) for i in range(cfg.num_layers)]
    assert kinds.count(AttentionKind.GLOBAL) == 7 and kinds[4] is AttentionKind.GLOBAL
    assert [cfg.head_dim(i) for i in (0, 4)] == [256, 512]
    # The last 20 layers reuse K/V of the last unshared layer of their kind.
    assert cfg.first_shared_layer == 15
    assert cfg.kv_donor(14) is None
    assert cfg.kv_donor(15) == 13 and cfg.kv_donor(19) == 14 and cfg.kv_donor(34) == 14
    assert cfg.donor_layers == {13, 14}
    assert cfg.mlp_width(14) == 6144 and cfg.mlp_width(15) == 12288


def test_e4b_structure():
    cfg = PRESETS["gemma4-e4b"]
    assert (cfg.width, cfg.num_layers, cfg.num_kv_heads) == (2560, 42, 2)
    assert cfg.first_shared_layer == 24
    assert cfg.kv_donor(24) == 22 and cfg.kv_donor(29) == 23
    assert cfg.mlp_width(30) == cfg.mlp_width(0) == 10240


def test_per_layer_embedding_shapes():
    _, params = abstract_params(PRESETS["gemma4-e2b"])
    assert params["ple_table"].shape == (262_144, 35 * 256)
    assert params["ple_model_proj"].shape == (1536, 35 * 256)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))


def test_checkpoint_names_agree():
    assert tuple(CHECKPOINT_NAMES) == STRATEGY_NAMES


@pytest.mark.parametrize("window", [None, 16, 24])
@pytest.mark.parametrize("heads,kv_heads", [(4, 1), (4, 2)])
def test_blockwise_attention_matches_dense(window, heads, kv_heads):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(keys[0], (2, 64, heads, 8))
    k = jax.random.normal(keys[1], (2, 64, kv_heads, 8))
    v = jax.random.normal(keys[2], (2, 64, kv_heads, 8))

    def fast(q, k, v):
        return blockwise_attention(q, k, v, window=window, block=16, scale=0.4)

    def dense(q, k, v):
        return reference_attention(q, k, v, window=window, scale=0.4)

    np.testing.assert_allclose(fast(q, k, v), dense(q, k, v), atol=1e-5)
    g_fast = jax.grad(lambda *a: jnp.sum(jnp.sin(fast(*a))), argnums=(0, 1, 2))(q, k, v)
    g_dense = jax.grad(lambda *a: jnp.sum(jnp.sin(dense(*a))), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_fast, g_dense):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _key_blocks_visited(seq, window, block=256):
    """Score blocks the forward pass computes: outer (query) x inner (key) loop trip counts."""
    q = jax.ShapeDtypeStruct((1, seq, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, seq, 1, 64), jnp.bfloat16)
    f = jax.jit(lambda q, k, v: blockwise_attention(q, k, v, window=window, block=block))
    assert f"{seq},{seq}" not in f.lower(q, kv, kv).as_text()  # no [seq, seq] scores anywhere
    lengths = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "scan":
                lengths.append(eqn.params["length"])
            for p in eqn.params.values():
                inner = getattr(p, "jaxpr", None)
                if inner is not None:
                    walk(getattr(inner, "jaxpr", inner))

    walk(jax.make_jaxpr(f)(q, kv, kv).jaxpr)
    assert len(lengths) == 2, lengths
    return math.prod(lengths)


def test_sliding_window_visits_only_blocks_inside_the_window():
    # 16 query blocks; a 256-token window over 256-token blocks needs 2 key blocks each.
    assert _key_blocks_visited(4096, 256) == 16 * 2
    assert _key_blocks_visited(8192, 256) == 2 * _key_blocks_visited(4096, 256)
    # Causal-global attention visits every key block: quadratic in the sequence.
    assert _key_blocks_visited(4096, None) == 16 * 16
    assert _key_blocks_visited(8192, None) == 4 * _key_blocks_visited(4096, None)


def test_the_loss_of_2_to_the_31_tokens_traces():
    # The mean divided by the token count as a Python int, which JAX made an int32: a global
    # batch of 2^31 tokens (seq 2^20 x 1 on 2048 devices) failed with an OverflowError.
    graphdef, params = abstract_params(PRESETS["tiny-e2b"])
    tokens = jax.ShapeDtypeStruct((2048, 2**20), jnp.int32)

    def loss(p, x):
        return nnx.merge(graphdef, p).loss(x, x, loss_chunks=2**11)

    out = jax.eval_shape(loss, params, tokens)
    assert (out.shape, out.dtype) == ((), jnp.float32)


def test_default_loss_chunks():
    assert default_loss_chunks(24576) == 48
    assert default_loss_chunks(256) == 1
    assert default_loss_chunks(1536) == 3
    # Its largest divisor up to 512 is 9: found at once (counting chunks up took minutes).
    assert default_loss_chunks(99_999_999_999) == 99_999_999_999 // 9


# Model files: a preset with some sizes changed, or every size given.

def _toml(values: dict) -> str:
    def value(v):
        return "[" + ", ".join(f'"{k}"' for k in v) + "]" if isinstance(v, list) else (
            f'"{v}"' if isinstance(v, str) else repr(v))
    return "".join(f"{k} = {value(v)}\n" for k, v in values.items())


def test_a_model_file_changes_only_the_sizes_it_names(tmp_path):
    path = tmp_path / "tiny-v1k.toml"
    path.write_text('description = "tiny-e2b, twice the vocabulary"\nbase = "tiny-e2b"\nvocab_size = 1024\n')
    cfg = load_model_file(path)
    assert cfg.name == "tiny-v1k" and not is_preset(cfg) and is_preset(PRESETS["tiny-e2b"])
    assert dataclasses.replace(cfg, name="tiny-e2b", vocab_size=512) == PRESETS["tiny-e2b"]
    # 512 more rows in the embedding (width 128) and in the per-layer table (5 layers x 16).
    assert parameter_count(cfg) - parameter_count(PRESETS["tiny-e2b"]) == 512 * (128 + 5 * 16)


def test_a_model_files_line_counts_in_words_and_names_only_layers_it_has(tmp_path):
    path = tmp_path / "one-global.toml"
    path.write_text('base = "tiny-e2b"\nnum_layers = 1\nnum_kv_shared_layers = 0\nattention_pattern = ["global"]\n')
    line = describe(load_model_file(path))
    assert line.startswith("1 layer, width 128, vocab 512, 4 heads (1 K/V), ") and ", 0 KV-shared layers, " in line
    # The wider MLP of KV-shared layers is said only where there are such layers.
    assert "MLP 512, pattern 1 global (window 64)" in line
    assert "MLP 512 (1,024 on KV-shared layers), " in describe(PRESETS["tiny-e2b"])


def test_a_model_file_with_every_size_is_that_model(tmp_path):
    # E4B written out in full (what a record of a model file carries), read back: the same
    # model to the parameter, though nothing names E4B.
    path = tmp_path / "my-e4b.toml"
    path.write_text(_toml(model_mapping(PRESETS["gemma4-e4b"])))
    assert "base" not in tomllib.loads(path.read_text())
    assert dataclasses.replace(load_model_file(path), name="gemma4-e4b") == PRESETS["gemma4-e4b"]
    assert parameter_count(load_model_file(path)) == 7_518_069_034


@pytest.mark.parametrize("preset", list(PRESETS))
def test_a_model_written_out_as_a_file_reads_back_as_that_model(tmp_path, preset):
    # What `memprobe models --format toml` writes: every key, each explained, read back to the
    # same model and the same parameter count, under the file's own name.
    cfg = PRESETS[preset]
    count = parameter_count(cfg)
    text = model_toml(cfg, count, "a memprobe preset")
    path = tmp_path / "mine.toml"
    path.write_text(text)
    mine = load_model_file(path)
    assert mine.name == "mine" and not is_preset(mine)
    assert dataclasses.replace(mine, name=preset) == cfg and parameter_count(mine) == count
    data = tomllib.loads(text)
    assert set(data) == {"description", *KEY_HELP} and "base" not in data
    assert f"{count:,} parameters" in text.splitlines()[0]
    for key, help_ in KEY_HELP.items():
        [line] = [line for line in text.splitlines() if line.startswith(f"{key} = ")]
        assert line.endswith(f"  # {help_}")


def test_a_written_model_file_keeps_any_description(tmp_path):
    # Quotes, a backslash, a tab, DEL, accents and an emoji: TOML escapes differ from Python's
    # and JSON's (no surrogate pairs, DEL escaped), and the text must come back as it went.
    description = 'E2B "tuned" \\ for\tSpanish, niño \x7f 🚀'
    path = tmp_path / "mine.toml"
    path.write_text(model_toml(PRESETS["tiny-e2b"], 1, "x", description))
    assert tomllib.loads(path.read_text())["description"] == description
    assert dataclasses.replace(load_model_file(path), name="tiny-e2b") == PRESETS["tiny-e2b"]


@pytest.mark.parametrize("name,text,message", [
    ("m", 'base = "tiny-e2b"\nvocab_size = 0\n', "m.toml: vocab_size: expected a positive integer, got 0"),
    ("m", 'base = "tiny-e2b"\nwidth = 1.5\n', "m.toml: width: expected a positive integer, got 1.5"),
    ("m", 'base = "tiny-e2b"\nnum_kv_heads = 3\n', "m.toml: num_heads 4 is not a multiple of num_kv_heads 3"),
    ("m", 'base = "tiny-e2b"\nnum_kv_shared_layers = 5\n', "m.toml: num_kv_shared_layers 5 leaves no layer of the 5"),
    ("m", 'base = "tiny-e2b"\nnum_kv_shared_layers = 4\n', "m.toml: no unshared global layer to donate K/V to layer 1"),
    ("m", 'base = "tiny-e2b"\nattention_pattern = ["sliding", "glob"]\n',
     "m.toml: attention_pattern: unknown attention kind 'glob' (did you mean 'global'?"),
    ("m", 'base = "tiny-e2b"\nattention_pattern = []\n', "m.toml: attention_pattern: expected a list of"),
    ("m", 'base = "tiny-e2b"\nglobal_rope_fraction = 1.5\n',
     "m.toml: global_rope_fraction: expected a number between 0 and 1, got 1.5"),
    ("m", 'base = "tiny-e2b"\nsliding_rope_base = "big"\n', "m.toml: sliding_rope_base: expected a number"),
    ("m", 'base = "gemma-e2b"\n', "m.toml: base: unknown base model 'gemma-e2b' (did you mean 'gemma4-e2b'?"),
    ("m", 'base = "tiny-e2b"\nwidht = 256\n', "m.toml: unknown key 'widht' (did you mean 'width'?"),
    ("m", 'base = "tiny-e2b"\nname = "x"\n', "m.toml: unknown key 'name': a model file is named by its file name"),
    ("m", 'vocab_size = 512\n', "m.toml: missing key 'width' (or start from a preset"),
    ("m", 'base = "tiny-e2b\n', "m.toml: not valid TOML"),
    ("m", b'base = "tiny-e2b"\n\xff\n', "m.toml: not valid TOML (not UTF-8 text: byte 0xff at offset 18)"),
    ("tiny-e2b", 'base = "tiny-e2b"\nvocab_size = 1024\n', "tiny-e2b.toml: a model file is named by its file name, "
     "and 'tiny-e2b' is a preset's"),
])
def test_a_model_file_that_cannot_build_is_refused_in_one_line(tmp_path, name, text, message):
    path = tmp_path / f"{name}.toml"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    with pytest.raises(BadInput) as e:
        resolve_model(str(path))
    assert str(e.value).removeprefix(f"{tmp_path}/").startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_a_model_is_a_preset_or_a_file():
    assert resolve_model("tiny-e4b") is PRESETS["tiny-e4b"]
    assert resolve_model("Gemma4-E2B") is PRESETS["gemma4-e2b"]  # as the model card writes it (was "unknown")
    with pytest.raises(BadInput, match=r"^missing\.toml: model file not found$"):
        resolve_model("missing.toml")
    with pytest.raises(BadInput, match=r"unknown model 'gemma4-e3b' \(did you mean 'gemma4-e4b'\? .*"
                                        r"or a model file of your own, my-model.toml\)$"):
        resolve_model("gemma4-e3b")
