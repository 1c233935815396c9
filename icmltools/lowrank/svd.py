"""Truncated SVD factors of one weight matrix (the paper's layout: W ~ up @ down, down bias-free).

W = U S V': up = U_r S_r^(1/2) [out x r], down = S_r^(1/2) V_r' [r x in]. By Eckart-Young the exact truncation
has the least Frobenius error of any rank-r matrix, rel_fro_err = sqrt(sum_{i>r} s_i^2 / sum_i s_i^2); the
randomized factors (Halko, Martinsson, Tropp 2011, Alg. 4.4 + 5.1: q = r + oversample columns, `niter` power
iterations) can only be worse, and their error is measured.

Memory (the compressor's target is ~3x the largest tensor): LAPACK's divide-and-conquer SVD (`gesdd`, behind
`torch.linalg.svd` on a CPU) holds a copy of W, U, V' and a workspace of ~4 n^2, about 8x the tensor. The exact
solver here for float32/16-bit weights on a CPU is the symmetric eigenproblem of the Gram matrix of the smaller
side, accumulated in float64 (G = W'W, or WW' when W is wide; 2x a square float32 tensor): the top r eigenpairs
(LAPACK `syevr` through scipy, in place, subset by index) are the squared singular values and the right (left)
singular vectors; W is read again to form the other side blockwise. Peak ~3x (W and G together), and in float64
the singular values come out to ~sqrt(k eps64) s_1 (k = the smaller side), finer than float32 weights hold.
Float64 weights and GPU devices keep `torch.linalg.svd`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from icmltools.core.errors import BadInputError

BLOCKS = 64          # row/column blocks of a float64 temporary: 1/32 of the tensor's float32 bytes each


@dataclass
class Factors:
    up: torch.Tensor        # out x r
    down: torch.Tensor      # r x in
    rank: int
    rel_fro_err: float      # exact: from the singular values; randomized: measured
    solver: str = "svd"     # "gram" (float64 Gram eigendecomposition), "svd" (torch.linalg.svd), "randomized"


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


def _halves(s: torch.Tensor):
    """s^(1/2) and s^(-1/2) (0 where s = 0: a zero singular value contributes nothing to up @ down)."""
    root = s.clamp_min(0).sqrt()
    inv = root.reciprocal()
    inv[root == 0] = 0
    return root, inv


def _step(n: int) -> int:
    return max(1, -(-n // BLOCKS))


class Rows:
    """A weight matrix read in row blocks: `rows(a, b)` returns rows [a, b) as a tensor (a view of a tensor in
    memory, or a positioned read from a checkpoint), so the exact solver never needs the whole matrix at once."""

    def __init__(self, shape, dtype, rows, device="cpu"):
        self.shape, self.dtype, self.rows, self.device = tuple(shape), dtype, rows, torch.device(device)

    @classmethod
    def of(cls, w: torch.Tensor) -> Rows:
        return cls(w.shape, w.dtype, lambda a, b: w[a:b], w.device)

    def full(self) -> torch.Tensor:
        return self.rows(0, self.shape[0])


def exact(w, rank: int) -> Factors:
    """Exact truncated SVD of `w`, a tensor or `Rows` (the Gram solver reads a tall or square W twice in row
    blocks and never holds it whole; a wide W is held only while its Gram matrix WW' is formed)."""
    src = w if isinstance(w, Rows) else Rows.of(w)
    if src.dtype == torch.float64 or src.device.type != "cpu":
        return _exact_svd(src.full(), rank)
    return _exact_gram(src, rank)


def _exact_svd(w: torch.Tensor, rank: int) -> Factors:
    """Thin SVD (full_matrices=False), truncated."""
    u, s, vh = torch.linalg.svd(w.to(compute_dtype(w.dtype)), full_matrices=False)
    err = tail_error(s, rank)
    root = s[:rank].sqrt()
    up = u[:, :rank] * root
    del u
    down = root[:, None] * vh[:rank]
    return Factors(up, down, rank, err, "svd")


def gram(src: Rows) -> tuple[torch.Tensor, float, bool]:
    """G of the smaller side in float64 and ||W||_F^2 = trace(G): W'W (out >= in, `right` True) summed over row
    blocks read one at a time; WW' (a wide W, read whole: W and G then take < 3x W) over column blocks."""
    m, n = src.shape
    right = n <= m
    if right:
        g = torch.zeros(n, n, dtype=torch.float64, device=src.device)
        for a in range(0, m, _step(m)):
            blk = src.rows(a, min(a + _step(m), m)).double()
            g.addmm_(blk.T, blk)
    else:
        w = src.full()
        g = torch.zeros(m, m, dtype=torch.float64, device=src.device)
        for a in range(0, n, _step(n)):
            blk = w[:, a:a + _step(n)].double()
            g.addmm_(blk, blk.T)
    return g, float(g.diagonal().sum()), right


def top_eigh(g: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `rank` largest eigenvalues (descending) and eigenvectors of the symmetric float64 `g`, which is
    overwritten: LAPACK syevr on the index range only (workspace O(k), vectors k x r)."""
    k = g.shape[0]
    if g.device.type != "cpu":
        lam, z = torch.linalg.eigh(g)
        return lam.flip(0)[:rank], z[:, k - rank:].flip(1)

    from scipy.linalg import eigh

    lam, z = eigh(g.numpy().T, subset_by_index=[k - rank, k - 1], driver="evr", overwrite_a=True, check_finite=False)
    zt = z.T                    # r x k, C-contiguous (LAPACK returns the vectors column-major): rows reversed in place
    for i in range(rank // 2):  # (a reversed copy would hold the vectors twice)
        zt[[i, rank - 1 - i]] = zt[[rank - 1 - i, i]]
    return torch.from_numpy(lam[::-1].copy()), torch.from_numpy(zt).T


def _exact_gram(src: Rows, rank: int) -> Factors:
    """Eckart-Young through the Gram matrix: W'W = V S^2 V', so up = W V_r S_r^(-1/2), down = S_r^(1/2) V_r'
    (mirrored for WW' = U S^2 U': down = S_r^(-1/2) U_r' W, summed over row blocks); up @ down = W V_r V_r'
    whatever the rounding of S. The error comes from the singular values: ||W||^2 - sum_{i<=r} s_i^2, in float64.
    Held at once: G, then G and the vectors, then the vectors and the factors (plus one row block of W)."""
    m, n = src.shape
    g, nw2, right = gram(src)
    lam, z = top_eigh(g, rank)
    del g
    err = 0.0 if nw2 == 0 else math.sqrt(max(nw2 - float(lam.sum()), 0.0) / nw2)
    root, inv = _halves(lam)
    out = compute_dtype(src.dtype)
    step = _step(m)
    if right:                   # z = V_r
        up = torch.empty((m, rank), dtype=out)
        for a in range(0, m, step):
            b = min(a + step, m)
            up[a:b] = (src.rows(a, b).double() @ z * inv).to(out)
        return Factors(up, (z * root).T.to(out).contiguous(), rank, err, "gram")
    acc = torch.zeros((rank, n), dtype=torch.float64)  # z = U_r
    for a in range(0, m, step):
        b = min(a + step, m)
        acc.addmm_(z[a:b].T, src.rows(a, b).double())
    return Factors((z * root).to(out).contiguous(), (inv[:, None] * acc).to(out), rank, err, "gram")


def _orth(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.qr(x).Q


def randomized(w: torch.Tensor, rank: int, oversample: int, niter: int, stream) -> Factors:
    """Randomized SVD (Halko et al. 2011: Alg. 4.4, subspace iteration with re-orthonormalisation, then Alg. 5.1)
    with q = r + oversample columns (capped at min(out, in)), Gaussian test matrix from `stream`; the small q x in
    problem B = Q'W goes through its float64 Gram BB'. Holds W, Q and B (each of the last two q/min of W)."""
    m, n = w.shape
    q = min(rank + oversample, m, n)
    omega = torch.randn(n, q, generator=stream.torch(w.device), dtype=w.dtype, device=w.device)
    basis = _orth(w @ omega)
    del omega
    for _ in range(niter):
        basis = _orth(w @ _orth(w.T @ basis))
    b = basis.T @ w                                     # q x in
    g = torch.zeros(q, q, dtype=torch.float64, device=w.device)
    for a in range(0, n, _step(n)):
        blk = b[:, a:a + _step(n)].double()
        g.addmm_(blk, blk.T)
    lam, ub = top_eigh(g, rank)
    del g
    root, inv = _halves(lam)
    ub = ub.to(w.dtype)                                 # q x r: the float64 copy goes before the factors exist
    up = basis @ (ub * root.to(w.dtype))
    del basis
    down = (ub * inv.to(w.dtype)).T @ b
    del b, ub
    return Factors(up, down, rank, measured_error(w, up, down), "randomized")


def measured_error(w: torch.Tensor, up: torch.Tensor, down: torch.Tensor, block: int | None = None) -> float:
    """||W - up down||_F / ||W||_F from the residual itself, `block` rows at a time (no W-sized temporary, and
    no cancellation: the expanded form ||W||^2 - 2<A'W, B> + ... loses small errors to float32 rounding)."""
    nw2, res2 = 0.0, 0.0
    block = block or _step(w.shape[0])
    for a in range(0, w.shape[0], block):
        wb = w[a:a + block]
        nw2 += float(wb.double().square().sum())
        res2 += float(torch.addmm(wb, up[a:a + block], down, alpha=-1).double().square().sum())
    return 0.0 if nw2 == 0 else (res2 / nw2) ** 0.5
