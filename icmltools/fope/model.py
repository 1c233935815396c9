"""Position-embedding choices and the small decoder-only LM used by fope-train."""
from __future__ import annotations

import torch

from icmltools.core.errors import BadInputError
from icmltools.nn import ALiBi, DecoderStack, RotaryEmbedding, TransformerConfig

from .embedding import PADS, FourierEmbedding

PE_CHOICES = ("rope", "fope", "fope-cf", "fope-fs", "nope", "alibi")
EXTENSIONS = ("pi", "yarn")


def parse_pes(spec: str | list | tuple) -> list[str]:
    """'rope,fope' -> ['rope', 'fope'] (order kept, duplicates dropped); unknown names raise."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for raw in items:
        name = raw.strip().lower()
        if not name:
            continue
        if name == "all":
            out.extend(p for p in PE_CHOICES if p not in out)
            continue
        if name not in PE_CHOICES:
            raise BadInputError(f"--pe: unknown position embedding {name!r}; choose from {', '.join(PE_CHOICES)} or all")
        if name not in out:
            out.append(name)
    if not out:
        raise BadInputError("--pe: no position embedding given")
    return out


def pos_emb_factory(pe: str, cfg: TransformerConfig, train_length: int, theta: float = 10000.0,
                    sigma: float = 0.3, pad: str = "official", seed: int = 0):
    """Per-layer position hook for `pe`. FoPE variants draw their coefficients from their own
    generator (seed + 1), so the shared weights' init is identical across position embeddings."""
    if pe not in PE_CHOICES:
        raise BadInputError(f"unknown position embedding {pe!r}")
    if pad not in PADS:
        raise BadInputError(f"--pad must be one of {sorted(PADS)}")
    hd, h = cfg.head_dim, cfg.n_heads
    if pe == "nope":
        return None
    if pe == "rope":
        return lambda i: RotaryEmbedding(hd, theta)
    if pe == "alibi":
        return lambda i: ALiBi(h)
    gen = torch.Generator().manual_seed(seed + 1)
    clip = pe in ("fope", "fope-cf")
    s = 0.0 if pe == "fope-cf" else sigma
    return lambda i: FourierEmbedding(hd, h, train_length, theta, sigma=s, clip_floor=clip, pad=pad, generator=gen)


def build_model(pe: str, cfg: TransformerConfig, train_length: int, theta: float = 10000.0, sigma: float = 0.3,
                pad: str = "official", seed: int = 0) -> DecoderStack:
    if cfg.head_dim % 2:
        raise BadInputError(f"head dim {cfg.head_dim} (d_model / n_heads) must be even for rotary embeddings")
    torch.manual_seed(seed)
    return DecoderStack(cfg, pos_emb_factory(pe, cfg, train_length, theta, sigma, pad, seed))


def set_rope_scaling(model: DecoderStack, scaling: dict | None) -> int:
    """Apply PI/YaRN (or None) to every RoPE layer of `model`; returns how many layers changed."""
    n = 0
    for pe in model.position_embeddings:
        if isinstance(pe, RotaryEmbedding):
            pe.set_scaling(scaling)
            n += 1
    return n
