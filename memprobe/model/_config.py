"""Gemma 4 small architecture as data: one frozen config, presets built by one factory."""

from __future__ import annotations

import dataclasses
import enum


class AttentionKind(enum.Enum):
    SLIDING = "sliding"
    GLOBAL = "global"


@dataclasses.dataclass(frozen=True)
class LayerStack:
    """``repeats`` trips of ``period`` consecutive layers starting at ``first``, where the
    layers at one position of every trip have the same structure, so their parameters can be
    stacked along a leading axis and the trips run as one ``lax.scan``."""

    first: int
    period: int
    repeats: int

    def layer(self, trip: int, position: int) -> int:
        return self.first + trip * self.period + position

    @property
    def layers(self) -> range:
        return range(self.first, self.first + self.period * self.repeats)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Every size that decides a Gemma 4 small parameter or activation shape."""

    name: str
    vocab_size: int
    width: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    sliding_head_dim: int
    global_head_dim: int
    mlp_hidden: int
    # MLP width on KV-shared layers (E2B doubles it); None keeps ``mlp_hidden``.
    shared_mlp_hidden: int | None
    # One period of the attention pattern, e.g. 4 sliding then 1 global.
    attention_pattern: tuple[AttentionKind, ...]
    sliding_window: int
    # The last ``num_kv_shared_layers`` layers reuse a donor layer's K/V.
    num_kv_shared_layers: int
    per_layer_dim: int
    sliding_rope_base: float = 10_000.0
    global_rope_base: float = 1_000_000.0
    sliding_rope_fraction: float = 1.0
    global_rope_fraction: float = 0.25
    final_logit_softcap: float = 30.0

    def attention_kind(self, layer: int) -> AttentionKind:
        return self.attention_pattern[layer % len(self.attention_pattern)]

    def head_dim(self, layer: int) -> int:
        if self.attention_kind(layer) is AttentionKind.GLOBAL:
            return self.global_head_dim
        return self.sliding_head_dim

    @property
    def first_shared_layer(self) -> int:
        return self.num_layers - self.num_kv_shared_layers

    def is_kv_shared(self, layer: int) -> bool:
        return layer >= self.first_shared_layer

    def kv_donor(self, layer: int) -> int | None:
        """The layer whose K/V a shared layer reuses: the last unshared layer of its kind."""
        if not self.is_kv_shared(layer):
            return None
        kind = self.attention_kind(layer)
        for candidate in range(self.first_shared_layer - 1, -1, -1):
            if self.attention_kind(candidate) is kind:
                return candidate
        raise ValueError(f"{self.name}: no unshared {kind.value} layer to donate K/V to layer {layer}")

    @property
    def donor_layers(self) -> frozenset[int]:
        return frozenset(d for i in range(self.num_layers) if (d := self.kv_donor(i)) is not None)

    def mlp_width(self, layer: int) -> int:
        if self.is_kv_shared(layer) and self.shared_mlp_hidden is not None:
            return self.shared_mlp_hidden
        return self.mlp_hidden

    def layer_layout(self) -> tuple[int | LayerStack, ...]:
        """The layers in order, whole periods of the attention pattern grouped into stacks.

        Layers differ in structure by attention kind and, across the KV-sharing boundary, by
        MLP width, so each side of that boundary is cut into periods of the pattern: E2B is
        3 trips of 5 layers, then 4 trips of 5 (all 35 layers stacked). A side with fewer
        than two whole periods, and the layers after its last whole period, stay single:
        a loop of one trip is no loop.
        """
        period = len(self.attention_pattern)
        out: list[int | LayerStack] = []
        for start, end in ((0, self.first_shared_layer), (self.first_shared_layer, self.num_layers)):
            repeats = (end - start) // period
            if repeats >= 2:
                out.append(LayerStack(start, period, repeats))
                start += period * repeats
            out.extend(range(start, end))
        return tuple(out)


def gemma4_small_config(
    *,
    name: str,
    width: int,
    num_layers: int,
    num_kv_heads: int,
    num_kv_shared_layers: int,
    sliding_per_global: int,
    double_shared_mlp: bool,
    vocab_size: int = 262_144,
    num_heads: int = 8,
    sliding_head_dim: int = 256,
    global_head_dim: int = 512,
    sliding_window: int = 512,
    per_layer_dim: int = 256,
) -> ModelConfig:
    """Builds a Gemma 4 small config; the MLP is 4x the width, as in the published models."""
    mlp_hidden = 4 * width
    pattern = (AttentionKind.SLIDING,) * sliding_per_global + (AttentionKind.GLOBAL,)
    return ModelConfig(
        name=name,
        vocab_size=vocab_size,
        width=width,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        sliding_head_dim=sliding_head_dim,
        global_head_dim=global_head_dim,
        mlp_hidden=mlp_hidden,
        shared_mlp_hidden=2 * mlp_hidden if double_shared_mlp else None,
        attention_pattern=pattern,
        sliding_window=sliding_window,
        num_kv_shared_layers=num_kv_shared_layers,
        per_layer_dim=per_layer_dim,
    )


GEMMA4_E2B = gemma4_small_config(
    name="gemma4-e2b",
    width=1536,
    num_layers=35,
    num_kv_heads=1,
    num_kv_shared_layers=20,
    sliding_per_global=4,
    double_shared_mlp=True,
)

GEMMA4_E4B = gemma4_small_config(
    name="gemma4-e4b",
    width=2560,
    num_layers=42,
    num_kv_heads=2,
    num_kv_shared_layers=18,
    sliding_per_global=5,
    double_shared_mlp=False,
)

# Tiny presets keep the full architecture (PLE, KV sharing, both attention kinds, the
# doubled shared MLP) at sizes that compile in seconds: for tests and quick trials.
_TINY_SIZES = dict(vocab_size=512, num_heads=4, sliding_head_dim=32, global_head_dim=64,
                   sliding_window=64, per_layer_dim=16, width=128)

TINY_E2B = gemma4_small_config(name="tiny-e2b", num_layers=5, num_kv_heads=1, num_kv_shared_layers=2,
                               sliding_per_global=1, double_shared_mlp=True, **_TINY_SIZES)

TINY_E4B = gemma4_small_config(name="tiny-e4b", num_layers=6, num_kv_heads=2, num_kv_shared_layers=2,
                               sliding_per_global=2, double_shared_mlp=False, **_TINY_SIZES)

# A deeper, wider small model where remat visibly pays: activations dwarf parameters.
SMALL_DEEP = gemma4_small_config(
    name="small-deep", width=256, num_layers=12, num_kv_heads=1, num_kv_shared_layers=4,
    sliding_per_global=3, double_shared_mlp=True, vocab_size=1024, num_heads=4,
    sliding_head_dim=64, global_head_dim=128, sliding_window=128, per_layer_dim=32,
)

PRESETS: dict[str, ModelConfig] = {
    c.name: c for c in (GEMMA4_E2B, GEMMA4_E4B, TINY_E2B, TINY_E4B, SMALL_DEEP)
}


# Shape arithmetic the plan checks before anything is traced (no JAX needed).

def attention_block_size(seq_len: int, preferred: int = 512) -> int:
    """The query/key block length used for ``seq_len``: ``preferred`` or the whole sequence."""
    return min(preferred, seq_len)


def default_loss_chunks(seq_len: int, max_chunk_tokens: int = 512) -> int:
    """The fewest chunks of at most ``max_chunk_tokens`` tokens that divide ``seq_len``: the
    sequence over its largest divisor up to ``max_chunk_tokens``, found in at most that many
    steps (counting chunks up from the fewest took minutes for a ``seq_len`` of 10^11)."""
    return seq_len // next(t for t in range(min(max_chunk_tokens, seq_len), 0, -1) if seq_len % t == 0)
