"""Per-layer numerics of GuidedQuant: the layer objective, damping, LNQ (P-step, C-step), the SqueezeLLM
weighted k-means init, GPTQ and RTN. Torch tensors in, torch tensors out; nothing here draws random numbers.

Shapes: W (d_out, d_in); H (G, d_in, d_in), one Hessian per group of d_out / G contiguous output rows;
labels (d_out, d_in) int64; codebook C (d_out, K = 2^b).
"""
from __future__ import annotations

import functools
import math

import torch

from icmltools.core.errors import BadInputError, MissingDependencyError

from .options import QuantConfig


def grouped(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(d_out, ...) -> (G, d_out / G, ...): rows of group g are the g-th contiguous block."""
    return x.reshape(groups, x.shape[0] // groups, *x.shape[1:])


def effective_groups(d_out: int, groups: int) -> int:
    """The largest divisor of d_out not above `groups` (the official code asserts divisibility)."""
    return max(g for g in range(1, min(groups, d_out) + 1) if d_out % g == 0)


def dequant(C: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """W_hat[i, j] = C[i, labels[i, j]]."""
    return torch.gather(C, 1, labels)


def objective(W: torch.Tensor, W_hat: torch.Tensor, H: torch.Tensor) -> float:
    """f = (1/d_out) sum_g sum_{rows i in g} (w_hat_i - w_i)^T H_g (w_hat_i - w_i), in float64 (spec; the
    official `objective_function` divides by d_out / G instead, a constant factor)."""
    D = grouped((W_hat - W).double(), H.shape[0])
    return float(((D @ H.double()) * D).sum() / W.shape[0])


def damp_hessians(H: torch.Tensor, layer: str, damp0: float = 1e-5) -> tuple[torch.Tensor, list[float]]:
    """LNQ damping (official `train_least_squares`): per group, while Cholesky fails add
    damp * mean(diag H_g) with damp = damp0, 10 damp0, ... (total, not cumulative); fail above 1."""
    H = H.clone()
    used = []
    idx = torch.arange(H.shape[1], device=H.device)
    for g in range(H.shape[0]):
        mean_diag = float(H[g, idx, idx].mean())
        damp, prev = damp0, 0.0
        while int(torch.linalg.cholesky_ex(H[g])[1]) != 0:
            if damp > 1.0 or not mean_diag > 0 or not math.isfinite(mean_diag):
                raise BadInputError(f"layer {layer}: Hessian of group {g} is not positive definite after damping "
                                    f"1 x mean diagonal (mean diagonal {mean_diag:.3g}; dead inputs?)", param="model")
            H[g, idx, idx] += (damp - prev) * mean_diag
            prev, damp = damp, damp * 10
        used.append(prev)
    return H, used


# --------------------------------------------------------------------------------------------- LNQ


def _nearest(t: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Index of the codeword nearest to t (first on ties): t (..., ), C (..., K)."""
    return (t.unsqueeze(-1) - C).abs().argmin(dim=-1)


KERNELS = ("auto", "numba", "numpy", "torch")


@functools.cache
def numba_available() -> bool:
    """Whether the compiled P-step can run: numba imports (a dependency; a numba that does
    not import, e.g. built for another numpy, counts as missing)."""
    try:
        from icmltools.core.device import load_numba_module

        load_numba_module("icmltools.guidedquant._pstep_numba")
    except ImportError:
        return False
    return True


def pstep_kernel(device="cpu", kernel: str = "auto") -> str:
    """The P-step kernel `p_step` runs for tensors on `device`: "auto" is the numba sweep on CPU where numba is
    installed, else the numpy sweep; on other devices the torch sweep."""
    if kernel not in KERNELS:
        raise BadInputError(f"unknown P-step kernel {kernel!r}; choose from {', '.join(KERNELS)}", param="kernel")
    cpu = torch.device(device).type == "cpu"
    if kernel == "auto":
        return ("numba" if numba_available() else "numpy") if cpu else "torch"
    if kernel in ("numba", "numpy") and not cpu:
        raise BadInputError(f"the {kernel} P-step runs on CPU tensors only, got {device}", param="kernel")
    if kernel == "numba" and not numba_available():
        raise MissingDependencyError("the numba P-step needs numba, which does not import here: pip install numba")
    return kernel


def p_step(W: torch.Tensor, H: torch.Tensor, labels: torch.Tensor, C: torch.Tensor, cd_cycles: int = 4,
           block: int = 128, inner: int = 8, HT=None, kernel: str = "auto") -> torch.Tensor:
    """LNQ P-step (Alg. 1, official `update_P`): `cd_cycles` sweeps of exact coordinate minimisation over the
    columns j = 0..d_in-1, all rows at once: t = w_j - sum_{k != j} (w_hat_k - w_k) Hn[k, j] with
    Hn = H_g / diag(H_g) per column, w_hat_j = nearest codeword. Three implementations, the same labels
    (`pstep_kernel` picks one): "numba" (CPU, `_pstep_numba`: a compiled column loop keeping every entry's
    t current with an update per changed label), "numpy" (CPU: lazy blocks of `block` columns, GPTQ-style:
    the other columns' contributions to a block come from one matmul; inside it, columns are swept in
    sub-blocks of `inner`, each column's change added to the rest of its sub-block, and a sub-block's changes
    pushed to the rest of the block with one matmul) and "torch" (accelerators: the lazy blocks in torch).
    `HT`: `p_step_matrix(H)` when the caller runs several numpy P-steps on the same H (it does not change
    across LNQ iterations)."""
    kernel = pstep_kernel(W.device, kernel)
    if kernel == "torch":
        return _p_step_torch(W, H, labels, C, cd_cycles, block)
    if kernel == "numba":
        return torch.from_numpy(_p_step_numba(W.numpy(), H.numpy(), labels.numpy(), C.numpy(), cd_cycles))
    HT = p_step_matrix(H) if HT is None else HT
    return torch.from_numpy(_p_step_numpy(W.numpy(), HT, labels.numpy(), C.numpy(), cd_cycles, block, inner))


def p_step_matrix(H: torch.Tensor):
    """HT[g, i, k] = H_g[k, i] / H_g[i, i] for k != i, 0 on the diagonal (numpy, contiguous): row i holds the
    weights of every column's error in t_i (the transposed column-normalised Hn of `update_P`); the numpy
    sweep's matrix."""
    import numpy as np

    Hn = H.cpu().numpy()
    diag = np.diagonal(Hn, axis1=1, axis2=2)
    HT = np.empty_like(Hn)
    np.divide(Hn.transpose(0, 2, 1), diag[:, :, None], out=HT)
    HT[:, np.arange(HT.shape[1]), np.arange(HT.shape[1])] = 0
    return HT


def _cols(x, G: int):
    """(d_out, m) -> (G, m, d_out / G) contiguous: column j of a group's rows is one contiguous vector."""
    import numpy as np

    return np.ascontiguousarray(x.reshape(G, x.shape[0] // G, x.shape[1]).transpose(0, 2, 1))


def _sorted_codebook(C, G: int) -> dict:
    """Each row's codebook sorted ascending (stable), for the nearest-codeword search by midpoints:
    `mid` (G, K - 1, gs) the midpoints, `flat`/`base` the sorted values (flat[base + k] = k-th smallest),
    `rank` original label -> sorted position, `label` sorted position -> original label (a repeated value
    maps to its first, lowest original index, as argmin's first-on-ties)."""
    import numpy as np

    d_out, K = C.shape
    order = np.argsort(C, axis=1, kind="stable")
    Cs = np.take_along_axis(C, order, 1)
    label = order.copy()
    for k in range(1, K):
        label[:, k] = np.where(Cs[:, k] == Cs[:, k - 1], label[:, k - 1], order[:, k])
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(K), order.shape), 1)
    return {"mid": _cols((Cs[:, 1:] + Cs[:, :-1]) / 2, G), "flat": Cs.ravel(), "rank": rank, "label": label,
            "base": (np.arange(d_out) * K).reshape(G, d_out // G)}


def _p_step_numpy(W, HT, labels, C, cd_cycles: int, block: int, inner: int):
    """The P-step on CPU arrays (see `p_step`). Nearest codeword: the number of sorted-codebook midpoints below
    t (a value exactly on a midpoint goes to the lower codeword); layout (G, column, row) so that every
    per-column step works on contiguous vectors; the sweep keeps D = W_hat - W current. Rows are independent
    problems: a row none of whose labels changed during a cycle sees the same t in the next one, so later
    cycles sweep only the rows that changed (the same labels as sweeping all), and stop when none did."""
    import numpy as np

    G = HT.shape[0]
    cb = _sorted_codebook(C, G)
    cb["mid"] = cb["mid"].astype(W.dtype)
    Wt = _cols(W, G)
    S = _cols(np.take_along_axis(cb["rank"], labels, 1), G).astype(np.uint8 if C.shape[1] <= 256 else np.int64)
    D = cb["flat"][cb["base"][:, None, :] + S] - Wt
    rows = np.arange(Wt.shape[2])
    for _ in range(cd_cycles):
        full = rows.size == Wt.shape[2]
        if full:
            sub, Wc, Dc, Sc = cb, Wt, D, S
        else:                                            # the rows (of every group) still moving
            sub = {"mid": np.ascontiguousarray(cb["mid"][:, :, rows]), "flat": cb["flat"], "base": cb["base"][:, rows]}
            Wc, Dc, Sc = (np.ascontiguousarray(x[:, :, rows]) for x in (Wt, D, S))
        before = Sc.copy()
        _sweep(Wc, Dc, Sc, HT, sub, block, inner)
        if not full:
            D[:, :, rows], S[:, :, rows] = Dc, Sc
        rows = rows[(Sc != before).any(axis=(0, 1))]
        if rows.size == 0:
            break
    return np.take_along_axis(cb["label"], S.transpose(0, 2, 1).reshape(W.shape).astype(np.int64), 1)


def _sweep(Wt, D, S, HT, cb, block: int, inner: int) -> None:
    """One cycle over the columns in lazy blocks of `block`, each swept in sub-blocks of `inner`."""
    d = Wt.shape[1]
    for s in range(0, d, block):
        e = min(s + block, d)
        B = HT[:, s:e] @ D                               # (G, e - s, rows): every other column's contribution
        for a in range(s, e, inner):
            _sweep_inner(Wt, D, S, B, HT, cb, s, a, min(a + inner, e), e)


def _sweep_inner(Wt, D, S, B, HT, cb, s: int, a: int, b: int, e: int) -> None:
    """Columns a..b-1 of the block starting at s (ending at e), in order; then their changes pushed to
    columns b..e-1 of the block with one matmul."""
    import numpy as np

    mid, flat, base = cb["mid"], cb["flat"], cb["base"]
    delta = np.empty((D.shape[0], b - a, D.shape[2]), dtype=D.dtype)
    for j in range(a, b):
        t = Wt[:, j] - B[:, j - s]
        k = (t[:, None, :] > mid).sum(1, dtype=S.dtype)  # sorted position of the nearest codeword
        S[:, j] = k
        dj = flat[base + k] - Wt[:, j]
        np.subtract(dj, D[:, j], out=delta[:, j - a])
        D[:, j] = dj
        if j + 1 < b:
            B[:, j + 1 - s:b - s] += HT[:, j + 1:b, j, None] * delta[:, j - a, None, :]
    if b < e:
        B[:, b - s:] += HT[:, b:e, a:b] @ delta


def _p_step_numba(W, H, labels, C, cd_cycles: int, tile: int = 16, cols: int = 256):
    """The P-step on CPU arrays with the compiled sweep (`_pstep_numba`; see `p_step`), in W's dtype: codebooks
    sorted as in the numpy sweep (same midpoints and tie rule, a repeated value takes its first index); every
    entry's g = ((W_hat - W) H_g)[i, j] from one matmul per group, then kept current by the sweep."""
    import numpy as np

    from . import _pstep_numba as nb

    G = H.shape[0]
    gs = W.shape[0] // G
    W = np.ascontiguousarray(W)
    H = np.ascontiguousarray(H, dtype=W.dtype)
    cb = _sorted_codebook(C, G)
    Cs = cb["flat"].reshape(C.shape)
    vals, mids = Cs.astype(W.dtype), np.ascontiguousarray((Cs[:, 1:] + Cs[:, :-1]) / 2, dtype=W.dtype)
    S = np.empty(W.shape, dtype=np.uint8 if C.shape[1] <= 256 else np.int64)
    D = np.empty_like(W)
    nb.start(W, np.ascontiguousarray(labels, dtype=np.int64), cb["rank"], vals, S, D)
    R = np.empty_like(D)
    for g in range(G):
        np.matmul(D[g * gs:(g + 1) * gs], H[g], out=R[g * gs:(g + 1) * gs])
    out = np.empty(W.shape, dtype=np.int64)
    inv = 1 / np.diagonal(H, axis1=1, axis2=2)
    inf = np.full((W.shape[0], 1), np.inf, dtype=W.dtype)
    bounds = np.ascontiguousarray(np.concatenate([-inf, mids, inf], axis=1))
    nb.sweep(H, R, S, vals, mids, bounds, inv, cb["label"], out, gs, cd_cycles, tile, cols)
    return out


def _p_step_torch(W: torch.Tensor, H: torch.Tensor, labels: torch.Tensor, C: torch.Tensor, cd_cycles: int,
                  block: int) -> torch.Tensor:
    """The P-step in torch (accelerators: one kernel per step, no host round trips): lazy blocks, each
    column's change added to the rest of its block."""
    G = H.shape[0]
    d = W.shape[1]
    diag = torch.diagonal(H, dim1=1, dim2=2)
    Hn = H / diag.unsqueeze(1)                       # column j divided by H[j, j]
    Hoff = Hn.clone()
    Hoff.diagonal(dim1=1, dim2=2).zero_()
    Wg, Cg = grouped(W, G), grouped(C, G)
    lab = grouped(labels.clone(), G)
    D = torch.gather(Cg, 2, lab) - Wg                # (G, gs, d): w_hat - w
    for _ in range(cd_cycles):
        for s in range(0, d, block):
            e = min(s + block, d)
            B = torch.bmm(D, Hoff[:, :, s:e])        # (G, gs, e - s)
            for j in range(s, e):
                new = _nearest(Wg[:, :, j] - B[:, :, j - s], Cg)
                lab[:, :, j] = new
                dj = torch.gather(Cg, 2, new.unsqueeze(-1)).squeeze(-1) - Wg[:, :, j]
                if j + 1 < e:
                    B[:, :, j + 1 - s:] += (dj - D[:, :, j]).unsqueeze(-1) * Hoff[:, j:j + 1, j + 1:e]
                D[:, :, j] = dj
    return lab.reshape(labels.shape)


def p_step_plain(W, H, labels, C, cd_cycles: int = 4):
    """The straightforward per-column numpy P-step (same sweep, one matrix-vector product per column, reading
    the contiguous row H[j] = H[:, j] of the symmetric H; the input's dtype): the baseline of
    benchmarks/guidedquant_layers.py and a reference in the tests."""
    import numpy as np

    W, H, C = np.asarray(W), np.asarray(H), np.asarray(C)
    lab = np.array(labels, dtype=np.int64)
    G, d = H.shape[0], W.shape[1]
    gs = W.shape[0] // G
    for g in range(G):
        rows = slice(g * gs, (g + 1) * gs)
        Wg, Cg, Hg = W[rows], C[rows], H[g]
        D = np.take_along_axis(Cg, lab[rows], 1) - Wg
        r = np.arange(gs)
        for _ in range(cd_cycles):
            for j in range(d):
                t = Wg[:, j] - (D @ Hg[j] - D[:, j] * Hg[j, j]) / Hg[j, j]
                new = np.abs(t[:, None] - Cg).argmin(axis=1)
                lab[rows, j] = new
                D[:, j] = Cg[r, new] - Wg[:, j]
    return lab


def c_step(W: torch.Tensor, H: torch.Tensor, labels: torch.Tensor, K: int, reg: float = 1e-7,
           chunk: int = 256) -> torch.Tensor:
    """LNQ C-step (official `update_C`): per row, c = argmin (P c - w)^T H_g (P c - w) + reg |c|^2, i.e.
    (P^T H_g P + reg I) c = P^T H_g w with P the one-hot assignment (d_in x K); solved in float64. A codeword
    no entry uses gets 0."""
    G, d = H.shape[0], W.shape[1]
    gs = W.shape[0] // G
    out = torch.empty(W.shape[0], K, dtype=W.dtype, device=W.device)
    eye = reg * torch.eye(K, dtype=torch.float64, device=W.device)
    for g in range(G):
        for r0 in range(g * gs, (g + 1) * gs, chunk):
            r1 = min(r0 + chunk, (g + 1) * gs)
            P = torch.nn.functional.one_hot(labels[r0:r1], K).to(W.dtype)        # (r, d, K)
            HP = (H[g] @ P.permute(1, 0, 2).reshape(d, -1)).reshape(d, r1 - r0, K).permute(1, 0, 2)
            A = torch.einsum("rjc,rje->rce", P, HP).double() + eye
            b = torch.einsum("rjc,rj->rc", HP, W[r0:r1]).double()
            out[r0:r1] = torch.linalg.solve(A, b.unsqueeze(-1)).squeeze(-1).to(W.dtype)
    return out


def lnq(W: torch.Tensor, H: torch.Tensor, labels: torch.Tensor, C: torch.Tensor, cfg: QuantConfig,
        kernel: str = "auto") -> dict:
    """LNQ (Alg. 1, official `train_least_squares`) from an init (labels, C), H already damped: iteration 1 is a
    C-step only, later ones a P-step then a C-step; after each C-step the result is kept if f fell, else the
    best is restored and the loop stops. `kernel`: the P-step's (`pstep_kernel`). Returns labels, codebook, the
    accepted trace and the raw trace."""
    K = C.shape[1]
    best = objective(W, dequant(C, labels), H)
    trace, raw = [best], [best]
    best_lab, best_C = labels, C
    kernel = pstep_kernel(W.device, kernel)
    HT = p_step_matrix(H) if kernel == "numpy" and cfg.iters > 1 else None
    for it in range(cfg.iters):
        if it > 0:
            labels = p_step(W, H, labels, C, cfg.cd_cycles, cfg.block, HT=HT, kernel=kernel)
            raw.append(objective(W, dequant(C, labels), H))
        C = c_step(W, H, labels, K, cfg.c_reg)
        f = objective(W, dequant(C, labels), H)
        raw.append(f)
        if f < best:
            best, best_lab, best_C = f, labels, C
            trace.append(f)
        else:
            labels, C = best_lab, best_C
            break
    return {"labels": best_lab, "codebook": best_C, "objective_trace": trace, "raw_trace": raw}


def is_monotone(raw: list, rel: float = 1e-6) -> bool:
    """Every raw step (P or C) is non-increasing up to a relative `rel`."""
    return all(b <= a + rel * abs(a) for a, b in zip(raw, raw[1:]))


# --------------------------------------------------------------------------------------------- k-means init


def kmeans_init(W: torch.Tensor, F: torch.Tensor, K: int, iters: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    """SqueezeLLM init: per-row 1-D k-means of the weights with sample weights F (Fisher diagonal), entries
    w = 0 weighted 0 (official), a row of zero total weight weighted uniformly. Deterministic: centres start at
    the weighted quantiles (k + 1/2) / K, then at most `iters` Lloyd steps (the official code uses
    flash1dkmeans' k-means++ seeding). Returns (labels, codebook) with codebooks sorted ascending."""
    W64 = W.double()
    wts = F.double().clamp_min(0) * (W64 != 0)
    tot = wts.sum(1, keepdim=True)
    wts = torch.where(tot > 0, wts, torch.ones_like(wts))
    vals, order = W64.sort(dim=1)
    cum = torch.cumsum(wts.gather(1, order), 1)
    target = (torch.arange(K, dtype=torch.float64, device=W.device) + 0.5) / K * cum[:, -1:]
    idx = torch.searchsorted(cum.contiguous(), target.contiguous()).clamp_max(W.shape[1] - 1)
    C = vals.gather(1, idx)
    for _ in range(iters):
        lab = _sorted_nearest(W64, C)
        num = torch.zeros_like(C).scatter_add_(1, lab, wts * W64)
        den = torch.zeros_like(C).scatter_add_(1, lab, wts)
        new = torch.where(den > 0, num / den.clamp_min(1e-300), C).sort(dim=1).values
        if torch.equal(new, C):
            break
        C = new
    return _sorted_nearest(W64, C), C.to(W.dtype)


def _sorted_nearest(W: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Nearest codeword for ascending codebooks (midpoint boundaries; a tie goes to the lower codeword)."""
    mid = ((C[:, 1:] + C[:, :-1]) / 2).contiguous()
    return torch.searchsorted(mid, W.contiguous())


# --------------------------------------------------------------------------------------------- uniform


def minmax_grid(W: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row asymmetric min-max grid (GPTQ's `Quantizer.find_params`, per channel, the range includes 0);
    the scale is rounded to float16 first so the saved (f16 scale, zero) dequantize exactly."""
    maxq = 2 ** bits - 1
    lo = W.min(1).values.clamp_max(0)
    hi = W.max(1).values.clamp_min(0)
    flat = lo == hi
    lo, hi = torch.where(flat, -1.0, lo), torch.where(flat, 1.0, hi)
    scale = ((hi - lo) / maxq).half().float()
    scale = torch.where(scale > 0, scale, torch.full_like(scale, 2.0 ** -14))
    zero = torch.round(-lo / scale).clamp(0, maxq)
    return scale.to(W.dtype), zero.to(W.dtype)


def quantize_uniform(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """q = clamp(round(w / scale) + zero, 0, 2^b - 1) (integer codes; dequantized: scale * (q - zero))."""
    return torch.clamp(torch.round(w / scale) + zero, 0, 2 ** bits - 1)


def rtn(W: torch.Tensor, bits: int) -> dict:
    """Round-to-nearest on the per-row min-max grid."""
    scale, zero = minmax_grid(W, bits)
    q = quantize_uniform(W, scale[:, None], zero[:, None], bits)
    return {"q": q.long(), "scale": scale, "zero": zero}


def _gptq_rows(W: torch.Tensor, H: torch.Tensor, scale, zero, bits: int, damp: float, block: int, layer: str):
    """GPTQ (Frantar et al. 2023, Alg. 1) on rows W with Hessian H: dead columns H = 1, W = 0; damping
    damp * mean diag; upper Cholesky factor of H^-1; lazy blocks; no act-order. Returns integer codes."""
    W = W.clone().double()
    H = H.clone().double()
    d = W.shape[1]
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H.diagonal().add_(damp * torch.diagonal(H).mean())
    L, info = torch.linalg.cholesky_ex(H)
    if int(info) != 0:
        raise BadInputError(f"layer {layer}: GPTQ Hessian is not positive definite after damping", param="model")
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)
    Q = torch.zeros_like(W)
    s, z = scale.double()[:, None], zero.double()[:, None]
    for i1 in range(0, d, block):
        i2 = min(i1 + block, d)
        W1, Hi = W[:, i1:i2].clone(), Hinv[i1:i2, i1:i2]
        E = torch.zeros_like(W1)
        for i in range(i2 - i1):
            q = quantize_uniform(W1[:, i:i + 1], s, z, bits)
            Q[:, i1 + i] = q[:, 0]
            err = (W1[:, i] - (s[:, 0] * (q[:, 0] - z[:, 0]))) / Hi[i, i]
            W1[:, i:] -= err[:, None] * Hi[i, i:][None]
            E[:, i] = err
        W[:, i2:] -= E @ Hinv[i1:i2, i2:]
    return Q


def gptq(W: torch.Tensor, H: torch.Tensor, bits: int, cfg: QuantConfig, layer: str) -> dict:
    """GPTQ per row group g with H_g (G = 1: plain GPTQ); the grid is found once on the full W."""
    scale, zero = minmax_grid(W, bits)
    G = H.shape[0]
    gs = W.shape[0] // G
    q = torch.cat([_gptq_rows(W[g * gs:(g + 1) * gs], H[g], scale[g * gs:(g + 1) * gs], zero[g * gs:(g + 1) * gs],
                              bits, cfg.gptq_damp, cfg.block, layer) for g in range(G)])
    return {"q": q.long(), "scale": scale, "zero": zero}


def bits_per_weight(bits: int, d_in: int, uniform: bool) -> float:
    """Storage cost: non-uniform b + 16 * 2^b / d_in (an f16 codebook per row), uniform b + 32 / d_in."""
    return bits + (32 / d_in if uniform else 16 * 2 ** bits / d_in)
