"""Small decoder-only transformer blocks shared by every `icml` model (pre-RMSNorm, SwiGLU, no biases,
SDPA causal attention with a pluggable position-embedding hook).

API (stable; other methods import it):

    cfg = TransformerConfig(d_model=128, n_layers=2, n_heads=4, vocab_size=256)   # vocab_size=None: no
    model = DecoderStack(cfg, pos_emb_factory=lambda layer: RotaryEmbedding(cfg.head_dim))  # token layers
    logits = model(tokens)                        # tokens (B, T) int64 -> (B, T, vocab_size)
    h = model(embeds=x, attn_mask=mask)           # x (B, T, D) float -> (B, T, D) after the final norm
                                                  # (or logits when vocab_size is set)

* `pos_emb_factory(layer_idx) -> PositionEmbedding | None` builds each layer's own hook (FoPE keeps
  per-layer coefficients); None or no factory = NoPE. Callers with learned absolute positions add
  them to `embeds` themselves.
* `attn_mask` (optional) is combined with the causal mask (`cfg.causal`, default True):
  bool masks are True where attention is allowed, float masks are added to the logits.
  Shapes: (B, T) key padding, (B, Tq, Tk) or (B|1, H|1, Tq, Tk). A query row left with no allowed key
  is allowed to attend to itself (its output is then meaningless but finite).
* Attention runs `torch.nn.functional.scaled_dot_product_attention`; with no mask and no bias it uses
  `is_causal=True` (flash/efficient kernels on CUDA).
* Initialisation as OLMo's `normal` init: truncated normal, std `cfg.init_std` (0.02), cut at 3 std.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .position import PositionEmbedding


@dataclass
class TransformerConfig:
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mlp_hidden: Optional[int] = None      # SwiGLU hidden width; default 4 * d_model (OLMo mlp_ratio 8)
    vocab_size: Optional[int] = None      # None: the stack takes embeddings (B, T, D) only
    norm_eps: float = 1e-6
    dropout: float = 0.0
    causal: bool = True
    tie_weights: bool = False
    init_std: float = 0.02

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def hidden(self) -> int:
        return int(self.mlp_hidden or 4 * self.d_model)

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    """x / rms(x) * weight (computed in float32), no bias."""

    def __init__(self, dim: int, eps: float = 1e-6, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight.float()
        return y.to(x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), no biases (Shazeer 2020)."""

    def __init__(self, d_model: int, hidden: int, bias: bool = False):
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=bias)
        self.down = nn.Linear(hidden, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


def build_attn_mask(attn_mask: Optional[torch.Tensor], batch: int, n_heads: int, q_len: int, k_len: int,
                    causal: bool, device, dtype, bias: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """Combine causal structure, a user mask and an additive bias (H, Tq, Tk) into one float mask for SDPA
    (shape broadcastable to (B, H, Tq, Tk)); None when nothing constrains attention."""
    if attn_mask is None and bias is None and not causal:
        return None
    allowed = None
    additive = bias.to(torch.float32)[None] if bias is not None else None
    if causal:
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(diagonal=k_len - q_len)[None, None]
    if attn_mask is not None:
        m = attn_mask.to(device)
        if m.dim() == 2:
            if m.shape != (batch, k_len):
                raise ValueError(f"2-D attn_mask must be (B, T) = {(batch, k_len)}, got {tuple(m.shape)}")
            m = m[:, None, None, :]
        elif m.dim() == 3:
            m = m[:, None]
        elif m.dim() != 4:
            raise ValueError(f"attn_mask must have 2, 3 or 4 dims, got {m.dim()}")
        if m.dtype == torch.bool:
            allowed = m if allowed is None else (allowed & m)
        else:
            additive = m.float() if additive is None else additive + m.float()
    if allowed is not None:
        # a query row with no allowed key may attend to itself (keeps softmax finite)
        eye = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len).triu(k_len - q_len)
        empty = ~allowed.any(-1, keepdim=True)
        allowed = allowed | (empty & eye)
        base = torch.zeros((), device=device) if additive is None else additive
        out = torch.where(allowed, base, torch.tensor(float("-inf"), device=device))
    else:
        out = additive
    return out.to(dtype)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention over (B, T, D) with a position hook applied to q and k (rotary) or to
    the logits (bias). Fused q/k/v projection, no biases."""

    def __init__(self, d_model: int, n_heads: int, pos_emb: Optional[PositionEmbedding] = None,
                 dropout: float = 0.0, causal: bool = True, bias: bool = False):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.pos_emb = pos_emb
        self.dropout = dropout
        self.causal = causal

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        bias = None
        pe = self.pos_emb
        if pe is not None:
            if pe.kind == "rotary":
                q, k = pe(q, k)
            elif pe.kind == "bias":
                bias = pe.bias(T, T, x.device, torch.float32)
        mask = build_attn_mask(attn_mask, B, self.n_heads, T, T, self.causal, x.device, q.dtype, bias)
        drop = self.dropout if self.training else 0.0
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=self.causal)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
        return self.out(y.transpose(1, 2).reshape(B, T, D))


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)); x + mlp(norm(x))."""

    def __init__(self, cfg: TransformerConfig, pos_emb: Optional[PositionEmbedding] = None):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, pos_emb, cfg.dropout, cfg.causal)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.hidden)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x), attn_mask))
        return x + self.drop(self.mlp(self.mlp_norm(x)))


class DecoderStack(nn.Module):
    """Token embedding (if `vocab_size`), `n_layers` pre-norm blocks, final RMSNorm, LM head (if
    `vocab_size`). `forward(tokens=None, embeds=None, attn_mask=None)`; give exactly one of tokens/embeds."""

    def __init__(self, cfg: TransformerConfig,
                 pos_emb_factory: Optional[Callable[[int], Optional[PositionEmbedding]]] = None):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model) if cfg.vocab_size else None
        self.blocks = nn.ModuleList(
            Block(cfg, pos_emb_factory(i) if pos_emb_factory is not None else None) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False) if cfg.vocab_size else None
        self.reset_parameters()
        if self.head is not None and cfg.tie_weights:
            self.head.weight = self.embed.weight

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(m.weight, std=std, a=-3 * std, b=3 * std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    @property
    def position_embeddings(self) -> list:
        return [b.attn.pos_emb for b in self.blocks]

    def num_params(self, trainable_only: bool = True) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def forward(self, tokens: Optional[torch.Tensor] = None, embeds: Optional[torch.Tensor] = None,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if (tokens is None) == (embeds is None):
            raise ValueError("give exactly one of tokens (B, T) or embeds (B, T, D)")
        if tokens is not None:
            if self.embed is None:
                raise ValueError("this stack has no token embedding (vocab_size=None); pass embeds")
            x = self.embed(tokens)
        else:
            if embeds.dim() != 3 or embeds.shape[-1] != self.cfg.d_model:
                raise ValueError(f"embeds must be (B, T, {self.cfg.d_model}), got {tuple(embeds.shape)}")
            x = embeds
        for block in self.blocks:
            x = block(x, attn_mask)
        x = self.norm(x)
        return self.head(x) if self.head is not None else x
