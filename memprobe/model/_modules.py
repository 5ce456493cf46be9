"""Gemma 4 small building blocks in Flax NNX: norms, attention, MLP, one decoder block.

Parameters are stored in fp32 and cast to the activation dtype (bf16) where used, as a
mixed-precision trainer does. Tensors a remat policy may want are tagged with
``checkpoint_name``; the names are listed in ``CHECKPOINT_NAMES``. The code producing each
runs under a ``jax.named_scope`` of the same name (the layer loop adds ``layer<i>``), so
the compiled program's op names say which tensor a buffer is (``memprobe explain``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from memprobe.model._attention import blockwise_attention
from memprobe.model._config import AttentionKind, ModelConfig, attention_block_size

# Names a strategy can save, offload or recompute, and what each is.
CHECKPOINT_NAMES: dict[str, str] = {
    "layer_input": "a decoder layer's input hidden state [B, T, D]",
    "query_proj": "query projection after norm and RoPE [B, T, N, H]",
    "key_proj": "key projection after norm and RoPE [B, T, K, H]",
    "value_proj": "value projection after norm [B, T, K, H]",
    "attention_out": "attention output projected back to the width [B, T, D]",
    "mlp_hidden": "gated MLP hidden activation [B, T, F]",
    "mlp_out": "MLP output projected back to the width [B, T, D]",
}

_ZEROS = nnx.initializers.zeros_init()
_NORMAL = nnx.initializers.normal(0.02)


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], init=_NORMAL) -> nnx.Param:
    return nnx.Param(init(rngs.params(), shape, jnp.float32))


def rms_norm(x: jax.Array, scale: jax.Array | None, eps: float = 1e-6) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if scale is not None:
        y = y * (1.0 + scale.astype(jnp.float32))
    return y.astype(x.dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, *, rngs: nnx.Rngs):
        self.scale = _param(rngs, (dim,), _ZEROS)

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...])


def apply_rope(x: jax.Array, positions: jax.Array, *, base: float, fraction: float) -> jax.Array:
    """Rotary embedding on the first ``fraction`` of the head dimensions; the rest pass through."""
    head_dim = x.shape[-1]
    rotated = int(head_dim * fraction) // 2 * 2
    if rotated == 0:
        return x
    half = rotated // 2
    freq = base ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / rotated)
    angle = positions[..., None].astype(jnp.float32) * freq  # [B, T, half]
    sin = jnp.sin(angle)[..., None, :]
    cos = jnp.cos(angle)[..., None, :]
    x_rot, x_pass = x[..., :rotated].astype(jnp.float32), x[..., rotated:]
    x1, x2 = x_rot[..., :half], x_rot[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
    return jnp.concatenate([out, x_pass], axis=-1)


class Attention(nnx.Module):
    """Grouped-query attention with q/k norm, unscaled v norm and partial RoPE."""

    def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs):
        self.kind = cfg.attention_kind(layer)
        self.head_dim = cfg.head_dim(layer)
        global_ = self.kind is AttentionKind.GLOBAL
        self.rope_base = cfg.global_rope_base if global_ else cfg.sliding_rope_base
        self.rope_fraction = cfg.global_rope_fraction if global_ else cfg.sliding_rope_fraction
        self.window = None if global_ else cfg.sliding_window
        n, k, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.width, self.head_dim
        self.q_proj = _param(rngs, (n, d, h))
        # KV-shared layers keep their own K/V weights (unused in the forward), as the
        # published checkpoints do: they count towards parameters and optimizer state.
        self.kv_proj = _param(rngs, (2, k, d, h))
        self.out_proj = _param(rngs, (n, h, d))
        self.q_norm = RMSNorm(h, rngs=rngs)
        self.k_norm = RMSNorm(h, rngs=rngs)

    def _rope(self, x, positions):
        return apply_rope(x, positions, base=self.rope_base, fraction=self.rope_fraction)

    def key_value(self, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """K and V for a normalised input: [B, T, K, H] each."""
        with jax.named_scope("key_value_proj"):
            w = self.kv_proj[...].astype(x.dtype)
            k, v = jnp.einsum("btd,ckdh->cbtkh", x, w)
            k = self._rope(self.k_norm(k), positions)
            v = rms_norm(v, None)
            return checkpoint_name(k, "key_proj"), checkpoint_name(v, "value_proj")

    def __call__(self, x, positions, kv: tuple[jax.Array, jax.Array]) -> jax.Array:
        with jax.named_scope("query_proj"):
            q = jnp.einsum("btd,ndh->btnh", x, self.q_proj[...].astype(x.dtype))
            q = checkpoint_name(self._rope(self.q_norm(q), positions), "query_proj")
        k, v = kv
        # Gemma 4 normalises q and k instead of scaling the scores by 1/sqrt(head_dim).
        with jax.named_scope("attention"):
            o = blockwise_attention(
                q, k, v, window=self.window, block=attention_block_size(x.shape[1]), scale=1.0)
        with jax.named_scope("attention_out"):
            out = jnp.einsum("btnh,nhd->btd", o, self.out_proj[...].astype(x.dtype))
            return checkpoint_name(out, "attention_out")


class MLP(nnx.Module):
    """Gated GELU (tanh approximation) feed-forward."""

    def __init__(self, width: int, hidden: int, *, rngs: nnx.Rngs):
        self.gate_up = _param(rngs, (2, hidden, width))
        self.down = _param(rngs, (hidden, width))

    def __call__(self, x: jax.Array) -> jax.Array:
        with jax.named_scope("mlp_hidden"):
            gate, up = jnp.einsum("btd,cfd->cbtf", x, self.gate_up[...].astype(x.dtype))
            hidden = checkpoint_name(jax.nn.gelu(gate, approximate=True) * up, "mlp_hidden")
        with jax.named_scope("mlp_out"):
            out = jnp.einsum("btf,fd->btd", hidden, self.down[...].astype(x.dtype))
            return checkpoint_name(out, "mlp_out")


class Block(nnx.Module):
    """One decoder layer: attention, MLP, per-layer-embedding gate, layer scalar."""

    def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs):
        d = cfg.width
        self.pre_attention_norm = RMSNorm(d, rngs=rngs)
        self.attention = Attention(cfg, layer, rngs=rngs)
        self.post_attention_norm = RMSNorm(d, rngs=rngs)
        self.pre_mlp_norm = RMSNorm(d, rngs=rngs)
        self.mlp = MLP(d, cfg.mlp_width(layer), rngs=rngs)
        self.post_mlp_norm = RMSNorm(d, rngs=rngs)
        self.ple_gate = _param(rngs, (d, cfg.per_layer_dim))
        self.ple_proj = _param(rngs, (cfg.per_layer_dim, d))
        self.ple_norm = RMSNorm(d, rngs=rngs)
        self.layer_scale = nnx.Param(jnp.ones((1,), jnp.float32))

    def key_value(self, x: jax.Array, positions: jax.Array):
        """This layer's K/V from its input, as a donor layer hands it to the KV-shared layers."""
        return self.attention.key_value(self.pre_attention_norm(x), positions)

    def __call__(self, x, per_layer_input, positions, kv=None):
        """Returns the layer output and the K/V it attended with."""
        x = checkpoint_name(x, "layer_input")
        h = self.pre_attention_norm(x)
        if kv is None:
            kv = self.attention.key_value(h, positions)
        x = x + self.post_attention_norm(self.attention(h, positions, kv))
        x = x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))
        gate = jnp.einsum("btd,dp->btp", x, self.ple_gate[...].astype(x.dtype))
        ple = jax.nn.gelu(gate, approximate=True) * per_layer_input
        ple = jnp.einsum("btp,pd->btd", ple, self.ple_proj[...].astype(x.dtype))
        x = x + self.ple_norm(ple)
        return x * self.layer_scale[...].astype(x.dtype), kv
