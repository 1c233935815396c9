"""The methods, one small function each in a registry, all on the same `LayerStats`.

Each returns the stored tensors (f16 codebook + u8 indices, or f16 scale/zero + u8 codes), the dequantized
weights computed from exactly those stored values, and a per-layer record (objective, trace, damping).
The SqueezeLLM init is shared by sqllm, lnq and lnq_guided (cached per layer and bit width).
"""
from __future__ import annotations

import torch

from . import quant as q
from .options import METHODS, QuantConfig
from .stats import LayerStats


def _codebook_out(ls: LayerStats, labels, C, H, trace=None, raw=None, damp=None) -> dict:
    C16 = C.half()
    W_hat = q.dequant(C16.float(), labels)
    rec = {"objective": q.objective(ls.W, q.dequant(C.float(), labels), H),
           "objective_f16": q.objective(ls.W, W_hat, H)}
    if trace is not None:
        rec.update(objective_trace=trace, raw_trace=raw, monotone=q.is_monotone(raw), damp=damp)
    return {"tensors": {"codebook": C16, "indices": labels.to(torch.uint8)}, "W_hat": W_hat, "record": rec}


def _uniform_out(ls: LayerStats, res: dict, H) -> dict:
    scale, zero = res["scale"], res["zero"]
    W_hat = scale.half().float()[:, None] * (res["q"].float() - zero.half().float()[:, None])
    return {"tensors": {"scale": scale.half(), "zero": zero.half(), "indices": res["q"].to(torch.uint8)},
            "W_hat": W_hat, "record": {"objective": q.objective(ls.W, W_hat, H)}}


def _init(ls: LayerStats, bits: int, cfg: QuantConfig, cache: dict):
    key = (ls.name, bits)
    if key not in cache:
        cache[key] = q.kmeans_init(ls.W, ls.F, 2 ** bits, cfg.kmeans_iters)
    return cache[key]


def _lnq(H_raw):
    def run(ls: LayerStats, bits: int, cfg: QuantConfig, cache: dict) -> dict:
        H, damp = q.damp_hessians(H_raw(ls).to(ls.W.dtype), ls.name, cfg.lnq_damp0)
        labels, C = _init(ls, bits, cfg, cache)
        res = q.lnq(ls.W, H, labels, C, cfg)
        return _codebook_out(ls, res["labels"], res["codebook"], H, res["objective_trace"], res["raw_trace"], damp)
    return run


def _sqllm(ls: LayerStats, bits: int, cfg: QuantConfig, cache: dict) -> dict:
    labels, C = _init(ls, bits, cfg, cache)
    return _codebook_out(ls, labels, C, ls.H_plain)


def _gptq(H_raw):
    def run(ls: LayerStats, bits: int, cfg: QuantConfig, cache: dict) -> dict:
        return _uniform_out(ls, q.gptq(ls.W, H_raw(ls), bits, cfg, ls.name), H_raw(ls))
    return run


def _rtn(ls: LayerStats, bits: int, cfg: QuantConfig, cache: dict) -> dict:
    return _uniform_out(ls, q.rtn(ls.W, bits), ls.H_plain)


def _plain(ls):
    return ls.H_plain


def _guided(ls):
    return ls.H_guided


REGISTRY = {
    "lnq_guided": _lnq(_guided),
    "lnq": _lnq(_plain),
    "gptq_guided": _gptq(_guided),
    "gptq": _gptq(_plain),
    "sqllm": _sqllm,
    "rtn": _rtn,
}
assert set(REGISTRY) == set(METHODS)
