"""The LNQ P-step sweep compiled with numba (a dependency); imported only by
`quant.p_step` on CPU (through `quant.numba_available`), never at package import. Same coordinate descent as
the official lazy-block `update_P` (Alg. 1's P-step; and `quant._p_step_numpy`), in a column loop: every
entry keeps g_ij = ((W_hat - W) H_g)[i, j] (from one matmul per group, done by the caller), so per column j
t = w_hat_j - g_j / H[j, j] = w_j - sum_{k != j} (w_hat_k - w_k) H[k, j] / H[j, j] and w_hat_j = the nearest
codeword; when an entry's label changes by delta, its row's g += delta H_g[j] (fused multiply-adds). A column
costs two comparisons per row (t against its label's interval between two midpoints; the search only when t
left it) and an update of d values per changed label, in place of the dense d_out d^2 product per cycle. Rows
are independent problems: they are swept in tiles, columns in blocks (a block of H_g read once per tile), and
a row with no change during a cycle has converged (it would see the same t again) and leaves the next ones.

Compiled once and cached (`cache=True`): numba writes the cache next to this file (`__pycache__`) when that
folder is writable, else under its user-wide cache folder (~/.cache/numba; `NUMBA_CACHE_DIR` overrides
both); nothing is written to the working directory. Where no cache location is writable the kernel is
compiled in every process (`CACHED` is False).
"""
from __future__ import annotations

import numpy as np

from icmltools.core.device import numba_jit


def _nearest(mid, t):
    """Number of the ascending midpoints `mid` below t: a count for short codebooks (no branches), a binary
    search for long ones."""
    n = mid.shape[0]
    if n < 16:
        k = 0
        for m in range(n):
            k += mid[m] < t
        return k
    lo, hi = 0, n
    while lo < hi:
        m = (lo + hi) // 2
        if mid[m] < t:
            lo = m + 1
        else:
            hi = m
    return lo


def _start(W, labels, rank, vals, S, D):
    """S[i, j] = rank[i, labels[i, j]] (the entry's position in its row's ascending codebook), and the error
    D = W_hat - W."""
    for i in range(W.shape[0]):
        s, d, w, lab, rk, v = S[i], D[i], W[i], labels[i], rank[i], vals[i]
        for j in range(w.shape[0]):
            s[j] = rk[lab[j]]
            d[j] = v[s[j]] - w[j]


def _axpy(r, a, X, j):
    """r += a X[j] (the row indexed in place: a row view would cost reference counting per call)."""
    for m in range(r.shape[0]):
        r[m] += a * X[j, m]


def _row_block(R, S, Hg, inv, vals, mids, bounds, i, j0, j1):
    """Columns j0..j1-1 of row i, in order: t = w_hat_j - g_j / H[j, j] (= w_j minus the other columns' errors
    weighted by H[k, j] / H[j, j]) and its nearest codeword; a change by delta adds delta H[j] to the row's g.
    Most labels stay: codeword s is the nearest (s midpoints below t) exactly when bounds[s] < t <= bounds[s + 1]
    (`bounds` = the midpoints with -inf and +inf around them, ascending), two comparisons; the search runs
    only otherwise (a NaN t fails the test and gets the search's answer). Returns the number of changes."""
    r, v, mid, b = R[i], vals[i], mids[i], bounds[i]
    rb, sb, ib = r[j0:j1], S[i, j0:j1], inv[j0:j1]  # the block's columns, indexed from 0 (no negative-index checks)
    nc = 0
    for m in range(rb.shape[0]):
        s = sb[m]
        t = v[s] - rb[m] * ib[m]
        if b[s] < t and not b[s + 1] < t:
            continue
        k = _nearest(mid, t)
        if k != s:
            sb[m] = k
            nc += 1
            _axpy(r, v[k] - v[s], Hg, j0 + m)
    return nc


def _sweep(H, R, S, vals, mids, bounds, inv, label, out, gs, cycles, tile, cols):
    """In place on R (d_out, d), each entry's running g = ((W_hat - W) H_g)[i, j], and S (d_out, d), each
    entry's position in its row's ascending codebook `vals` (d_out, K) with midpoints `mids` (d_out, K - 1)
    and `bounds` (d_out, K + 1) = the midpoints between -inf and +inf:
    `cycles` sweeps over the columns j = 0..d-1 of the rows of each group g (H[g], `gs` rows each,
    inv[g] = 1 / diag H[g]), in tiles of `tile` rows and blocks of `cols` columns (a block of H[g] is read
    once per tile). The nearest codeword of t is the number of midpoints below t (a t exactly on a midpoint
    goes to the lower codeword; NaN to the first). A row with no change in a cycle has converged and is left
    out of the next ones. Writes the labels, out[i, j] = label[i, S[i, j]]; returns the number of changes."""
    d = R.shape[1]
    changes = 0
    moved = np.empty(tile, np.int64)
    for g in range(H.shape[0]):
        for i0 in range(g * gs, (g + 1) * gs, tile):
            n = min(tile, (g + 1) * gs - i0)
            moved[:] = 1
            for _ in range(cycles):
                active = moved[:n] > 0
                if not active.any():
                    break
                moved[:] = 0
                for j0 in range(0, d, cols):
                    for a in range(n):
                        if active[a]:
                            moved[a] += _row_block(R, S, H[g], inv[g], vals, mids, bounds, i0 + a, j0, min(j0 + cols, d))
                changes += moved[:n].sum()
            for i in range(i0, i0 + n):
                o, s, lab = out[i], S[i], label[i]
                for j in range(d):
                    o[j] = lab[s[j]]
    return changes


def _jit(fn, **opts):
    global CACHED
    fn, cached = numba_jit(fn, **opts)
    CACHED = CACHED and cached  # numba found no writable cache location: compiled in every process
    return fn


CACHED = True
_nearest = _jit(_nearest)
_axpy = _jit(_axpy, fastmath={"contract"})   # r + a x as one fused multiply-add
_row_block = _jit(_row_block)
start = _jit(_start)
sweep = _jit(_sweep)
