"""Gemma 4 small (E2B, E4B) in Flax NNX, plus tiny presets with the same architecture."""

from memprobe.model._attention import attention_block_size, blockwise_attention, reference_attention
from memprobe.model._config import PRESETS, AttentionKind, ModelConfig
from memprobe.model._modules import CHECKPOINT_NAMES
from memprobe.model._transformer import (
    LayerRunner,
    LayerStep,
    Transformer,
    default_loss_chunks,
    run_directly,
)

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
