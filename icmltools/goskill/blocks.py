"""Adapter to the shared transformer blocks (`icmltools.nn`, STYLE point 5).

GO-Skill needs a causal stack over input embeddings (B, T, D) -> (B, T, D). The official code uses a
GPT-2 without position embeddings (positions come from learned step/timestep embeddings added by the
caller); here the shared pre-RMSNorm/SwiGLU `DecoderStack` with no position hook (NoPE) plays that role.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from icmltools.nn import DecoderStack, TransformerConfig


class CausalTransformer(nn.Module):
    def __init__(self, dim: int, n_layers: int, n_heads: int, dropout: float = 0.1):
        super().__init__()
        # SwiGLU width 8/3 * dim keeps the parameter count of GPT-2's 4 * dim GELU MLP (official n_inner)
        hidden = max(8, int(round(8 * dim / 3 / 8)) * 8)
        self.stack = DecoderStack(TransformerConfig(d_model=dim, n_layers=n_layers, n_heads=n_heads, mlp_hidden=hidden,
                                                    vocab_size=None, dropout=dropout, causal=True))

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D); key_mask (B, T) bool, True where a token may be attended to."""
        return self.stack(embeds=x, attn_mask=key_mask)
