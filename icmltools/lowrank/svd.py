"""Truncated SVD factors of one weight matrix (the paper's layout: W ~ up @ down, down bias-free).

W = U S V': up = U_r S_r^(1/2) [out x r], down = S_r^(1/2) V_r' [r x in]. By Eckart-Young the exact truncation
has the least Frobenius error of any rank-r matrix, rel_fro_err = sqrt(sum_{i>r} s_i^2 / sum_i s_i^2); the
randomized factors (torch.svd_lowrank, Halko et al. 2011: q = r + oversample columns, `niter` power
iterations) can only be worse, and their error is measured.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from icmltools.core.errors import BadInputError


@dataclass
class Factors:
    up: torch.Tensor        # out x r
    down: torch.Tensor      # r x in
    rank: int
    rel_fro_err: float      # exact: from the singular values; randomized: measured


def compute_dtype(dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rank_from_ratio(shape, ratio: float) -> int:
    """r = max(1, floor(ratio * min(out, in)))."""
    if not 0 < ratio <= 1:
        raise BadInputError(f"must be in (0, 1], got {ratio}", param="rank_ratio")
    return max(1, math.floor(ratio * min(shape) + 1e-9))


def rank_from_energy(s: torch.Tensor, energy: float) -> int:
    """The smallest r whose top-r singular values keep `energy` of sum s_i^2."""
    if not 0 < energy <= 1:
        raise BadInputError(f"must be in (0, 1], got {energy}", param="energy")
    e = (s.double() ** 2).cumsum(0)
    if float(e[-1]) == 0:
        return 1
    frac = e / e[-1]
    return int(min(len(s), int(torch.searchsorted(frac, torch.tensor(energy, dtype=frac.dtype) - 1e-12)) + 1))


def saves(shape, rank: int) -> bool:
    """Factoring pays only when r (out + in) < out * in."""
    out, inp = shape
    return rank * (out + inp) < out * inp


def tail_error(s: torch.Tensor, rank: int) -> float:
    """sqrt(sum_{i>r} s_i^2 / sum s_i^2), summed from the small end (no cancellation)."""
    s2 = s.double() ** 2
    tot = float(s2.sum())
    return 0.0 if tot == 0 else math.sqrt(float(s2[rank:].sum()) / tot)


def exact(w: torch.Tensor, rank: int) -> Factors:
    """Exact thin SVD, truncated to `rank`."""
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    err = tail_error(s, rank)
    root = s[:rank].sqrt()
    up = u[:, :rank] * root
    del u
    down = root[:, None] * vh[:rank]
    return Factors(up, down, rank, err)


def randomized(w: torch.Tensor, rank: int, oversample: int, niter: int, stream) -> Factors:
    """torch.svd_lowrank with q = r + oversample (capped at min(out, in)); its draws come from `stream`."""
    q = min(rank + oversample, min(w.shape))
    with stream.torch_init(devices=[w.device] if w.device.type == "cuda" else []):
        u, s, v = torch.svd_lowrank(w, q=q, niter=niter)
    root = s[:rank].sqrt()
    up = u[:, :rank] * root
    down = root[:, None] * v[:, :rank].T
    return Factors(up, down, rank, measured_error(w, up, down))


def measured_error(w: torch.Tensor, up: torch.Tensor, down: torch.Tensor, block: int = 256) -> float:
    """||W - up down||_F / ||W||_F from the residual itself, `block` rows at a time (no W-sized temporary, and
    no cancellation: the expanded form ||W||^2 - 2<A'W, B> + ... loses small errors to float32 rounding)."""
    nw2, res2 = 0.0, 0.0
    for a in range(0, w.shape[0], block):
        wb = w[a:a + block]
        nw2 += float(wb.double().square().sum())
        res2 += float(torch.addmm(wb, up[a:a + block], down, alpha=-1).double().square().sum())
    return 0.0 if nw2 == 0 else (res2 / nw2) ** 0.5
