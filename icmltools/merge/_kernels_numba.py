"""The merge engine's fused CPU loops, compiled with numba (a dependency); imported only
through :mod:`icmltools.merge.kernels`, never at package import.

Every loop does, element by element and in the same order, the float32 operations of the torch path it
replaces (no fastmath: no reassociation, no fused multiply-add), so the outputs are bitwise those of the torch
path; the only reductions are integer counts. bfloat16 is read as its uint16 bits (a bf16 value is the high
half of a float32: exact), and written with torch's round-to-nearest-even.

Compiled once and cached next to this file (`cache=True`) when that folder is writable, else in every process.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange, types
from numba.extending import intrinsic, overload

from icmltools.core.device import numba_jit, numba_target_has


@intrinsic
def _u32_as_f32(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))
    return types.float32(types.uint32), codegen


@intrinsic
def _f32_as_u32(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))
    return types.uint32(types.float32), codegen


def _jit(fn, parallel=False, interleave=None):
    return numba_jit(fn, parallel=parallel, interleave=interleave)[0]


def _jit_once(fn):
    """_jit with each vectorised loop interleaved once (:func:`icmltools.core.device.llvm_interleave`): for a loop
    whose many live values LLVM's own choice (4) spilled to the stack."""
    return _jit(fn, interleave=1)


def _inlined(fn):
    """_jit for a loop body called from one place (a piece function's body, or that body's block): numba copies its
    code into the caller's before typing it (`inline='always'`). A jitted callee is compiled on its own, then its
    code is linked into each caller, where LLVM optimises and compiles it again (docs/merge-engine.md, Decisions,
    session 52)."""
    return numba_jit(fn, inline="always")[0]


def _pjit(fn):
    """A loop spread over numba's threads (`prange`; :func:`icmltools.core.device.set_threads` sizes them): each
    element, block or piece is computed by the same serial code whatever the thread count, so the results do
    not depend on it (the reductions are integer counts). Not inside a one-pass merge, whose loops go in pieces
    (:func:`_run_pieces`): numba's parallel loops run on torch's OpenMP, whose idle threads spin after each loop
    on the core the next pieces need (as pieces: DARE 2.60-2.71 -> 2.04-2.23 s, magnitude 2.94-3.04 -> 2.49-2.71,
    CA-magnitude 4.75-4.89 -> 3.98-4.28, two threads). The model-by-model path runs these loops back to back,
    where the spinning helps (docs/merge-engine.md, Decisions)."""
    return _jit(fn, parallel=True)


def _run_pieces(fn, T, phase, args, after=None):
    """fn(p, T, phase, *args) for every piece p of T, spread over numba's thread count (`core.device.numba_threads`
    sizes it): the calling thread and a pool's threads each take the next piece until none is left (fn is a
    serial loop compiled with nogil, so they run at once). Instead of `prange`, for the one-pass drivers: a
    parallel loop's compile optimises its body's code again (_merge_models: 18.9-20.4 s per model count and
    dtype, 9.2-10.6 s serial). `after(p)`, where given, runs in the same thread once piece p is done (the
    deferred passes release its inputs' pages there). A Ctrl-C waits for the pieces running (they write into the
    caller's buffers), starts no other, and is raised then; an error in a piece is raised after every piece has
    stopped."""
    import itertools

    n = min(T, numba.get_num_threads())
    if n <= 1:
        for p in range(T):
            fn(p, T, phase, *args)
            if after is not None:
                after(p)
        return
    nxt, stop = itertools.count(), []

    def work():
        while not stop:
            p = next(nxt)  # atomic: each piece is taken once
            if p >= T:
                return
            try:
                fn(p, T, phase, *args)
                if after is not None:
                    after(p)
            except BaseException:
                stop.append(p)
                raise

    from concurrent.futures import wait

    futs = [_pool().submit(work) for _ in range(n - 1)]
    err = None
    try:
        work()
    except BaseException as e:
        err = e
        stop.append(-1)
    while True:
        try:
            wait(futs)
            break
        except BaseException as e:  # a Ctrl-C while the others finish their pieces
            err = err or e
            stop.append(-1)
    if err is not None:
        raise err
    for f in futs:
        f.result()


_POOL = []


def _pool():
    """The worker threads of :func:`_run_pieces` (started when first needed; as many as numba may use)."""
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor

        _POOL.append(ThreadPoolExecutor(max(1, numba.config.NUMBA_NUM_THREADS - 1), "merge-piece"))
    return _POOL[0]


_MAX_PIECES = 8  # numba's threads share these out (a fixed count: the compiled loops stay cacheable)


