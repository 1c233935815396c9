"""Fourier Position Embedding (FoPE; Hua et al., ICML 2025, arXiv 2412.17739), as the official
OLMo-based code builds it (`olmo/model.py`, class FourierEmbedding with `fourier_separate_basis`,
`fourier_separate_head`, `fourier_ignore_zero`, `rope_clamp_floor_freq`, `rope_clamp_floor_to_zero`,
`fourier_init=eye_xavier_norm`), which differs from the paper's prose in places:

* Clip-floor (paper Sec. 4, "zero-frequency"): RoPE frequencies omega_i = theta^(-2i/hd) whose period is
  longer than the training length N (omega_i < 2*pi/N) are set to zero and dropped from the basis;
  the D kept frequencies feed the Fourier series.
* Fourier series (paper Eq. 8-10): per layer (one module per attention layer) and per head h, frozen
  coefficient matrices S_h, C_h in R^{D x d}, d = min(D, hd // 4), initialised as
  xavier_normal(gain=sigma) + "step eye" (identity if D == d, else output i takes input i*ceil(D/d)).
  sin_t = sin(t * omega_keep) @ S_h, cos_t = cos(t * omega_keep) @ C_h, both padded to hd/2 (with 1.0
  in the official code; the vLLM port pads sin with 0.0: `pad="vllm"`), then duplicated to hd and
  applied as RoPE is: x * cos + rotate_half(x) * sin, with the same coefficients for q and k.
* Ablations: clip-floor only = sigma 0; Fourier series only = no clipping (all hd/2 frequencies,
  d = hd/2, no padding).

The coefficients are buffers (frozen, in `state_dict`, saved with checkpoints); the cos/sin tables
are computed once per (length, offset, device) and cached, so a training step costs what RoPE's does.
Call signature as a RoPE module: `q, k = fope(q, k)` on (B, H, T, hd).
"""
from __future__ import annotations

import math

import torch

from icmltools.nn.position import PositionEmbedding, rope_inv_freq, rotate_qk

from .options import PADS  # (cos pad, sin pad) per padding name


def kept_frequencies(head_dim: int, train_length: int, theta: float = 10000.0) -> torch.Tensor:
    """Clip-floor (paper Sec. 4, zero-frequency components): the RoPE frequencies that complete at least one
    period within the training length, omega_i >= 2*pi/N; the others become zero-frequency and are dropped."""
    inv = rope_inv_freq(head_dim, theta)
    return inv[inv >= 2 * math.pi / train_length]


