"""The small decoder-only LM used by fope-train, one position embedding per name in `options.PES`."""
from __future__ import annotations

from typing import Callable

from icmltools.core.errors import BadInputError
from icmltools.core.seed import as_stream
from icmltools.nn import ALiBi, DecoderStack, RotaryEmbedding, TransformerConfig

from .embedding import FourierEmbedding
from .options import EXTENSIONS, PADS, PES

__all__ = ["PES", "EXTENSIONS", "parse_pes", "pos_emb_factory", "build_model", "set_rope_scaling"]


def parse_pes(spec) -> list[str]:
    """'rope,fope' or ['rope', 'fope'] -> ['rope', 'fope'] (order kept, duplicates dropped, 'all' = every
    name in options.PES); unknown names raise BadInputError(param='pes')."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for raw in items:
        name = raw.strip().lower()
        for pe in (PES if name == "all" else (name,) if name else ()):
            if pe not in PES:
                raise BadInputError(f"unknown position embedding {pe!r}; choose from {', '.join(PES)} or all",
                                    param="pes")
            if pe not in out:
                out.append(pe)
    if not out:
        raise BadInputError("no position embedding given", param="pes")
    return out


def _fope(clip_floor: bool, fourier: bool):
    """FoPE and its ablations: clip-floor only is sigma 0 (no Fourier noise), Fourier series only is no clip."""
    def make(hd, h, n, theta, sigma, pad, init):
        return lambda i: FourierEmbedding(hd, h, n, theta, sigma=sigma if fourier else 0.0, clip_floor=clip_floor,
                                          pad=pad, generator=init.child("fope", i).torch())
    return make


# name -> (head_dim, n_heads, train_length, theta, sigma, pad, init stream) -> per-layer factory (or None)
_FACTORIES: dict[str, Callable] = {
    "rope": lambda hd, h, n, theta, sigma, pad, init: (lambda i: RotaryEmbedding(hd, theta)),
    "fope": _fope(clip_floor=True, fourier=True),
    "fope-cf": _fope(clip_floor=True, fourier=False),
    "fope-fs": _fope(clip_floor=False, fourier=True),
    "nope": lambda hd, h, n, theta, sigma, pad, init: None,
    "alibi": lambda hd, h, n, theta, sigma, pad, init: (lambda i: ALiBi(h)),
}


def pos_emb_factory(pe: str, cfg: TransformerConfig, train_length: int, theta: float = 10000.0,
                    sigma: float = 0.3, pad: str = "official", seed=0):
    """Per-layer position hook for `pe`. FoPE coefficients of layer i come from their own stream,
    `derive(seed, "init", "fope", i)`, so the shared weights' init is identical across position embeddings."""
    if pe not in _FACTORIES:
        raise BadInputError(f"unknown position embedding {pe!r}; choose from {', '.join(PES)}", param="pes")
    if pad not in PADS:
        raise BadInputError(f"must be one of {', '.join(PADS)}, got {pad!r}", param="pad")
    return _FACTORIES[pe](cfg.head_dim, cfg.n_heads, train_length, theta, sigma, pad, as_stream(seed, "init"))


def build_model(pe: str, cfg: TransformerConfig, train_length: int, theta: float = 10000.0, sigma: float = 0.3,
                pad: str = "official", seed=0) -> DecoderStack:
    """The model for `pe`: shared weights from torch's default initialisers under `derive(seed, "init")`
    (the same for every position embedding), FoPE coefficients from `derive(seed, "init", "fope", layer)`."""
    if cfg.head_dim % 2:
        raise BadInputError(f"head dim {cfg.head_dim} (d_model / n_heads) must be even for rotary embeddings",
                            param="d_model")
    factory = pos_emb_factory(pe, cfg, train_length, theta, sigma, pad, seed)
    with as_stream(seed, "init").torch_init():
        return DecoderStack(cfg, factory)


def set_rope_scaling(model: DecoderStack, scaling: dict | None) -> int:
    """Apply PI/YaRN (or None) to every RoPE layer of `model`; returns how many layers changed."""
    n = 0
    for pe in model.position_embeddings:
        if isinstance(pe, RotaryEmbedding):
            pe.set_scaling(scaling)
            n += 1
    return n
