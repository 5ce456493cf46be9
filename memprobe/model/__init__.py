"""Gemma 4 small (E2B, E4B) in Flax NNX, plus tiny presets with the same architecture.

The configuration (``_config``) needs no JAX, so planning a comparison, reading the results
cache and rendering never import it; the modules that build the model load on first use.
"""

import importlib

from memprobe.model._config import (
    PRESETS,
    AttentionKind,
    ModelConfig,
    attention_block_size,
    default_loss_chunks,
)

_LAZY = {
    "blockwise_attention": "_attention",
    "reference_attention": "_attention",
    "CHECKPOINT_NAMES": "_modules",
    "LayerRunner": "_transformer",
    "LayerStep": "_transformer",
    "Transformer": "_transformer",
    "run_directly": "_transformer",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"memprobe.model.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'memprobe.model' has no attribute {name!r}")


__all__ = [
    "CHECKPOINT_NAMES",
    "PRESETS",
    "AttentionKind",
    "LayerRunner",
    "LayerStep",
    "ModelConfig",
    "Transformer",
    "attention_block_size",
    "blockwise_attention",
    "default_loss_chunks",
    "reference_attention",
    "run_directly",
]
