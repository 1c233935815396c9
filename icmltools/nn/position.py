"""Position-embedding hooks for `CausalSelfAttention`.

A position embedding is an `nn.Module` subclassing `PositionEmbedding` with one or both of:

* `forward(q, k, offset=0) -> (q, k)`: rotate queries and keys, shapes `(B, H, T, hd)`; `offset` is
  the absolute position of the first query/key (0 for full sequences). RoPE, FoPE, PI and YaRN.
* `bias(q_len, k_len, device, dtype) -> (H, q_len, k_len)` additive attention-logit bias, or None. ALiBi.

`kind` says which: "rotary", "bias" or "none". Rotary modules compute their cos/sin once per
(length, offset, device) and cache them (the tables depend on frozen tensors only).

RoPE follows Su et al. 2021 with the half-split layout (`rotate_half`) used by GPT-NeoX, LLaMA, HF
transformers and the FoPE/OLMo code. PI (Chen et al. 2023) and YaRN (Peng et al. 2023) follow HF
transformers' rope utilities (`linear` and `yarn` rope types).
"""
from __future__ import annotations

import math

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last dim split in two halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin (cos, sin broadcast to x's shape)."""
    return x * cos + rotate_half(x) * sin


def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The same tables applied to q and k in float32; each comes back in its own dtype."""
    return apply_rotary(q.float(), cos, sin).to(q.dtype), apply_rotary(k.float(), cos, sin).to(k.dtype)


class PositionEmbedding(nn.Module):
    """Base class of attention position hooks; the identity (NoPE) by itself.

    Subclasses keep their tables (cos/sin, biases) in a small cache: `self.cached(key, build)` builds a
    table once per key; moving the module (`.to()`, `.cuda()`) empties it.
    """

    kind = "none"
    cache_size = 16

    def __init__(self):
        super().__init__()
        self._cache: dict = {}

    def forward(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0):  # noqa: D401
        return q, k

    def bias(self, q_len: int, k_len: int, device, dtype):
        return None

    def cached(self, key, build):
        """`build()` once per `key` (at most `cache_size` tables are kept)."""
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) >= self.cache_size:
                self._cache.clear()
            hit = self._cache[key] = build()
        return hit

    def clear_cache(self) -> None:
        self._cache = {}

    def _apply(self, fn, *args, **kwargs):  # .to()/.cuda() move the tensors the tables come from
        self.clear_cache()
        return super()._apply(fn, *args, **kwargs)


def rope_inv_freq(head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """omega_i = theta^(-2i/hd), i = 0..hd/2-1 (float32)."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def yarn_inv_freq(head_dim: int, theta: float, factor: float, original_length: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0) -> tuple[torch.Tensor, float]:
    """YaRN frequencies and attention factor, as HF transformers' `_compute_yarn_parameters`.

    Dimensions rotating more than `beta_fast` times in the original context keep their frequency
    (extrapolation), those rotating fewer than `beta_slow` times are divided by `factor`
    (interpolation), with a linear ramp between; cos/sin are scaled by 0.1*ln(factor)+1.
    """
    pos_freqs = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)

    def correction_dim(num_rotations: float) -> float:
        return (head_dim * math.log(original_length / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_factor = 1.0 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq, attention_factor


def _pi(head_dim: int, theta: float, scaling: dict) -> tuple[torch.Tensor, float]:
    """Position interpolation (Chen et al. 2023): every frequency divided by the factor."""
    return rope_inv_freq(head_dim, theta) / float(scaling["factor"]), 1.0


def _yarn(head_dim: int, theta: float, scaling: dict) -> tuple[torch.Tensor, float]:
    return yarn_inv_freq(head_dim, theta, float(scaling["factor"]), int(scaling["original_length"]),
                         float(scaling.get("beta_fast", 32.0)), float(scaling.get("beta_slow", 1.0)))


# RoPE context extensions by `scaling["type"]`: (head_dim, theta, scaling) -> (inv_freq, attention factor)
ROPE_SCALINGS = {"pi": _pi, "yarn": _yarn}


class RotaryEmbedding(PositionEmbedding):
    """RoPE on `(B, H, T, hd)` queries and keys, optionally extended with PI or YaRN.

    `scaling`: None, or a dict `{"type": "pi"|"yarn", "factor": s, "original_length": N}` (YaRN also takes
    `beta_fast`, `beta_slow`). `set_scaling(...)` changes it after training (context extension).
    """

    kind = "rotary"

    def __init__(self, head_dim: int, theta: float = 10000.0, scaling: dict | None = None):
        super().__init__()
        self.head_dim = int(head_dim)
        self.theta = float(theta)
        self.register_buffer("inv_freq", rope_inv_freq(self.head_dim, self.theta), persistent=False)
        self.attention_factor = 1.0
        self.scaling = None
        self.set_scaling(scaling)

    def set_scaling(self, scaling: dict | None) -> None:
        """Apply PI / YaRN (or None for plain RoPE) to the frequencies; clears the cos/sin cache."""
        kind = None if scaling is None else str(scaling.get("type", "none")).lower()
        if kind in (None, "none"):
            inv, attention_factor = rope_inv_freq(self.head_dim, self.theta), 1.0
        elif kind in ROPE_SCALINGS:
            inv, attention_factor = ROPE_SCALINGS[kind](self.head_dim, self.theta, scaling)
        else:
            raise ValueError(f"unknown rope scaling type {kind!r}; use one of {', '.join(ROPE_SCALINGS)}")
        self.scaling = None if kind in (None, "none") else dict(scaling)
        self.inv_freq = inv.to(self.inv_freq.device)
        self.attention_factor = attention_factor
        self.clear_cache()

    def _tables(self, length: int, offset: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            t = torch.arange(offset, offset + length, device=device, dtype=torch.float32)
            freqs = torch.outer(t, self.inv_freq.to(device))
            emb = torch.cat((freqs, freqs), dim=-1)
            return (emb.cos() * self.attention_factor)[None, None], (emb.sin() * self.attention_factor)[None, None]

    def cos_sin(self, length: int, offset: int = 0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin tables of shape (1, 1, length, hd), float32, for positions offset..offset+length-1."""
        device = device or self.inv_freq.device
        return self.cached((int(length), int(offset), str(device)), lambda: self._tables(length, offset, device))

    def forward(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0):
        return rotate_qk(q, k, *self.cos_sin(q.shape[-2], offset, q.device))


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi head slopes (Press et al. 2022): 2^(-8i/n) for n a power of two, else the paper's
    interleaving of the next power of two's slopes."""
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(n_heads).is_integer():
        s = pow2(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        s = pow2(closest) + pow2(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(s, dtype=torch.float32)


class ALiBi(PositionEmbedding):
    """Additive bias -slope_h * (i - j) on the attention logits (no rotation)."""

    kind = "bias"

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def _bias(self, q_len: int, k_len: int, device, dtype) -> torch.Tensor:
        i = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        j = torch.arange(k_len, device=device)[None, :]
        dist = (i - j).clamp(min=0).to(torch.float32)
        return (-self.slopes.to(device)[:, None, None] * dist[None]).to(dtype)

    def bias(self, q_len: int, k_len: int, device, dtype):
        return self.cached((q_len, k_len, str(device), dtype), lambda: self._bias(q_len, k_len, device, dtype))