def kept_count_formula(head_dim: int, train_length: int, theta: float = 10000.0) -> int:
    """Closed form of `len(kept_frequencies)`: #{i < hd/2 : i <= hd * ln(N / 2pi) / (2 ln theta)}."""
    if train_length < 2 * math.pi:
        return 0
    return min(head_dim // 2, math.floor(head_dim * math.log(train_length / (2 * math.pi)) / (2 * math.log(theta))) + 1)


def step_eye(n_heads: int, d_in: int, d_out: int) -> torch.Tensor:
    """(H, D, d) zeros with 1 at [.., i*ceil(D/d), i] (the identity when D == d): the dominant frequency of
    each Fourier series at initialisation (official `fourier_init=eye_xavier_norm`)."""
    out = torch.zeros(n_heads, d_in, d_out)
    if d_in == 0 or d_out == 0:
        return out
    step = math.ceil(d_in / d_out)
    for i in range(d_out):
        if i * step < d_in:
            out[:, i * step, i] = 1.0
    return out


class FourierEmbedding(PositionEmbedding):
    """FoPE for one attention layer (paper Eq. 8-10, clip-floor of Sec. 4): a drop-in replacement of
    `RotaryEmbedding` (same call signature).

    Args:
        head_dim: per-head width hd (even).
        n_heads: number of heads H (separate coefficients per head).
        train_length: training context N (sets the clip-floor frequency 2*pi/N).
        theta: RoPE base (10000).
        sigma: xavier-normal gain of the coefficient init (paper: 0.3 / 0.4 / 0.6 for 60M / 180M / 1.2B).
        clip_floor: zero out (drop) frequencies with period > N (False = Fourier series only).
        pad: "official" (pad sin and cos with 1.0) or "vllm" (sin padded with 0.0).
        generator: optional torch.Generator for the coefficient init.
    """

    kind = "rotary"

    def __init__(self, head_dim: int, n_heads: int, train_length: int, theta: float = 10000.0,
                 sigma: float = 0.3, clip_floor: bool = True, pad: str = "official",
                 generator: torch.Generator | None = None):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even, got {head_dim}")
        if pad not in PADS:
            raise ValueError(f"pad must be one of {sorted(PADS)}, got {pad!r}")
        if sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        self.head_dim, self.n_heads, self.train_length = int(head_dim), int(n_heads), int(train_length)
        self.theta, self.sigma, self.clip_floor, self.pad = float(theta), float(sigma), bool(clip_floor), pad
        if clip_floor:
            freqs = kept_frequencies(self.head_dim, self.train_length, self.theta)
            d_in = int(freqs.numel())
            d_out = min(d_in, self.head_dim // 4)
        else:
            freqs = rope_inv_freq(self.head_dim, self.theta)
            d_in = d_out = self.head_dim // 2
        self.d_in, self.d_out = d_in, d_out
        self.register_buffer("freqs", freqs, persistent=False)
        sin_coef = torch.zeros(self.n_heads, d_in, d_out)
        cos_coef = torch.zeros(self.n_heads, d_in, d_out)
        if d_in and d_out and self.sigma > 0:
            # torch's xavier on an (H, D, d) tensor: fan_in = D*d, fan_out = H*d (as the official code's)
            torch.nn.init.xavier_normal_(sin_coef, gain=self.sigma, generator=generator)
            torch.nn.init.xavier_normal_(cos_coef, gain=self.sigma, generator=generator)
        eye = step_eye(self.n_heads, d_in, d_out)
        self.register_buffer("sin_coef", sin_coef + eye)
        self.register_buffer("cos_coef", cos_coef + eye)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, n_heads={self.n_heads}, N={self.train_length}, D={self.d_in}, "
                f"d={self.d_out}, sigma={self.sigma}, clip_floor={self.clip_floor}, pad={self.pad}")

    def _tables(self, length: int, offset: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The Fourier series of the kept frequencies (Eq. 8-10): sin(t w) @ S_h, cos(t w) @ C_h, padded."""
        with torch.no_grad():
            t = torch.arange(offset, offset + length, device=device, dtype=torch.float32)
            phase = torch.outer(t, self.freqs.to(device))                                  # (T, D)
            sin_c, cos_c = self.sin_coef.to(device).float(), self.cos_coef.to(device).float()
            sin = torch.einsum("tD,hDd->htd", phase.sin(), sin_c)                           # (H, T, d)
            cos = torch.einsum("tD,hDd->htd", phase.cos(), cos_c)
            half = self.head_dim // 2
            if self.d_out < half:
                cos_pad, sin_pad = PADS[self.pad]
                cos = torch.nn.functional.pad(cos, (0, half - self.d_out), value=cos_pad)
                sin = torch.nn.functional.pad(sin, (0, half - self.d_out), value=sin_pad)
            return torch.cat((cos, cos), dim=-1)[None], torch.cat((sin, sin), dim=-1)[None]

    def cos_sin(self, length: int, offset: int = 0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin tables of shape (1, H, length, hd), float32 (Fourier series of the kept frequencies)."""
        device = device or self.sin_coef.device
        key = (int(length), int(offset), str(device), self.sin_coef._version, self.cos_coef._version)
        return self.cached(key, lambda: self._tables(length, offset, device))

    def forward(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0):
        """Rotate q and k (B, H, T, hd) with the same per-head Fourier tables (float32 math)."""
        if q.shape[1] != self.n_heads or q.shape[-1] != self.head_dim:
            raise ValueError(f"FoPE built for {self.n_heads} heads x {self.head_dim}, got q of shape {tuple(q.shape)}")
        return rotate_qk(q, k, *self.cos_sin(q.shape[-2], offset, q.device))