@_jit
def _n_pieces(n, align):
    """How many pieces a loop over n elements is cut into: up to 8, none smaller than 2^18 elements; more only
    where a piece would pass 2^30 elements (a piece's loops count in 32 bits: _inc)."""
    return max(1, min(_MAX_PIECES, n // max(1 << 18, align)), (n + (1 << 30) - 1) >> 30)


@_jit
def _piece(n, t, T, align):
    """[lo, hi) of piece t of T over n elements, cut at multiples of `align` (blocks never straddle pieces)."""
    blocks = (n + align - 1) // align
    return min(n, (blocks * t // T) * align), min(n, (blocks * (t + 1) // T) * align)


def _releasing(done, n, T, align):
    """_run_pieces' `after` for a pass whose pieces read only their own elements: done(lo, hi) with piece p's
    range (_piece's) once it is done (None without `done`)."""
    return None if done is None else (lambda p: done(*_piece(n, p, T, align)))


_EXP = np.uint32(0x7F800000)
_ABS = np.uint32(0x7FFFFFFF)


@_jit
def _tau_at(raw, base, j, is_bf16):
    """tau_j = float32(raw_j) - base_j (raw: bf16 bits as uint16, or float32)."""
    if is_bf16:
        return _u32_as_f32(np.uint32(raw[j]) << np.uint32(16)) - base[j]
    return np.float32(raw[j]) - base[j]


@_pjit
def bf16_to_f32(raw, out):
    """out = float32(raw) (raw: bf16 bits as uint16)."""
    for j in prange(raw.shape[0]):
        out[j] = _u32_as_f32(np.uint32(raw[j]) << np.uint32(16))


@_pjit
def tau_bf16(raw, base, out):
    """out = float32(raw) - base; returns the number of non-finite results."""
    bad = 0
    for j in prange(raw.shape[0]):
        x = _u32_as_f32(np.uint32(raw[j]) << np.uint32(16)) - base[j]
        out[j] = x
        bad += (_f32_as_u32(x) & _EXP) == _EXP
    return bad


@_pjit
def tau_f32(raw, base, out):
    """out = raw - base (float32); returns the number of non-finite results."""
    bad = 0
    for j in prange(raw.shape[0]):
        x = raw[j] - base[j]
        out[j] = x
        bad += (_f32_as_u32(x) & _EXP) == _EXP
    return bad


@_pjit
def count_non_finite(x):
    bad = 0
    for j in prange(x.shape[0]):
        bad += (_f32_as_u32(x[j]) & _EXP) == _EXP
    return bad


@_pjit
def count_nonzero(x):
    c = 0
    for j in prange(x.shape[0]):
        c += x[j] != 0
    return c


@_jit
def _round_bf16(r):
    u = _f32_as_u32(r)
    if (u & _ABS) > _EXP:  # NaN (torch writes 0x7FC0)
        return np.uint16(0x7FC0)
    return np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@_jit
def _applied(b, m, lf, mode):
    """theta_0 + tau (mode 0), theta_0 + tau * lambda (1), theta_0 - tau * lambda (2), in float32."""
    if mode == 0:
        return b + m
    if mode == 1:
        return b + m * lf
    return b - m * lf


@_pjit
def apply_bf16(bd, merged, lam, mode, out):
    """out = bf16(bd + merged) (mode 0), bf16(bd + merged * lam) (mode 1), bf16(bd - merged * lam) (mode 2);
    returns the number of non-finite outputs."""
    bad = 0
    lf = np.float32(lam)
    for j in prange(bd.shape[0]):
        o = _round_bf16(_applied(bd[j], merged[j], lf, mode))
        out[j] = o
        bad += (o & np.uint16(0x7F80)) == np.uint16(0x7F80)
    return bad


@_pjit
def apply_f32(bd, merged, lam, mode, out):
    """out = bd + merged (mode 0), bd + merged * lam (1), bd - merged * lam (2), float32; non-finite count."""
    bad = 0
    lf = np.float32(lam)
    for j in prange(bd.shape[0]):
        r = _applied(bd[j], merged[j], lf, mode)
        out[j] = r
        bad += (_f32_as_u32(r) & _EXP) == _EXP
    return bad


# --------------------------------------------------------------------------------------------- exact top-k


@_pjit
def hist_hi(x, counts):
    """counts[h] += #elements whose |x| has the high 16 bits h (|x| as its int bits: the order of |x|)."""
    T, part = _parts(x.shape[0], counts.shape[0])
    for t in prange(T):
        lo, hi = _piece(x.shape[0], t, T, 1)
        xs = x[lo:hi]
        for j in range(xs.shape[0]):
            part[t, (_f32_as_u32(xs[j]) & _ABS) >> np.uint32(16)] += 1
    _add_parts(counts, part)


@_pjit
def hist_lo(x, bucket, counts):
    """counts[l] += #elements of high bits `bucket` whose low 16 bits are l."""
    b = np.uint32(bucket)
    T, part = _parts(x.shape[0], counts.shape[0])
    for t in prange(T):
        lo, hi = _piece(x.shape[0], t, T, 1)
        xs = x[lo:hi]
        for j in range(xs.shape[0]):
            u = _f32_as_u32(xs[j]) & _ABS
            if (u >> np.uint32(16)) == b:
                part[t, u & np.uint32(0xFFFF)] += 1
    _add_parts(counts, part)


@_jit
def _parts(n, width):
    """(pieces, their zeroed histograms) for a histogram of `width` bins over n elements."""
    T = _n_pieces(n, 1)
    return T, np.zeros((T, width), np.int64)


@_jit
def _add_parts(counts, part):
    """counts += the per-piece histograms."""
    for t in range(part.shape[0]):
        for h in range(counts.shape[0]):
            counts[h] += part[t, h]


@_pjit
def topk_prune(x, mode, thr, all_ties, left):
    """Zero the elements of chunk x not kept by one TopK (mode 0: none kept, 1: all, 2: |x| > thr, and of the
    |x| == thr the first `left` (every one with all_ties)); returns the number of |x| == thr seen.

    In pieces (one per thread, cut at blocks of 4096): the ties of each piece are counted first, so each piece
    knows how many ties come before it; then each piece runs :func:`_topk_span`."""
    n = x.shape[0]
    if mode == 1:
        return 0
    if mode == 0:
        for j in prange(n):
            x[j] = np.float32(0.0)
        return 0
    t = np.float32(thr)
    T = _n_pieces(n, 4096)
    before = np.zeros(T + 1, np.int64)
    if T > 1 and not all_ties:
        for p in prange(T):
            lo, hi = _piece(n, p, T, 4096)
            before[p + 1] = _count_ties(x[lo:hi], t)
        for p in range(T):
            before[p + 1] += before[p]
    seen = np.zeros(T, np.int64)
    for p in prange(T):
        lo, hi = _piece(n, p, T, 4096)
        seen[p] = _topk_span(x[lo:hi], t, all_ties, left, before[p])
    return seen.sum()


# The element loops below take their range as a slice of the array (x[lo:hi], looped from 0): numba vectorises
# those, not a loop over range(lo, hi) of the whole array (8x slower, measured on 2^20 float32).


@_jit
def _count_ties(xs, t):
    """#|xs| == t."""
    c = np.int32(0)
    for j in range(xs.shape[0]):
        c = _inc(c, abs(xs[j]) == t)
    return c


@_jit
def _keep_above(xs, t, ties):
    """Zero xs where not |xs| > t (or == t when `ties`), branch-free."""
    zero = np.float32(0.0)
    for j in range(xs.shape[0]):
        v = xs[j]
        a = abs(v)
        xs[j] = v if (a > t) | (ties & (a == t)) else zero


@_jit
def _topk_span(xs, t, all_ties, left, seen0):
    """topk_prune over the piece xs with `seen0` ties before it, in blocks of 4096: a block whose ties are all
    kept or all dropped runs a branch-free select (vectorised); only the block where the ties' quota runs out is
    walked one element at a time. Returns the ties in xs."""
    zero = np.float32(0.0)
    seen = seen0
    n = xs.shape[0]
    for s in range(0, n, 4096):
        blk = _span(xs, s, min(s + 4096, n))
        c = _count_ties(blk, t)
        if all_ties or seen + c <= left or seen >= left:
            _keep_above(blk, t, all_ties or seen + c <= left)
        else:
            q = seen
            for j in range(blk.shape[0]):
                a = abs(blk[j])
                if a > t:
                    continue
                if a == t:
                    q += 1
                    if q <= left:
                        continue
                blk[j] = zero
        seen += c
    return seen - seen0


@_jit
def _topk_keeps(a, mode, thr, keep_all, left, seen):
    """Whether one TopK rule keeps |x| = a (mode 0: none, 1: all, else |x| > thr, and the first `left` of the
    |x| == thr ties unless `keep_all`), and its tie counter after this element."""
    if mode == 0:
        return False, seen
    if mode == 1:
        return True, seen
    if a > thr:
        return True, seen
    if a == thr:
        return keep_all or seen < left, seen + 1
    return False, seen


@_pjit
def band_prune(x, mode_k, thr_k, all_k, left_k, mode_t, thr_t, all_t, left_t):
    """Breadcrumbs: keep where TopK k keeps and TopK t (the top gamma) does not; zero the rest. Returns the
    |x| == thr counts of both (each TopK's tie counter advances over the whole chunk).

    In pieces and blocks as :func:`topk_prune`, both TopKs' ties counted before each piece and block."""
    n = x.shape[0]
    tk, tt = np.float32(thr_k), np.float32(thr_t)
    T = _n_pieces(n, 4096)
    bk = np.zeros(T + 1, np.int64)
    bt = np.zeros(T + 1, np.int64)
    if T > 1:
        for p in prange(T):
            lo, hi = _piece(n, p, T, 4096)
            bk[p + 1] = _count_ties(x[lo:hi], tk) if mode_k == 2 else 0
            bt[p + 1] = _count_ties(x[lo:hi], tt) if mode_t == 2 else 0
        for p in range(T):
            bk[p + 1] += bk[p]
            bt[p + 1] += bt[p]
    sk = np.zeros(T, np.int64)
    st = np.zeros(T, np.int64)
    for p in prange(T):
        lo, hi = _piece(n, p, T, 4096)
        got = _band_span(x[lo:hi], mode_k, tk, all_k, left_k, bk[p], mode_t, tt, all_t, left_t, bt[p])
        sk[p] = got[0]
        st[p] = got[1]
    return sk.sum(), st.sum()


@_jit
def _band_span(xs, mode_k, tk, all_k, left_k, sk0, mode_t, tt, all_t, left_t, st0):
    """band_prune over the piece xs, `sk0`/`st0` ties of each TopK before it, in blocks of 4096: a block where
    neither TopK's tie quota runs out runs :func:`_band_keep` (vectorised); the others are walked element by
    element. Returns the ties of each TopK in xs."""
    seen_k, seen_t = sk0, st0
    n = xs.shape[0]
    for s in range(0, n, 4096):
        blk = _span(xs, s, min(s + 4096, n))
        ck = _count_ties(blk, tk) if mode_k == 2 else 0
        ct = _count_ties(blk, tt) if mode_t == 2 else 0
        ties_k = all_k or seen_k + ck <= left_k
        ties_t = all_t or seen_t + ct <= left_t
        if (ties_k or seen_k >= left_k) and (ties_t or seen_t >= left_t):
            _band_keep(blk, mode_k, tk, ties_k, mode_t, tt, ties_t)
        else:
            qk, qt = seen_k, seen_t
            for j in range(blk.shape[0]):
                a = abs(blk[j])
                ink, qk = _topk_keeps(a, mode_k, tk, all_k, left_k, qk)
                intop, qt = _topk_keeps(a, mode_t, tt, all_t, left_t, qt)
                if not ink or intop:
                    blk[j] = 0.0
        seen_k += ck
        seen_t += ct
    return seen_k - sk0, seen_t - st0


@_jit
def _band_keep(blk, mode_k, tk, ties_k, mode_t, tt, ties_t):
    """Zero blk where TopK k drops or TopK t keeps, each with its ties all kept (`ties_*`) or all dropped."""
    zero = np.float32(0.0)
    for j in range(blk.shape[0]):
        v = blk[j]
        a = abs(v)
        ink = (mode_k == 1) | ((mode_k == 2) & ((a > tk) | (ties_k & (a == tk))))
        intop = (mode_t == 1) | ((mode_t == 2) & ((a > tt) | (ties_t & (a == tt))))
        blk[j] = v if ink > intop else zero  # ink and not intop, branch-free


# --------------------------------------------------------------------------------------------- sums


@_jit
def _sum_into(total, j, v, first):
    """total[j] = v (the first model) or total[j] + v (the running sum, in the torch path's order)."""
    if first:
        total[j] = v
    else:
        total[j] = total[j] + v


@_pjit
def accumulate(x, total, w, first, bits, bit):
    """The weighted sum of a pruned chunk: v = x * w (w != 1), total = v (first) or total + v; x is left
    multiplied (as the torch path's in-place mul_). bits[j] += bit where x != 0 (when bit != 0; uint8 bits).
    Returns the nonzeros of x before the weighting."""
    c = 0
    scale = w != 1.0
    wf = np.float32(w)
    b = bits.dtype.type(bit)
    nil = bits.dtype.type(0)
    for j in prange(x.shape[0]):
        v = x[j]
        nz = v != 0
        c += nz
        if bit != 0:
            bits[j] += b if nz else nil  # branch-free (a branch on nz: 10x slower on sparse chunks)
        if scale:
            v = v * wf
            x[j] = v
        _sum_into(total, j, v, first)
    return c


@_pjit
def agree(x, total, acc, div, w, first, pz):
    """TIES pass 1 (Alg. 1 l. 6-7): wp = x * w; where sign(wp) is the elected sign(total), acc += wp and
    div += w (acc, div zeroed first). A total of 0 elects pz: 0 (the paper's sgn(0)) or 1 (mergekit's +)."""
    wf = np.float32(w)
    one = w == 1.0
    for j in prange(x.shape[0]):
        t = total[j]
        s = np.float32(1.0) if t > 0 else (np.float32(-1.0) if t < 0 else np.float32(pz))
        v = x[j]
        if not one:
            v = v * wf
        ok = v * s > 0
        a = v if ok else np.float32(0.0)
        d = np.float32(1.0) if ok else np.float32(0.0)
        if not one:
            d = d * wf
        if first:
            acc[j] = np.float32(0.0) + a
            div[j] = np.float32(0.0) + d
        else:
            acc[j] = acc[j] + a
            div[j] = div[j] + d


@_pjit
def ties_finish(acc, div, normalize):
    """TIES' disjoint mean: acc / div where div != 0 (acc, 0 elsewhere, as torch's where(div == 0, 1, div)),
    with `normalize`; returns the nonzeros of div (the kept count)."""
    c = 0
    one = np.float32(1.0)
    for j in prange(acc.shape[0]):
        d = div[j]
        c += d != 0
        if normalize:
            acc[j] = acc[j] / (one if d == 0 else d)
    return c


@_pjit
def tau_accumulate(raw, base, total, w, first, is_bf16):
    """total = (float32(raw) - base) * w (first) or total + that (the * w only for w != 1), without storing the
    task vector (raw: bf16 bits as uint16, or float32); returns the number of non-finite task-vector elements."""
    bad = 0
    scale = w != 1.0
    wf = np.float32(w)
    for j in prange(raw.shape[0]):
        x = _tau_at(raw, base, j, is_bf16)
        bad += (_f32_as_u32(x) & _EXP) == _EXP
        if scale:
            x = x * wf
        _sum_into(total, j, x, first)
    return bad


@_pjit
def pair_counts(bits, n):
    """counts[i][j] = #slots with bits i and j both set (uint8 bits: n <= 8), from one histogram."""
    size = bits.shape[0]
    T = _n_pieces(size, 1)
    part = np.zeros((4 * T, 256), np.int64)
    for t in prange(T):
        lo, hi = _piece(size, t, T, 1)
        _count_bytes(bits[lo:hi], part[4 * t:4 * t + 4])
    h = np.zeros(256, np.int64)
    _add_parts(h, part)
    return _hist_pairs(h, n)


@_jit
def _hist_pairs(h, n):
    """counts[i][j] (i <= j) = #slots whose bits (h: their histogram over 256 byte values) hold both i and j."""
    out = np.zeros((n, n), np.int64)
    for v in range(256):
        if h[v] == 0:
            continue
        for i in range(n):
            if (v >> i) & 1:
                for k in range(i, n):
                    if (v >> k) & 1:
                        out[i, k] += h[v]
    return out


@_jit
def _count_bytes(bs, h4):
    """h4 += the histogram of the bytes bs over its 256 bins (h4: four rows, which its readers sum). Bytes all
    below 16 (the kept bits of up to 4 models) go through _count_nibbles, 0.41 -> 0.14 ns per byte (one thread,
    4096-byte blocks of 4 random bits); others as h4[j % 4][bs[j]] += 1: four histograms, so runs of equal bytes
    (most slots hold the same bits) do not wait on one counter (0.86 -> 0.31 ns per byte)."""
    n8 = bs.shape[0] // 8
    w = _span(bs, 0, n8 * 8).view(np.uint64)
    o = np.uint64(0)
    for q in range(n8):  # vectorised: the bits any byte sets
        o |= w[q]
    for j in range(n8 * 8, bs.shape[0]):
        o |= np.uint64(bs[j])
    if o & np.uint64(0xF0F0F0F0F0F0F0F0) == 0:
        _count_nibbles(bs, w, _rowspan(h4, 0, 0, h4.shape[1]))
        return
    n4 = bs.shape[0] // 4 * 4
    for j in range(0, n4, 4):
        h4[0, bs[j]] += 1
        h4[1, bs[j + 1]] += 1
        h4[2, bs[j + 2]] += 1
        h4[3, bs[j + 3]] += 1
    for j in range(n4, bs.shape[0]):
        h4[0, bs[j]] += 1


_ONES8 = np.uint64(0x0101010101010101)  # bit 0 of every byte of a word
_EVEN16 = np.uint64(0x00FF00FF00FF00FF)
_SUM16 = np.uint64(0x0001000100010001)


@_jit
def _count_nibbles(bs, w, h):
    """h[v] += the bytes of bs equal to v, every byte below 16 (w: bs's whole words as uint64). For each set S of
    the 4 bits, the bytes holding all of S are counted 8 to a word (bit 0 of each byte of the AND of the shifted
    words, summed per byte lane for at most 255 words, then across the lanes: vectorised); the exact counts
    follow from those by inclusion-exclusion (subtracting, bit by bit, the counts of the sets with that bit)."""
    n8 = w.shape[0]
    sup = _stack16()  # per call: no allocation (np.zeros: malloc, free and NRT's count per span)
    for q0 in range(0, n8, 255):
        ws = _span(w, q0, min(n8, q0 + 255))
        c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = c9 = c10 = c11 = c12 = c13 = c14 = c15 = np.uint64(0)
        for q in range(ws.shape[0]):
            x0 = ws[q] & _ONES8
            x1 = (ws[q] >> np.uint64(1)) & _ONES8
            x2 = (ws[q] >> np.uint64(2)) & _ONES8
            x3 = (ws[q] >> np.uint64(3)) & _ONES8
            x01 = x0 & x1
            x02 = x0 & x2
            x12 = x1 & x2
            x012 = x01 & x2
            c1 += x0
            c2 += x1
            c3 += x01
            c4 += x2
            c5 += x02
            c6 += x12
            c7 += x012
            c8 += x3
            c9 += x0 & x3
            c10 += x1 & x3
            c11 += x01 & x3
            c12 += x2 & x3
            c13 += x02 & x3
            c14 += x12 & x3
            c15 += x012 & x3
        i = 1
        for c in (c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15):  # c_i: the set of i's bits
            s16 = (c & _EVEN16) + ((c >> np.uint64(8)) & _EVEN16)  # 4 lanes of at most 510
            sup[i] += np.int64((s16 * _SUM16) >> np.uint64(48))
            i += 1
    sup[0] += n8 * 8
    for j in range(n8 * 8, bs.shape[0]):  # the tail, byte by byte
        for t in range(16):
            sup[t] += (bs[j] & t) == t
    for b in range(4):  # sup[t] = the bytes holding every bit of t -> the bytes equal to t
        for t in range(16):
            if not t & (1 << b):
                sup[t] -= sup[t | (1 << b)]
    for v in range(16):
        h[v] += sup[v]


# --------------------------------------------------------------------------------------------- n:m blocks


# Where the other paths win (one thread, float32 differences of bf16 values; figures in docs/cabs-merge.md):
_NM_NET_MIN = 3  # blocks of 3 to 32 slots go through a sorting network, _NM_G blocks side by side (1 and 2:
_NM_NET = 32     # one loop over the pairs, _nm_tiny), except blocks of 4 and 8: each slot's rank in its block
                 # (the rank loop for 3, 5, 6 and 7 too was as fast, but each m compiled into every caller: the
                 # n:m loops' first compile 12-13 -> 23-29 s with all six, so only the common 1:4, 2:4, 2:8, 4:8)
_NM_ROW = 2048    # the rank loop's key row (nm_prune and the one-pass loop pass a scratch row of this length)
_NM_G = 16
_NM_BISECT = 24  # longer blocks: from this k on the threshold is bisected (the same cost at 24:64 and 24:96,
                 # faster from 32:128 on, slower at 16:64)


@_pjit
def nm_prune(x, n, m, taken, use_taken, pad_tail):
    """Balanced n:m (BS; with `use_taken` the CA step): per block of m (row-major), keep the n largest |x| among
    the slots not taken (ties by lower index), zero the rest, mark the kept in `taken`; the last partial block
    keeps its top min(n, r) (`pad_tail`) or nothing. Returns the blocks keeping fewer than min(n, length).

    Each free slot gets the key bits(|x|) (int32, ordered as |x|; a taken slot -1). For m = 4 and 8 each slot's
    rank in its block decides (:func:`_rank_src`). Otherwise the k-th largest key counted with multiplicity, t,
    is found per block: for 3 <= m <= 32 by a sorting network over 16 blocks side by side
    (:func:`_nm_net_span`); for longer blocks by vectorised passes, each taking the largest key below the
    last maximum and counting that maximum's copies (bf16 task vectors repeat values often: ties cost no extra
    pass), from k = 24 on (the 7B recipe's 64:256) by bisection on the key (about 30 counting passes whatever
    k). The keys > t are kept and, of the keys == t, the first by position until k are kept (all of them, the
    common case, in one branch-free loop). In pieces of whole blocks, one per thread."""
    size = x.shape[0]
    T = _n_pieces(size, m)
    short = np.zeros(T, np.int64)
    for t in prange(T):
        lo, hi = _piece(size, t, T, m)
        short[t] = _nm_blocks(x, lo, hi, n, m, taken, use_taken, pad_tail, np.empty(max(m, _NM_ROW), np.int32))
    return short.sum()


@_jit
def _nm_blocks(x, lo, hi, n, m, taken, use_taken, pad_tail, keys):
    """nm_prune over the blocks in [lo, hi) (lo a multiple of m; the tail block last), by the path for m: the
    pair loop, the ranks, the sorting network or the passes; keys: a scratch row of at least m (the ranks use
    up to _NM_ROW of it). Its short blocks."""
    if m < _NM_NET_MIN:
        return _nm_tiny(x, lo, hi, n, m, taken, use_taken, pad_tail)
    if m == 4:
        return _nm_rank4(x, lo, hi, n, taken, use_taken, pad_tail, keys)
    if m == 8:
        return _nm_rank8(x, lo, hi, n, taken, use_taken, pad_tail, keys)
    if m <= _NM_NET:
        return _nm_net_span(x, lo, hi, n, m, taken, use_taken, pad_tail, None, keys)
    return _nm_keys(x, lo, hi, n, m, taken, use_taken, pad_tail, keys)


@_jit
def _nm_tiny(x, lo, hi, n, m, taken, use_taken, pad_tail):
    """nm_prune over the blocks in [lo, hi) for m = 1 or 2, written out (one branch-free loop over the whole
    blocks: with m this short, any per-block set-up costs more than the choice): k = m keeps every free slot;
    1:2 keeps the larger free key of each pair, the first on a tie. The tail block by :func:`_nm_keys`."""
    zero = np.float32(0.0)
    none = np.int32(-1)
    k = min(n, m)
    whole = (hi - lo) // m
    xs, tk = _span(x, lo, lo + whole * m), _span(taken, lo, lo + whole * m)
    short = 0
    if k == m:  # every free slot kept: short where a slot of the block was taken
        for i in range(whole):
            full = True
            for j in range(m):
                free = True
                if use_taken:
                    free = not tk[i * m + j]
                    tk[i * m + j] = True
                xs[i * m + j] = xs[i * m + j] if free else zero
                full &= free
            short += not full
    else:  # 1:2
        for i in range(whole):
            a = np.int32(_f32_as_u32(abs(xs[2 * i])))
            b = np.int32(_f32_as_u32(abs(xs[2 * i + 1])))
            if use_taken:
                a = none if tk[2 * i] else a
                b = none if tk[2 * i + 1] else b
            k0 = (a >= 0) & (a >= b)
            k1 = (b >= 0) & (b > a)
            xs[2 * i] = xs[2 * i] if k0 else zero
            xs[2 * i + 1] = xs[2 * i + 1] if k1 else zero
            if use_taken:
                tk[2 * i] = tk[2 * i] | k0
                tk[2 * i + 1] = tk[2 * i + 1] | k1
            short += (a < 0) & (b < 0)
    s = lo + whole * m
    if s < hi:
        short += _nm_keys(x, s, hi, n, m, taken, use_taken, pad_tail, np.empty(m, np.int32))
    return short


def _rank_src(m: int) -> str:
    """The source of _nm_rank<m>: nm_prune over the whole blocks of m in [lo, hi) by ranks. Slot i of a block
    is kept when it is free (key >= 0) and its rank, the keys above it plus the equal keys before it, is below
    k = min(n, m): exactly the k largest free keys, ties to the lower position, as the other paths. The m keys
    of a block are locals and the loop over the blocks vectorises (m - 1 comparisons per slot, no per-block
    branch). With taken slots, the keys go to a row first (key -1 where taken), the rank loop writes each slot's
    keep bit there (and the block's short bit above the first slot's), then one loop zeroes and marks, and one
    counts the short blocks (a per-block int64 count in the rank loop halved its vector width: 0.36 ns per slot
    more). One thread, 2^21 + 37 float32 differences of bf16 values, against the network: 1:4 and 2:4 2.5-3.8 ->
    0.30-0.31 ns per element (30 % of the slots taken: 3.2-4.1 -> 0.64-0.66), 4:8 1.7-2.7 -> 0.59-0.61 (2.1-2.9
    -> 0.98-1.0). Blocks of 16 by ranks (15 comparisons per slot): 1.1-1.9 against 1.4-3.1, not taken further.
    The ranks and the short count in 32 bits (numba widens an int sum to 64; AMD Zen 3, AVX2): 1:4 0.97 -> 0.52,
    4:8 1.54 -> 0.63, with a third of the slots taken 1.85 -> 1.12 and 2.49 -> 1.18."""
    lines = ["def f(x, lo, hi, n, taken, use_taken, pad_tail, keys):",
             "    zero = np.float32(0.0)",
             "    none = np.int32(-1)",
             "    one = np.int32(1)",
             f"    k = np.int32(min(n, {m}))",
             f"    end = lo + (hi - lo) // {m} * {m}",
             f"    span = keys.shape[0] // {m} * {m}",
             "    short = 0",
             "    for s in range(lo, end, span):",
             "        e = min(end, s + span)",
             "        xs, tk = _span(x, s, e), _span(taken, s, e)",
             f"        nb = (e - s) // {m}",
             "        if use_taken:",
             "            kr = _span(keys, 0, e - s)",
             "            for j in range(e - s):",
             "                kr[j] = none if tk[j] else np.int32(_f32_as_u32(abs(xs[j])))",
             "            for i in range(nb):"]
    ind = " " * 16

    def ranks(load):
        out = [f"{ind}v{j} = {load(j)}" for j in range(m)]
        for i in range(m):
            terms = [f"np.int32(v{j} >= v{i})" for j in range(i)] + [f"np.int32(v{j} > v{i})" for j in range(i + 1, m)]
            out.append(f"{ind}r{i} = np.int32(" + " + ".join(terms) + ")")
        return out

    lines += ranks(lambda j: f"kr[{m} * i + {j}]")
    lines.append(f"{ind}sh = np.int32(np.int32(" + " + ".join(f"np.int32(v{j} >= 0)" for j in range(m)) + ") < k) << one")
    lines += [f"{ind}kr[{m} * i + {i}] = np.int32((v{i} >= 0) & (r{i} < k))" + (" | sh" if i == 0 else "")
              for i in range(m)]
    lines += ["            for j in range(e - s):",
              "                kj = (kr[j] & one) != 0",
              "                xs[j] = xs[j] if kj else zero",
              "                tk[j] = tk[j] | kj",
              "            c = np.int32(0)",
              "            for j in range(e - s):",
              "                c = np.int32(c + (kr[j] >> one))",
              "            short += c",
              "        else:  # every slot free: no block is short",
              "            for i in range(nb):"]
    lines += ranks(lambda j: f"np.int32(_f32_as_u32(abs(xs[{m} * i + {j}])))")
    lines += [f"{ind}xs[{m} * i + {i}] = xs[{m} * i + {i}] if r{i} < k else zero" for i in range(m)]
    lines += ["    if end < hi:",
              f"        short += _nm_keys(x, end, hi, n, {m}, taken, use_taken, pad_tail, keys)",
              "    return short"]
    return "\n".join(lines) + "\n"


def _rank_stub(m: int):
    def rank(x, lo, hi, n, taken, use_taken, pad_tail, keys):
        """nm_prune by ranks for blocks of m (generated when compiled, see _rank_src)."""

    @overload(rank)
    def _impl(x, lo, hi, n, taken, use_taken, pad_tail, keys):
        return _defined(_rank_src(m))
    return rank


_nm_rank4, _nm_rank8 = (_rank_stub(m) for m in (4, 8))


def _batcher_pairs(n: int) -> list:
    """Batcher's odd-even merge sort for n (a power of two) as its compare-exchange pairs (i, j), i < j, in order:
    after them a[i] <= a[j] for every i < j (checked on every 0-1 input up to n = 16 and at random, tests)."""
    pairs = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (p * 2) == (i + j + k) // (p * 2):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return pairs


def _net_src(P: int) -> str:
    """The source of _nm_net<P>: per lane b of _NM_G, the P keys kt[i * _NM_G + b] sorted by Batcher's network
    (min/max on locals: the loop over the lanes vectorises) to find t = the sorted key at r (ascending), the k-th
    largest; then, over the keys in their order, the block's keep bits mk[b] (bit i: key i kept): the keys above t
    and the first k - (keys above t) copies of t, or, where t < 0 (fewer than k free slots), every free key (sh[b]
    = 1: a short block). Every count is 32-bit, written inline as np.int32(a + b) (through _inc the network ran
    1.17 -> 1.38 ns per element at 4:32, 1.97 -> 2.41 at 9:17, one thread, measured), and no branch depends on
    the data: the ties' rule costs the common case (every copy kept) nothing."""
    G = _NM_G
    lines = ["def f(kt, r, k, mk, sh):", f"    for b in range({G}):"]
    lines += [f"        v{i} = kt[{i * G} + b]" for i in range(P)]
    lines += [f"        v{i}, v{j} = min(v{i}, v{j}), max(v{i}, v{j})" for i, j in _batcher_pairs(P)]
    lines.append("        t = v0")
    lines += [f"        t = v{i} if r == {i} else t" for i in range(1, P)]
    lines.append("        ab = np.int32(0)")
    lines += [f"        ab = np.int32(ab + np.int32(v{i} > t))" for i in range(P)]
    lines += ["        neg = t < 0",
              f"        left = np.int32({P}) if neg else np.int32(k - ab)",
              "        t = np.int32(0) if neg else t",
              "        q = np.int32(0)",
              "        bits = np.uint32(0)"]
    for i in range(P):
        lines += [f"        w = kt[{i * G} + b]",
                  "        e = w == t",
                  "        keep = (w > t) | (e & (q < left))",
                  "        q = np.int32(q + np.int32(e))",
                  f"        bits = np.uint32(bits | (np.uint32(keep) << np.uint32({i})))"]
    lines += ["        mk[b] = bits", "        sh[b] = np.int32(neg)"]
    return "\n".join(lines) + "\n"


def _net_stub(P: int, src=None):
    """A network over the _NM_G lanes of kt, its source `src(P)` (default _net_src; _tree_src for the top-L
    networks, which take no r), generated when compiled."""
    def net(kt, r, k, mk, sh):
        """A network (generated when compiled, see _net_stub)."""

    @overload(net)
    def _impl(kt, r, k, mk, sh):
        return _defined((src or _net_src)(P))
    return net


_nm_net4, _nm_net8, _nm_net16, _nm_net32 = (_net_stub(P) for P in (4, 8, 16, 32))


@_jit
def _nm_sort(kt, P, r, k, mk, sh):
    """The network for P keys (P a power of two, 4..32) over the _NM_G lanes of kt (see _net_src)."""
    if P == 4:
        _nm_net4(kt, r, k, mk, sh)
    elif P == 8:
        _nm_net8(kt, r, k, mk, sh)
    elif P == 16:
        _nm_net16(kt, r, k, mk, sh)
    else:
        _nm_net32(kt, r, k, mk, sh)


def _nm_sort_of(only32, kt, P, r, k, mk, sh):
    """_nm_sort, or the 32-key network alone where `only32` is not None (chosen when compiled)."""


@overload(_nm_sort_of)
def _nm_sort_of_impl(only32, kt, P, r, k, mk, sh):
    if isinstance(only32, types.NoneType):
        return lambda only32, kt, P, r, k, mk, sh: _nm_sort(kt, P, r, k, mk, sh)
    return lambda only32, kt, P, r, k, mk, sh: _nm_net32(kt, r, k, mk, sh)


def _nm_blocks_of(net, x, lo, hi, n, m, taken, use_taken, pad_tail, keys, nzm):
    """nm_prune's path for [lo, hi), chosen when compiled by the type of `net` (see nm_net_of): a tuple, every
    block 32 slots: _nm_span32 with the top-len(net) network alone; np.int8, every model's m in 17..32: the
    32-key sorting network's path alone (the CABS loop's first compile, 4 float32 models, cold cache: 32.5 ->
    18.6 s); None: _nm_blocks, every path for m compiled in (pairs, ranks, four networks, passes, bisection).
    nzm: _nm_span32's row of the blocks' nonzero slots (the other paths leave it); keys: a scratch row of at least
    max(m, _NM_ROW) (_NM_ROW >= _NM_SCR)."""


@overload(_nm_blocks_of)
def _nm_blocks_of_impl(net, x, lo, hi, n, m, taken, use_taken, pad_tail, keys, nzm):
    if isinstance(net, types.NoneType):
        return (lambda net, x, lo, hi, n, m, taken, use_taken, pad_tail, keys, nzm:
                _nm_blocks(x, lo, hi, n, m, taken, use_taken, pad_tail, keys))
    if isinstance(net, types.BaseTuple):
        return (lambda net, x, lo, hi, n, m, taken, use_taken, pad_tail, keys, nzm:
                _nm_span32(x, lo, hi, n, taken, use_taken, pad_tail, net, nzm, keys))
    return (lambda net, x, lo, hi, n, m, taken, use_taken, pad_tail, keys, nzm:
            _nm_net_span(x, lo, hi, n, m, taken, use_taken, pad_tail, net, keys))


def _nm_kept_of(net, tb, L, pat, h4, nzm, pairs):
    """The kept pairs of a span: from the models' rows of nonzero bits per block of 32 (net a tuple:
    _nm_span32's; a span's tail block, if any, has no word there and goes through the bytes) into pairs[a, b]
    (a <= b) by popcounts, else _kept_bits' pattern bytes into h4 (chosen when compiled)."""


@overload(_nm_kept_of)
def _nm_kept_of_impl(net, tb, L, pat, h4, nzm, pairs):
    if not isinstance(net, types.BaseTuple):
        return lambda net, tb, L, pat, h4, nzm, pairs: _kept_bits(tb, L, _span(pat, 0, L), h4)
    return lambda net, tb, L, pat, h4, nzm, pairs: _mask_pairs(tb, L, pat, h4, nzm, pairs)


@_jit
def _nm_columns(x, lo, g, m, taken, use_taken, kt):
    """Column b of kt (row j at kt[j * _NM_G + b]) = the keys of block b of the g blocks of m from lo."""
    G = _NM_G
    none = np.int32(-1)
    for b in range(g):
        o = lo + b * m
        blk, tk = _span(x, o, o + m), _span(taken, o, o + m)  # slices: the loops over them vectorise
        for j in range(m):
            kb = np.int32(_f32_as_u32(abs(blk[j])))
            if use_taken:
                kb = none if tk[j] else kb
            kt[j * G + b] = kb


@_jit
def _nm_net_span(x, lo, hi, n, m, taken, use_taken, pad_tail, only32, scr):
    """nm_prune over the blocks in [lo, hi) for _NM_NET_MIN <= m <= _NM_NET, m not 4 or 8 (lo a multiple of
    m): per group of _NM_G whole blocks, each block's keys go to a column of kt (P = m rounded up to a power of
    two rows, the rows past m holding -2, below every key), one sorting network sorts every column at once and
    gives each block its keep bits (see _net_src), then one loop per block zeroes and marks by them. The tail
    block by :func:`_nm_keys`. `only32` None: the network for any P (_nm_sort); else every block has 17 to 32
    slots and only the 32-key network is compiled in (see _nm_blocks_of). One thread, 2^21 float32 differences
    of bf16 values: 4:32 2.23 -> 1.12 ns per element, 16:32 7.53 -> 1.26 against the passes this replaced
    (docs/merge-engine.md); blocks of 4 and 8 went here too (2:4 2.80) until the rank loop. Keep bits from the
    network in place of a per-block threshold and a second look at the keys (AMD Zen 3, AVX2): 4:32 1.97 -> 1.29,
    16:32 3.00 -> 1.30, with a third of the slots taken 2.35 -> 1.40 and 2.79 -> 1.39."""
    G = _NM_G
    P = 4  # m >= _NM_NET_MIN = 3
    while P < m:
        P *= 2
    kt = _span(scr, 0, P * G)  # scr: an int32 scratch row of at least _NM_SCR (see _nm_span32)
    kt[:] = np.int32(-2)
    sh = _span(scr, P * G, P * G + G)
    mk = _span(scr, P * G + G, P * G + 2 * G).view(np.uint32)
    zero = np.float32(0.0)
    one = np.uint32(1)
    short = 0
    k = np.int32(min(n, m))
    r = P - k
    whole = (hi - lo) // m
    for g0 in range(0, whole, G):
        g = min(G, whole - g0)
        _nm_columns(x, lo + g0 * m, g, m, taken, use_taken, kt)
        _nm_sort_of(only32, kt, P, r, k, mk, sh)
        for b in range(g):
            o = lo + (g0 + b) * m
            blk, tk = _span(x, o, o + m), _span(taken, o, o + m)  # slices: the loops over them vectorise
            bits = mk[b]
            short += sh[b]
            for j in range(m):
                keep = ((bits >> np.uint32(j)) & one) != 0
                blk[j] = blk[j] if keep else zero
                if use_taken:
                    tk[j] = tk[j] | keep
    s = lo + whole * m
    if s < hi:
        short += _nm_keys(x, s, hi, n, m, taken, use_taken, pad_tail, np.empty(m, np.int32))
    return short


# --------------------------------------------------------------------------------------------- blocks of 32


def _ptr(builder, arr, off, ty):
    """A pointer to `ty` (a vector type) at element `off` of the contiguous array `arr` (its numba struct)."""
    return builder.bitcast(builder.gep(arr.data, [off]), ty.as_pointer())


def _laundered(builder, p):
    """p through an empty inline asm: the same address, which LLVM can no longer tell is p. A store of
    select(m, load p, 0) back to p is otherwise made a masked store of the zeros (vmaskmovps / vpmaskmovd), slow on
    AMD's Zen 3 (perf's samples and an A/B: docs/merge-engine.md, Decisions); to another pointer it is a whole
    vector store."""
    from llvmlite import ir

    i64 = ir.IntType(64)
    q = builder.asm(ir.FunctionType(i64, [i64]), "", "=r,0", [builder.ptrtoint(p, i64)], False)
    return builder.inttoptr(q, p.type)


def _splat(builder, value, vt):
    """The vector of type vt with `value` in every lane."""
    from llvmlite import ir

    i32 = ir.IntType(32)
    v = builder.insert_element(ir.Constant(vt, None), value, ir.Constant(i32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, vt.count), [0] * vt.count))


def _c_rows(*arrays):
    return all(isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" for a in arrays)


def _flat_rows(*arrays):
    """One-dimensional arrays, of any layout."""
    return all(isinstance(a, types.Array) and a.ndim == 1 for a in arrays)


def _span(a, lo, hi):
    """a[lo:hi] of a 1-D array, a slice of the borrowed view of `a` (:func:`_borrowed`) where `a` is contiguous, so
    neither making it nor its end runs NRT's count (a plain slice of the others: none in the loops' spans). Only
    where `a` outlives the view (numba releases a local after its last use): an argument, or a local used after
    the view's last use or on every pass of the loop the view lives in."""


@overload(_span)
def _span_impl(a, lo, hi):
    if isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C":
        return lambda a, lo, hi: _borrowed(a)[lo:hi]
    return lambda a, lo, hi: a[lo:hi]


def _rowspan(a, k, lo, hi):
    """a[k, lo:hi] of a 2-D array, borrowed as :func:`_span` (where `a` is contiguous), under the same rule."""


@overload(_rowspan)
def _rowspan_impl(a, k, lo, hi):
    if isinstance(a, types.Array) and a.ndim == 2 and a.layout == "C":
        return lambda a, k, lo, hi: _borrowed(a)[k, lo:hi]
    return lambda a, k, lo, hi: a[k, lo:hi]


@intrinsic
def _stack16(typingctx):
    """16 zeroed int64 in the calling function's stack frame, as an array whose meminfo is null: valid until
    that function returns (never returned or stored), where np.zeros would cost a malloc, a free and NRT's
    counts on every call."""
    row = types.Array(types.int64, 1, "C")

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        from numba.core import cgutils
        from numba.np.arrayobj import populate_array

        i64 = ir.IntType(64)
        buf = cgutils.alloca_once(builder, ir.ArrayType(i64, 16))
        builder.store(ir.Constant(ir.ArrayType(i64, 16), [0] * 16), buf)
        out = context.make_array(row)(context, builder)
        data = builder.bitcast(buf, context.get_data_type(types.int64).as_pointer())
        populate_array(out, data=data, shape=[context.get_constant(types.intp, 16)],
                       strides=[context.get_constant(types.intp, 8)], itemsize=8, meminfo=None)
        return out._getvalue()
    return row(), codegen


def _unref(a):
    """a as borrowed: an array (or each array of a tuple) as the same view with a null meminfo (:func:`_borrowed`);
    anything else as it is. A jitted function that is not inlined counts each array argument on entry and again
    on exit (NRT's locked add, see :func:`_borrowed`), so the loops' per-span calls count every array they pass:
    the pieces borrow their arguments on entry (the caller, in Python, holds them) and pass their own scratch rows
    borrowed where the row stays alive across the loop (a local used on every pass: never released inside it)."""


@overload(_unref)
def _unref_impl(a):
    if isinstance(a, types.Array):
        return lambda a: _borrowed(a)
    if isinstance(a, types.BaseTuple) and len(a) and all(isinstance(t, types.Array) for t in a):
        return _defined("def f(a):\n    return (" + "".join(f"_borrowed(a[{k}]), " for k in range(len(a))) + ")\n")
    return lambda a: a


@intrinsic
def _borrowed(typingctx, a):
    """The array a (any layout) as a view of the same elements whose meminfo is null: no reference to `a`'s
    memory is taken, so neither this view, its slices nor the calls it is passed to run NRT's count. A slice's
    count is a locked add on the parent's meminfo, and a locked instruction waits until every store before it has
    drained: in the compiled loops' spans (a few slices and calls per 512-2048 elements) NRT's two counting
    functions took 15-16 % of CABS' and BS' samples and 6-7 % of TIES' and Breadcrumbs' (perf,
    docs/merge-engine.md). Only where `a` outlives the view (:func:`_span`, :func:`_unref`)."""
    if not isinstance(a, types.Array):
        return None

    def codegen(context, builder, signature, args):
        from numba.np.arrayobj import populate_array

        src = context.make_array(a)(context, builder, args[0])
        out = context.make_array(a)(context, builder)
        populate_array(out, data=src.data, shape=src.shape, strides=src.strides, itemsize=src.itemsize,
                       meminfo=None)
        return out._getvalue()
    return a(a), codegen


@intrinsic
def _t16(typingctx, src, so, ss, dst, do):
    """dst[do + 16 i + l] = src[so + l ss + i] for i, l < 16 (contiguous int32 rows): a 16 x 16 transposition in
    vector registers, written as LLVM IR (four rounds of 16 two-source shuffles, each round swapping the
    off-diagonal quarters of blocks half as large as the last). _nm_columns' scalar stores wrote about one key a
    cycle; this, in cache, 0.08 ns per key (one thread, AVX-512). No bounds check: the caller's rows hold the
    tile."""
    if not (_c_rows(src, dst) and src.dtype == dst.dtype == types.int32):
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir

        i32, i64 = ir.IntType(32), ir.IntType(64)
        vt = ir.VectorType(i32, 16)
        sa = context.make_array(signature.args[0])(context, builder, args[0])
        da = context.make_array(signature.args[3])(context, builder, args[3])
        so_, ss_, do_ = (context.cast(builder, a, t, types.int64) for a, t in
                         zip((args[1], args[2], args[4]), (signature.args[1], signature.args[2], signature.args[4])))
        rows = [builder.load(_ptr(builder, sa, builder.add(so_, builder.mul(ss_, ir.Constant(i64, i))), vt), align=4)
                for i in range(16)]
        h = 8
        while h:
            new = list(rows)
            for i in (i for i in range(16) if not i & h):
                lo = ir.Constant(vt, [ir.Constant(i32, lane if not lane & h else 16 + lane - h) for lane in range(16)])
                hi = ir.Constant(vt, [ir.Constant(i32, lane + h if not lane & h else 16 + lane) for lane in range(16)])
                new[i] = builder.shuffle_vector(rows[i], rows[i + h], lo)
                new[i + h] = builder.shuffle_vector(rows[i], rows[i + h], hi)
            rows = new
            h //= 2
        for i in range(16):
            builder.store(rows[i], _ptr(builder, da, builder.add(do_, ir.Constant(i64, 16 * i)), vt), align=4)
        return context.get_dummy_value()
    return types.void(src, so, ss, dst, do), codegen


def _keep32_of(mark: bool):
    @intrinsic
    def keep32(typingctx, x, o, taken, bits):
        """x[o + j] = x[o + j] if bit j of `bits` is set else 0 for j < 32 (and, `mark`, taken[o + j] |= the bit): a
        select on two 16-lane vectors. Written in a loop, LLVM made this a scalar store per slot (0.37 ns per
        element over 2^21 elements; one thread, AVX-512). Returns the bits of the slots left nonzero (x != 0, as
        _kept_bits tests: NaN is nonzero, -0.0 is not). No bounds check: the caller's rows hold the block."""
        if not (_c_rows(x, taken) and x.dtype == types.float32 and taken.dtype == types.boolean):
            return None
        whole = not numba_target_has("avx512f")  # the store kept whole: no masked store (see _laundered)

        def codegen(context, builder, signature, args):
            from llvmlite import ir

            i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
            v32, vf, v8 = ir.VectorType(i32, 16), ir.VectorType(ir.FloatType(), 16), ir.VectorType(i8, 16)
            xa = context.make_array(signature.args[0])(context, builder, args[0])
            ta = context.make_array(signature.args[2])(context, builder, args[2])
            o = context.cast(builder, args[1], signature.args[1], types.int64)
            b = context.cast(builder, args[3], signature.args[3], types.uint32)
            sv = _splat(builder, b, v32)
            nzm = ir.Constant(i32, 0)
            for h in range(2):
                off = builder.add(o, ir.Constant(i64, 16 * h))
                lanes = ir.Constant(v32, [ir.Constant(i32, 1 << (16 * h + lane)) for lane in range(16)])
                m = builder.icmp_unsigned("!=", builder.and_(sv, lanes), ir.Constant(v32, [ir.Constant(i32, 0)] * 16))
                px = _ptr(builder, xa, off, vf)
                zf = ir.Constant(vf, [ir.Constant(ir.FloatType(), 0.0)] * 16)
                kept = builder.select(m, builder.load(px, align=4), zf)
                builder.store(kept, _laundered(builder, px) if whole else px, align=4)
                nz = builder.zext(builder.bitcast(builder.fcmp_unordered("!=", kept, zf), ir.IntType(16)), i32)
                nzm = builder.or_(nzm, builder.shl(nz, ir.Constant(i32, 16 * h)) if h else nz)
                if mark:
                    pt = _ptr(builder, ta, off, v8)
                    builder.store(builder.or_(builder.load(pt, align=1), builder.zext(m, v8)), pt, align=1)
            return nzm
        return types.uint32(x, o, taken, bits), codegen
    return keep32


@intrinsic
def _popc(typingctx, x):
    """The set bits of a uint32 (as uint32) or a uint64 (as int64) (llvm.ctpop: one instruction where the CPU has
    it)."""
    if x not in (types.uint32, types.uint64):
        return None

    def codegen(context, builder, signature, args):
        return builder.ctpop(args[0])
    return (types.uint32 if x == types.uint32 else types.int64)(x), codegen


_keep32, _keep32m = _keep32_of(False), _keep32_of(True)


def _tree_pairs(L: int) -> list:
    """A network that leaves, in slots 0..L-1 (ascending), the L largest of 32 keys (L a power of two <= 32), as
    its compare-exchange pairs (a, b): min to a, max to b. Batcher's network sorts each group of L slots; then
    pairs of groups merge, the first keeping the top L: its slot i takes the larger of its own i-th and the other
    group's (L-1-i)-th (a bitonic sequence), then L/2 log2 L half-cleaners sort it. Pruned to the pairs that
    reach the top L (_tree_src): 96 pairs, 159 min/max, for the top 4 of 32, against the full sort's 191 and 382."""
    groups = [list(range(g, g + L)) for g in range(0, 32, L)]
    pairs = [(g[i], g[j]) for g in groups for i, j in _batcher_pairs(L)]
    while len(groups) > 1:
        for a, b in zip(groups[0::2], groups[1::2]):
            pairs += [(b[L - 1 - i], a[i]) for i in range(L)]
            h = L // 2
            while h:
                pairs += [(a[i], a[i + h]) for s in range(0, L, 2 * h) for i in range(s, s + h)]
                h //= 2
        groups = groups[0::2]
    return pairs


def _tree_src(L: int) -> str:
    """The source of _nm_top<L>: per lane b of _NM_G, the 32 keys kt[i * _NM_G + b] through :func:`_tree_pairs`
    (only the pairs whose outputs reach slots 0..L-1, and of a pair whose one output does, that min or max
    alone: for the top 4, 96 pairs), t = the k-th largest (slot L - k; 1 <= k <= L), then the block's keep bits
    mk[b] (bit i: key i kept) by _net_src's rule: the keys above t, and the first k - (keys above t) copies of t
    by position, or, where t < 0 (fewer than k free slots), every free key (sh[b] = 1). The keys above t are
    found once: their count and bits in one pass, the copies of t in a second (the rule of _net_src, which
    compares each key to t twice: 0.222 -> 0.204 ns per element, top 4)."""
    G = _NM_G
    need, kept = set(range(L)), []
    for a, b in reversed(_tree_pairs(L)):
        if a in need or b in need:
            kept.append((a, b, a in need, b in need))
            need |= {a, b}
    lines = ["def f(kt, r, k, mk, sh):", f"    for b in range({G}):"]  # r: _net_src's, unused
    lines += [f"        v{i} = kt[{i * G} + b]" for i in sorted(need)]
    for a, b, lo, hi in reversed(kept):
        if lo and hi:
            lines.append(f"        v{a}, v{b} = min(v{a}, v{b}), max(v{a}, v{b})")
        else:
            lines.append(f"        v{a} = min(v{a}, v{b})" if lo else f"        v{b} = max(v{a}, v{b})")
    lines.append("        t = v0")
    lines += [f"        t = v{i} if k == {L - i} else t" for i in range(1, L)]
    lines += ["        neg = t < 0", "        bits = np.uint32(0)", "        ab = np.int32(0)"]
    for i in range(32):
        lines += [f"        g = kt[{i * G} + b] > t",
                  "        ab = np.int32(ab + np.int32(g))",
                  f"        bits = np.uint32(bits | (np.uint32(g) << np.uint32({i})))"]
    lines += ["        left = np.int32(32) if neg else np.int32(k - ab)",
              "        t = np.int32(0) if neg else t",
              "        q = np.int32(0)"]
    for i in range(32):
        lines += [f"        e = kt[{i * G} + b] == t",
                  "        keep = e & (q < left)",
                  "        q = np.int32(q + np.int32(e))",
                  f"        bits = np.uint32(bits | (np.uint32(keep) << np.uint32({i})))"]
    lines += ["        mk[b] = bits", "        sh[b] = np.int32(neg)"]
    return "\n".join(lines) + "\n"


_NM_TOPS = {L: _net_stub(L, _tree_src) for L in (1, 2, 4, 8, 16, 32)}


def _nm_top_of(net, kt, k, mk, sh):
    """The top-L network for L = len(net) (a tuple whose length is the choice, made when compiled)."""


@overload(_nm_top_of)
def _nm_top_of_impl(net, kt, k, mk, sh):
    top = _NM_TOPS[net.count]
    return lambda net, kt, k, mk, sh: top(kt, 0, k, mk, sh)


def nm_net_of(ms, ns):
    """The one-pass n:m loop's choice of path, made when compiled (see _nm_blocks_of): a tuple of L zeros where
    every block has 32 slots (the default pattern), L the least power of two >= every min(n, 32); np.int8(1)
    where every m is 17..32 (the 32-key sorting network alone); None: every path."""
    if all(m == 32 for m in ms):
        L = 1
        while L < max(min(n, 32) for n in ns):
            L *= 2
        return (np.int8(0),) * L
    return np.int8(1) if all(_NM_NET // 2 < m <= _NM_NET for m in ms) else None


@_jit
def _nm_span32(x, lo, hi, n, taken, use_taken, pad_tail, net, nzm, scr):
    """nm_prune over the blocks of 32 in [lo, hi) (lo a multiple of 32), min(n, 32) <= len(net): per group of
    _NM_G whole blocks, the keys in a row (vectorised), the row transposed into columns (_t16, twice), the top-L
    network's keep bits (_nm_top_of), applied two 16-lane vectors a block (_keep32), each whole block's slots
    left nonzero into nzm[i] (bit j: slot j of block i from lo). The tail block by :func:`_nm_keys`. scr: an
    int32 scratch row of at least _NM_SCR (the one-pass loop calls this per span: its four rows allocated in each
    call, spans of 2048, 4:32, one thread: 0.498 against 0.454 ns per element). One thread, 2^21 + 37 float32
    differences of bf16 values, 30 % of the slots taken, against _nm_net_span (AVX-512): 4:32 0.85-0.86 -> 0.41-0.42
    ns per element, 16:32 0.84-0.86 -> 0.44-0.46."""
    G = _NM_G
    keys = _span(scr, 0, 32 * G)  # lanes past a last, partial group hold what they held: their bits unused
    kt = _span(scr, 32 * G, 64 * G)
    sh = _span(scr, 64 * G, 65 * G)
    mk = _span(scr, 65 * G, 66 * G).view(np.uint32)
    none = np.int32(-1)
    k = np.int32(min(n, 32))
    short = 0
    whole = (hi - lo) // 32
    for g0 in range(0, whole, G):
        g = min(G, whole - g0)
        o = lo + g0 * 32
        xs, tk = _span(x, o, o + 32 * g), _span(taken, o, o + 32 * g)  # slices: the loop over them vectorises
        for j in range(32 * g):
            kb = np.int32(_f32_as_u32(abs(xs[j])))
            if use_taken:
                kb = none if tk[j] else kb
            keys[j] = kb
        _t16(keys, 0, 32, kt, 0)
        _t16(keys, 16, 32, kt, 16 * G)
        _nm_top_of(net, kt, k, mk, sh)
        for b in range(g):
            short += sh[b]
        if use_taken:
            for b in range(g):
                nzm[g0 + b] = _keep32m(x, o + 32 * b, taken, mk[b])
        else:
            for b in range(g):
                nzm[g0 + b] = _keep32(x, o + 32 * b, taken, mk[b])
    s = lo + whole * 32
    if s < hi:
        short += _nm_keys(x, s, hi, n, 32, taken, use_taken, pad_tail, keys)
    return short


_NM_SCR = 66 * _NM_G  # _nm_span32's scratch row (int32)


@_jit
def _nm_keys(x, lo, hi, n, m, taken, use_taken, pad_tail, keys):
    """nm_prune over the blocks in [lo, hi) (lo a multiple of m) by passes or bisection, keys: a scratch row of
    at least m; returns its short blocks."""
    short = 0
    zero = np.float32(0.0)
    none = np.int32(-1)
    for s in range(lo, hi, m):
        e = min(s + m, hi)
        blk, tk = _span(x, s, e), _span(taken, s, e)  # slices: the loops over them vectorise
        L = e - s
        if L < m and not pad_tail:
            blk[:] = zero
            continue
        k = min(n, L)
        ks = _span(keys, 0, L)
        t = none
        for j in range(L):
            b = np.int32(_f32_as_u32(abs(blk[j])))
            if use_taken:  # loop-invariant (as fast as two separate loops, measured)
                b = none if tk[j] else b
            ks[j] = b
            t = max(t, b)
        t, left, eq = _nm_bisect(ks, k, t) if k >= _NM_BISECT else _nm_threshold(ks, k, t)
        if t < 0:  # no free slot
            blk[:] = zero
            short += k > 0
            continue
        if left >= eq:  # every copy of t kept
            q = 0
            for j in range(L):
                keep = ks[j] >= t
                q += keep
                blk[j] = blk[j] if keep else zero
                if use_taken:
                    tk[j] = tk[j] | keep
            short += q < k
        else:
            _keep_ties(blk, tk, ks, t, left, use_taken)  # keeps exactly k
    return short


@_jit
def _nm_threshold(ks, k, t):
    """(t, left, eq) for one block's keys `ks` (a taken slot -1) whose maximum is t: t becomes the k-th largest
    key counted with multiplicity (the smallest free key when fewer than k are free; -1: none free), of whose eq
    copies the first `left` by position are kept (left >= eq: all). Passes that each take the largest key below
    the last t and count t's copies; k = len(ks) keeps every free slot without a pass."""
    none = np.int32(-1)
    L = ks.shape[0]
    if k == L:  # every free slot is kept (n >= the block's length)
        return min(t, np.int32(0)), L, 0
    above = 0  # keys > t
    while t >= 0:
        mx = none
        eq = 0
        for j in range(L):
            kj = ks[j]
            mx = max(mx, kj if kj < t else none)
            eq += kj == t
        if above + eq >= k:  # t is the k-th largest
            return t, k - above, eq
        above += eq
        if mx < 0:  # fewer than k free slots: keep every free one
            return t, L, eq
        t = mx
    return t, L, 0


@_jit
def _nm_bisect(ks, k, t):
    """:func:`_nm_threshold`'s (t, left, eq) by bisection: the largest key T with at least k keys >= T, between
    the smallest free key and the maximum t (each step one vectorised count)."""
    L = ks.shape[0]
    if k == L or t < 0:  # every free slot kept, or none free
        return min(t, np.int32(0)), L, 0
    free = 0
    lo = t
    for j in range(L):
        kj = ks[j]
        free += kj >= 0
        lo = min(lo, kj if kj >= 0 else t)
    if free < k:  # fewer than k free slots: keep every free one
        return lo, L, 0
    hi = t
    if _count_at_least(ks, hi) >= k:
        lo = hi
    while hi - lo > 1:  # count(keys >= lo) >= k > count(keys >= hi)
        mid = np.int32(lo + (hi - lo) // 2)
        if _count_at_least(ks, mid) >= k:
            lo = mid
        else:
            hi = mid
    above = 0
    eq = 0
    for j in range(L):
        kj = ks[j]
        above += kj > lo
        eq += kj == lo
    return lo, k - above, eq


@_jit
def _count_at_least(ks, v):
    c = np.int32(0)
    for j in range(ks.shape[0]):
        c = _inc(c, ks[j] >= v)
    return c


@_jit
def _keep_ties(blk, tk, ks, t, left, use_taken):
    """Keep the keys > t and the first `left` keys == t by position (a branch-free running count), zero the
    rest, taken |= kept."""
    zero = np.float32(0.0)
    q = 0
    for j in range(ks.shape[0]):
        kj = ks[j]
        e = kj == t
        keep = (kj > t) | (e & (q < left))
        q += e
        blk[j] = blk[j] if keep else zero
        if use_taken:
            tk[j] = tk[j] | keep


@_pjit
def tau_sign_stats(raw, base, total, mn, mx, first, is_bf16):
    """NegMerge's add: tau = raw - base; total = tau (first) or total + tau; mn/mx the running min/max (used only
    through mn > 0 and mx < 0, so the sign of a zero and the payload of a NaN do not matter); returns the number
    of non-finite tau elements."""
    bad = 0
    for j in prange(raw.shape[0]):
        x = _tau_at(raw, base, j, is_bf16)
        bad += (_f32_as_u32(x) & _EXP) == _EXP
        if first:
            total[j] = x
            mn[j] = x
            mx[j] = x
        else:
            total[j] = total[j] + x
            a = mn[j]
            mn[j] = x if (x < a or x != x) else a
            b = mx[j]
            mx[j] = x if (x > b or x != x) else b
    return bad


@_pjit
def sign_consensus_finish(total, mn, mx, n):
    """NegMerge's finish: total / n where every tau shares a strict sign (mn > 0 or mx < 0), else 0; returns the
    kept count."""
    c = 0
    nf = np.float32(n)
    zero = np.float32(0.0)
    for j in prange(total.shape[0]):
        keep = (mn[j] > 0) | (mx[j] < 0)
        v = total[j] / nf
        total[j] = v if keep else zero
        c += keep
    return c


@_pjit
def dare_zero(x, u, p):
    """DARE's drop: x = 0 where the uniform u < p (float32 compare, as torch's lt with a Python float)."""
    pf = np.float32(p)
    zero = np.float32(0.0)
    for j in prange(x.shape[0]):
        x[j] = zero if u[j] < pf else x[j]

# --------------------------------------------------------------------------------------------- DARE's uniforms
# torch's CPU generator is MT19937 (Matsumoto & Nishimura 1998), seeded with the low 32 bits of the seed as
# init_genrand; torch.rand (float32) turns each 32-bit output v into (v & 0xFFFFFF) * 2^-24. These loops draw the
# same numbers (tested against torch.rand; the twist and tempering vectorise: DARE's drop of 4M elements took
# 1.7 ms against 29 ms for torch.rand and masked_fill_, one thread) and compare the 24 bits with the threshold:
# u < p (float32) <=> (v & 0xFFFFFF) < ceil(float32(p) * 2^24).
_MT_N = 624
_MT_M = 397
_MT_UPPER = np.uint32(0x80000000)
_MT_LOWER = np.uint32(0x7FFFFFFF)
_MT_A = np.uint32(0x9908B0DF)


@_jit
def mt_seed(seed, mt):
    """init_genrand: mt (uint32[624]) from a 32-bit seed."""
    mt[0] = np.uint32(seed & 0xFFFFFFFF)
    for j in range(1, _MT_N):
        prev = np.uint64(mt[j - 1])
        mt[j] = np.uint32((np.uint64(1812433253) * (prev ^ (prev >> np.uint64(30))) + np.uint64(j)) & np.uint64(0xFFFFFFFF))


@_jit
def _mt_mix(a, b, c):
    """One twist step: c ^ ((a's upper bit | b's lower bits) >> 1) ^ (its low bit ? A : 0)."""
    y = np.uint32((a & _MT_UPPER) | (b & _MT_LOWER))
    return np.uint32(c ^ np.uint32(y >> np.uint32(1)) ^ (_MT_A if (y & np.uint32(1)) != np.uint32(0) else np.uint32(0)))


@_jit
def _mt_twist(mt):
    """The next 624 words of state, in place."""
    for k in range(_MT_N - _MT_M):
        mt[k] = _mt_mix(mt[k], mt[k + 1], mt[k + _MT_M])
    for k in range(_MT_N - _MT_M, _MT_N - 1):
        mt[k] = _mt_mix(mt[k], mt[k + 1], mt[k + _MT_M - _MT_N])
    mt[_MT_N - 1] = _mt_mix(mt[_MT_N - 1], mt[0], mt[_MT_M - 1])


@_jit
def _mt_out24(w):
    """The low 24 bits of one tempered output."""
    y = np.uint32(w)  # every step wrapped in 32 bits (numba computes uint32 shifts in 64)
    y = np.uint32(y ^ np.uint32(y >> np.uint32(11)))
    y = np.uint32(y ^ np.uint32(np.uint32(y << np.uint32(7)) & np.uint32(0x9D2C5680)))
    y = np.uint32(y ^ np.uint32(np.uint32(y << np.uint32(15)) & np.uint32(0xEFC60000)))
    y = np.uint32(y ^ np.uint32(y >> np.uint32(18)))
    return np.uint32(y & np.uint32(0xFFFFFF))


@_jit
def dare_zero_mt(x, mt, pos, thr):
    """x = 0 where the next uniform of the stream (mt, pos[0]: words used of the current state) is below the
    threshold (as 24 bits, `thr`), one uniform per element in order."""
    _mt_walk(x, mt, pos, thr, False)


@_jit
def mt_uniforms(out, mt, pos):
    """out = the stream's next uniforms (float32, as torch.rand)."""
    _mt_walk(out, mt, pos, 0, True)


@_jit
def _mt_walk(x, mt, pos, thr, fill):
    """One number of the stream per element of x, in order: x = the uniform (`fill`), or x = 0 where its 24 bits
    are below `thr` (float32 x); x = 1 where they are at least `thr`, else 0 (uint8 x: DARE's keep mask). The
    state is refilled every 624 numbers; pos[0] carries the position to the next call."""
    n = x.shape[0]
    t = np.uint32(thr)
    j = 0
    i = pos[0]
    while j < n:
        if i == _MT_N:
            _mt_twist(mt)
            i = 0
        k = min(_MT_N - i, n - j)
        _mt_span(_span(x, j, j + k), _span(mt, i, i + k), t, fill)
        i += k
        j += k
    pos[0] = i


def _mt_span(xs, ws, t, fill):
    """One span of _mt_walk (xs and the state words ws of the same length), chosen by xs's dtype when compiled:
    float32 xs = the uniforms (`fill`) or xs = 0 where the 24 bits are below t; uint8 xs = 1 where they are at
    least t (DARE's keep mask), else 0."""


@overload(_mt_span)
def _mt_span_impl(xs, ws, t, fill):
    if xs.dtype == types.uint8:
        def keep(xs, ws, t, fill):
            for q in range(xs.shape[0]):
                xs[q] = np.uint8(1) if _mt_out24(ws[q]) >= t else np.uint8(0)
        return keep

    def f32(xs, ws, t, fill):
        if fill:
            scale = np.float32(2.0 ** -24)
            for q in range(xs.shape[0]):
                xs[q] = np.float32(_mt_out24(ws[q])) * scale
        else:
            zero = np.float32(0.0)
            for q in range(xs.shape[0]):
                xs[q] = zero if _mt_out24(ws[q]) < t else xs[q]
    return f32


@_pjit
def mark_above(x, thr, taken):
    """taken |= |x| > thr (CA-magnitude's scan: the slots model i keeps, whatever was taken before)."""
    t = np.float32(thr)
    for j in prange(x.shape[0]):
        taken[j] = taken[j] | (abs(x[j]) > t)  # branch-free: a store under a data-dependent test, 12x slower

@_pjit
def magmax_add(x, best, first):
    """MagMax: best = x where |x| > |best| (the first model wins ties)."""
    for j in prange(x.shape[0]):
        if first:
            best[j] = x[j]
        elif abs(x[j]) > abs(best[j]):
            best[j] = x[j]


@_pjit
def threshold_prune(x, thr, taken):
    """CA-magnitude's add: keep |x| > thr on the slots not taken, zero the rest, taken |= kept."""
    t = np.float32(thr)
    zero = np.float32(0.0)
    for j in prange(x.shape[0]):
        tk = taken[j]
        keep = (abs(x[j]) > t) & (not tk)
        taken[j] = tk | keep
        x[j] = x[j] if keep else zero


def hist_hi_tau(raw, base, counts, taken):
    """hist_hi of tau = raw - base computed on the fly (the task vector is never stored; raw and base each bf16
    bits or float32, compiled per pair), tau read as 0 where `taken` (a bool array, or None: nothing taken);
    returns the number of non-finite tau elements (taken ones included)."""
    T, part = _parts(raw.shape[0], counts.shape[0])
    bads = np.zeros(T, np.int64)
    _run_pieces(_hist_hi_piece, T, 0, (raw, base, taken, part, bads))
    _add_parts(counts, part)
    return bads.sum()


@_jit
def _hist_hi_piece(p, T, phase, raw, base, taken, part, bads):
    """Piece p of T of hist_hi_tau (serial, run by _run_pieces)."""
    # the arguments borrowed: the caller holds them (see _unref)
    raw, base, taken, part, bads = _unref(raw), _unref(base), _unref(taken), _unref(part), _unref(bads)
    lo, hi = _piece(raw.shape[0], p, T, 1)
    bads[p] = _hist_hi_span(_span(raw, lo, hi), _span(base, lo, hi), _part_of(taken, lo, hi), part[p])


def hist_lo_tau(raw, base, bucket, counts, taken):
    """hist_lo of tau = raw - base computed on the fly (0 where `taken`, as hist_hi_tau)."""
    T, part = _parts(raw.shape[0], counts.shape[0])
    _run_pieces(_hist_lo_piece, T, 0, (raw, base, taken, np.uint32(bucket), part))
    _add_parts(counts, part)


@_jit
def _hist_lo_piece(p, T, phase, raw, base, taken, bucket, part):
    """Piece p of T of hist_lo_tau (serial, run by _run_pieces)."""
    # the arguments borrowed: the caller holds them (see _unref)
    raw, base, taken, part = _unref(raw), _unref(base), _unref(taken), _unref(part)
    lo, hi = _piece(raw.shape[0], p, T, 1)
    _hist_lo_span(_span(raw, lo, hi), _span(base, lo, hi), _part_of(taken, lo, hi), bucket, part[p])


@_jit
def sample_hi_tau(raw, base, taken, starts, width, out):
    """out = the high 16 bits of |tau| (0 where taken) over [a, a + width) for each a of `starts`, in order."""
    ub = np.empty(width, np.uint32)
    for i in range(starts.shape[0]):
        u, _ = _block_bits(raw, base, taken, starts[i], starts[i] + width, ub)
        for k in range(width):
            out[i * width + k] = (u[k] & _ABS) >> np.uint32(16)


def sample_hi_models(base, raws, starts, width, counts):
    """Each model's sample_hi_tau (nothing taken), counted: counts[k] = how often each high 16 bits of |tau_k|
    occurs in model k's sample (np.bincount of sample_hi_tau's). The models on threads (_run_pieces: one piece
    each, _sample_piece, as CA-magnitude's sample; the bits not kept)."""
    _run_pieces(_sample_piece, len(raws), 0, (base, raws, starts, width, None, counts))


@_jit
def _sample_piece(k, T, phase, base, raws, starts, width, us, counts):
    """Model k's |tau| bits over the sample's runs [a, a + width), a in `starts`, in order: into us[k] (None: a
    scratch run), and, with `counts` (None: not counted), counts[k] = the histogram of their high 16 bits. Serial,
    run by _run_pieces (a model per piece: the runs lie all over the inputs). Each run's bits by the loop over
    slices (vectorised: _tau_bits), then their sign dropped."""
    # the arguments borrowed: the caller holds them (see _unref)
    base, raws, starts = _unref(base), _unref(raws), _unref(starts)
    r = raws[k]
    ub = np.empty(width, np.uint32)
    if counts is not None:
        h = counts[k]
        for i in range(h.shape[0]):
            h[i] = 0
    for i in range(starts.shape[0]):
        a = starts[i]
        if us is None:
            u = _unref(ub)
        else:
            u = _rowspan(us, k, i * width, (i + 1) * width)
        _tau_bits(_span(r, a, a + width), _span(base, a, a + width), u)
        for j in range(width):
            u[j] &= _ABS
        if counts is not None:
            for j in range(width):
                h[u[j] >> np.uint32(16)] += 1


def hist_tau_windows(raw, base, counts, taken, s0, w0, s1, w1, lo_counts, threads):
    """hist_hi_tau, and in the same pass the low histograms of the high-bit buckets s0 .. s0 + w0 - 1 (rows 0 ..
    w0 - 1 of lo_counts) and s1 .. s1 + w1 - 1 (the rows after them; the two windows disjoint): the buckets a
    sample says the k-th largest falls in, so the low pass over tau is not needed when it does. A piece of at
    most 2^31 elements (int32 counts per piece); returns the number of non-finite tau elements. One piece per
    thread (`threads`: numba's count; the pieces on threads: _run_pieces), not the usual 8: each piece's
    counts are zeroed and summed (8 pieces of 6 rows would be 12 MB per call); integer counts, any cut gives the
    same. Each piece counts into two halves of the buckets followed by the windows' low rows
    (_hist_windows_span): an element of a window's bucket counts in its low row only, and the bucket's count is
    its row's sum."""
    T = max(1, min(_n_pieces(raw.shape[0], 1), threads))
    NB = counts.shape[0]
    W = w0 + w1
    part = np.zeros((T, 2 * NB + W * 65536), np.int32)
    bads = np.zeros(T, np.int64)
    _run_pieces(_hist_windows_piece, T, 0, (raw, base, taken, part, bads, NB, np.uint32(s0), np.uint32(w0),
                                            np.uint32(s1), np.uint32(w1)))
    _windows_sum(counts, part, lo_counts, NB, s0, w0, s1, W)
    return bads.sum()


@_jit
def _hist_windows_piece(p, T, phase, raw, base, taken, part, bads, NB, s0, w0, s1, w1):
    """Piece p of T of hist_tau_windows (serial, run by _run_pieces)."""
    # the arguments borrowed: the caller holds them (see _unref)
    raw, base, taken, part, bads = _unref(raw), _unref(base), _unref(taken), _unref(part), _unref(bads)
    lo, hi = _piece(raw.shape[0], p, T, 1)
    bads[p] = _hist_windows_span(_span(raw, lo, hi), _span(base, lo, hi), _part_of(taken, lo, hi), part[p], NB, s0,
                                 w0, s1, w1)


@_jit
def _windows_sum(counts, part, lo_counts, NB, s0, w0, s1, W):
    """hist_tau_windows' pieces summed: the high histogram's two halves into counts, each window's low rows into
    lo_counts and their sums into their bucket's count."""
    _add_parts(counts, part[:, :NB])
    _add_parts(counts, part[:, NB:2 * NB])
    for d in range(W):
        row = lo_counts[d]
        had = row.sum()
        _add_parts(row, part[:, 2 * NB + d * 65536:2 * NB + (d + 1) * 65536])
        counts[s0 + d if d < w0 else s1 + d - w0] += row.sum() - had


def mark_above_tau(raw, base, thr, taken):
    """taken |= |tau| > thr with tau = raw - base computed on the fly (CA-magnitude's scan), in pieces
    (_run_pieces, not `prange`: see _pjit)."""
    _run_pieces(_mark_piece, _n_pieces(raw.shape[0], 1), 0, (raw, base, np.float32(thr), taken))


@_jit
def _mark_piece(p, T, phase, raw, base, t, taken):
    """Piece p of T of mark_above_tau (pieces, not `prange`: see _pjit)."""
    # the arguments borrowed: the caller holds them (see _unref)
    raw, base, taken = _unref(raw), _unref(base), _unref(taken)
    lo, hi = _piece(raw.shape[0], p, T, 1)
    _mark_span(_span(raw, lo, hi), _span(base, lo, hi), t, _span(taken, lo, hi))


@_jit
def _mark_span(raw, base, t, taken):
    """mark_above_tau over one piece's slices: a loop over slices vectorises (2^21 bf16 elements, two threads:
    0.15 ns per element with the pieces' hand-off, against 0.94 indexing the whole arrays from lo to hi, and 0.10
    for the parallel loop this replaced)."""
    for j in range(raw.shape[0]):
        taken[j] = taken[j] | (abs(as_f32(raw, j) - as_f32(base, j)) > t)


# The histograms of tau go block by block: tau's bits for 2048 elements first (a vectorised loop), then the
# counting over that small buffer (measured on a 4M bf16 task vector, one thread: 1.2-1.5 -> 0.65 ns per element
# for the high histogram, 1.0-1.6 -> 0.35-0.65 for the low one).
_BLOCK = 2048


def _part_of(taken, lo, hi):
    """taken[lo:hi], or None when taken is None (chosen when compiled; an optional output chunk too)."""


@overload(_part_of)
def _part_of_impl(taken, lo, hi):
    if isinstance(taken, types.NoneType):
        return lambda taken, lo, hi: None
    return lambda taken, lo, hi: _span(taken, lo, hi)


def _drop_taken(u, tk):
    """u = 0 where tk (no-op for None), chosen when compiled."""


@overload(_drop_taken)
def _drop_taken_impl(u, tk):
    if isinstance(tk, types.NoneType):
        return lambda u, tk: None

    def impl(u, tk):
        for k in range(u.shape[0]):
            u[k] = np.uint32(0) if tk[k] else u[k]
    return impl


@_jit
def _tau_bits(rs, bs, ub):
    """ub = the float32 bits of tau = rs - bs."""
    for k in range(rs.shape[0]):
        ub[k] = _f32_as_u32(as_f32(rs, k) - as_f32(bs, k))


@_jit
def _block_bits(rs, bs, tk, s, e, ub):
    """(u, c): u = ub[:e - s] = the float32 bits of tau over [s, e) of the piece, 0 where tk; c = its non-finite
    tau count (taken elements included)."""
    u = _span(ub, 0, e - s)
    _tau_bits(_span(rs, s, e), _span(bs, s, e), u)
    c = np.int32(0)
    for k in range(u.shape[0]):
        c = _inc(c, (u[k] & _EXP) == _EXP)
    _drop_taken(u, _part_of(tk, s, e))
    return u, c


@_jit
def _hist_hi_span(rs, bs, tk, h):
    """h[high 16 bits of |tau|] += 1 over one piece (0 where tk); its non-finite tau count."""
    ub = np.empty(_BLOCK, np.uint32)
    bad = 0
    n = rs.shape[0]
    for s in range(0, n, _BLOCK):
        u, c = _block_bits(rs, bs, tk, s, min(n, s + _BLOCK), ub)
        bad += c
        for k in range(u.shape[0]):
            h[(u[k] & _ABS) >> np.uint32(16)] += 1
    return bad


@_jit
def _hist_windows_span(rs, bs, tk, h, NB, s0, w0, s1, w1):
    """h[high 16 bits of |tau|] += 1 over one piece (0 where tk), except where the high bits fall in a window
    (see hist_tau_windows): there h[NB + row * 2^16 + low 16 bits] += 1. The index of each element is worked out
    branch-free over the block (a vectorised loop), then one scatter per element. A branch on the window inside
    the counting loop cost more than the scatter (benchmarks/topk_scan.py, the merge benchmark's bf16 tensors:
    the selection 1.11-1.63x the plain high pass this way, 1.44-1.77x with the branch). Kept apart from
    _hist_hi_span: with no window this loop took 0.43 / 0.37-0.38 ns per element against 0.37 / 0.31 for the plain
    one (embedding / MLP tensor of that benchmark, 2 threads). The buckets are counted in two halves of h, even
    and odd elements (h[b] and h[NB + b]; the windows' rows from 2 NB on): the taken elements all fall in bucket
    0, and one counter hit by a quarter of the elements made each increment wait on the last (25 % of the slots
    taken at random: 0.73-0.80 -> 0.65-0.69 ns per element, 2 threads; none taken: the same). Every counter is
    worked out in 32 bits: numba types uint32 arithmetic as 64-bit, and with 64-bit lanes this loop ran at 2.3-3.4x
    the plain high pass on an AVX2 host (1.5-2.0x in 32 bits; docs/merge-engine.md). Its non-finite tau count."""
    ub = np.empty(_BLOCK, np.uint32)
    bad = 0
    n = rs.shape[0]
    nb = np.uint32(2 * NB)
    odd = np.uint32(NB)  # the odd elements' half
    W = np.uint32(w0 + w1)
    for s in range(0, n, _BLOCK):
        u, c = _block_bits(rs, bs, tk, s, min(n, s + _BLOCK), ub)
        bad += c
        for k in range(u.shape[0]):
            v = u[k] & _ABS
            b = v >> np.uint32(16)
            d0 = np.uint32(b - s0)  # unsigned: a bucket below a window's first wraps to a large difference
            d1 = np.uint32(b - s1)
            row = d0 if d0 < w0 else (np.uint32(w0 + d1) if d1 < w1 else W)
            half = odd if k & 1 else np.uint32(0)
            u[k] = np.uint32(nb + (row << np.uint32(16)) + (v & np.uint32(0xFFFF))) if row < W else np.uint32(b + half)
        for k in range(u.shape[0]):
            h[u[k]] += 1
    return bad


@_jit
def _hist_lo_span(rs, bs, tk, b, h):
    """h[low 16 bits of |tau|] += 1 for the |tau| of high bits b in one piece (0 where tk): a block without one is
    skipped after a vectorised count; the others gather theirs first (branch-free), then count them."""
    ub = np.empty(_BLOCK, np.uint32)
    hit = np.empty(_BLOCK, np.uint32)
    n = rs.shape[0]
    for s in range(0, n, _BLOCK):
        e = min(n, s + _BLOCK)
        u = _span(ub, 0, e - s)
        _tau_bits(_span(rs, s, e), _span(bs, s, e), u)
        _drop_taken(u, _part_of(tk, s, e))
        c = np.int32(0)
        for k in range(u.shape[0]):
            c = _inc(c, ((u[k] & _ABS) >> np.uint32(16)) == b)
        if c == 0:
            continue
        m = 0
        for k in range(u.shape[0]):
            v = u[k] & _ABS
            hit[m] = v
            m += (v >> np.uint32(16)) == b
        for k in range(m):
            h[hit[k] & np.uint32(0xFFFF)] += 1


# --------------------------------------------------------------------------------------------- one pass over all models
# The models' chunks come as one tuple, so each loop is compiled for the model count and the dtype it is given
# (cached per signature): the loop over the models unrolls and the element loop vectorises (runtime dtype
# flags and a model index read at run time made it 2x slower, measured on bf16 inputs).


def as_f32(x, j):
    """Element j of x as float32 (bf16 bits as uint16, or float32), chosen when compiled."""


@overload(as_f32)
def _as_f32_impl(x, j):
    if x.dtype == types.uint16:
        return lambda x, j: _u32_as_f32(np.uint32(x[j]) << np.uint32(16))
    return lambda x, j: np.float32(x[j])


def put(out, j, r):
    """out[j] = r (float32 out) or its bf16 rounding (bf16 bits as uint16); 1 when the stored value is not
    finite, else 0."""


@overload(put)
def _put_impl(out, j, r):
    if out.dtype == types.uint16:
        def bf16(out, j, r):
            o = _round_bf16(r)
            out[j] = o
            return (o & np.uint16(0x7F80)) == np.uint16(0x7F80)
        return bf16

    def f32(out, j, r):
        out[j] = r
        return (_f32_as_u32(r) & _EXP) == _EXP
    return f32


@_jit
def _bad(x):
    return (_f32_as_u32(x) & _EXP) == _EXP


# The one-pass loops only need to know whether anything turned non-finite (a chunk that did goes model by model,
# which names and counts): x - x is +0.0 for a finite x and NaN for NaN/inf, a sum of those is NaN as soon as one
# is, and its bits are 0 or not; a loop keeps the max of those bits (a uint32 reduction: vectorised, where an
# int64 count of _bad cost 15-25 % of the loop).
@_jit
def _nf(x):
    """x - x: +0.0 for finite x, NaN for NaN/inf."""
    return x - x


@_jit
def _flag(g):
    """The bits of a sum of _nf terms: 0 when all were finite."""
    return _f32_as_u32(g)


@_jit
def _emit(oraw, base, j, v, sc):
    """oraw[j] = base_j + v * sc, the output element (sc: 1, lambda or -lambda as float32, kernels._scale: b + m * 1
    == b + m and b + m * -l == b - m * l, bitwise); 1 when the stored value is not finite, else 0 (uint32)."""
    return np.uint32(put(oraw, j, as_f32(base, j) + v * sc))


def _store(total, oraw, base, j, v, sc):
    """A one-pass loop's result v of element j: total[j] = v (oraw None), or the output element (_emit) into
    oraw; chosen when compiled, so each loop stays one specialised, vectorised loop. 1 for a non-finite output,
    else 0 (uint32)."""


@overload(_store)
def _store_impl(total, oraw, base, j, v, sc):
    if isinstance(oraw, types.NoneType):
        def keep(total, oraw, base, j, v, sc):
            total[j] = v
            return np.uint32(0)
        return keep
    return lambda total, oraw, base, j, v, sc: _emit(oraw, base, j, v, sc)


@_jit
def _emit_span(oraw, base, merged, sc):
    """_emit over a span (slices: indexed from 0, so the loop vectorises); 1 when an output is not finite, else 0
    (uint32)."""
    bo = np.uint32(0)
    for j in range(merged.shape[0]):
        bo = max(bo, _emit(oraw, base, j, merged[j], sc))
    return bo


@_jit
def _sum_at(base, raws, ws, j, weighted):
    """(sum_k (float32(raws[k][j]) - base[j]) * w_k in model order (the * w_k only when `weighted`; x * 1 == x),
    the sum of the task-vector elements' _nf)."""
    b = as_f32(base, j)
    s = as_f32(raws[0], j) - b
    c = _nf(s)
    if weighted:
        s = s * np.float32(ws[0])
    for k in range(1, len(raws)):
        x = as_f32(raws[k], j) - b
        c = c + _nf(x)
        if weighted:
            x = x * np.float32(ws[k])
        s = s + x
    return s, c


def sum_raw(base, raws, ws, total, div, oraw, sc):
    """Task arithmetic over every model's chunk at once (each input read once, tau never stored): total = sum_k
    tau_k * w_k, tau_k = float32(raws[k]) - base, in model order as tau_accumulate model after model; then
    total / div where div > 0 (the uniform mean). With an output chunk `oraw` (not None) the output goes
    straight to it (see _emit) and total is not written. Returns (nonzero where a task-vector element or total
    is not finite, nonzeros of total, nonzero where an output is not finite). Pieces of whole 4096-element
    blocks on threads (_run_pieces)."""
    return _element_pieces(_sum_piece, base, raws, ws, total, div, oraw, sc)


def _element_pieces(piece, base, *args):
    """An element-wise one-pass loop (sum_raw, consensus_raw, magmax_raw) in pieces of whole 4096-element blocks
    (_run_pieces), piece(p, T, phase, base, *args, res) putting its (non-finite flag, count, non-finite output
    flag) in res[p]: (their maximum, sum, maximum)."""
    T = _n_pieces(base.shape[0], 4096)
    res = np.zeros((T, 3), np.int64)
    _run_pieces(piece, T, 0, (base, *args, res))
    return res[:, 0].max(), res[:, 1].sum(), res[:, 2].max()


@_jit
def _element_spans(p, T, base, raws, total, oraw):
    """Piece p of T of an element-wise loop as spans indexed from 0 (so its loop vectorises): the base's, the
    models' (a tuple), the result's and the output chunk's (None without one)."""
    lo, hi = _piece(base.shape[0], p, T, 4096)
    return _span(base, lo, hi), _slices(raws, lo, hi), _span(total, lo, hi), _part_of(oraw, lo, hi)


@_jit
def _sum_piece(p, T, phase, base, raws, ws, total, div, oraw, sc, res):
    """Piece p of T of sum_raw (serial): its (non-finite flag, nonzeros, non-finite output flag) into res[p]."""
    bs, rs, tt, oo = _element_spans(p, T, base, raws, total, oraw)
    weighted = _weighted(ws, len(raws))
    bad = np.uint32(0)
    nz = np.int32(0)
    bo = np.uint32(0)
    if div > 0:
        df = np.float32(div)
        for j in range(bs.shape[0]):
            s, c = _sum_at(bs, rs, ws, j, False)
            v = s / df
            bo = max(bo, _store(tt, oo, bs, j, v, sc))
            bad = max(bad, _flag(c + _nf(v)))
            nz = _inc(nz, v != 0)
    elif weighted:
        for j in range(bs.shape[0]):
            s, c = _sum_at(bs, rs, ws, j, True)
            bo = max(bo, _store(tt, oo, bs, j, s, sc))
            bad = max(bad, _flag(c + _nf(s)))
            nz = _inc(nz, s != 0)
    else:
        for j in range(bs.shape[0]):
            s, c = _sum_at(bs, rs, ws, j, False)
            bo = max(bo, _store(tt, oo, bs, j, s, sc))
            bad = max(bad, _flag(c + _nf(s)))
            nz = _inc(nz, s != 0)
    res[p, 0] = bad
    res[p, 1] = nz
    res[p, 2] = bo


@_jit
def _consensus_at(base, raws, j):
    """(sum, min, max of tau_k = raws[k][j] - base[j] in model order (as tau_sign_stats), sum of their _nf)."""
    b = as_f32(base, j)
    s = as_f32(raws[0], j) - b
    lo = s
    hi = s
    c = _nf(s)
    for k in range(1, len(raws)):
        x = as_f32(raws[k], j) - b
        c = c + _nf(x)
        s = s + x
        lo = x if (x < lo or x != x) else lo
        hi = x if (x > hi or x != x) else hi
    return s, lo, hi, c


def consensus_raw(base, raws, total, oraw, sc):
    """NegMerge over every model's chunk at once: the sum, min and max of tau_k = raws[k] - base in model order
    (as tau_sign_stats) and the sign-consensual mean (as sign_consensus_finish) into total, or the output chunk
    into oraw where it is not None (see _emit). Returns (nonzero where a task-vector element or sum is not
    finite, kept count, nonzero where an output is not finite). Pieces on threads as sum_raw."""
    return _element_pieces(_consensus_piece, base, raws, total, oraw, sc)


@_jit
def _consensus_piece(p, T, phase, base, raws, total, oraw, sc, res):
    """Piece p of T of consensus_raw (serial): its (non-finite flag, kept, non-finite output flag) into res[p]."""
    bs, rs, tt, oo = _element_spans(p, T, base, raws, total, oraw)
    nf = np.float32(len(raws))
    zero = np.float32(0.0)
    bad = np.uint32(0)
    kept = np.int32(0)
    bo = np.uint32(0)
    for j in range(bs.shape[0]):
        s, mn, mx, c = _consensus_at(bs, rs, j)
        keep = (mn > 0) | (mx < 0)
        v = s / nf
        v = v if keep else zero
        bad = max(bad, _flag(c + _nf(s)))
        kept = _inc(kept, keep)
        bo = max(bo, _store(tt, oo, bs, j, v, sc))
    res[p, 0] = bad
    res[p, 1] = kept
    res[p, 2] = bo


@_jit
def _magmax_at(base, raws, j):
    """(the tau_k = raws[k][j] - base[j] of largest magnitude, the first winning ties, sum of their _nf)."""
    b = as_f32(base, j)
    m = as_f32(raws[0], j) - b
    c = _nf(m)
    for k in range(1, len(raws)):
        x = as_f32(raws[k], j) - b
        c = c + _nf(x)
        if abs(x) > abs(m):
            m = x
    return m, c


def magmax_raw(base, raws, best, oraw, sc):
    """MagMax over every model's chunk at once (as magmax_add model after model: the first model wins ties) into
    best, or the output chunk into oraw where it is not None (see _emit). Returns (nonzero where a task-vector
    element is not finite, nonzeros of best, nonzero where an output is not finite). Pieces on threads as
    sum_raw."""
    return _element_pieces(_magmax_piece, base, raws, best, oraw, sc)


@_jit
def _magmax_piece(p, T, phase, base, raws, best, oraw, sc, res):
    """Piece p of T of magmax_raw (serial): its (non-finite flag, nonzeros, non-finite output flag) into res[p]."""
    bs, rs, tt, oo = _element_spans(p, T, base, raws, best, oraw)
    bad = np.uint32(0)
    nz = np.int32(0)
    bo = np.uint32(0)
    for j in range(bs.shape[0]):
        m, c = _magmax_at(bs, rs, j)
        bad = max(bad, _flag(c))
        nz = _inc(nz, m != 0)
        bo = max(bo, _store(tt, oo, bs, j, m, sc))
    res[p, 0] = bad
    res[p, 1] = nz
    res[p, 2] = bo


@_pjit
def apply_raw(base, merged, sc, out):
    """apply_bf16 / apply_f32 with the base chunk as read (bf16 bits or float32) instead of its float32 copy, into
    out (bf16 bits or float32), as the one-pass loops write it (_emit, sc: float32(lambda) * sign). Returns 1
    when an output is not finite, else 0."""
    bad = np.uint32(0)
    for j in prange(base.shape[0]):
        bad = max(bad, _emit(out, base, j, merged[j], sc))
    return bad


# --------------------------------------------------------------------------------------------- top-k methods in one pass


@_jit
def _tau_block(rs, bs, x):
    """x = float32(rs) - float32(bs) over one block; its non-finite count."""
    bad = np.int32(0)
    for j in range(x.shape[0]):
        v = as_f32(rs, j) - as_f32(bs, j)
        x[j] = v
        bad = _inc(bad, _bad(v))
    return bad


@_jit
def _ties_before(base, raws, lo, hi, modes, thrs, alls, band):
    """Per model: the ties at its threshold in [lo, hi) (0 where the count is not needed), and at its second
    threshold (`band`; zeros without)."""
    K = len(raws)
    tv = _tv_of(modes, thrs)
    tv2, _ = _band_tv(band, K)
    out = np.zeros(K, np.int64)
    out2 = np.zeros(K, np.int64)
    for s in range(lo, hi, _BLOCK):
        e = min(hi, s + _BLOCK)
        rs = _slices(raws, s, e)
        packed = _ties_span(_span(base, s, e), rs, tv)
        for k in range(K):
            if modes[k] == 2 and not alls[k]:
                out[k] += _unpack(packed, k)
        _band_before(band, _span(base, s, e), rs, tv2, out2)
    return out, out2


@_jit
def _ties_span(bs, rs, tv):
    """The elements with |rs[k] - bs| == tv[k] per model k over one span of fewer than 2^16 elements, packed 16
    bits a model into four words (_unpack): one loop over the elements with the models inside it, so the base
    is read once and the loop vectorises (0.17 ns per model and element, one thread, 4 bf16 models of 2^25
    elements; a model at a time over a float32 scratch block: 0.87-0.93)."""
    K = len(rs)
    ws = _NO_COUNTS
    for j in range(bs.shape[0]):
        b = as_f32(bs, j)
        for k in range(K):
            ws = _count16(ws, abs(as_f32(rs[k], j) - b) == tv[k], k)
    return ws


@_jit
def _unpack(packed, k):
    """Model k's count in _ties_span's result (four words of two 16-bit counts: models 0-1, 2-3, 4-5, 6-7)."""
    return np.int64((packed[k // 2] >> np.uint32(16 * (k % 2))) & np.uint32(0xFFFF))


@_jit
def _inc(c, flag):
    """c + flag as int32. A loop's counts stay 32-bit where its span is below 2^31 elements: numba widens every
    integer sum to 64 bits, and 64-bit lanes in a vectorised loop cost the widening of each compare and half the
    lanes (task arithmetic's loop 2.22 -> 1.06 ms on 2^21 elements x 4 bf16 models, one thread, AVX2)."""
    return np.int32(c + np.int32(flag))


@_jit
def _add16(w, flag, k):
    """Word w of packed 16-bit counts (uint32: two per word) with flag added to count k % 2 (see _inc)."""
    return np.uint32(w + (np.uint32(flag) << np.uint32(16 * (k % 2))))


_NO_COUNTS = (np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0))  # _ties_span's packed counts, all zero


@_jit
def _count16(ws, flag, k):
    """The packed counts ws (_unpack's four words) with flag added to model k's."""
    w0, w1, w2, w3 = ws
    if k < 2:
        w0 = _add16(w0, flag, k)
    elif k < 4:
        w1 = _add16(w1, flag, k)
    elif k < 6:
        w2 = _add16(w2, flag, k)
    else:
        w3 = _add16(w3, flag, k)
    return w0, w1, w2, w3


@_jit
def _prune_block(x, mode, t, all_ties, left, seen):
    """One TopK's selection on one block in place (as topk_prune); the ties at the threshold in it."""
    if mode == 1:
        return 0
    if mode == 0:
        for j in range(x.shape[0]):
            x[j] = np.float32(0.0)
        return 0
    return _topk_span(x, t, all_ties, left, seen)


@_jit
def _kept_bits(tb, L, pt, h4):
    """pt[j] = the models keeping element j (bit k: row k of tb nonzero), row by row (vectorised), counted into
    h4 (see _count_bytes)."""
    zero = np.float32(0.0)
    for j in range(L):
        pt[j] = np.uint8(0)
    for k in range(tb.shape[0]):
        x = _rowspan(tb, k, 0, L)
        bk = np.uint8(1 << k)
        for j in range(L):
            pt[j] |= bk if x[j] != zero else np.uint8(0)
    _count_bytes(pt, h4)


@_jit
def _mask_pairs(tb, L, pt, h4, nzm, pairs):
    """pairs[a, b] += the slots of the whole blocks of 32 of a span kept nonzero by models a and b (rows of nzm:
    a bit per slot), popcounts of their words ANDed; a tail below 32 slots by _kept_bits' bytes. Against
    _kept_bits (per slot and model a pattern bit, then a histogram of the bytes), 4 models' spans of 2048 in
    cache, 15 % kept, one thread: 0.316 -> 0.039 ns per output element."""
    K = tb.shape[0]
    nb = L // 32
    for a in range(K):
        ma = _rowspan(nzm, a, 0, nb)
        for b in range(a, K):
            mb = _rowspan(nzm, b, 0, nb)
            c = np.uint32(0)
            for i in range(nb):
                c = np.uint32(c + _popc(np.uint32(ma[i] & mb[i])))
            pairs[a, b] += c
    if nb * 32 < L:
        _kept_bits(tb[:, nb * 32:L], L - nb * 32, pt[:L - nb * 32], h4)


@_jit
def _combine_block(tb, L, ws, weighted, consensus, normalize, o, pt, h4, sc):
    """The pruned task vectors of one block (row k of tb: model k's, L elements) combined in model order into o:
    sum_k w_k x_k (consensus False), or TIES' sign election and disjoint (weighted) mean; pt[j] = which models
    kept element j (bits), counted into h4; sc: 3 scratch rows. Row by row, so every loop vectorises (each
    element still sees the model-by-model loops' float32 operations in their order; x * 1 == x, so one
    `weighted` flag serves all models). Returns (non-finite count, nonzeros of the result (consensus: of the
    divisor))."""
    K = tb.shape[0]
    zero = np.float32(0.0)
    one = np.float32(1.0)
    _kept_bits(tb, L, pt, h4)
    t = _rowspan(sc, 0, 0, L)
    x = _rowspan(tb, 0, 0, L)
    w0 = np.float32(ws[0]) if weighted else one
    for j in range(L):
        t[j] = x[j] * w0
    for k in range(1, K):
        x = _rowspan(tb, k, 0, L)
        wk = np.float32(ws[k]) if weighted else one
        for j in range(L):
            t[j] = t[j] + x[j] * wk
    bad = np.int32(0)
    nz = np.int32(0)
    if not consensus:
        for j in range(L):
            v = t[j]
            o[j] = v
            bad = _inc(bad, _bad(v))
            nz = _inc(nz, v != zero)
        return bad, nz
    acc = _rowspan(sc, 1, 0, L)
    div = _rowspan(sc, 2, 0, L)
    pz = np.float32(consensus == 2)   # what a sum of 0 elects: 0 (consensus 1, the paper's) or + (2, mergekit's)
    for j in range(L):
        acc[j] = zero
        div[j] = zero
    for k in range(K):
        x = _rowspan(tb, k, 0, L)
        wk = np.float32(ws[k]) if weighted else one
        for j in range(L):
            v = x[j] * wk
            tj = t[j]
            ok = v * (np.float32(tj > zero) - np.float32(tj < zero) + np.float32(tj == zero) * pz) > zero
            acc[j] = acc[j] + (v if ok else zero)
            div[j] = div[j] + (wk if ok else zero)
    for j in range(L):
        a = acc[j]
        d = div[j]
        nz = _inc(nz, d != zero)
        if normalize:
            a = a / (one if d == zero else d)
        o[j] = a
        bad = _inc(bad, _bad(t[j]) + _bad(a))
    return bad, nz


@_inlined
def _merge_piece(base, raws, lo, hi, dare, modes, thrs, alls, lefts, seen, masks, ds, ws, weighted, consensus,
                 normalize, out, h4, oraw, sc, emit, band, seen2):
    """topk_merge_raw (dare False: each model pruned by its TopK, seen[k] its ties so far) or dare_merge_raw
    (each model's DARE drop) over [lo, hi), per block of _BLOCK: every model's rule made one comparison (a top-k
    block where each model's ties at its threshold are all kept or all dropped; DARE), then :func:`_fused_span`,
    which counts the ties; only a block where a model's quota of ties can run out counts them first
    (:func:`_quota_ends`), and where one does it goes model by model (its tau pruned in a scratch row, then
    combined: :func:`_counted_block`); with `emit` each block's output goes to the output chunk oraw while it
    is in cache (see _emit: a test per block, so this loop is compiled once whether it writes the output or not;
    a second specialisation took 9 s to compile). `band`: None, or Breadcrumbs' second TopK per model (modes,
    thresholds, all ties, ties left; seen2 its ties so far): an element is kept where the first keeps it and
    the second does not. Returns (non-finite flag (nonzero: some task-vector element or result is not finite),
    nonzeros of the result, non-finite output flag)."""
    K = len(raws)
    tb = np.empty((K, _BLOCK), np.float32)
    scr = np.empty((3, _BLOCK), np.float32)
    pat = np.empty(_BLOCK, np.uint8)
    s32 = np.empty((2, _BLOCK), np.uint32)  # _fused_span's marks
    ob = np.empty(_BLOCK, np.float32)  # the merged block where the output is written (out is not touched)
    tv = _tv_of(modes, thrs)  # keep |tau| > tv[k], or >= where tf[k] (DARE: tf[k] keeps every element)
    tf = np.zeros(K, np.bool_)
    dv = np.ones(K, np.float32)  # DARE's divisor (1: p = 0, x / 1 == x)
    wv = np.ones(K, np.float32)
    for k in range(K):
        if weighted:
            wv[k] = np.float32(ws[k])
        if dare:
            tf[k] = ds[k] <= 0
            dv[k] = np.float32(ds[k]) if ds[k] > 0 else np.float32(1.0)
    tv2, tf2 = _band_tv(band, K)
    bad = 0
    nz = 0
    bo = 0
    for s in range(lo, hi, _BLOCK):
        e = min(hi, s + _BLOCK)
        L = e - s
        rs = _slices(raws, s, e)
        dst = _span(ob, 0, L) if emit else _span(out, s, e)
        if dare:
            b, z, _, _, _ = _fused_span(_span(base, s, e), rs, _rows(masks, raws, s, e), tv, tf, dv, wv, consensus,
                                        normalize, dst, _span(pat, 0, L), None, None, None, None, None, s32)
            _count_bytes(_span(pat, 0, L), h4)
        elif not (_quota_ends(modes, alls, lefts, seen, L) or _band_ends(band, seen2, L)):
            for k in range(K):  # every tie kept (seen + L <= left) or none (seen >= left): counted as it goes
                tf[k] = modes[k] == 2 and (alls[k] or seen[k] + L <= lefts[k])
            _band_flags(band, seen2, L, tf2)
            b, z, packed, packed2, _ = _fused_span(_span(base, s, e), rs, None, tv, tf, dv, wv, consensus, normalize,
                                                   dst, _span(pat, 0, L), tv2, tf2, None, None, None, s32)
            _add_ties(modes, packed, seen)
            _band_add(band, packed2, seen2)
            _count_bytes(_span(pat, 0, L), h4)
        else:
            b, z = _counted_block(base, raws, s, e, rs, modes, thrs, alls, lefts, seen, tv, tf, dv, wv, ws, weighted,
                                  consensus, normalize, dst, pat, h4, tb, scr, band, seen2, tv2, tf2, s32)
        bad += b
        nz += z
        if emit:
            bo += _emit_span(_span(oraw, s, e), _span(base, s, e), dst, sc)
    return bad, nz, bo


@_jit
def _quota_ends(modes, alls, lefts, seen, L):
    """Whether a model's quota of ties at its threshold can run out inside the next block of L elements (it has
    seen[k] of them so far, lefts[k] to keep): seen < left < seen + L. Only such a block counts its ties before
    it is merged (about one block per model and tensor: a pass over the block saved elsewhere). With seen = 0
    and L = a chunk's length: whether the chunk's pieces must count the ties before them (_merge_models)."""
    for k in range(len(modes)):
        if modes[k] == 2 and not alls[k] and seen[k] < lefts[k] < seen[k] + L:
            return True
    return False


@_jit
def _add_ties(modes, packed, seen):
    """seen[k] += model k's ties in `packed` (_ties_span's packing) for the models selecting by threshold."""
    for k in range(len(modes)):
        if modes[k] == 2:
            seen[k] += _unpack(packed, k)


@_inlined
def _counted_block(base, raws, s, e, rs, modes, thrs, alls, lefts, seen, tv, tf, dv, wv, ws, weighted, consensus,
                   normalize, dst, pat, h4, tb, scr, band, seen2, tv2, tf2, s32):
    """One top-k block [s, e) where a quota of ties may run out: its ties counted first; where one does, the block
    goes model by model (each tau pruned in a scratch row by its TopK, then combined), else the fused loop with
    each model keeping all or none of its ties. Returns (non-finite flag, nonzeros)."""
    L = e - s
    packed = _ties_span(_span(base, s, e), rs, tv)
    split = False
    for k in range(len(modes)):
        if modes[k] == 2:
            c = _unpack(packed, k)
            tf[k] = alls[k] or seen[k] + c <= lefts[k]
            split |= not (tf[k] or seen[k] >= lefts[k])
    split2, packed2 = _band_counted(band, _span(base, s, e), rs, tv2, tf2, seen2)
    if split or split2:
        bad = 0
        for k in range(len(modes)):
            x = _rowspan(tb, k, 0, L)
            bad += _tau_block(_span(raws[k], s, e), _span(base, s, e), x)
            _prune_model(x, k, modes, thrs, alls, lefts, seen, band, seen2)
        b, z = _combine_block(tb, L, ws, weighted, consensus, normalize, dst, _span(pat, 0, L), h4, scr)
        return bad + b, z
    _add_ties(modes, packed, seen)
    _band_add(band, packed2, seen2)
    b, z, _, _, _ = _fused_span(_span(base, s, e), rs, None, tv, tf, dv, wv, consensus, normalize, dst,
                                _span(pat, 0, L), tv2, tf2, None, None, None, s32)
    _count_bytes(_span(pat, 0, L), h4)
    return b, z


# Breadcrumbs' second TopK per model (the top gamma, dropped) in the top-k one pass: `band` is None for the other
# methods, and each helper below is then a no-op chosen when compiled (their loops are compiled without it).


@_jit
def _tv_of(modes, thrs):
    """The TopKs' thresholds as float32: mode 2 its threshold, mode 0 (none kept) inf, mode 1 (all kept) -1."""
    tv = np.empty(len(modes), np.float32)
    for k in range(len(modes)):
        tv[k] = np.float32(thrs[k]) if modes[k] == 2 else (np.float32(np.inf) if modes[k] == 0 else np.float32(-1.0))
    return tv


def _band_tv(band, K):
    """(thresholds, tie flags) of the second TopKs as _tv_of's, or (None, None)."""


@overload(_band_tv)
def _band_tv_impl(band, K):
    if isinstance(band, types.NoneType):
        return lambda band, K: (None, None)

    return lambda band, K: (_tv_of(band[0], band[1]), np.zeros(K, np.bool_))


def _band_ends(band, seen2, L):
    """_quota_ends for the second TopKs (False without them)."""


@overload(_band_ends)
def _band_ends_impl(band, seen2, L):
    if isinstance(band, types.NoneType):
        return lambda band, seen2, L: False
    return lambda band, seen2, L: _quota_ends(band[0], band[2], band[3], seen2, L)


def _band_flags(band, seen2, L, tf2):
    """tf2 of a block where no second quota runs out: every tie dropped from the top (kept in the band) or none."""


@overload(_band_flags)
def _band_flags_impl(band, seen2, L, tf2):
    if isinstance(band, types.NoneType):
        return lambda band, seen2, L, tf2: None

    def impl(band, seen2, L, tf2):
        modes, alls, lefts = band[0], band[2], band[3]
        for k in range(len(modes)):
            tf2[k] = modes[k] == 2 and (alls[k] or seen2[k] + L <= lefts[k])
    return impl


def _band_add(band, packed2, seen2):
    """_add_ties for the second TopKs."""


@overload(_band_add)
def _band_add_impl(band, packed2, seen2):
    if isinstance(band, types.NoneType):
        return lambda band, packed2, seen2: None
    return lambda band, packed2, seen2: _add_ties(band[0], packed2, seen2)


def _band_counted(band, bs, rs, tv2, tf2, seen2):
    """(whether a second quota runs out in this block, its ties packed) after counting them and setting tf2 as
    _counted_block does for the first; (False, zeros) without second TopKs."""


@overload(_band_counted)
def _band_counted_impl(band, bs, rs, tv2, tf2, seen2):
    if isinstance(band, types.NoneType):
        return lambda band, bs, rs, tv2, tf2, seen2: (False, _NO_COUNTS)

    def impl(band, bs, rs, tv2, tf2, seen2):
        modes, alls, lefts = band[0], band[2], band[3]
        packed = _ties_span(bs, rs, tv2)
        split = False
        for k in range(len(modes)):
            if modes[k] == 2:
                c = _unpack(packed, k)
                tf2[k] = alls[k] or seen2[k] + c <= lefts[k]
                split |= not (tf2[k] or seen2[k] >= lefts[k])
        return split, packed
    return impl


def _prune_model(x, k, modes, thrs, alls, lefts, seen, band, seen2):
    """Model k's scratch row pruned by its TopK (_prune_block), or by its band (_band_span: kept by the first
    TopK, not by the second), its ties counted into seen (and seen2)."""


@overload(_prune_model)
def _prune_model_impl(x, k, modes, thrs, alls, lefts, seen, band, seen2):
    if isinstance(band, types.NoneType):
        def top(x, k, modes, thrs, alls, lefts, seen, band, seen2):
            seen[k] += _prune_block(x, modes[k], np.float32(thrs[k]), alls[k], lefts[k], seen[k])
        return top

    def impl(x, k, modes, thrs, alls, lefts, seen, band, seen2):
        ck, ct = _band_span(x, modes[k], np.float32(thrs[k]), alls[k], lefts[k], seen[k], band[0][k],
                            np.float32(band[1][k]), band[2][k], band[3][k], seen2[k])
        seen[k] += ck
        seen2[k] += ct
    return impl


def _band_before(band, bs, rs, tv2, out2):
    """out2[k] += the ties at model k's second threshold in the span where its quota needs counting."""


@overload(_band_before)
def _band_before_impl(band, bs, rs, tv2, out2):
    if isinstance(band, types.NoneType):
        return lambda band, bs, rs, tv2, out2: None

    def impl(band, bs, rs, tv2, out2):
        packed = _ties_span(bs, rs, tv2)
        for k in range(len(band[0])):
            if band[0][k] == 2 and not band[2][k]:
                out2[k] += _unpack(packed, k)
    return impl


def _slices(raws, lo, hi):
    """(raws[0][lo:hi], raws[1][lo:hi], ...): the models' spans as a tuple (generated for its length when
    compiled), so loops over them index from 0 and vectorise."""


@overload(_slices)
def _slices_impl(raws, lo, hi):
    return _defined("def f(raws, lo, hi):\n    return ("
                    + "".join(f"_span(raws[{k}], lo, hi), " for k in range(len(raws)))
                    + ")\n")


def _rows(masks, raws, lo, hi):
    """(masks[0, lo:hi], masks[1, lo:hi], ...), a row per model of raws (generated as _slices)."""


@overload(_rows)
def _rows_impl(masks, raws, lo, hi):
    return _defined("def f(masks, raws, lo, hi):\n    return ("
                    + "".join(f"_rowspan(masks, {k}, lo, hi), " for k in range(len(raws))) + ")\n")


def _defined(src: str):
    """The function `f` defined by `src`, our own generated text (literal model indices), with this module's
    names in scope, named after a hash of its text: numba names a compiled function after its qualified name and
    types (and a counter that restarts in every process), so two generated functions of the same name and types
    (the networks for different sizes) compiled in different processes would share a symbol when their cached
    callers meet in one process, and one would run in place of the other."""
    import hashlib

    ns = dict(globals())
    exec(src, ns)
    fn = ns["f"]
    fn.__name__ = fn.__qualname__ = "gen_" + hashlib.sha1(src.encode()).hexdigest()[:16]
    return fn


def _fused_span(bs, rs, ms, tv, tf, dv, ws, consensus, normalize, o, pt, tv2, tf2, wl, ww, pw, s32):
    """One span of every model combined element by element, the models written out (generated for their count and for
    DARE (ms: the mask rows) or top-k (ms None) when compiled: a loop over a tuple of models indexed at run time
    stayed scalar, 2.9-18 ns per model and element for DARE, measured). Model k's value x_k = rs[k] - bs is kept
    where |x_k| > tv[k] (or == with tf[k]) (top-k), or x_k / dv[k] kept where ms[k] != 0 or tf[k] (DARE); then the
    weighted sum, or TIES' sign election and disjoint (weighted) mean (consensus), in the float32 operations and
    order of _combine_block; pt[j] = which models kept element j (bits; made in s32's first row, a (2, n) uint32
    scratch, then bytes). With Breadcrumbs' second thresholds (tv2, tf2; None otherwise) x_k is kept only where it
    is not in the top as well (|x_k| > tv2[k], or == with tf2[k]). With windows (wl, ww: uint32 arrays, pw: a uint8
    row; None otherwise; the deferred pass of magnitude, TIES and Breadcrumbs) it marks pw[j] = the models whose
    |x_k|'s bits u lie in their window (u - wl[k] < ww[k], unsigned; Breadcrumbs: or in its top's, see _fused_src;
    made in s32's second row), in the same loop (0.92 -> 0.67 ns per model and element with a separate loop's, one
    thread, 4 bf16 models). That pass keeps every tie (tf, and tf2, all True: |x_k| >= tv[k], one comparison) and
    counts none (in-process merges, 2 threads, alternated: TIES 1.18-1.23 -> 1.14-1.19 s, magnitude 1.03-1.13 ->
    1.01-1.10). Returns (non-finite flag: 1 where an x_k, the sum or the result is not finite (top-k: from the
    largest |x_k|'s bits, _EXP or more; DARE: see _nf), else 0, nonzeros of the result (consensus: of the divisor),
    the top-k ties: the elements with |x_k| == tv[k] per model, packed as _ties_span's (DARE and windows: zeros),
    those with |x_k| == tv2[k] (zeros without tv2; Breadcrumbs' deferred pass: its elements from his2[k] on), the
    positions with a window bit (0 without windows)).

    The positions with a window bit are counted from the models' window bools, not from the mark byte (numba widens
    the uint8 marks' OR to 64 bits, and a compare of it kept the loop's marks in 64-bit lanes: TIES' AVX2 loop
    zero-extended each model's marks into two 64-bit vectors per eight elements), and TIES' sign of a zero sum is a
    select, not a float conversion. AMD Zen 3 (AVX2), two threads, the deferred pass on an MLP tensor called again
    in the merge's process, the previous code alternated with it in the same process (a copy of the module under
    another name): 0.806-0.893x the time for TIES on single files, 0.844-0.861x magnitude on HF folders,
    0.920-0.927x Breadcrumbs (medians of 4-5 pairs; TIES three processes, the others two).

    One thread, 4 bf16 models of 2^25 elements, per model and element: sum 0.47 ns, TIES 0.76, DARE 0.46,
    DARE-TIES 0.74 (model by model over scratch rows: 0.92, 0.92, 0.91, 1.15), measured before the loop counted
    the ties (64075ec, without _ties_span's pass: the merge pass of magnitude 1.28-1.53 -> 1.15-1.26 s, TIES
    1.57-1.68 -> 1.38-1.44, HF folders, 2 threads)."""


@overload(_fused_span)
def _fused_span_impl(bs, rs, ms, tv, tf, dv, ws, consensus, normalize, o, pt, tv2, tf2, wl, ww, pw, s32):
    return _defined(_fused_src(len(rs), not isinstance(ms, types.NoneType), not isinstance(tv2, types.NoneType),
                               not isinstance(wl, types.NoneType)))


def _fused_hoisted(k: int, dare: bool, band: bool, windows: bool) -> list:
    """_fused_src's lines that read model k's scalars (and rows) before the loop."""
    lines = [f"    r{k} = rs[{k}]", f"    t{k} = tv[{k}]", f"    f{k} = tf[{k}]", f"    d{k} = dv[{k}]",
             f"    w{k} = ws[{k}]"]
    if dare:
        lines.append(f"    m{k} = ms[{k}]")
    if band:
        lines += [f"    u{k} = tv2[{k}]", f"    g{k} = tf2[{k}]"]
    if windows and band:
        lines += [f"    l{k} = wl[0][{k}]", f"    m{k} = wl[1][{k}]", f"    n{k} = wl[2][{k}]",
                  f"    z{k} = ww[0][{k}]", f"    y{k} = ww[1][{k}]"]
    elif windows:
        lines += [f"    l{k} = wl[{k}]", f"    z{k} = ww[{k}]"]
    return lines


def _fused_kept(k: int, dare: bool, band: bool, windows: bool) -> list:
    """_fused_src's lines, inside the loop, that give model k's kept value v{k} from its tau x{k} (and its
    window bit i{k}, its counts)."""
    ind = " " * 12
    if dare:
        return [f"{ind}v{k} = x{k} / d{k}", f"{ind}v{k} = v{k} if f{k} | (m{k}[j] != 0) else zero"]
    lines = [f"{ind}a{k} = abs(x{k})"]
    if windows and band:  # Breadcrumbs' deferred pass: tf and tf2 all True, no tie counted
        return lines + [f"{ind}v{k} = x{k} if (a{k} >= t{k}) > (a{k} >= u{k}) else zero",
                        f"{ind}b{k} = _f32_as_u32(a{k})",
                        f"{ind}i{k} = (np.uint32(b{k} - l{k}) < z{k}) | (np.uint32(b{k} - m{k}) < y{k})",
                        f"{ind}q{4 + k // 2} = _add16(q{4 + k // 2}, b{k} >= n{k}, {k})"]
    if windows:  # the deferred pass of magnitude and TIES: every tie kept (tf all True), none counted
        return lines + [f"{ind}v{k} = x{k} if a{k} >= t{k} else zero",
                        f"{ind}i{k} = np.uint32(_f32_as_u32(a{k}) - l{k}) < z{k}"]
    lines += [f"{ind}e{k} = a{k} == t{k}", f"{ind}q{k // 2} = _add16(q{k // 2}, e{k}, {k})"]
    if band:  # kept by the first, not in the top (bools compared: and-not, branch-free)
        return lines + [f"{ind}h{k} = a{k} == u{k}", f"{ind}q{4 + k // 2} = _add16(q{4 + k // 2}, h{k}, {k})",
                        f"{ind}v{k} = x{k} if ((a{k} > t{k}) | (f{k} & e{k})) > ((a{k} > u{k}) | (g{k} & h{k}))"
                        " else zero"]
    return lines + [f"{ind}v{k} = x{k} if (a{k} > t{k}) | (f{k} & e{k}) else zero"]


def _bits_src(K: int, cond: str) -> str:
    """A generated loop's expression of K models' mark bits in uint32: bit k where `cond` (with {k}) holds. uint32,
    stored to a row of a uint32 scratch and made bytes after the loop (_bytes_src): LLVM narrows such an OR made
    uint8 to byte operations and packs each model's compare to bytes first (AVX2: 3 instructions a model and row,
    more than the ORs; Decisions, session 50)."""
    return " | ".join(f"(np.uint32({1 << k}) if {cond.format(k=k)} else np.uint32(0))" for k in range(K))


def _marks_src(*rows: str) -> list:
    """The lines before a generated loop that name its uint32 mark rows (rows of the scratch s32, n long)."""
    return ["    n = bs.shape[0]"] + [f"    {r} = _rowspan(s32, {i}, 0, n)" for i, r in enumerate(rows)]


def _bytes_src(*pairs) -> list:
    """The lines after a generated loop that make each uint32 mark row (src) the caller's byte row (dst)."""
    return [line for dst, src in pairs for line in ("    for j in range(n):", f"        {dst}[j] = np.uint8({src}[j])")]


def _max_src(terms: list) -> str:
    """max over `terms`, nested (a generated loop's flag: the largest |x_k|'s bits, _EXP or more where one is not
    finite, so no x_k is held to the loop's end for _nf)."""
    got = terms[0]
    for t in terms[1:]:
        got = f"max({got}, {t})"
    return got


def _bad_src(c: str, terms: str, summed: bool) -> str:
    """A generated loop's line that folds one element's flag into `bad`: `c` (a sum of _nf terms where `summed`,
    DARE's; else the largest |x_k|'s bits, _max_src) with the _nf terms of its results."""
    return f"bad = max(bad, _flag({c} + {terms}))" if summed else f"bad = max(bad, max({c}, _flag({terms})))"


_FLAG_01 = "    bad = np.uint32(1) if bad >= _EXP else np.uint32(0)"  # a flag of bits (_EXP or more: not finite) as 0/1


def _fused_src(K: int, dare: bool, band: bool = False, windows: bool = False) -> str:
    """The source of _fused_span for K models (x{k}: tau, v{k}: kept value, model k's scalars hoisted). With band
    and windows (Breadcrumbs' deferred pass): wl = (los, los2, his2), ww = (wds, wds2), both windows marked and
    each model's elements from his2[k] on counted, packed as the second ties (see _folded)."""
    assert not (windows and dare)
    lines = ["def f(bs, rs, ms, tv, tf, dv, ws, consensus, normalize, o, pt, tv2, tf2, wl, ww, pw, s32):",
             "    cw = np.int32(0)",
             "    zero = np.float32(0.0)",
             "    one = np.float32(1.0)",
             "    bad = np.uint32(0)",
             "    nz = np.int32(0)",
             "    q0 = q1 = q2 = q3 = q4 = q5 = q6 = q7 = np.uint32(0)",
             "    pz = np.float32(consensus == 2)"]   # a sum of 0 elects 0 (consensus 1) or + (2, mergekit's)
    add = lines.append
    for k in range(K):
        lines += _fused_hoisted(k, dare, band, windows)
    lines += _marks_src("q32", "w32")  # the marks in uint32 rows (_bits_src)
    for consensus in (False, True):
        add(f"    if {'' if consensus else 'not '}consensus:")
        add("        for j in range(bs.shape[0]):")
        add("            b = as_f32(bs, j)")
        for k in range(K):
            add(f"            x{k} = as_f32(r{k}, j) - b")
            lines += _fused_kept(k, dare, band, windows)
        if windows:
            add("            w32[j] = " + _bits_src(K, "i{k}"))
            add("            cw = _inc(cw, " + " | ".join(f"i{k}" for k in range(K)) + ")")  # bools: 32-bit lanes
        if dare:
            add("            c = " + " + ".join(f"_nf(x{k})" for k in range(K)))
        else:
            add("            c = " + _max_src([f"_f32_as_u32(a{k})" for k in range(K)]))
        add("            q32[j] = " + _bits_src(K, "v{k} != zero"))
        add("            t = v0 * w0")
        for k in range(1, K):
            add(f"            t = t + v{k} * w{k}")
        if not consensus:
            add("            o[j] = t")
            add("            " + _bad_src("c", "_nf(t)", dare))
            add("            nz = _inc(nz, t != zero)")
            continue
        add("            sg = np.float32(t > zero) - np.float32(t < zero) + (pz if t == zero else zero)")
        add("            acc = zero")
        add("            div = zero")
        for k in range(K):
            add(f"            p{k} = v{k} * w{k}")
            add(f"            ok{k} = p{k} * sg > zero")
            add(f"            acc = acc + (p{k} if ok{k} else zero)")
            add(f"            div = div + (w{k} if ok{k} else zero)")
        add("            nz = _inc(nz, div != zero)")
        add("            if normalize:")
        add("                acc = acc / (one if div == zero else div)")
        add("            o[j] = acc")
        add("            " + _bad_src("c", "_nf(t) + _nf(acc)", dare))
    lines += _bytes_src(("pt", "q32"), *([("pw", "w32")] if windows else [])) + [_FLAG_01]
    add("    return bad, np.int64(nz), (q0, q1, q2, q3), (q4, q5, q6, q7), np.int64(cw)")
    return "\n".join(lines) + "\n"


@_jit
def _pairs_of(h4, K):
    """The kept pairs of K models (counts[a][b], a <= b) from the pieces' byte histograms."""
    hist = np.zeros(256, np.int64)
    _add_parts(hist, h4)
    return _hist_pairs(hist, K)


@_jit
def _weighted(ws, K):
    """Whether a weight of the first K models is not 1 (x * 1 == x: one flag serves all models)."""
    w = False
    for k in range(K):
        w |= ws[k] != 1.0
    return w


@_jit
def _models_piece(p, T, phase, base, raws, dare, modes, thrs, alls, lefts, masks, ds, ws, weighted, consensus,
                  normalize, out, oraw, sc, emit, band, before, before2, seen, seen2, h4, res):
    """Piece p of T of _merge_models (serial: run by :func:`_run_pieces`). Phase 0: the ties before it, into
    before[p + 1] and before2[p + 1]; phase 1: _merge_piece from its ties before (seen[p] = before[p]), its
    (non-finite flag, nonzeros, non-finite output flag) into res[p]."""
    # the arguments borrowed: the caller holds them (see _unref)
    base, raws, modes, alls, lefts = _unref(base), _unref(raws), _unref(modes), _unref(alls), _unref(lefts)
    masks, ds, ws, out, oraw, sc = _unref(masks), _unref(ds), _unref(ws), _unref(out), _unref(oraw), _unref(sc)
    band, before, before2, seen, seen2 = _unref(band), _unref(before), _unref(before2), _unref(seen), _unref(seen2)
    h4, res = _unref(h4), _unref(res)
    K = len(raws)
    lo, hi = _piece(base.shape[0], p, T, 4096)
    if phase == 0:
        a, b = _ties_before(base, raws, lo, hi, modes, thrs, alls, band)
        for k in range(K):
            before[p + 1, k] = a[k]
            before2[p + 1, k] = b[k]
        return
    for k in range(K):
        seen[p, k] = before[p, k]
        seen2[p, k] = before2[p, k]
    b, z, bo = _merge_piece(base, raws, lo, hi, dare, modes, thrs, alls, lefts, seen[p], masks, ds, ws, weighted,
                            consensus, normalize, out, h4[4 * p:4 * p + 4], oraw, sc, emit, band, seen2[p])
    res[p, 0] = b
    res[p, 1] = z
    res[p, 2] = bo


def _merge_models(base, raws, dare, modes, thrs, alls, lefts, masks, ds, ws, consensus, normalize, out, oraw, sc,
                  emit, band):
    """topk_merge_raw (dare False) and dare_merge_raw (dare True) in one loop, so each model count and dtype is
    compiled once for both: the pieces run _merge_piece on the calling thread and the pool's (see _run_pieces);
    for a top-k merge whose quota splits the ties at a threshold, each piece first learns the ties before it.
    Returns (non-finite flag, nonzeros of the result, ties at each model's threshold, kept pairs (counts[a][b],
    a <= b: both models a and b kept), non-finite output flag (`emit`: the output chunk written to oraw as it
    goes, see _emit), ties at each model's second threshold (`band`, Breadcrumbs: see _merge_piece; zeros
    without)))."""
    K = len(raws)
    n = base.shape[0]
    T = _n_pieces(n, 4096)
    before = np.zeros((T + 1, K), np.int64)
    before2 = np.zeros((T + 1, K), np.int64)
    seen = np.zeros((T, K), np.int64)
    seen2 = np.zeros((T, K), np.int64)
    h4 = np.zeros((4 * T, 256), np.int64)
    res = np.zeros((T, 3), np.int64)
    weighted = _weighted(ws, K)
    args = (base, raws, dare, modes, thrs, alls, lefts, masks, ds, ws, weighted, consensus, normalize, out, oraw,
            sc, emit, band, before, before2, seen, seen2, h4, res)
    # a quota of ties that can run out inside this chunk: each piece counts the ties before it
    need = not dare and (_quota_ends(modes, alls, lefts, before[0], n)
                         or (band is not None and _quota_ends(band[0], band[2], band[3], before2[0], n)))
    if need and T > 1:
        _run_pieces(_models_piece, T, 0, args)
        np.cumsum(before, axis=0, out=before)
        np.cumsum(before2, axis=0, out=before2)
    _run_pieces(_models_piece, T, 1, args)
    ties = (seen - before[:T]).sum(axis=0)
    ties2 = (seen2 - before2[:T]).sum(axis=0)
    return res[:, 0].sum(), res[:, 1].sum(), ties, _pairs_of(h4, K), res[:, 2].sum(), ties2


def topk_merge_raw(base, raws, modes, thrs, alls, lefts, ws, consensus, normalize, out, oraw, sc, emit, band=None):
    """magnitude (consensus False: out = sum_k w_k * prune_k(tau_k)) or TIES (consensus: the sign of that sum
    elected, out = the disjoint (weighted) mean of the agreeing pruned tau_k, normalized when `normalize`) over
    every model's chunk at once, tau_k = float32(raws[k]) - base never stored; prune_k is model k's TopK
    selection (modes/thrs/alls/lefts as topk_prune's, ties by lower index). Bitwise as topk_prune, accumulate,
    agree and ties_finish model after model: the same float32 operations in the same order. `band` (Breadcrumbs):
    each model's second TopK as arrays (modes, thresholds, all ties, ties left), an element kept only where the
    first keeps it and the second does not, bitwise as band_prune. Returns _merge_models's (non-finite flag,
    nonzeros, ties per model, kept pairs, non-finite output flag, ties at the second thresholds)."""
    k = len(raws)
    return _merge_models(base, raws, False, modes, thrs, alls, lefts, np.zeros((1, 1), np.uint8), np.zeros(k), ws,
                         consensus, normalize, out, oraw, sc, emit, band)


# --------------------------------------------------------------------------------------------- top-k, thresholds deferred
# Magnitude, TIES and breadcrumbs without the scan's pass over every model: a sample names a window of |tau| each
# model's k-th largest falls in (kernels.bucket_windows; breadcrumbs: a second one for its top); the one pass
# merges with each model keeping what lies above its window (breadcrumbs: and below its top's) and stores every
# position where some model's |tau| lies in a window (the base's and every model's raw element there); the stored
# elements and the counts above the windows give the exact thresholds (the same radix select), and the stored
# positions are merged again with them, through _combine_block (the fused loop's float32 operations in its
# order: bitwise the two-pass merge).


def _folded(tv2, los, wds, los2, wds2, his2, pp):
    """(wl, ww, pw) for the fused loop to mark the windows itself: (los, wds, pp) for magnitude and TIES (tv2
    None), ((los, los2, his2), (wds, wds2), pp) for Breadcrumbs (its two windows marked, and its elements above
    the top's window counted, in the same loop: see _fused_src)."""


@overload(_folded)
def _folded_impl(tv2, los, wds, los2, wds2, his2, pp):
    if isinstance(tv2, types.NoneType):
        return lambda tv2, los, wds, los2, wds2, his2, pp: (los, wds, pp)
    return lambda tv2, los, wds, los2, wds2, his2, pp: ((los, los2, his2), (wds, wds2), pp)


def _above(tv2, packed2, ab):
    """ab[k] += model k's elements above its top's window, the fused loop's second packed counts (Breadcrumbs;
    nothing for tv2 None)."""


@overload(_above)
def _above_impl(tv2, packed2, ab):
    if isinstance(tv2, types.NoneType):
        return lambda tv2, packed2, ab: None

    def add(tv2, packed2, ab):
        for k in range(ab.shape[0]):
            ab[k] += _unpack(packed2, k)
    return add


@intrinsic
def _marks64(typingctx, q, o, bits):
    """The 64 bits of (q[o + i] & bits) != 0 for i < 64 (a contiguous uint8 row): one vector compare. No bounds
    check: the caller's row holds q[o:o + 64]."""
    if not (_c_rows(q) and q.dtype == types.uint8 and bits == types.uint8):
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir

        i8 = ir.IntType(8)
        v8 = ir.VectorType(i8, 64)
        qa = context.make_array(signature.args[0])(context, builder, args[0])
        x = builder.load(_ptr(builder, qa, context.cast(builder, args[1], signature.args[1], types.int64), v8), align=1)
        m = builder.icmp_unsigned("!=", builder.and_(x, _splat(builder, args[2], v8)),
                                  ir.Constant(v8, [ir.Constant(i8, 0)] * 64))
        return builder.bitcast(m, ir.IntType(64))
    return types.uint64(q, o, bits), codegen


@intrinsic
def _tz(typingctx, x):
    """The trailing zero bits of a nonzero uint64 (llvm.cttz: one instruction where the CPU has it), as int64."""
    if x != types.uint64:
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir

        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 1))
    return types.int64(x), codegen


def _compress_call(context, builder, vec, mask, lanes: int, bits: int):
    """vec's lanes whose mask bit is set, moved to the low lanes in order, the rest zero (llvm.x86 compress:
    vpcompress into a register)."""
    from llvmlite import ir
    from numba.core import cgutils

    vt = ir.VectorType(ir.IntType(bits), lanes)
    fnty = ir.FunctionType(vt, [vt, vt, ir.VectorType(ir.IntType(1), lanes)])
    fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.x86.avx512.mask.compress.v{lanes}i{bits}")
    return builder.call(fn, [vec, ir.Constant(vt, None), mask])


def _compress_parts(context, builder, m, dst, do, lanes: int, part):
    """Store part(p) compressed by its 64 / lanes bits of the uint64 mask m, for each part p of 64 / lanes, whole
    (lanes elements) at dst's element do + the set bits of the parts before it (dst: a numba array struct)."""
    from llvmlite import ir

    i32, i64 = ir.IntType(32), ir.IntType(64)
    mask = builder.bitcast(m, ir.VectorType(ir.IntType(1), 64))
    for p in range(64 // lanes):
        sub = builder.shuffle_vector(mask, mask, ir.Constant(ir.VectorType(i32, lanes), list(range(p * lanes,
                                                                                                   (p + 1) * lanes))))
        packed = part(p, sub)
        builder.store(packed, _ptr(builder, dst, do, packed.type), align=1)
        if p < 64 // lanes - 1:
            do = builder.add(do, builder.zext(builder.ctpop(builder.bitcast(sub, ir.IntType(lanes))), i64))


@intrinsic
def _packed64(typingctx, src, so, m, dst, do):
    """dst[do:do + popcount(m)] = the elements src[so + i] (i < 64) whose bit i of m is set, in order (rows of the
    same 8-, 16- or 32-bit dtype): compressed in vector registers (needs AVX-512 VBMI2 for 8 and 16 bits), each
    512-bit part stored whole, so dst[do:do + 64] is written (beyond the count: zeros or the next part). No bounds
    check: the caller's rows hold src[so:so + 64] and dst[do:do + 64]; dst may be typed non-contiguous (a row of a
    column slice), its elements adjacent all the same (the caller checks)."""
    if not (_c_rows(src) and _flat_rows(dst) and src.dtype == dst.dtype and src.dtype.bitwidth in (8, 16, 32)
            and m == types.uint64):
        return None
    bits = src.dtype.bitwidth
    lanes = 512 // bits

    def codegen(context, builder, signature, args):
        from llvmlite import ir

        vt = ir.VectorType(ir.IntType(bits), lanes)
        sa = context.make_array(signature.args[0])(context, builder, args[0])
        da = context.make_array(signature.args[3])(context, builder, args[3])
        so = context.cast(builder, args[1], signature.args[1], types.int64)

        def part(p, sub):
            at = builder.add(so, ir.Constant(ir.IntType(64), p * lanes))
            return _compress_call(context, builder, builder.load(_ptr(builder, sa, at, vt), align=1), sub, lanes,
                                  bits)
        _compress_parts(context, builder, args[2], da, context.cast(builder, args[4], signature.args[4], types.int64),
                        lanes, part)
        return context.get_dummy_value()
    return types.void(src, so, m, dst, do), codegen


@intrinsic
def _iota64(typingctx, first, m, dst, do):
    """dst[do:do + popcount(m)] = first + i for the bits i (< 64) set in m, in order (an int32 row; first + 63 below
    2^31), as _packed64 (dst[do:do + 64] written). No bounds check."""
    if not (_c_rows(dst) and dst.dtype == types.int32 and m == types.uint64 and isinstance(first, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir

        i32 = ir.IntType(32)
        vt = ir.VectorType(i32, 16)
        f = builder.trunc(context.cast(builder, args[0], signature.args[0], types.int64), i32)
        fs = _splat(builder, f, vt)

        def part(p, sub):
            return _compress_call(context, builder, builder.add(fs, ir.Constant(vt, list(range(16 * p, 16 * p + 16)))),
                                  sub, 16, 32)
        _compress_parts(context, builder, args[1], context.make_array(signature.args[2])(context, builder, args[2]),
                        context.cast(builder, args[3], signature.args[3], types.int64), 16, part)
        return context.get_dummy_value()
    return types.void(first, m, dst, do), codegen


@_jit
def _list_marked(q, bits, idx):
    """idx[:c] = the positions j of q (uint8 marks) with q[j] & bits nonzero, in order; returns c (deferred pass:
    the positions in a window; deferred select: a model's entries). 64 marks at a time as the bits of one
    compare (_marks64), their set bits walked; the tail branch-free. 2048-byte blocks, one thread, against a
    branch-free loop over every byte: 1 % marked 0.275 -> 0.119 ns per byte, 4 % 0.274 -> 0.179, 10 % 0.268 ->
    0.21, 30 % 0.286 -> 0.318."""
    c = 0
    n64 = q.shape[0] // 64
    for i in range(n64):
        m = _marks64(q, 64 * i, bits)
        while m != np.uint64(0):
            idx[c] = 64 * i + _tz(m)
            c += 1
            m &= m - np.uint64(1)
    for j in range(n64 * 64, q.shape[0]):
        idx[c] = j
        c += (q[j] & bits) != np.uint8(0)
    return c


@_jit_once
def _deferred_piece(base, raws, lo, hi, tv, tf, dv, wv, consensus, normalize, out, h4, oraw, sc, emit, los, wds,
                    los2, wds2, his2, ab, tv2, tf2, pos, pat, vals, m, cap):
    """topk_merge_deferred's pass over [lo, hi): each block merged by the fused loop with the provisional
    thresholds (tv, every tie kept; Breadcrumbs: not from tv2 on either), which marks the models in their windows
    (Breadcrumbs: either window, and ab[k] += model k's elements above the top's window), then those positions
    stored from index m on (pos, pat: the models in their windows, vals: rows of the base's then each model's
    raw elements).
    Returns (non-finite flag, nonzeros, non-finite output flag, end of the stored entries, or -1 past `cap`). With
    `emit` the output is written block by block and out is not touched."""
    pt = np.empty(_BLOCK, np.uint8)
    pp = np.empty(_BLOCK, np.uint8)
    idx = np.empty(_BLOCK, np.int64)
    ob = np.empty(_BLOCK, np.float32)  # the merged block where the output is written (out is not touched)
    s32 = np.empty((2, _BLOCK), np.uint32)  # _fused_span's marks
    wl, ww, pw = _folded(tv2, los, wds, los2, wds2, his2, pp)  # once: a tuple of arrays made per block counts them
    bad = 0
    nz = 0
    bo = 0
    for s in range(lo, hi, _BLOCK):
        e = min(hi, s + _BLOCK)
        L = e - s
        rs = _slices(raws, s, e)
        dst = _span(ob, 0, L) if emit else _span(out, s, e)
        b, z, _, packed2, c = _fused_span(_span(base, s, e), rs, None, tv, tf, dv, wv, consensus, normalize, dst,
                                          _span(pt, 0, L), tv2, tf2, wl, ww, pw, s32)
        _above(tv2, packed2, ab)
        _count_bytes(_span(pt, 0, L), h4)
        bad += b
        nz += z
        if emit:
            bo += _emit_span(_span(oraw, s, e), _span(base, s, e), dst, sc)
        if c == 0:
            continue
        m = _store_marked(_span(pp, 0, L), _unref(idx), s, base, rs, pos, pat, vals, m, cap)  # those in a window
        if m < 0:
            return bad, nz, bo, -1
    return bad, nz, bo, m


def _store_marked(pp, idx, s, base, rs, pos, pat, vals, m, end):
    """The positions of the block at s that pp marks (any bit) stored as entries from index m on: pat[m] = the
    marks, vals[:, m] = the base's then each model's raw element, pos[m] = the position (pos None: not stored).
    Returns the entries' new end, or -1 where they would pass `end`: the marks' own count decides, so the stores
    stay inside the piece's share whatever the loop counted (slots from the returned end on may hold leftovers).
    Where numba's target has AVX-512 VBMI2, 64 positions at a time compressed in vector registers
    (_store_packed), else listed and copied one by one (_store_listed): chosen when compiled."""


@overload(_store_marked)
def _store_marked_impl(pp, idx, s, base, rs, pos, pat, vals, m, end):
    if numba_target_has("avx512f", "avx512bw", "avx512vbmi2"):
        return lambda pp, idx, s, base, rs, pos, pat, vals, m, end: _store_packed(pp, idx, s, base, rs, pos, pat, vals,
                                                                                  m, end)
    return lambda pp, idx, s, base, rs, pos, pat, vals, m, end: _store_listed(pp, idx, s, base, rs, pos, pat, vals, m,
                                                                              end)


@_jit
def _store_listed(pp, idx, s, base, rs, pos, pat, vals, m, end):
    """_store_marked through the listed positions (_list_marked), copied one by one."""
    hits = _list_marked(pp, np.uint8(0xFF), idx)
    if m + hits > end:
        return -1
    for i in range(hits):
        _store_entry(idx[i], s, pp, base, rs, pos, pat, vals, m)
        m += 1
    return m


@_jit
def _store_entry(j, s, pp, base, rs, pos, pat, vals, m):
    """Position j of the block at s stored as entry m (see _store_marked)."""
    if pos is not None:
        pos[m] = s + j
    pat[m] = pp[j]
    vals[0, m] = base[s + j]
    for k in range(len(rs)):
        vals[1 + k, m] = rs[k][j]


@_jit
def _store_packed(pp, idx, s, base, rs, pos, pat, vals, m, end):
    """_store_marked 64 positions at a time: their marks as the bits of one compare (_marks64), then each row's
    marked elements compressed in registers and stored whole (_packed64, _iota64: room for 64 from m needed),
    the entries advancing by the bits' count; positions within 64 of `end`, and the block's tail, one by one. In
    the deferred pass (one thread, 2^24 elements x 4 bf16 models, 4.5 % of them entries): 0.35 -> 0.2 ns per
    element for the stores, the listing included. Rows of vals whose elements are not adjacent (never here):
    listed."""
    if vals.strides[1] != vals.itemsize:
        return _store_listed(pp, idx, s, base, rs, pos, pat, vals, m, end)
    n64 = pp.shape[0] // 64
    for i in range(n64):
        mm = _marks64(pp, 64 * i, np.uint8(0xFF))
        if mm == np.uint64(0):
            continue
        if m + 64 > end:
            m = _store_one_by_one(pp, 64 * i, 64 * i + 64, s, base, rs, pos, pat, vals, m, end)
            if m < 0:
                return -1
            continue
        if pos is not None:
            _iota64(s + 64 * i, mm, pos, m)
        _packed64(pp, 64 * i, mm, pat, m)
        _packed64(base, s + 64 * i, mm, _rowspan(vals, 0, 0, vals.shape[1]), m)
        for k in range(len(rs)):
            _packed64(rs[k], 64 * i, mm, _rowspan(vals, 1 + k, 0, vals.shape[1]), m)
        m += _popc(mm)
    return _store_one_by_one(pp, 64 * n64, pp.shape[0], s, base, rs, pos, pat, vals, m, end)


@_jit
def _store_one_by_one(pp, a, b, s, base, rs, pos, pat, vals, m, end):
    """The marked positions of pp[a:b] stored as _store_marked's entries, one by one; -1 past `end`."""
    for j in range(a, b):
        if pp[j] != np.uint8(0):
            if m >= end:
                return -1
            _store_entry(j, s, pp, base, rs, pos, pat, vals, m)
            m += 1
    return m


def topk_merge_deferred(base, raws, tv, los, wds, los2, wds2, his2, tv2, tf2, ws, consensus, normalize, out, oraw, sc,
                        emit, pos, pat, vals, done=None):
    """The provisional pass (see above): the pieces (on threads: _run_pieces) each store their entries in their share of
    pos/pat/vals. tv2, tf2: Breadcrumbs' provisional top (None for magnitude and TIES), los2/wds2 its window,
    his2 its end; `done(lo, hi)`, where given, with each piece's range as it ends (_releasing). Returns (non-finite flag, nonzeros, the kept-model bits' histogram (256), the pieces' first
    entries, their ends (-1: a piece's share overflowed), non-finite output flag, each model's elements above
    its top's window)."""
    K = len(raws)
    T = _n_pieces(base.shape[0], 4096)
    cap = pos.shape[0]
    wv = np.asarray(ws[:K], np.float32) if _weighted(ws, K) else np.ones(K, np.float32)
    h4 = np.zeros((4 * T, 256), np.int64)
    res = np.zeros((T, 4), np.int64)
    ab = np.zeros((T, K), np.int64)
    starts = np.array([cap * p // T for p in range(T)], np.int64)
    _run_pieces(_deferred_piece_of, T, 0, (base, raws, tv, np.ones(K, np.bool_), np.ones(K, np.float32), wv,
                                           consensus, normalize, out, h4, oraw, sc, emit, los, wds, los2, wds2, his2,
                                           ab, tv2, tf2, pos, pat, vals, cap, res),
                _releasing(done, base.shape[0], T, 4096))
    return (res[:, 0].sum(), res[:, 1].sum(), h4.sum(axis=0), starts, res[:, 3].copy(), res[:, 2].sum(),
            ab.sum(axis=0))


@_jit
def _deferred_piece_of(p, T, phase, base, raws, tv, tf, dv, wv, consensus, normalize, out, h4, oraw, sc, emit, los,
                       wds, los2, wds2, his2, ab, tv2, tf2, pos, pat, vals, cap, res):
    """Piece p of T of topk_merge_deferred (serial, run by _run_pieces): _deferred_piece over its elements into its
    share of the entries, its (non-finite flag, nonzeros, non-finite output flag, end of its entries) into
    res[p]."""
    # the arguments borrowed: the caller holds them (see _unref)
    base, raws, tv, tf, dv, wv = _unref(base), _unref(raws), _unref(tv), _unref(tf), _unref(dv), _unref(wv)
    out, h4, oraw, sc, los, wds = _unref(out), _unref(h4), _unref(oraw), _unref(sc), _unref(los), _unref(wds)
    los2, wds2, his2, ab, tv2, tf2 = _unref(los2), _unref(wds2), _unref(his2), _unref(ab), _unref(tv2), _unref(tf2)
    pos, pat, vals, res = _unref(pos), _unref(pat), _unref(vals), _unref(res)
    lo, hi = _piece(base.shape[0], p, T, 4096)
    b, z, bo, m = _deferred_piece(base, raws, lo, hi, tv, tf, dv, wv, consensus, normalize, out, h4[4 * p:4 * p + 4],
                                  oraw, sc, emit, los, wds, los2, wds2, his2, ab[p], tv2, tf2, pos, pat, vals,
                                  cap * p // T, cap * (p + 1) // T)
    res[p, 0] = b
    res[p, 1] = z
    res[p, 2] = bo
    res[p, 3] = m


def deferred_select(vals, pat, starts, ends, los, wds, ks, above):
    """The k-th largest |tau| in each window j from the stored entries with its model's bit (model j % K of the
    K models of vals; Breadcrumbs: a second window per model, its top's, from j = K on, above the first) and the
    count above the window: above[j], plus for a first window the entries in the model's second one. The models
    in parallel (one piece each: _run_pieces), one pass over the entries each: (threshold bits, elements above
    it, elements equal to it, whether every k was inside its window)."""
    J = los.shape[0]
    K = vals.shape[0] - 1
    thr = np.zeros(J, np.uint32)
    gt = np.zeros(J, np.int64)
    eq = np.zeros(J, np.int64)
    found = np.zeros(J, np.bool_)
    _run_pieces(_select_piece, K, 0, (vals, pat, starts, ends, los, wds, ks, above, thr, gt, eq, found))
    return thr, gt, eq, bool(found.all())


@_jit
def _select_piece(k, T, phase, vals, pat, starts, ends, los, wds, ks, above, thr, gt, eq, found):
    """Model k's windows of deferred_select (its entries j = k and, with a band, K + k, of the outputs). Block by
    block of entries, the model's own entries are first listed branch-free (idx), then counted, instead of a branch
    on its bit per entry, taken for about a quarter of them with 4 models (mispredicted: our inference; measured,
    0.93M entries of 4 models' windows on 2^24 elements, one thread: 0.73 -> 0.29 ns per element of the tensor).
    With a band (Breadcrumbs: two windows per model) the listed entries' |tau| bits are read first in a loop of
    their own, which vectorises, then counted: on the benchmark's largest tensor (3.47M entries, 2 threads)
    10.3-10.6 -> 8.0-8.3 ms; with one window (magnitude, TIES) that split was slower (5.4-6.1 -> 6.2-6.6 ms)."""
    # the arguments borrowed: the caller holds them (see _unref)
    vals, pat, starts, ends, los = _unref(vals), _unref(pat), _unref(starts), _unref(ends), _unref(los)
    wds, ks, above, thr, gt, eq = _unref(wds), _unref(ks), _unref(above), _unref(thr), _unref(gt), _unref(eq)
    found = _unref(found)
    J = los.shape[0]
    K = T
    band = J > K
    W = np.int64(wds[k])
    W2 = np.int64(wds[K + k]) if band else np.int64(1)
    h = np.zeros(W, np.int32)
    h2 = np.zeros(W2, np.int32)
    lo, wd = los[k], wds[k]
    lo2 = los[K + k] if band else np.uint32(0)
    wd2 = wds[K + k] if band else np.uint32(0)
    in2 = 0
    bit = np.uint8(1 << k)
    idx = np.empty(_BLOCK, np.int32)
    ub = np.empty(_BLOCK, np.uint32)
    for p in range(starts.shape[0]):
        xs = _rowspan(vals, 1 + k, starts[p], ends[p])
        bs = _rowspan(vals, 0, starts[p], ends[p])
        ps = _span(pat, starts[p], ends[p])
        for s in range(0, ps.shape[0], _BLOCK):
            c = _list_marked(_span(ps, s, min(ps.shape[0], s + _BLOCK)), bit, _unref(idx))
            if not band:
                for i in range(c):
                    e = s + idx[i]
                    d = _f32_as_u32(abs(as_f32(xs, e) - as_f32(bs, e))) - lo
                    if d < wd:
                        h[d] += 1
                continue
            xb = _span(xs, s, xs.shape[0])
            bb = _span(bs, s, bs.shape[0])
            for i in range(c):  # the bits first: vectorised
                e = idx[i]
                ub[i] = _f32_as_u32(abs(as_f32(xb, e) - as_f32(bb, e)))
            for i in range(c):
                u = ub[i]
                d = u - lo
                if d < wd:
                    h[d] += 1
                else:
                    d2 = u - lo2
                    if d2 < wd2:
                        h2[d2] += 1
                        in2 += 1
    _walk(h, ks[k] - above[k] - in2, above[k] + in2, lo, k, thr, gt, eq, found)
    if band:
        _walk(h2, ks[K + k] - above[K + k], above[K + k], lo2, K + k, thr, gt, eq, found)


@_jit
def _walk(h, need, up, lo, j, thr, gt, eq, found):
    """The need-th largest of a window's histogram h (first bit pattern lo; `up` elements above the window) into
    slot j of thr, gt, eq and found (left False where need <= 0 or the window holds fewer)."""
    c = 0
    for d in range(h.shape[0] - 1, -1, -1):
        if need <= 0:
            return
        if c + h[d] >= need:
            thr[j] = lo + np.uint32(d)
            gt[j] = up + c
            eq[j] = h[d]
            found[j] = True
            return
        c += h[d]


def deferred_fix(vals, pos, starts, ends, his, tops, thr, alls, lefts, thr2, alls2, lefts2, ws, consensus, normalize,
                 out, oraw, sc, emit):
    """The stored positions merged again with the exact thresholds (thr: float32 per model; a tie kept where
    alls[k], else the first lefts[k] in position order; Breadcrumbs: minus its top, thr2/alls2/lefts2 alike, None
    otherwise), block by block of entries: each block's provisional merge (|tau| bits >= his[k] kept, and below
    tops[k]) and its exact one, both through _combine_block, the difference of their kept bits and nonzeros taken
    into the counts, and out[pos] (or the output element, `emit`) rewritten where a model's choice may have
    changed (elsewhere the pass's result stands). The pieces on threads (_run_pieces), each told the ties before
    it. Returns (non-finite flag of the new results, nonzeros gained, the kept-bits histogram's change (256),
    non-finite output flag)."""
    K = his.shape[0]
    T = starts.shape[0]
    tv = thr.astype(np.float32)
    tv2, al2 = (tv, alls) if thr2 is None else (thr2.astype(np.float32), alls2)
    before = np.zeros((T + 1, K), np.int64)
    before2 = np.zeros((T + 1, K), np.int64)
    minus = np.zeros((4 * T, 256), np.int64)
    plus = np.zeros((4 * T, 256), np.int64)
    res = np.zeros((T, 3), np.int64)
    args = (vals, pos, starts, ends, his, tops, tv, alls, lefts, thr2, tv2, al2, lefts2, ws, _weighted(ws, K),
            consensus, normalize, out, oraw, sc, emit, before, before2, minus, plus, res)
    _run_pieces(_fix_piece, T, 0, args)
    np.cumsum(before, axis=0, out=before)
    np.cumsum(before2, axis=0, out=before2)
    _run_pieces(_fix_piece, T, 1, args)
    change = (plus - minus).sum(axis=0)
    return res[:, 0].sum(), res[:, 1].sum(), change, res[:, 2].sum()


@_jit
def _fix_piece(p, T, phase, vals, pos, starts, ends, his, tops, tv, alls, lefts, thr2, tv2, al2, lefts2, ws, weighted,
               consensus, normalize, out, oraw, sc, emit, before, before2, minus, plus, res):
    """Piece p of T of deferred_fix (serial, run by _run_pieces). Phase 0: its ties into before[p + 1] (and
    before2[p + 1]); phase 1: its blocks merged again from the ties before it, its (non-finite flag, nonzeros
    gained, non-finite output flag) into res[p]."""
    # the arguments borrowed: the caller holds them (see _unref)
    vals, pos, starts, ends, his = _unref(vals), _unref(pos), _unref(starts), _unref(ends), _unref(his)
    tops, tv, alls, lefts, tv2 = _unref(tops), _unref(tv), _unref(alls), _unref(lefts), _unref(tv2)
    al2, lefts2, ws, out, oraw, sc = _unref(al2), _unref(lefts2), _unref(ws), _unref(out), _unref(oraw), _unref(sc)
    before, before2, minus, plus, res = _unref(before), _unref(before2), _unref(minus), _unref(plus), _unref(res)
    K = his.shape[0]
    if phase == 0:
        _entry_ties(vals, starts[p], ends[p], tv, alls, before[p + 1])
        if thr2 is not None:
            _entry_ties(vals, starts[p], ends[p], tv2, al2, before2[p + 1])
        return
    seen = before[p].copy()
    seen2 = before2[p].copy()
    tb = np.empty((K, _BLOCK), np.float32)
    tb2 = np.empty((K, _BLOCK), np.float32)
    ch = np.empty(_BLOCK, np.uint8)
    o = np.empty(_BLOCK, np.float32)
    scr = np.empty((3, _BLOCK), np.float32)
    pt = np.empty(_BLOCK, np.uint8)
    mp, pp = minus[4 * p:4 * p + 4], plus[4 * p:4 * p + 4]  # the piece's rows, taken once
    for s in range(starts[p], ends[p], _BLOCK):
        L = min(ends[p], s + _BLOCK) - s
        _entry_rows(vals, s, L, his, tops, tv, alls, lefts, _unref(seen), _unref(tb), _unref(tb2), _unref(ch))
        if thr2 is not None:
            _entry_top(vals, s, L, tv2, al2, lefts2, _unref(seen2), _unref(tb2), _unref(ch))
        _, z1 = _combine_block(_unref(tb), L, ws, weighted, consensus, normalize, _unref(o), _unref(pt), mp,
                               _unref(scr))
        b2, z2 = _combine_block(_unref(tb2), L, ws, weighted, consensus, normalize, _unref(o), _unref(pt), pp,
                                _unref(scr))
        res[p, 0] += b2
        res[p, 1] += z2 - z1
        res[p, 2] = max(res[p, 2], _entry_store(_rowspan(vals, 0, s, s + L), _span(pos, s, s + L), _unref(o),
                                                _unref(ch), out, oraw, sc, emit))


@_jit
def _entry_ties(vals, a, b, tv, alls, out):
    """out[k] = the entries [a, b) whose |tau| of model k equals tv[k], for the models that keep some ties only."""
    bs = _rowspan(vals, 0, a, b)
    for k in range(tv.shape[0]):
        if not alls[k]:
            xs = _rowspan(vals, 1 + k, a, b)
            t = tv[k]
            c = np.int32(0)
            for i in range(b - a):  # over slices from 0: vectorised (a range(a, b) over the rows was not)
                c = _inc(c, abs(as_f32(xs, i) - as_f32(bs, i)) == t)
            out[k] = c


@_jit
def _entry_rows(vals, s, L, his, tops, tv, alls, lefts, seen, tb, tb2, ch):
    """Rows of the entries [s, s + L): tb[k] model k's tau where the pass kept it (bits >= his[k] and below
    tops[k]), tb2[k] where the exact threshold keeps it (every tie where alls[k], else the first lefts[k] -
    seen[k]; seen advances), ch[i] whether a model's choice changed (Breadcrumbs' top is taken out of tb2 after:
    ch stays set where only it undoes a change, and the position is merely written again)."""
    zero = np.float32(0.0)
    bs = _rowspan(vals, 0, s, s + L)
    for i in range(L):
        ch[i] = np.uint8(0)
    for k in range(his.shape[0]):
        xs = _rowspan(vals, 1 + k, s, s + L)
        h = his[k]
        top = tops[k]
        t = tv[k]
        al = alls[k]
        nt = 0
        for i in range(L):  # vectorised: every tie kept where al, else none (the quota below)
            x = as_f32(xs, i) - as_f32(bs, i)
            a = abs(x)
            u = _f32_as_u32(a)
            old = (u >= h) & (u < top)
            keep = (a > t) | (al & (a == t))
            tb[k, i] = x if old else zero
            tb2[k, i] = x if keep else zero
            ch[i] |= np.uint8(keep != old)
            nt += a == t
        if not al:  # the first lefts[k] ties in position order
            _quota_ties(xs, bs, L, t, lefts[k] - seen[k], nt, tb2[k], ch, True)
            seen[k] += nt


@_jit
def _entry_top(vals, s, L, tv2, alls2, lefts2, seen2, tb2, ch):
    """Breadcrumbs: tb2[k] = 0 where model k's top keeps the entry (|tau| > tv2[k], or a tie: every one where
    alls2[k], else the first lefts2[k] - seen2[k]; seen2 advances). ch (_entry_rows' changed marks) is left as
    it is."""
    zero = np.float32(0.0)
    bs = _rowspan(vals, 0, s, s + L)
    for k in range(tv2.shape[0]):
        xs = _rowspan(vals, 1 + k, s, s + L)
        t = tv2[k]
        al = alls2[k]
        nt = 0
        for i in range(L):
            a = abs(as_f32(xs, i) - as_f32(bs, i))
            tb2[k, i] = zero if (a > t) | (al & (a == t)) else tb2[k, i]
            nt += a == t
        if not al:
            _quota_ties(xs, bs, L, t, lefts2[k] - seen2[k], nt, tb2[k], ch, False)
            seen2[k] += nt


@_jit
def _quota_ties(xs, bs, L, t, left, nt, row, ch, keep):
    """The first `left` of the nt entries i < L whose |xs[i] - bs[i]| equals t, in order: row[i] = that tau and
    ch[i] = 1 (`keep`), or row[i] = 0 (not `keep`: Breadcrumbs' top drops them; ch unused). Every one of them
    (nt <= left) in one vectorised loop, none (left <= 0) without a loop, else the one block where the quota
    runs out entry by entry."""
    if nt == 0 or left <= 0:
        return
    zero = np.float32(0.0)
    if nt <= left:
        for i in range(L):
            x = as_f32(xs, i) - as_f32(bs, i)
            tie = abs(x) == t
            if keep:
                row[i] = x if tie else row[i]
                ch[i] |= np.uint8(tie)
            else:
                row[i] = zero if tie else row[i]
        return
    c = 0
    for i in range(L):
        x = as_f32(xs, i) - as_f32(bs, i)
        if abs(x) == t:
            if c < left:
                row[i] = x if keep else zero
                if keep:
                    ch[i] = np.uint8(1)
            c += 1


@_jit
def _entry_store(bs, ps, o, ch, out, oraw, sc, emit):
    """The new results o of the changed entries (ch) stored at their positions ps: out[p] = o, or with `emit` the
    output element as _emit (bs: the entries' base elements; out is only scratch); the non-finite output flag."""
    bo = 0
    if emit:
        for i in range(ps.shape[0]):
            if ch[i]:
                bo = max(bo, np.int64(put(oraw, ps[i], as_f32(bs, i) + o[i] * sc)))
    else:
        for i in range(ps.shape[0]):
            if ch[i]:
                out[ps[i]] = o[i]
    return bo


@_jit
def pairs_of_hist(hist, K):
    """The kept pairs (counts[a][b], a <= b) from a kept-bits histogram."""
    return _hist_pairs(hist, K)


# --------------------------------------------------------------------------------------------- DARE in one pass


def dare_masks(mts, poss, thrs, masks):
    """Each model's DARE keep mask of the chunk from its own MT19937 stream (row k of mts, position poss[k]), the
    models' streams in parallel (one piece each: _run_pieces); a model with thrs[k] < 0 draws nothing (p = 0)."""
    _run_pieces(_mask_piece, mts.shape[0], 0, (mts, poss, thrs, masks))


@_jit
def _mask_piece(k, T, phase, mts, poss, thrs, masks):
    """Model k's mask of dare_masks."""
    # the arguments borrowed: the caller holds them (see _unref)
    mts, poss, thrs, masks = _unref(mts), _unref(poss), _unref(thrs), _unref(masks)
    if thrs[k] >= 0:
        _mt_walk(masks[k], mts[k], poss[k:k + 1], thrs[k], False)


def dare_merge_raw(base, raws, masks, ds, ws, consensus, normalize, out, oraw, sc, emit):
    """DARE (consensus False) or DARE-TIES over every model's chunk at once: tau_k = float32(raws[k]) - base,
    divided by ds[k] = float32(1 - p_k) and zeroed where masks[k] is 0 (ds[k] = 0: p_k = 0, tau_k as is), then
    combined as topk_merge_raw. Bitwise as dare_tensor, accumulate, agree and ties_finish model after model.
    Returns _merge_models's (non-finite flag, nonzeros, ties (none), kept pairs, non-finite output flag)."""
    k = len(raws)
    z = np.zeros(k, np.int64)
    return _merge_models(base, raws, True, z, np.zeros(k), np.zeros(k, np.bool_), z, masks, ds, ws, consensus,
                         normalize, out, oraw, sc, emit, None)[:5]


# --------------------------------------------------------------------------------------------- n:m methods in one pass


def nm_merge_raw(base, raws, K, ns, ms, align, use_taken, pad_tail, ws, out, oraw, sc, emit):
    """CABS (use_taken: each model keeps its n:m among the slots no earlier model kept) or BS alone over every
    model's chunk at once: tau_k = float32(raws[k]) - base, model k's balanced ns[k]:ms[k] pruning as nm_prune,
    then out = sum_k tau_k * ws[k] over the models of nonzero weight, in model order (a zero-weight model takes
    its slots and adds nothing; at least one weight must be nonzero). Bitwise as nm_prune and accumulate model
    after model: the blocks are local, so a span of whole blocks (a multiple of `align`, the lcm of the ms) is
    pruned, summed and written (`emit`, see _emit) while it is in cache. Pieces of whole spans (_run_pieces).
    Returns (non-finite flag (nonzero: a task-vector element or sum is not finite), nonzeros of out, short
    blocks per model, kept pairs (counts[a][b], a <= b), non-finite output flag). `raws` holds MAX_ONE_PASS
    arrays, the first K the models' (the rest unused): one compiled loop for every model count (each count took
    13-25 s to compile, the networks' code optimised again in each)."""
    T = _n_pieces(base.shape[0], align)
    sb = max(align, _BLOCK // align * align)  # a span: whole blocks of every model
    h4 = np.zeros((4 * T, 256), np.int64)
    pairs = np.zeros((T, K, K), np.int64)
    res = np.zeros((T, 3), np.int64)
    shorts = np.zeros((T, K), np.int64)
    net = nm_net_of([ms[k] for k in range(K)], [ns[k] for k in range(K)])
    _run_pieces(_nm_piece, T, 0, (base, raws, K, align, sb, ns, ms, use_taken, pad_tail, ws, _weighted(ws, K), out,
                                  oraw, sc, emit, shorts, h4, pairs, res, net))
    return (res[:, 0].sum(), res[:, 1].sum(), shorts.sum(axis=0), _pairs_of(h4, K) + pairs.sum(axis=0),
            res[:, 2].sum())


@_jit
def _nm_piece(p, T, phase, base, raws, K, align, sb, ns, ms, use_taken, pad_tail, ws, weighted, out, oraw, sc, emit,
              shorts, h4, pairs, res, net):
    """Piece p of T of nm_merge_raw (serial, run by _run_pieces): its (non-finite flag, nonzeros, non-finite
    output flag) into res[p], its short blocks into shorts[p], its kept pairs into h4's rows or pairs[p]."""
    # the arguments borrowed: the caller holds them (see _unref)
    base, raws, ns, ms, ws, out = _unref(base), _unref(raws), _unref(ns), _unref(ms), _unref(ws), _unref(out)
    oraw, sc, shorts, h4, pairs = _unref(oraw), _unref(sc), _unref(shorts), _unref(h4), _unref(pairs)
    res = _unref(res)
    lo, hi = _piece(base.shape[0], p, T, align)
    b, z, bo = _nm_merge_piece(base, raws, K, lo, hi, sb, ns, ms, use_taken, pad_tail, ws, weighted, out, oraw, sc,
                               emit, shorts[p], h4[4 * p:4 * p + 4], pairs[p], net)
    res[p, 0] = b
    res[p, 1] = z
    res[p, 2] = bo


@_inlined
def _nm_merge_piece(base, raws, K, lo, hi, sb, ns, ms, use_taken, pad_tail, ws, weighted, out, oraw, sc, emit,
                    short, h4, pairs, net):
    """nm_merge_raw over [lo, hi), span by span: each model's tau in a scratch row, pruned by _nm_blocks in the
    models' order (one `taken` row for the span), then the overlap bits and the weighted sum row by row (every
    loop vectorises). Returns (non-finite count, nonzeros of the sum, non-finite output flag)."""
    tb = np.empty((K, sb), np.float32)
    taken = np.zeros(sb, np.bool_)
    keys = np.empty(max(ms.max(), _NM_ROW), np.int32)
    pat = np.empty(sb, np.uint8)
    nzm = np.empty((K, sb // 32 + 1), np.uint32)  # per model, the blocks' nonzero slots (blocks of 32: _nm_span32)
    ob = np.empty(sb, np.float32)  # the merged span where the output is written (out is not touched)
    zero = np.float32(0.0)
    one = np.float32(1.0)
    bad = 0
    nz = np.int32(0)
    bo = 0
    for s in range(lo, hi, sb):
        e = min(hi, s + sb)
        L = e - s
        tk = _span(taken, 0, L)
        if use_taken:
            for j in range(L):
                tk[j] = False
        for k in range(K):
            x = _rowspan(tb, k, 0, L)
            bad += _tau_block(_span(raws[k], s, e), _span(base, s, e), x)
            short[k] += _nm_blocks_of(net, x, 0, L, ns[k], ms[k], tk, use_taken, pad_tail, _unref(keys),
                                      _rowspan(nzm, k, 0, nzm.shape[1]))
        _nm_kept_of(net, _unref(tb), L, _unref(pat), h4, _unref(nzm), pairs)  # scratch rows borrowed (_unref)
        o = _span(ob, 0, L) if emit else _span(out, s, e)
        first = True
        for k in range(K):
            if ws[k] == 0.0:
                continue
            x = _rowspan(tb, k, 0, L)
            wk = np.float32(ws[k]) if weighted else one
            if first:
                for j in range(L):
                    o[j] = x[j] * wk
                first = False
            else:
                for j in range(L):
                    o[j] = o[j] + x[j] * wk
        c = np.int32(0)  # a span's count in 32 bits (bad, int64, also sums _tau_block's counts)
        for j in range(L):
            v = o[j]
            c = _inc(c, _bad(v))
            nz = _inc(nz, v != zero)
        bad += c
        if emit:
            bo += _emit_span(_span(oraw, s, e), _span(base, s, e), o, sc)
    return bad, nz, bo


# --------------------------------------------------------------------------------------------- CA-magnitude in one pass


def ca_merge_raw(base, raws, tv, ws, out, oraw, sc, emit):
    """CA-magnitude over every model's chunk at once: in the models' order, model k keeps tau_k =
    float32(raws[k]) - base where |tau_k| > tv[k] and no earlier model kept the slot (tv[k] = inf: nothing);
    out = sum_k kept_k * ws[k] in model order (every weight nonzero). Bitwise as threshold_prune and accumulate
    model after model (one element's models in registers: the slots taken need no row). Per block of _BLOCK,
    pieces of whole blocks (_run_pieces); with `emit` each block's output written while it is in cache (see
    _emit). Returns (non-finite flag, nonzeros of out, kept pairs as topk_merge_raw's, non-finite output flag)."""
    K = len(raws)
    T = _n_pieces(base.shape[0], _BLOCK)
    h4 = np.zeros((4 * T, 256), np.int64)
    res = np.zeros((T, 3), np.int64)
    _run_pieces(_ca_piece, T, 0, (base, raws, np.asarray(tv, np.float32), np.asarray(ws, np.float32), out, oraw, sc,
                                  emit, h4, res))
    return res[:, 0].sum(), res[:, 1].sum(), _pairs_of(h4, K), res[:, 2].sum()


@_jit
def _ca_piece(p, T, phase, base, raws, tf, wf, out, oraw, sc, emit, h4, res):
    """Piece p of T of ca_merge_raw (serial, run by _run_pieces): its (non-finite flag, nonzeros, non-finite output
    flag) into res[p]."""
    # the arguments borrowed: the caller holds them (see _unref)
    base, raws, tf, wf, out, oraw = _unref(base), _unref(raws), _unref(tf), _unref(wf), _unref(out), _unref(oraw)
    sc, h4, res = _unref(sc), _unref(h4), _unref(res)
    lo, hi = _piece(base.shape[0], p, T, _BLOCK)
    pat = np.empty(_BLOCK, np.uint8)
    ob = np.empty(_BLOCK, np.float32)  # the merged block where the output is written (out is not touched)
    hp = h4[4 * p:4 * p + 4]  # the piece's rows, taken once
    bad = np.uint32(0)
    nz = 0
    bo = 0
    for s in range(lo, hi, _BLOCK):
        e = min(hi, s + _BLOCK)
        dst = _span(ob, 0, e - s) if emit else _span(out, s, e)
        b, z = _ca_span(_span(base, s, e), _slices(raws, s, e), tf, wf, dst, _span(pat, 0, e - s))
        _count_bytes(_span(pat, 0, e - s), hp)
        bad = max(bad, b)
        nz += z
        if emit:
            bo += _emit_span(_span(oraw, s, e), _span(base, s, e), dst, sc)
    res[p, 0] = bad
    res[p, 1] = nz
    res[p, 2] = bo


def _ca_span(bs, rs, tv, ws, o, pt):
    """One span of ca_merge_raw, the models written out (generated for their count when compiled, as
    _fused_span): (non-finite flag (see _nf), nonzeros of o)."""


@overload(_ca_span)
def _ca_span_impl(bs, rs, tv, ws, o, pt):
    K = len(rs)
    lines = ["def f(bs, rs, tv, ws, o, pt):",
             "    zero = np.float32(0.0)",
             "    bad = np.uint32(0)",
             "    nz = np.int32(0)"]
    for k in range(K):
        lines += [f"    r{k} = rs[{k}]", f"    t{k} = tv[{k}]", f"    w{k} = ws[{k}]"]
    lines += ["    for j in range(bs.shape[0]):", "        b = as_f32(bs, j)"]
    for k in range(K):
        lines.append(f"        x{k} = as_f32(r{k}, j) - b")
        lines.append(f"        k{k} = abs(x{k}) > t{k}" if k == 0 else f"        k{k} = (abs(x{k}) > t{k}) & (not tk)")
        lines.append("        tk = k0" if k == 0 else f"        tk = tk | k{k}")
        lines.append(f"        v{k} = x{k} if k{k} else zero")
    lines.append("        c = " + " + ".join(f"_nf(x{k})" for k in range(K)))
    lines.append("        pt[j] = " + " | ".join(f"(np.uint8({1 << k}) if v{k} != zero else np.uint8(0))"
                                                for k in range(K)))
    lines.append("        t = v0 * w0")
    lines += [f"        t = t + v{k} * w{k}" for k in range(1, K)]
    lines += ["        o[j] = t", "        bad = max(bad, _flag(c + _nf(t)))", "        nz = _inc(nz, t != zero)",
              "    return bad, nz"]
    return _defined("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------------ CA-magnitude's thresholds at once
# The scan's per-model passes (a histogram pass over tau_k, then a pass marking the slots model k keeps) in one pass
# over every model: a sample names the window of |x_k| each threshold lies in (x_k: tau_k, 0 where an earlier model
# kept), the pass counts per model the slots surely free with |x_k| above the window, and stores the elements where
# some model meets its window on a slot surely free: the slots whose status depends on a threshold not known yet.
# The thresholds then come one model after another from those entries (ca_candidates).


def ca_sample(base, raws, starts, width, qs, us, counts):
    """The sample of kernels._ca_windows run through CA-magnitude: us[k] = model k's |tau| bits over [a, a + width)
    for each a of `starts`, in order, 0 where the sample's earlier models kept (|x_j| above the qs[j]-th largest
    of us[j], the sample's own threshold); counts[k] += the histogram of us[k]'s high 16 bits. The models' bits
    read on threads (_sample_piece, a model each: the runs lie all over the inputs), then taken in the models'
    order (_ca_sample_taken, in cache). Before, one thread did both: the windows took 0.105-0.119 s of a 1.25-1.35 s
    CA-magnitude merge of the benchmark's files."""
    _run_pieces(_sample_piece, len(raws), 0, (base, raws, starts, width, us, None))
    _ca_sample_taken(us, qs, counts)


@_jit
def _ca_sample_taken(us, qs, counts):
    """ca_sample's models in order over their sampled bits: each one's 0 where an earlier one kept, its histogram,
    its own threshold's slots taken."""
    S = us.shape[1]
    taken = np.zeros(S, np.bool_)
    for k in range(us.shape[0]):
        u = us[k]
        h = counts[k]
        for i in range(S):
            u[i] = np.uint32(0) if taken[i] else u[i]
        for i in range(S):
            h[u[i] >> np.uint32(16)] += 1
        q = qs[k]  # the q-th largest: its bucket from the top, then its place among that bucket's values
        above = 0
        bk = h.shape[0] - 1
        while above + h[bk] < q:
            above += h[bk]
            bk -= 1
        inb = np.sort(u[(u >> np.uint32(16)) == np.uint32(bk)])
        t = inb[inb.shape[0] - (q - above)]
        for i in range(S):
            taken[i] = taken[i] | (u[i] > t)


@_jit
def ca_share(us, los, wds):
    """The sampled positions where some model's bits lie in its window (u - los[k] < wds[k], unsigned; a taken
    slot's 0 in none: no window starts at 0)."""
    c = 0
    for i in range(us.shape[1]):
        inside = False
        for k in range(us.shape[0]):
            inside |= np.uint32(us[k, i] - los[k]) < wds[k]
        c += inside
    return c


def ca_scan(base, raws, his, los, wds, pat, vals, done=None):
    """The pass (see above) over one segment: model k's window is the |tau| bits u with u - los[k] < wds[k]
    (unsigned), his[k] = los[k] + wds[k]; pieces of whole blocks on threads (_run_pieces), each storing its entries
    in its share of pat (the first model meeting its window, plus 1) and vals (rows: the base's then each model's
    raw elements); `done(lo, hi)`, where given, with each piece's range as it ends (_releasing). Returns
    (non-finite count, each model's count of free slots above its window, the pieces' first entries, their ends
    (-1: a piece's share overflowed))."""
    K = len(raws)
    T = _n_pieces(base.shape[0], _BLOCK)
    cap = pat.shape[0]
    ab = np.zeros((T, K), np.int64)
    res = np.zeros((T, 2), np.int64)
    _run_pieces(_ca_scan_piece, T, 0, (base, raws, his, los, wds, pat, vals, cap, ab, res),
                _releasing(done, base.shape[0], T, _BLOCK))
    starts = np.array([cap * p // T for p in range(T)], np.int64)
    return res[:, 0].sum(), ab.sum(axis=0), starts, res[:, 1].copy()


@_jit
def _ca_scan_piece(p, T, phase, base, raws, his, los, wds, pat, vals, cap, ab, res):
    """Piece p of T of ca_scan (serial, run by _run_pieces): (non-finite count, end of its entries or -1) into
    res[p], its counts above the windows into ab[p]."""
    # the arguments borrowed: the caller holds them (see _unref)
    base, raws, his, los, wds, pat = _unref(base), _unref(raws), _unref(his), _unref(los), _unref(wds), _unref(pat)
    vals, ab, res = _unref(vals), _unref(ab), _unref(res)
    lo, hi = _piece(base.shape[0], p, T, _BLOCK)
    m = cap * p // T
    end = cap * (p + 1) // T
    pp = np.empty(_BLOCK, np.uint8)
    s32 = np.empty((2, _BLOCK), np.uint32)  # the span's marks (see _ca_pass_src)
    idx = np.empty(_BLOCK, np.int64)
    abp = ab[p]  # the piece's row, taken once
    bad = 0
    for s in range(lo, hi, _BLOCK):
        e = min(hi, s + _BLOCK)
        rs = _slices(raws, s, e)
        c, b = _ca_scan_span(_span(base, s, e), rs, his, los, wds, _span(pp, 0, e - s), abp, s32)
        bad += b
        if c == 0:
            continue
        m = _store_marked(_span(pp, 0, e - s), _unref(idx), s, base, rs, None, pat, vals, m, end)
        if m < 0:
            break
    res[p, 0] = bad
    res[p, 1] = m


def _ca_scan_span(bs, rs, his, los, wds, pp, ab, s32):
    """One block of ca_scan, the models written out (generated for their count when compiled, as _ca_span):
    pp[j] = 1 + the first model whose |tau| meets its window on a slot free for sure (0: none), ab[k] += the free
    slots above model k's window (s32: a (2, n) uint32 scratch for the marks); returns (positions marked,
    non-finite tau count)."""


@overload(_ca_scan_span)
def _ca_scan_span_impl(bs, rs, his, los, wds, pp, ab, s32):
    return _defined(_ca_pass_src(len(rs), False))


def _ca_pass_src(K: int, merge: bool) -> str:
    """The source of _ca_scan_span (`merge` False) or _ca_merge_span for K models: per element and model in order,
    whether the slot is still free for sure (ok: no model before met its window there or lay above it), the marks
    (pp: 1 + the first model meeting its window on such a slot) and the counts above the windows (ab); with `merge`,
    the element merged as _ca_span merges it with each model keeping where it is free for sure and at or above its
    window (no model keeps at a marked slot)."""
    args = "bs, rs, his, los, wds, ws, o, pt, pp, ab, s32" if merge else "bs, rs, his, los, wds, pp, ab, s32"
    lines = [f"def f({args}):", "    c = np.int32(0)"]
    lines += ["    zero = np.float32(0.0)", "    bad = np.uint32(0)", "    nz = np.int32(0)"] if merge else [
        "    bad = np.int32(0)"]
    for k in range(K):
        lines += [f"    r{k} = rs[{k}]", f"    h{k} = his[{k}]", f"    l{k} = los[{k}]", f"    d{k} = wds[{k}]",
                  f"    a{k} = np.int32(0)"] + ([f"    w{k} = ws[{k}]"] if merge else [])
    lines += _marks_src("q32", "p32")  # the marks in uint32 rows (_bits_src)
    lines += ["    for j in range(n):", "        b = as_f32(bs, j)", "        ok = True",
              "        p = np.uint32(0)"]
    for k in range(K):  # ok: no model before k kept the slot or can have kept it, whatever the thresholds
        lines += [f"        x{k} = as_f32(r{k}, j) - b",
                  f"        u{k} = _f32_as_u32(abs(x{k}))"]
        if not merge:
            lines.append(f"        bad = _inc(bad, u{k} >= _EXP)")
        lines += [f"        up = u{k} >= h{k}",
                  f"        iw = np.uint32(u{k} - l{k}) < d{k}",
                  f"        k{k} = ok & up",
                  f"        a{k} = _inc(a{k}, k{k})",
                  f"        p = np.uint32(p | np.uint32(np.uint32(ok & iw) * np.uint32({k + 1})))"]
        if merge:
            lines.append(f"        v{k} = x{k} if k{k} else zero")
        lines.append("        ok = ok & (not (up | iw))")
    if merge:
        lines.append("        g = " + _max_src([f"u{k}" for k in range(K)]))
        lines.append("        q32[j] = " + _bits_src(K, "v{k} != zero"))
        lines.append("        t = v0 * w0")
        lines += [f"        t = t + v{k} * w{k}" for k in range(1, K)]
        lines += ["        o[j] = t", "        " + _bad_src("g", "_nf(t)", False), "        nz = _inc(nz, t != zero)"]
    lines += ["        p32[j] = p", "        c = _inc(c, p != np.uint32(0))"]
    lines += _bytes_src(("pp", "p32"), *([("pt", "q32")] if merge else [])) + ([_FLAG_01] if merge else [])
    lines += [f"    ab[{k}] += a{k}" for k in range(K)]
    lines.append("    return c, bad, nz" if merge else "    return c, bad")
    return "\n".join(lines) + "\n"


def ca_candidates(vals, pat, first, ends, offs, tk, k, hk, lk, wk, ub, fl, cand, res, t_before):
    """Model k's count over ca_scan's entries (vals (1 + K) x cap, pat cap; the pieces' entries in [first[i],
    ends[i]), region i at offs[i] of one list of M) for its threshold (see kernels.ca_thresholds): an entry counts
    from its pattern's model on where no earlier model kept it (tk, M). First, for k > 0, tk |= the entries model
    k - 1 keeps: its |tau| bits, left in ub by its own call, above t_before (its threshold's bits), from their
    pattern's model on (a pass of its own before, ca_taken: 204 more calls on threads in a CA-magnitude merge of
    the benchmark's files). ub[:M] = the entries' |tau_k| bits, fl[:M] = the counted ones inside the window
    [lk, lk + wk); region i's of these, in order, at cand[offs[i]:], res[i] = (the counted ones above the window,
    those inside). The regions on threads (_run_pieces)."""
    _run_pieces(_ca_cand_piece, first.shape[0], 0, (vals, pat, first, ends, offs, tk, np.uint8(k + 1), vals[1 + k],
                                                    hk, lk, wk, ub, fl, cand, res, np.uint8(k), np.uint32(t_before)))


@_jit
def _ca_cand_piece(i, T, phase, vals, pat, first, ends, offs, tk, on, rk, hk, lk, wk, ub, fl, cand, res, on0, t0):
    """Region i of ca_candidates (serial, run by _run_pieces)."""
    # the arguments borrowed: the caller holds them (see _unref)
    vals, pat, first, ends, offs = _unref(vals), _unref(pat), _unref(first), _unref(ends), _unref(offs)
    tk, rk, hk, lk, wk, ub, fl = _unref(tk), _unref(rk), _unref(hk), _unref(lk), _unref(wk), _unref(ub), _unref(fl)
    cand, res = _unref(cand), _unref(res)
    p0, p1, o = first[i], ends[i], offs[i]
    L = p1 - p0
    res[i, 0], res[i, 1] = _ca_cand_span(rk[p0:p1], vals[0][p0:p1], pat[p0:p1], tk[o:o + L], on, hk, lk, wk,
                                         ub[o:o + L], fl[o:o + L], on0, t0)
    _ca_compact(fl[o:o + L], ub[o:o + L], cand[o:o + L])


@_jit
def _ca_compact(fl, ub, cand):
    """cand[:c] = the ub[e] with fl[e] set, in order (without a branch per entry); returns c."""
    c = 0
    for e in range(fl.shape[0]):
        cand[c] = ub[e]
        c += fl[e]
    return c


@_jit
def _ca_cand_span(rk, b0, pat, tk, on, hk, lk, wk, ub, fl, on0, t0):
    """ca_candidates over one region, on slices (a loop indexing from 0 vectorises: 0.56 ns per entry against 3.4
    indexing the whole arrays at offsets; the 4.6M entries of the merge benchmark's lm_head, one thread). The
    previous model's keeps (pattern <= on0, bits ub > t0; on0 = 0: none, whatever ub holds) taken first."""
    a = np.int32(0)  # a region is a piece's entries: < 2^31
    c = np.int32(0)
    for e in range(pat.shape[0]):
        p = pat[e]
        taken = tk[e] | ((p != np.uint8(0)) & (p <= on0) & (ub[e] > t0))
        tk[e] = taken
        live = (p != np.uint8(0)) & (p <= on) & (not taken)
        u = _f32_as_u32(abs(as_f32(rk, e) - as_f32(b0, e)))
        a = _inc(a, live & (u >= hk))
        inw = live & (np.uint32(u - lk) < wk)
        c = _inc(c, inw)
        ub[e] = u
        fl[e] = inw
    return a, c


# ------------------------------------------------------------------------------- CA-magnitude merged in the same pass
# ca_scan's pass merging as it goes (kernels.ca_merge_deferred): where no model meets its window on a slot free for
# sure, every model's choice is known before the thresholds are (above its window: kept; below: not), so the merged
# element is written in the pass; the entries (the other slots, stored with their positions) are merged again once
# the thresholds are found (ca_fix), as topk_merge_deferred does for TIES. The inputs are read once instead of twice.


def ca_merge_scan(base, raws, his, los, wds, ws, out, oraw, sc, emit, pos, pat, vals, done=None):
    """ca_scan over one segment that also merges: out (or the output element, `emit`) = _ca_span's result where
    the slot is no entry, computed from what the windows decide (model k keeps where it is the first free for
    sure with |tau| at or above his[k]); at an entry every model counts as not keeping (out = the sum of zeros),
    left for ca_fix, which rewrites it. Entries stored as ca_scan's, with their positions (pos, from the segment's
    start); `done` as ca_scan's. Returns (non-finite flag, the counts above the windows, the pieces' first
    entries, their ends (-1: overflowed), nonzeros, the kept-bits histogram (256), non-finite output flag)."""
    K = len(raws)
    T = _n_pieces(base.shape[0], _BLOCK)
    cap = pat.shape[0]
    ab = np.zeros((T, K), np.int64)
    h4 = np.zeros((4 * T, 256), np.int64)
    res = np.zeros((T, 4), np.int64)
    _run_pieces(_ca_merge_piece, T, 0, (base, raws, his, los, wds, np.asarray(ws, np.float32), out, oraw, sc, emit,
                                        pos, pat, vals, cap, ab, h4, res), _releasing(done, base.shape[0], T, _BLOCK))
    starts = np.array([cap * p // T for p in range(T)], np.int64)
    hist = np.zeros(256, np.int64)
    _add_parts(hist, h4)
    return res[:, 0].max(), ab.sum(axis=0), starts, res[:, 1].copy(), res[:, 2].sum(), hist, res[:, 3].max()


@(_jit if numba_target_has("avx512f") else _jit_once)  # 16 vector registers: LLVM's interleave spilled (Decisions)
def _ca_merge_piece(p, T, phase, base, raws, his, los, wds, wf, out, oraw, sc, emit, pos, pat, vals, cap, ab, h4,
                    res):
    """Piece p of T of ca_merge_scan (serial, run by _run_pieces): (non-finite flag, end of its entries or -1,
    nonzeros, non-finite output flag) into res[p], its counts above the windows into ab[p]."""
    # the arguments borrowed: the caller holds them (see _unref)
    base, raws, his, los, wds, wf = _unref(base), _unref(raws), _unref(his), _unref(los), _unref(wds), _unref(wf)
    out, oraw, sc, pos, pat, vals = _unref(out), _unref(oraw), _unref(sc), _unref(pos), _unref(pat), _unref(vals)
    ab, h4, res = _unref(ab), _unref(h4), _unref(res)
    lo, hi = _piece(base.shape[0], p, T, _BLOCK)
    m = cap * p // T
    end = cap * (p + 1) // T
    pp = np.empty(_BLOCK, np.uint8)
    pt = np.empty(_BLOCK, np.uint8)
    s32 = np.empty((2, _BLOCK), np.uint32)  # the span's marks (see _ca_pass_src)
    idx = np.empty(_BLOCK, np.int64)
    ob = np.empty(_BLOCK, np.float32)
    hp, abp = h4[4 * p:4 * p + 4], ab[p]  # the piece's rows, taken once
    bad = np.uint32(0)
    nz = 0
    bo = 0
    for s in range(lo, hi, _BLOCK):
        e = min(hi, s + _BLOCK)
        L = e - s
        rs = _slices(raws, s, e)
        dst = _span(ob, 0, L) if emit else _span(out, s, e)
        c, b, z = _ca_merge_span(_span(base, s, e), rs, his, los, wds, wf, dst, _span(pt, 0, L), _span(pp, 0, L), abp,
                                 s32)
        _count_bytes(_span(pt, 0, L), hp)
        bad = max(bad, b)
        nz += z
        if emit:
            bo += _emit_span(_span(oraw, s, e), _span(base, s, e), dst, sc)
        if c == 0:
            continue
        m = _store_marked(_span(pp, 0, L), _unref(idx), s, base, rs, pos, pat, vals, m, end)
        if m < 0:
            break
    res[p, 0] = bad
    res[p, 1] = m
    res[p, 2] = nz
    res[p, 3] = min(bo, 1)


def _ca_merge_span(bs, rs, his, los, wds, ws, o, pt, pp, ab, s32):
    """One block of ca_merge_scan, the models written out (generated for their count when compiled, as _ca_span):
    pp[j] as _ca_scan_span's, ab[k] += the free slots above model k's window, o[j] and pt[j] as _ca_span's with
    model k keeping where the slot is free for sure and |tau_k| >= his[k] (no model keeps at an entry); s32: a
    (2, n) uint32 scratch for the marks. Returns (positions marked, non-finite flag (1 where an |x_k| or a sum is not
    finite, else 0), nonzeros of o)."""


@overload(_ca_merge_span)
def _ca_merge_span_impl(bs, rs, his, los, wds, ws, o, pt, pp, ab, s32):
    return _defined(_ca_pass_src(len(rs), True))


def ca_fix(vals, rows, pos, first, ends, tv, ws, out, oraw, sc, emit):
    """ca_merge_scan's entries merged with the thresholds found (tv: float32 per model), by _ca_span itself over
    blocks of entries (vals[0]: their base elements, rows: the models' rows of vals as a tuple), the results
    stored at their positions (out[pos], or the output element with `emit`); the regions [first[i], ends[i]) on
    threads (_run_pieces). Returns (non-finite flag, nonzeros, the kept-bits histogram (256), non-finite output
    flag)."""
    T = first.shape[0]
    h4 = np.zeros((4 * T, 256), np.int64)
    res = np.zeros((T, 3), np.int64)
    _run_pieces(_ca_fix_piece, T, 0, (vals[0], rows, pos, first, ends, np.asarray(tv, np.float32),
                                      np.asarray(ws, np.float32), out, oraw, sc, emit, h4, res))
    hist = np.zeros(256, np.int64)
    _add_parts(hist, h4)
    return res[:, 0].max(), res[:, 1].sum(), hist, res[:, 2].max()


@_jit
def _ca_fix_piece(i, T, phase, b0, rows, pos, first, ends, tf, wf, out, oraw, sc, emit, h4, res):
    """Region i of ca_fix (serial, run by _run_pieces)."""
    # the arguments borrowed: the caller holds them (see _unref)
    b0, rows, pos, first, ends, tf = _unref(b0), _unref(rows), _unref(pos), _unref(first), _unref(ends), _unref(tf)
    wf, out, oraw, sc, h4, res = _unref(wf), _unref(out), _unref(oraw), _unref(sc), _unref(h4), _unref(res)
    o = np.empty(_BLOCK, np.float32)
    pt = np.empty(_BLOCK, np.uint8)
    ch = np.ones(_BLOCK, np.uint8)
    hp = h4[4 * i:4 * i + 4]  # the region's rows, taken once
    bad = np.uint32(0)
    nz = 0
    bo = 0
    for s in range(first[i], ends[i], _BLOCK):
        e = min(ends[i], s + _BLOCK)
        L = e - s
        b, z = _ca_span(_span(b0, s, e), _slices(rows, s, e), tf, wf, _span(o, 0, L), _span(pt, 0, L))
        _count_bytes(_span(pt, 0, L), hp)
        bad = max(bad, b)
        nz += z
        bo = max(bo, _entry_store(_span(b0, s, e), _span(pos, s, e), _span(o, 0, L), _span(ch, 0, L), out, oraw, sc,
                                  emit))
    res[i, 0] = bad
    res[i, 1] = nz
    res[i, 2] = bo
