"""Chunked distance work in torch (CPU or GPU): class means, nearest class mean, greedy per-class loops.

Never forms an N x N matrix. The full-data passes read the feature matrix in row chunks (a memory-mapped
`.npy` is read once per pass), so memory is O(chunk x d + N) beyond the features themselves; the greedy
methods (k-center, herding, graph-cut) hold one class (n_c x d) at a time.
"""
from __future__ import annotations

import numpy as np

from .io import nonfinite_error


class Engine:
    """Where and how the heavy linear algebra runs. `device` is a resolved torch device string."""

    def __init__(self, device: str = "cpu", chunk_rows: int = 0, progress=None):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.chunk_rows = int(chunk_rows)
        self.progress = progress or (lambda desc, done, total: None)
        # accumulation dtype: float64, except on MPS which has no float64
        self.acc = torch.float32 if self.device.type == "mps" else torch.float64

    def rows(self, d: int) -> int:
        """Rows per chunk: about 64 MB of float64 per block unless set explicitly."""
        if self.chunk_rows > 0:
            return self.chunk_rows
        return int(max(1024, min(262144, (8 * 2**20) // max(d, 1))))

    def work_dtype(self, X):
        """float64 for float64 inputs, else float32 (as the official code), always on centred data."""
        t = self.torch
        return t.float64 if (np.dtype(X.dtype) == np.float64 and self.acc == t.float64) else t.float32

    def _block(self, X, s: int, e: int, dtype):
        """Rows s:e as a writable tensor of `dtype` on the device."""
        t = self.torch
        if self.device.type == "cpu":
            return t.from_numpy(np.array(X[s:e], dtype=t.empty(0, dtype=dtype).numpy().dtype))
        return t.from_numpy(np.array(X[s:e])).to(self.device).to(dtype)

    # ------------------------------------------------------------------ full-data passes
    def class_means(self, X, labels: np.ndarray, n_classes: int, name: str = "features"):
        """Per-class means (float64, C x d) in one chunked pass; also rejects NaN/inf rows.

        Rows are shifted by the first row before summing (per-chunk partial sums in the working dtype,
        accumulated in float64), so large common offsets cost no precision."""
        t = self.torch
        n, d = X.shape
        wd = self.work_dtype(X)
        shift64 = t.from_numpy(np.array(X[0], dtype=np.float64)).to(self.acc).to(self.device)
        shift = shift64.to(wd)
        sums = t.zeros(n_classes, d, dtype=self.acc, device=self.device)
        lab = t.from_numpy(np.asarray(labels, dtype=np.int64)).to(self.device)
        step = self.rows(d)
        for s in range(0, n, step):
            e = min(n, s + step)
            blk = self._block(X, s, e, wd)
            finite = t.isfinite(blk).all(dim=1)
            if not bool(finite.all()):
                bad = int(t.nonzero(~finite)[0, 0])
                raise nonfinite_error(name, s + bad, np.asarray(X[s + bad]))
            blk -= shift
            part = t.zeros(n_classes, d, dtype=wd, device=self.device).index_add_(0, lab[s:e], blk)
            sums += part.to(self.acc)
            self.progress(f"class means ({name})", e, n)
        counts = t.bincount(lab, minlength=n_classes).to(self.acc)
        return sums / counts[:, None] + shift64

    def nearest_mean(self, X, labels: np.ndarray, means, name: str = "features"):
        """For every row: index of the nearest class mean (Euclidean) and the distance to its own class mean.

        Chunked N x C distances on features centred on the mean of the class means (translation
        invariant, no cancellation from large offsets), in float32 for float32 inputs (as the official
        code) and float64 otherwise; the own-class distance is the norm of the explicit difference.
        """
        t = self.torch
        n, d = X.shape
        wd = self.work_dtype(X)
        lab = t.from_numpy(np.asarray(labels, dtype=np.int64)).to(self.device)
        centre = means.mean(dim=0, keepdim=True)
        mc64 = means - centre
        mc = mc64.to(wd)
        mc_sq = (mc64 * mc64).sum(dim=1).to(wd)
        centre = centre.to(wd)
        pred = np.empty(n, dtype=np.int64)
        own = np.empty(n, dtype=np.float64)  # filled from the working dtype
        step = self.rows(d)
        for s in range(0, n, step):
            e = min(n, s + step)
            blk = self._block(X, s, e, wd)
            blk -= centre
            d2 = t.addmm(mc_sq[None, :], blk, mc.T, alpha=-2.0)  # + ||x||^2, the same for every class
            pred[s:e] = d2.argmin(dim=1).cpu().numpy()
            blk -= mc[lab[s:e]]
            own[s:e] = t.linalg.vector_norm(blk, dim=1).cpu().numpy()
            self.progress(f"nearest class mean ({name})", e, n)
        return pred, own

    # ------------------------------------------------------------------ per-class greedy loops
    def class_block(self, X, idx: np.ndarray, center: bool = True):
        """Rows `idx` (sorted) as float32 on the device, centred on their mean (computed in float64)."""
        t = self.torch
        arr = np.asarray(X[idx], dtype=np.float64)
        if center:
            with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf rows are reported by the caller
                arr = arr - arr.mean(axis=0, keepdims=True)
        return t.from_numpy(arr.astype(np.float32)).to(self.device)

    def kcenter_order(self, Xc, budget: int, start: int) -> np.ndarray:
        """k-center greedy (Sener & Savarese 2018) from `start`: each step adds the point farthest from the
        selected centres. O(n_c x d) memory and O(budget x n_c x d) time; returns the selection order."""
        t = self.torch
        n = Xc.shape[0]
        budget = min(budget, n)
        if budget <= 0:
            return np.empty(0, dtype=np.int64)
        sq = (Xc * Xc).sum(dim=1)
        order = [start]

        def d2(p):
            return (sq + sq[p] - 2.0 * (Xc @ Xc[p])).clamp_min_(0.0)

        mins = d2(start)
        mins[start] = -1.0
        for _ in range(budget - 1):
            p = int(t.argmax(mins))
            order.append(p)
            mins = t.minimum(mins, d2(p))
            mins[p] = -1.0
        return np.asarray(order, dtype=np.int64)

    def herding_order(self, Xc, budget: int) -> np.ndarray:
        """Herding (Welling 2009; Chen et al. 2010): step i adds the unselected x minimising
        ||(i+1) mu - sum_S - x|| (argmin; DeepCore's argmax is a bug)."""
        t = self.torch
        n = Xc.shape[0]
        budget = min(budget, n)
        mu = Xc.to(self.acc).mean(dim=0).float()
        sq = (Xc * Xc).sum(dim=1)
        ssum = t.zeros_like(mu)
        taken = t.zeros(n, dtype=t.bool, device=Xc.device)
        order = []
        for i in range(budget):
            v = (i + 1) * mu - ssum
            score = sq - 2.0 * (Xc @ v)  # ||v - x||^2 - ||v||^2
            score[taken] = float("inf")
            p = int(t.argmin(score))
            order.append(p)
            taken[p] = True
            ssum = ssum + Xc[p]
        return np.asarray(order, dtype=np.int64)

    def graphcut_order(self, Xc, budget: int, lam: float = 1.0) -> np.ndarray:
        """Greedy graph-cut (Iyer et al. 2021, as in DeepCore) with similarity 0.5 + 0.5 cos(x_i, x_j).

        f(S) = lam * sum_{i in V, j in S} s_ij - sum_{i, j in S} s_ij. Because s is affine in the unit
        vectors, the marginal gain of x is const + 0.5 * <x_hat, lam * sum_V x_hat - 2 * sum_S x_hat>:
        O(n_c x d) per step and no n_c x n_c matrix (DeepCore caches the full similarity matrix)."""
        t = self.torch
        n = Xc.shape[0]
        budget = min(budget, n)
        norms = t.linalg.vector_norm(Xc, dim=1, keepdim=True)
        U = t.where(norms > 0, Xc / norms.clamp_min(1e-30), t.zeros_like(Xc))
        m_all = U.to(self.acc).sum(dim=0)
        s_sel = t.zeros_like(m_all)
        taken = t.zeros(n, dtype=t.bool, device=Xc.device)
        order = []
        for _ in range(budget):
            gain = U @ (lam * m_all - 2.0 * s_sel).float()
            gain[taken] = -float("inf")
            p = int(t.argmax(gain))
            order.append(p)
            taken[p] = True
            s_sel = s_sel + U[p].to(self.acc)
        return np.asarray(order, dtype=np.int64)
