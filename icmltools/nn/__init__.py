"""Shared transformer blocks for every `icml` model that needs them (STYLE.md point 5).

Stable API (see `transformer.py` for details):

    from icmltools.nn import RMSNorm, SwiGLU, CausalSelfAttention, Block, DecoderStack, TransformerConfig
    from icmltools.nn import PositionEmbedding, RotaryEmbedding, ALiBi, apply_rotary, rotate_half, rotate_qk

`DecoderStack(cfg, pos_emb_factory=None)` is a decoder-only stack of pre-norm blocks. Call it with token
ids `(B, T)` (when `cfg.vocab_size` is set) or with input embeddings `(B, T, D)` (continuous inputs;
learned absolute positions, if any, are the caller's to add), plus an optional attention mask.
"""
from .position import (
    ROPE_SCALINGS,
    ALiBi,
    PositionEmbedding,
    RotaryEmbedding,
    alibi_slopes,
    apply_rotary,
    rotate_half,
    rotate_qk,
)
from .transformer import Block, CausalSelfAttention, DecoderStack, RMSNorm, SwiGLU, TransformerConfig, build_attn_mask

__all__ = [
    "RMSNorm", "SwiGLU", "CausalSelfAttention", "Block", "DecoderStack", "TransformerConfig", "build_attn_mask",
    "PositionEmbedding", "RotaryEmbedding", "ALiBi", "alibi_slopes", "apply_rotary", "rotate_half", "rotate_qk",
    "ROPE_SCALINGS",
]
