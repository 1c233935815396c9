"""Fused CPU loops of the merge engine (numba), with the torch path as the fallback (numba missing or
not importing, an accelerator, float16/float64, or :func:`torch_only`).

Each function here runs its compiled loop when numba is installed, the tensors are float32 (bfloat16 raw
inputs/outputs) on the CPU and contiguous, and the kernels are not switched off (:func:`torch_only`); it
returns None otherwise and the caller runs its torch code. Both give bitwise the same results (the loops do
the torch path's float32 operations in the same order; tested on odd shapes, chunk boundaries and n:m tails).
"""
from __future__ import annotations

from contextlib import contextmanager

_state: dict = {"enabled": True, "mod": None, "tried": False, "ran": 0}


def _mod():
    if not _state["tried"]:
        _state["tried"] = True
        try:
            from icmltools.core.device import load_numba_module

            _state["mod"] = load_numba_module("icmltools.merge._kernels_numba")
        except ImportError:  # numba missing: the torch path
            _state["mod"] = None
        else:
            from icmltools.core.device import numba_threads

            numba_threads()  # the loops' threads: --threads (set before numba was loaded)
    return _state["mod"]


def available() -> bool:
    """Whether the compiled loops can run (numba importable)."""
    return _mod() is not None


@contextmanager
def torch_only(flag: bool = True):
    """Within this block the engine runs its torch path only (tests compare the two; a user may too)."""
    old = _state["enabled"]
    _state["enabled"] = not flag
    try:
        yield
    finally:
        _state["enabled"] = old


def _ok(*ts) -> bool:
    import torch

    if not _state["enabled"] or _mod() is None:
        return False
    for t in ts:
        if t.device.type != "cpu" or not t.is_contiguous() or t.dtype not in (torch.float32, torch.bfloat16, torch.bool,
                                                                             torch.uint8):
            return False
    _state["ran"] += 1
    return True


def runs() -> int:
    """How many times a compiled loop was chosen so far in this process (a merge records whether it used any)."""
    return _state["ran"]


def _np(t):
    """A numpy view of a CPU tensor (bfloat16 as its uint16 bits)."""
    import numpy as np
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def load_tau(raw, base, out):
    """out = float32(raw) - base (raw bf16 or float32, base float32); the number of non-finite results, or None
    (not run: the caller uses torch)."""
    import torch

    if base.dtype != torch.float32 or out.dtype != torch.float32 or not _ok(raw, base, out):
        return None
    k = _mod()
    f = k.tau_bf16 if raw.dtype == torch.bfloat16 else k.tau_f32
    return int(f(_np(raw).reshape(-1), _np(base).reshape(-1), _np(out).reshape(-1)))


def to_float32(raw, out) -> bool:
    """out = float32(raw) for a bfloat16 raw chunk; False when not run."""
    import torch

    if raw.dtype != torch.bfloat16 or out.dtype != torch.float32 or not _ok(raw, out):
        return False
    _mod().bf16_to_f32(_np(raw).reshape(-1), _np(out).reshape(-1))
    return True


def apply(bd, merged, lam: float, sign: int, out):
    """out = cast(bd + merged) (sign > 0, lam 1), cast(bd + merged * lam) or cast(bd - merged * lam) into the
    output chunk `out` (bfloat16 or float32): the number of non-finite outputs, or None when not run."""
    import torch

    if bd.dtype != torch.float32 or merged.dtype != torch.float32 or not _ok(bd, merged, out):
        return None
    mode = 0 if (sign > 0 and lam == 1.0) else (1 if sign > 0 else 2)
    k = _mod()
    f = k.apply_bf16 if out.dtype == torch.bfloat16 else k.apply_f32 if out.dtype == torch.float32 else None
    if f is None:
        return None
    return int(f(_np(bd).reshape(-1), _np(merged).reshape(-1), float(lam), mode, _np(out).reshape(-1)))


def count_non_finite(x):
    """NaN/inf elements of a float32 tensor, or None."""
    import torch

    if x.dtype != torch.float32 or not _ok(x):
        return None
    return int(_mod().count_non_finite(_np(x).reshape(-1)))


def count_nonzero(x):
    """Nonzero elements of a float32 tensor, or None."""
    import torch

    if x.dtype != torch.float32 or not _ok(x):
        return None
    return int(_mod().count_nonzero(_np(x).reshape(-1)))


def radix_select(a, k: int):
    """(k-th largest |a|, #|a| > it, #|a| == it) of a float32 tensor, exactly, in two histogram passes over a
    (the high 16 bits of |a|, then the low 16 bits inside the bucket holding the k-th); None when not run."""
    import numpy as np
    import torch

    if a.dtype != torch.float32 or not _ok(a):
        return None
    x = _np(a).reshape(-1)
    km = _mod()
    hi = np.zeros(1 << 15, np.int64)
    km.hist_hi(x, hi)
    return select_from_histograms(hi, k, lambda bucket, lo: km.hist_lo(x, bucket, lo))


def _raw_pair_ok(raw, base, taken=None) -> bool:
    """Whether a loop on tau = raw - base (each bf16 or float32, with a bool `taken` or None) can run."""
    import torch

    if {raw.dtype, base.dtype} - {torch.bfloat16, torch.float32} or (taken is not None and taken.dtype != torch.bool):
        return False
    return _ok(raw, base) if taken is None else _ok(raw, base, taken)


def radix_select_tau(raw, base, ks, taken=None):
    """radix_select of tau = raw - base (raw and base bf16 or float32; tau read as 0 where the bool `taken`) for
    each k of `ks`, without storing tau: one pass for the high histogram, one per distinct bucket for the low ones.
    On a tensor of at least 2^21 elements a sample first names the few buckets each k-th largest can fall in
    (:func:`bucket_windows`), and the high pass counts their low histograms too: the low pass then runs only for
    a bucket outside them (same counts, so the same thresholds). (list of (threshold, above, equal) or None per
    k (k <= 0 or k >= numel: no threshold), number of non-finite tau elements), or None."""
    import numpy as np

    if not _raw_pair_ok(raw, base, taken):
        return None
    r, b = _np(raw).reshape(-1), _np(base).reshape(-1)
    tk = None if taken is None else _np(taken).reshape(-1)
    km = _mod()
    n = r.shape[0]
    hi = np.zeros(1 << 15, np.int64)
    los: dict = {}
    wins = []
    if WINDOW_MIN <= n < 1 << 31 and any(0 < k < n for k in ks):
        starts = _sample_starts(n)
        sample = np.empty(_SAMPLE_BLOCKS * _SAMPLE_WIDTH, np.uint32)
        km.sample_hi_tau(r, b, tk, starts, _SAMPLE_WIDTH, sample)
        wins = bucket_windows(np.bincount(sample, minlength=1 << 15), ks, n)
    if wins:
        (s0, w0), (s1, w1) = (wins + [(0, 0)])[:2]
        rows = np.zeros((w0 + w1, 1 << 16), np.int64)
        bad = int(km.hist_tau_windows(r, b, hi, tk, s0, w0, s1, w1, rows, km.numba.get_num_threads()))
        los.update({s0 + d: rows[d] for d in range(w0)})
        los.update({s1 + d: rows[w0 + d] for d in range(w1)})
    else:
        bad = int(km.hist_hi_tau(r, b, hi, tk))
    if bad:
        return [], bad
    known = set(los)

    def lo_of(bucket, lo):
        if bucket not in los:
            los[bucket] = np.zeros(1 << 16, np.int64)
            km.hist_lo_tau(r, b, bucket, los[bucket], tk)
        lo += los[bucket]

    got = [(select_from_histograms(hi, k, lo_of) if 0 < k < n else None) for k in ks]
    WINDOWS["hit" if wins and set(los) == known else "missed" if wins else "none"] += 1
    return got, 0


WINDOW_MIN = 1 << 21  # smaller tensors: the low pass is short, no sample
_SAMPLE_BLOCKS, _SAMPLE_WIDTH = 256, 256  # the sample: 256 runs of 256 elements, evenly spaced (2^16 elements)


def _sample_starts(n: int, blocks: int = _SAMPLE_BLOCKS):
    """The first element of each of the sample's `blocks` runs over a tensor of n elements (evenly spaced, the last
    at its end): radix_select_tau and ca_thresholds take _SAMPLE_BLOCKS, topk_merge_deferred _DEFER_SAMPLE_BLOCKS."""
    import numpy as np

    return (np.arange(blocks, dtype=np.int64) * (n - _SAMPLE_WIDTH)) // (blocks - 1)


_WINDOW_MOST = 6  # buckets per window
WINDOWS = {"hit": 0, "missed": 0, "none": 0}  # selections whose buckets were all in the windows, not, no windows


def bucket_windows(sampled, ks, n: int, most: int = _WINDOW_MOST) -> list:
    """Up to two disjoint windows [(first bucket, width)] (the lowest) of high-bit buckets that hold the k-th
    largest of n values for each k of `ks`, predicted from a sample of their high bits (`sampled`: its count per
    bucket): the buckets of the sample's quantiles 4 standard errors either side of k / n, at most `most`
    buckets (then centred on the estimate's). A window that misses costs the low pass it would have saved."""
    import math

    import numpy as np

    below = np.cumsum(sampled)
    size = int(below[-1]) if below.size else 0

    def bucket(i):  # the bucket of the sample's (i+1)-th largest value
        return _from_top(below, min(size - 1, max(0, i)) + 1)[0]

    spans = []
    for k in ks:
        if not 0 < k < n or size == 0:
            continue
        q = k / n
        at, err = q * size - 1, 4.0 * math.sqrt(size * q * (1.0 - q))
        top, bottom = bucket(math.floor(at - err)), bucket(math.ceil(at + err))
        if top - bottom + 1 > most:
            bottom = max(0, bucket(round(at)) - (most - 1) // 2)
            top = bottom + most - 1
        spans.append([bottom, top])
    joined: list = []
    for a, b in sorted(spans):  # touching or overlapping spans become one window (the kernel's two are disjoint)
        if joined and a <= joined[-1][1] + 1:
            joined[-1][1] = max(joined[-1][1], b)
        else:
            joined.append([a, b])
    return [(a, b - a + 1) for a, b in joined[:2]]


def mark_above_tau(raw, base, thr: float, taken) -> bool:
    """taken |= |raw - base| > thr in place (raw and base bf16 or float32, bool taken); False when not run."""

    if not _raw_pair_ok(raw, base, taken):
        return False
    _mod().mark_above_tau(_np(raw).reshape(-1), _np(base).reshape(-1), float(thr), _np(taken).reshape(-1))
    return True


def select_from_histograms(hi, k: int, fill_lo):
    """(k-th largest, #above, #equal) of non-negative float32 values from the histogram `hi` of their high 16 bits
    (numpy, 2^15 buckets) and `fill_lo(bucket, lo)` adding the low 16 bits' histogram of that bucket into `lo`
    (a radix select: non-negative floats order as their bits). Shared by the compiled scans and the torch path
    (:func:`engine.kth_largest`)."""
    import numpy as np

    bucket, above = _from_top(np.cumsum(hi), k)  # the bucket where the count from the top reaches k
    lo = np.zeros(1 << 16, np.int64)
    fill_lo(bucket, lo)
    low, more = _from_top(np.cumsum(lo), k - above)
    bits = np.array([(bucket << 16) | low], dtype=np.uint32)
    return float(bits.view(np.float32)[0]), above + more, int(lo[low])


def _from_top(below, k: int):
    """(the last index b whose count from the top, counts[b:].sum(), reaches k; counts[b + 1:].sum()) from below =
    np.cumsum(counts): summed forward, since numpy's cumsum over the reversed view took 4-5x as long (70 us
    against 15 for 2^15 counts); (-1, the total) where k passes the total, (the last, 0) for k <= 0."""
    import numpy as np

    total = int(below[-1])
    if k > total:
        return -1, total
    b = int(np.searchsorted(below[:-1], total - k, side="right"))
    return b, total - int(below[b])


def topk_prune(x, mode: int, thr: float, all_ties: bool, left: int):
    """Zero in place the elements of chunk x that one top-k selection drops (see :class:`engine.TopK`); the
    number of ties at the threshold seen, or None when not run."""
    import torch

    if x.dtype != torch.float32 or not _ok(x):
        return None
    return int(_mod().topk_prune(_np(x).reshape(-1), mode, thr, all_ties, left))


def band_prune(x, sel_k: tuple, sel_t: tuple):
    """Breadcrumbs' keep-in-k-but-not-in-top in place; (ties seen by k, by top) or None."""
    import torch

    if x.dtype != torch.float32 or not _ok(x):
        return None
    sk, st = _mod().band_prune(_np(x).reshape(-1), *sel_k, *sel_t)
    return int(sk), int(st)


def accumulate(x, total, w: float, first: bool, bits=None, bit: int = 0):
    """total = x * w (first) or total + x * w, x left weighted, bits += bit where x != 0; the nonzeros of x,
    or None when not run."""
    import numpy as np
    import torch

    if x.dtype != torch.float32 or total.dtype != torch.float32 or not _ok(x, total):
        return None
    b = np.zeros(1, np.uint8) if bits is None else _np(bits).reshape(-1)
    return int(_mod().accumulate(_np(x).reshape(-1), _np(total).reshape(-1), float(w), bool(first), b,
                                 int(bit if bits is not None else 0)))


def agree(x, total, acc, div, w: float, first: bool, plus: bool = False) -> bool:
    """TIES' disjoint accumulation (pass 1) in one loop (`plus`: a total of 0 elects +, mergekit's); False when not
    run."""
    import torch

    if any(t.dtype != torch.float32 for t in (x, total, acc, div)) or not _ok(x, total, acc, div):
        return False
    _mod().agree(_np(x).reshape(-1), _np(total).reshape(-1), _np(acc).reshape(-1), _np(div).reshape(-1), float(w),
                 bool(first), 1.0 if plus else 0.0)
    return True


def pair_counts(bits, n: int):
    """K x K overlap counts from uint8 bits (n <= 8) as a list of lists, or None."""
    import torch

    if bits.dtype != torch.uint8 or n > 8 or not _ok(bits):
        return None
    return _mod().pair_counts(_np(bits).reshape(-1), n).tolist()


def nm_prune(x, n: int, m: int, taken, pad_tail: bool):
    """Balanced n:m in place (zero all but the n largest |x| of each block of m among the free slots; ties by
    lower index); with `taken` (bool) the CA step, marking the kept. The short-block count, or None."""
    import numpy as np
    import torch

    if x.dtype != torch.float32 or not _ok(x) or (taken is not None and not _ok(taken)):
        return None
    t = np.zeros(1, np.bool_) if taken is None else _np(taken).reshape(-1)
    return int(_mod().nm_prune(_np(x).reshape(-1), int(n), int(m), t, taken is not None, bool(pad_tail)))


def ties_finish(acc, div, normalize: bool):
    """TIES' disjoint mean in place (acc / div where div != 0, with `normalize`); the nonzeros of div, or None."""
    import torch

    if acc.dtype != torch.float32 or div.dtype != torch.float32 or not _ok(acc, div):
        return None
    return int(_mod().ties_finish(_np(acc).reshape(-1), _np(div).reshape(-1), bool(normalize)))


def tau_accumulate(raw, base, total, w: float, first: bool):
    """total = (float32(raw) - base) * w, or total + that, in one loop without storing the task vector; the
    number of non-finite task-vector elements, or None when not run."""
    import torch

    if base.dtype != torch.float32 or total.dtype != torch.float32 or not _ok(raw, base, total):
        return None
    return int(_mod().tau_accumulate(_np(raw).reshape(-1), _np(base).reshape(-1), _np(total).reshape(-1), float(w),
                                     bool(first), raw.dtype == torch.bfloat16))


def sign_stats(raw, base, total, mn, mx, first: bool):
    """NegMerge's fused add (sum, running min and max of tau = raw - base); non-finite count or None."""
    import torch

    if any(t.dtype != torch.float32 for t in (base, total, mn, mx)) or not _ok(raw, base, total, mn, mx):
        return None
    return int(_mod().tau_sign_stats(_np(raw).reshape(-1), _np(base).reshape(-1), _np(total).reshape(-1),
                                     _np(mn).reshape(-1), _np(mx).reshape(-1), bool(first),
                                     raw.dtype == torch.bfloat16))


def sign_consensus_finish(total, mn, mx, n: int):
    """NegMerge's sign-consensual mean in place; the kept count, or None."""
    import torch

    if any(t.dtype != torch.float32 for t in (total, mn, mx)) or not _ok(total, mn, mx):
        return None
    return int(_mod().sign_consensus_finish(_np(total).reshape(-1), _np(mn).reshape(-1), _np(mx).reshape(-1), int(n)))


def magmax_add(x, best, first: bool) -> bool:
    """MagMax's running choice in one loop; False when not run."""
    import torch

    if x.dtype != torch.float32 or best.dtype != torch.float32 or not _ok(x, best):
        return False
    _mod().magmax_add(_np(x).reshape(-1), _np(best).reshape(-1), bool(first))
    return True


def dare_zero(x, u, p: float) -> bool:
    """x = 0 where u < p in place (float32 x and u); False when not run."""
    import torch

    if x.dtype != torch.float32 or u.dtype != torch.float32 or not _ok(x, u):
        return False
    _mod().dare_zero(_np(x).reshape(-1), _np(u).reshape(-1), float(p))
    return True


class MTStream:
    """The numbers of ``torch.Generator().manual_seed(seed)`` for ``torch.rand`` (float32) on the CPU, drawn by
    the compiled loops (MT19937 state and position, carried from chunk to chunk)."""

    def __init__(self, seed: int):
        import numpy as np

        self.mt = np.empty(624, np.uint32)
        self.pos = np.array([624], np.int64)  # torch twists before its first number
        _mod().mt_seed(int(seed) & 0xFFFFFFFF, self.mt)

    def copy_from(self, other: "MTStream") -> None:
        """This stream continues where `other` is (the same state and position)."""
        self.mt[:] = other.mt
        self.pos[:] = other.pos

    def uniforms(self, out):
        """Fill the float32 CPU tensor `out` (contiguous) with the next uniforms; returns it."""
        _mod().mt_uniforms(_np(out).reshape(-1), self.mt, self.pos)
        return out


def mt_stream(seed: int):
    """An :class:`MTStream` when the compiled loops run, else None (the caller makes a torch generator)."""
    if not _state["enabled"] or _mod() is None:
        return None
    return MTStream(seed)


def dare_zero_mt(x, stream: MTStream, p: float) -> bool:
    """x = 0 in place where the stream's next uniform (one per element) is below p, as ``u < p`` in float32 on
    torch.rand's numbers; False when not run (x not float32 CPU contiguous: draw with :meth:`MTStream.uniforms`)."""

    import torch

    if x.dtype != torch.float32 or not _ok(x):
        return False
    _mod().dare_zero_mt(_np(x).reshape(-1), stream.mt, stream.pos, _dare_thr(p))
    return True


def _dare_thr(p: float) -> int:
    """u < p in float32 on torch.rand's numbers <=> the uniform's 24 bits < this (exact: float32(p) * 2^24 is a
    double)."""
    import math

    import numpy as np

    return min(1 << 24, math.ceil(float(np.float32(p)) * (1 << 24)))


def mark_above(x, thr: float, taken) -> bool:
    """taken |= |x| > thr in place (float32 x, bool taken); False when not run."""
    import torch

    if x.dtype != torch.float32 or taken.dtype != torch.bool or not _ok(x, taken):
        return False
    _mod().mark_above(_np(x).reshape(-1), float(thr), _np(taken).reshape(-1))
    return True


def threshold_prune(x, thr: float, taken) -> bool:
    """Keep |x| > thr where not `taken` (zero the rest in place), taken |= kept; False when not run."""
    import torch

    if x.dtype != torch.float32 or taken.dtype != torch.bool or not _ok(x, taken):
        return False
    _mod().threshold_prune(_np(x).reshape(-1), float(thr), _np(taken).reshape(-1))
    return True


# --------------------------------------------------------------------------------------------- one pass over all models

MAX_ONE_PASS = 8  # models merged in one pass (each count is compiled once; more models go one at a time)
_NM_SPAN_MAX = 1 << 16  # n:m patterns whose blocks align only on longer spans (lcm of the m) go model by model


def _one_pass(base, raws, *bufs):
    """(numpy base, tuple of numpy raw chunks) when the one-pass loops can run on these tensors, else None."""
    import torch

    if not 1 <= len(raws) <= MAX_ONE_PASS or base.dtype not in (torch.bfloat16, torch.float32) \
            or any(r.dtype != base.dtype for r in raws) or any(b.dtype != torch.float32 for b in bufs) \
            or not _ok(base, *raws, *bufs):
        return None
    return _np(base).reshape(-1), tuple(_np(r).reshape(-1) for r in raws)


def _emit_args(base, emit):
    """(output array, scale) for a one-pass loop that writes the output chunk itself: `emit` = (out, lam, sign),
    out in the base's dtype (bfloat16 or float32); the loop stores base + merged * scale, scale = float32(lam) *
    sign (bitwise apply_raw's base + merged, base + merged * lam, base - merged * lam). Else (None, 1): the loop
    compiled without the output."""
    import numpy as np

    if emit is None or emit[0].dtype != base.dtype or not _ok(emit[0]) or emit[0].numel() != base.numel():
        return None, np.float32(1.0)
    out, lam, sign = emit
    return _np(out).reshape(-1), _scale(lam, sign)


def _scale(lam: float, sign: int):
    """float32(lambda) * sign, the output's scale: base + merged * it is bitwise base + merged (sign > 0, lambda
    1), base + merged * lambda and base - merged * lambda (x * 1 == x; b + m * -l == b - m * l)."""
    import numpy as np

    with np.errstate(over="ignore"):  # a lambda beyond float32 is inf, as a cast in the loop would make it
        return np.float32(lam) * np.float32(1 if sign > 0 else -1)


def _emit_flagged(base, args):
    """_emit_args' `args` as (output array, scale, flag) for the top-k/DARE loop, which tests the flag per block
    (compiled once): a placeholder of the base's dtype where it does not write the output."""
    return (args[0], args[1], True) if args[0] is not None else (base[:0], args[1], False)


def _emitted(bo, args):
    """A loop's non-finite output flag (0: every output finite) given _emit_args' `args`, None where it did not
    write the output."""
    return None if args[0] is None else int(bo)


def sum_raw(base, raws, weights, total, div: int = 0, emit=None):
    """total = sum_k (float32(raws[k]) - base) * weights[k] in one pass over every model's chunk (then / div when
    div > 0), bitwise as tau_accumulate model after model; with `emit` = (out, lam, sign) the output chunk goes
    to `out` instead (as apply_raw; total is not written). (non-finite flag: nonzero where a task-vector element
    or total is not finite (the chunk then goes model by model, which names and counts), nonzeros of total,
    non-finite output flag or None where the output was not written) or None when not run."""
    import numpy as np

    got = _one_pass(base, raws, total)
    if got is None:
        return None
    e = _emit_args(base, emit)
    bad, nz, bo = _mod().sum_raw(got[0], got[1], np.asarray(weights, np.float64), _np(total).reshape(-1), int(div),
                                 *e)
    return int(bad), int(nz), _emitted(bo, e)


def consensus_raw(base, raws, total, emit=None):
    """NegMerge's sign-consensual mean in one pass over every model's chunk (bitwise as sign_stats model after
    model, then sign_consensus_finish), or the output chunk (`emit`, as sum_raw); (non-finite flag, kept count,
    non-finite output flag or None, as sum_raw's) or None."""
    got = _one_pass(base, raws, total)
    if got is None:
        return None
    e = _emit_args(base, emit)
    bad, kept, bo = _mod().consensus_raw(got[0], got[1], _np(total).reshape(-1), *e)
    return int(bad), int(kept), _emitted(bo, e)


def magmax_raw(base, raws, best, emit=None):
    """MagMax in one pass over every model's chunk (as magmax_add model after model), or the output chunk
    (`emit`, as sum_raw); (non-finite flag, nonzeros of best, non-finite output flag or None, as sum_raw's) or
    None."""
    got = _one_pass(base, raws, best)
    if got is None:
        return None
    e = _emit_args(base, emit)
    bad, nz, bo = _mod().magmax_raw(got[0], got[1], _np(best).reshape(-1), *e)
    return int(bad), int(nz), _emitted(bo, e)


def _selections(sels):
    """TopK selections [(mode, threshold, all ties, ties left)] as the loops' four arrays."""
    import numpy as np

    return (np.array([s[0] for s in sels], np.int64), np.array([s[1] for s in sels], np.float64),
            np.array([bool(s[2]) for s in sels], np.bool_), np.array([s[3] for s in sels], np.int64))


def topk_merge_raw(base, raws, sels, weights, consensus: int, normalize: bool, out, emit=None, tops=None):
    """Magnitude-pruned task arithmetic (consensus 0) or TIES (1: a sum of 0 elects no sign, the paper's; 2: it
    elects +, mergekit's) in one pass over every model's chunk, each model pruned by its TopK selection `sels[k]` =
    (mode, threshold, all ties, ties left) as :func:`topk_prune`; with `tops` (Breadcrumbs), each model's second
    selection, an element kept only where the first keeps it and the second does not (:func:`band_prune`); bitwise
    as pruning, accumulating and agreeing model after model. (non-finite flag, nonzeros of the result (TIES: of the
    divisor), ties at each model's threshold, kept pairs: numpy counts[a][b], a <= b, of the elements both models a
    and b kept, non-finite output flag or None (`emit`, as sum_raw: the output chunk written block by block, `out`
    then only scratch), ties at each model's second threshold (zeros without `tops`)) or None when not run."""
    import numpy as np

    got = _one_pass(base, raws, out)
    if got is None:
        return None
    band = None if tops is None else _selections(tops)
    e = _emit_args(base, emit)
    bad, nz, ties, pairs, bo, ties2 = _mod().topk_merge_raw(got[0], got[1], *_selections(sels),
                                                            np.asarray(weights, np.float64), int(consensus),
                                                            bool(normalize), _np(out).reshape(-1),
                                                            *_emit_flagged(got[0], e), band)
    return int(bad), int(nz), [int(t) for t in ties], pairs, _emitted(bo, e), [int(t) for t in ties2]


DEFER_MIN = 1 << 21  # smaller tensors: the scan's two passes are short, no deferred thresholds
DEFERRED = {"tried": 0, "found": 0}  # deferred passes run, and those whose thresholds held (the rest: scanned, again)
# the deferred pass's segment (elements): one call of its loop on the threads, whose pieces release their inputs'
# pages each as it ends (2^22 before session 43, released per segment: 0.03 s more per merge of the benchmark's files)
_DEFER_SEGMENT = 1 << 24
_DEFER_MOST = 0.25  # the sample's share of elements in the windows (summed over the models) a deferral takes at most
# the deferred pass's sample: 512 runs of _SAMPLE_WIDTH (2^17 elements). Its windows are the sample's quantiles 4
# standard errors either side of each k (twice the sample: the standard error / sqrt(2)), in whole buckets, so the
# pass stores fewer entries for its select and fix (session 50, Decisions: the benchmark's TIES windows spanned 3-6
# buckets and held 5.8 % of the elements with 256 runs, 1-5 and 4.3 % with 512; the scan's and CA-magnitude's
# samples stay 256 runs)
_DEFER_SAMPLE_BLOCKS = 512


def _windows_of(counts, ks, n: int):
    """(first buckets, widths) of one model's windows, one per k of `ks`, from its sample's counts (sampled as
    radix_select_tau samples: _kernels_numba.sample_hi_models), or None where a k gets no window of its own."""
    wins = [bucket_windows(counts, [k], n) for k in ks]
    if any(len(w) != 1 for w in wins):
        return None
    return [w[0][0] for w in wins], [w[0][1] for w in wins]


def _entry_buffers(n: int, share: float, K: int, dtype, buf, positions: bool):
    """For a pass that stores entries (topk_merge_deferred, ca_thresholds): its segments ([a, b) of _DEFER_SEGMENT
    elements), each one's entry slots (the sample's share of elements in the windows, with room), and the buffers
    of those slots from `buf(key, numel, torch dtype, spare)` (a pool's flat buffers, made anew with `spare`
    elements more; new ones where None): positions (int32; None unless `positions`), patterns (uint8), values
    ((K + 1) rows of `dtype`); then `buf` itself."""
    import torch

    segs = [(a, min(n, a + _DEFER_SEGMENT)) for a in range(0, n, _DEFER_SEGMENT)]
    caps = [int((e - a) * min(1.0, 1.5 * share + 0.005)) + 8 * 4096 for a, e in segs]
    cap = sum(caps)
    if buf is None:
        def buf(key, numel, dt, spare=0):
            return torch.empty(numel, dtype=dt)
    spare = cap // 2  # made anew, half as much again: a later tensor as large with more in its windows fits
    pos = _np(buf("defer_pos", cap, torch.int32, spare)) if positions else None
    pat = _np(buf("defer_pat", cap, torch.uint8, spare))
    vals = _np(buf("defer_vals", cap * (K + 1), dtype, spare * (K + 1))).reshape(K + 1, cap)
    return segs, caps, pos, pat, vals, buf


def _from(release, a):
    """release(a + lo, a + hi) for a piece [lo, hi) of the segment that starts at a (None without `release`)."""
    return None if release is None else (lambda lo, hi: release(a + lo, a + hi))


def _deferred_segments(km, b, rs, args, o, ef, segs, caps, pos, pat, vals, release):
    """topk_merge_deferred's pass, segment by segment ([a, b) of `segs`, entries in `caps[i]` slots each), `release`
    called for each piece as it ends: (nonzeros, kept-bits histogram, counts above the tops' windows, the entries'
    regions (first, end)), or None (a non-finite element or output, a segment's entries overflowing)."""
    import numpy as np

    fill, nz, hist, above2, first, ends = 0, 0, np.zeros(256, np.int64), 0, [], []
    for (a, bb), c in zip(segs, caps):
        oraw = ef[0][a:bb] if ef[2] else ef[0]
        got = km.topk_merge_deferred(b[a:bb], tuple(r[a:bb] for r in rs), *args, o[a:bb], oraw, ef[1], ef[2],
                                     pos[fill:fill + c], pat[fill:fill + c], vals[:, fill:fill + c],
                                     _from(release, a))
        if got[0] or got[5] or (got[4] < 0).any():
            return None
        nz, hist, above2 = nz + got[1], hist + got[2], above2 + got[6]
        for p0, p1 in zip(got[3], got[4]):
            pos[fill + p0:fill + p1] += a  # the segment's positions, made the tensor's
            first.append(fill + p0)
            ends.append(fill + p1)
        fill += c
    return nz, hist, above2, np.array(first, np.int64), np.array(ends, np.int64)


def topk_merge_deferred(base, raws, ks, keep_ties: bool, weights, consensus: int, normalize: bool, out, emit=None,
                        buf=None, tops=None, release=None, found=None):
    """topk_merge_raw over a whole tensor without the scan: each model keeps its ks[k] largest |tau| (ties by lower
    index, or all of them with `keep_ties`), its threshold found in the same pass (see _kernels_numba's "top-k,
    thresholds deferred"): a sample names the window of |tau| each threshold lies in (bucket_windows), the pass
    merges with what lies above the windows and stores the positions where a model's |tau| lies in its window, then
    those are merged again with the exact thresholds. With `tops` (Breadcrumbs, consensus False), each model's
    tops[k] largest are dropped as well (its second TopK): a second window per model, above the first, its elements
    stored too and those above it counted. Bitwise topk_merge_raw with the scan's selections. Its results (with each
    model's (threshold, above, equal) last, and its top's after them), or None: not run, a model's k outside its
    window or no window, windows that touch or hold too many elements, a non-finite element (the scan's path
    decides). `buf(key, numel, torch dtype, spare)`: the stored entries' buffers (a pool's, reused across tensors:
    their pages are touched once), else new ones. The pass goes segment by segment (_DEFER_SEGMENT elements), each
    segment's pieces calling `release(a, b)` with their range as each ends (the engine drops the inputs' mapped
    pages there: memory independent of the model count). Where only some windows miss their k, `found` (a dict) gets
    "sels": each window's selection as in the results, None where it missed (its model's scan alone is then needed)."""
    import numpy as np

    got = _one_pass(base, raws, out)
    if got is None:
        return None
    b, rs = got
    n, K = b.shape[0], len(rs)
    band = tops is not None
    kk = [list(ks), list(tops) if band else []]
    if not DEFER_MIN <= n < 1 << 31 or not all(0 < k < n for k in kk[0] + kk[1]) or K > 8:
        return None
    km = _mod()
    size = _DEFER_SAMPLE_BLOCKS * _SAMPLE_WIDTH
    counts = np.empty((K, 1 << 15), np.int64)
    km.sample_hi_models(b, rs, _sample_starts(n, _DEFER_SAMPLE_BLOCKS), _SAMPLE_WIDTH, counts)
    los, wds, top_at, share = [[], []], [[], []], [], 0.0
    for k in range(K):
        got = _windows_of(counts[k], [kk[0][k]] + ([kk[1][k]] if band else []), n)
        if got is None:
            return None
        first, width = got
        share += float(counts[k, first[0]:first[0] + width[0]].sum()) / size
        if band:  # the top's window above the first (the elements above it are only counted)
            if first[1] < first[0] + width[0]:
                return None
            share += float(counts[k, first[1]:first[1] + width[1]].sum()) / size
        for j in range(1 + band):
            los[j].append(first[j] << 16)
            wds[j].append(width[j] << 16)
        top_at.append(first[1] << 16 if band else 0xFFFFFFFF)
    if share > _DEFER_MOST:
        return None
    lo1, wd1, top_at = np.array(los[0], np.uint32), np.array(wds[0], np.uint32), np.array(top_at, np.uint32)
    his = lo1 + wd1
    segs, caps, pos, pat, vals, buf = _entry_buffers(n, share, K, base.dtype, buf, True)
    e = _emit_args(base, emit)
    o, ef = _np(out).reshape(-1), _emit_flagged(b, e)
    w = np.asarray(weights, np.float64)
    tv2 = top_at.view(np.float32) if band else None
    tf2 = np.ones(K, np.bool_) if band else None
    lo2 = np.array(los[1] if band else [0] * K, np.uint32)
    wd2 = np.array(wds[1] if band else [0] * K, np.uint32)
    his2 = lo2 + wd2 if band else np.full(K, 0xFFFFFFFF, np.uint32)
    DEFERRED["tried"] += 1
    args = (his.view(np.float32), lo1, wd1, lo2, wd2, his2, tv2, tf2, w, int(consensus), bool(normalize))
    got = _deferred_segments(km, b, rs, args, o, ef, segs, caps, pos, pat, vals, release)
    if got is None:
        return None
    nz, hist, above2, first, ends = got
    kept = hist[[[v for v in range(256) if v >> k & 1] for k in range(K)]].sum(axis=1)  # the pass kept, per model
    J = K * (1 + band)
    above = np.concatenate([kept + above2, above2[:J - K]]).astype(np.int64)  # the select adds the top's window
    thr, gt, eq, ok = km.deferred_select(vals, pat, first, ends, np.array(los[0] + los[1], np.uint32),
                                         np.array(wds[0] + wds[1], np.uint32), np.array(kk[0] + kk[1], np.int64),
                                         above)
    if not ok:
        if found is not None:  # a window that held its k has its count (eq > 0 only there: _kernels_numba._walk)
            found["sels"] = [(float(t), int(g), int(q)) if q > 0 else None
                             for t, g, q in zip(thr.view(np.float32), gt, eq)]
        return None
    left = np.array(kk[0] + kk[1], np.int64) - gt
    alls = np.array([(bool(keep_ties) and j < K) or int(left[j]) == int(eq[j]) for j in range(J)], np.bool_)
    thr_f = thr.view(np.float32)
    sec = (thr_f[K:].copy(), alls[K:].copy(), left[K:].copy()) if band else (None, None, None)
    bad2, dnz, change, bo2 = km.deferred_fix(vals, pos, first, ends, his, top_at, thr_f[:K].copy(), alls[:K].copy(),
                                             left[:K].copy(), *sec, w, int(consensus), bool(normalize), o, *ef)
    if bad2:
        return None
    DEFERRED["found"] += 1
    pairs = km.pairs_of_hist(hist + change, K)
    sels = [(float(thr_f[j]), int(gt[j]), int(eq[j])) for j in range(J)]
    return 0, int(nz + dnz), [int(x) for x in eq[:K]], pairs, _emitted(bo2, e), sels, [int(x) for x in eq[K:]]


def line_aligned_zeros(shape, dtype, line: int = 64):
    """Zeros (C order) whose data starts on a cache line. The MT19937 states of dare_masks, 624 uint32 words (39
    lines) a row, then share no line between rows: threads twisting neighbouring models' states in an array of
    numpy's 16-byte alignment wrote the lines their rows share, each twist, in turn (false sharing). Measured on
    the keep masks of 4 models x 2^21 elements, two threads, side by side in each run: 0.26-0.48 ns per number with
    rows 16, 32 or 48 bytes past a line against 0.14-0.36 aligned (one thread 0.26 against 0.24); in four DARE
    merges of the benchmark's files, alternated in one process, the masks took 0.48-0.76 s against 0.66-0.91."""
    import numpy as np

    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return aligned_span(np.zeros(nbytes + line, np.uint8), nbytes, line).view(dtype).reshape(shape)


def aligned_span(buf, nbytes: int, align: int):
    """The first `nbytes` of the uint8 array `buf` (at least nbytes + align long) that start on a multiple of
    `align` bytes: a view."""
    off = -buf.ctypes.data % align
    return buf[off:off + nbytes]


def dare_merge_raw(base, raws, streams, ps, weights, consensus: int, normalize: bool, rescale: bool, out, masks,
                   emit=None):
    """DARE (consensus 0) or DARE-TIES (1 or 2, as topk_merge_raw's) in one pass over every model's chunk: each
    model's keep mask drawn from its :class:`MTStream` (streams[k]; None where ps[k] <= 0: nothing drawn, tau kept
    as is), the models' streams in parallel, into the uint8 rows of `masks` (len(raws) x chunk); then tau / (1 - p)
    where kept (tau / 1 without `rescale`) and the sum or TIES' election and disjoint mean, bitwise as
    :func:`engine.dare_tensor` and the model-by-model loops. (non-finite flag, nonzeros of the result (TIES: of the
    divisor), kept pairs and non-finite output flag as topk_merge_raw's) or None when not run; the streams advance
    only when the flag is 0."""
    import numpy as np
    import torch

    got = _one_pass(base, raws, out)
    if got is None or masks.dtype != torch.uint8 or not _ok(masks):
        return None
    n, k = got[0].shape[0], len(raws)
    m = _np(masks).reshape(-1)[: k * n].reshape(k, n)
    thrs = np.array([_dare_thr(p) if p > 0 else -1 for p in ps], np.int64)
    ds = np.array([(np.float32(1.0 - p) if rescale else 1.0) if p > 0 else 0.0 for p in ps], np.float64)
    mts, poss = line_aligned_zeros((k, 624), np.uint32), np.full(k, 624, np.int64)
    for j, st in enumerate(streams):
        if st is not None:
            mts[j], poss[j] = st.mt, st.pos[0]
    km = _mod()
    km.dare_masks(mts, poss, thrs, m)  # on copies of the states: the streams advance only when the chunk is done
    e = _emit_args(base, emit)
    bad, nz, _, pairs, bo = km.dare_merge_raw(got[0], got[1], m, ds, np.asarray(weights, np.float64),
                                              int(consensus), bool(normalize), _np(out).reshape(-1),
                                              *_emit_flagged(got[0], e))
    if not bad:
        for j, st in enumerate(streams):
            if st is not None:
                st.mt[:], st.pos[0] = mts[j], poss[j]
    return int(bad), int(nz), pairs, _emitted(bo, e)


def nm_merge_raw(base, raws, nms, weights, conflict_aware: bool, pad_tail: bool, out, emit=None):
    """CABS (`conflict_aware`) or BS alone in one pass over every model's chunk: model k's balanced nms[k] = (n, m)
    pruning of tau_k = float32(raws[k]) - base (as :func:`nm_prune`, CABS' in the models' order), then out =
    the weighted sum over the models of nonzero weight (at least one), bitwise as nm_prune and accumulate model
    after model. The chunk starts on a block boundary of every model. (non-finite flag, nonzeros of out, short
    blocks per model, kept pairs as topk_merge_raw's, non-finite output flag or None (`emit`, as sum_raw)) or
    None when not run."""
    import math

    import numpy as np

    align = 1
    for _, m in nms:
        align = align * int(m) // math.gcd(align, int(m))
    if align > _NM_SPAN_MAX or not any(weights):  # a span holds whole blocks of every model, per model and thread
        return None
    got = _one_pass(base, raws, out)
    if got is None:
        return None
    e = _emit_args(base, emit)
    raws8 = got[1] + (got[0][:0],) * (MAX_ONE_PASS - len(raws))  # always 8: one compiled loop for every count
    ns, ms = np.array([n for n, _ in nms], np.int64), np.array([m for _, m in nms], np.int64)
    bad, nz, short, pairs, bo = _mod().nm_merge_raw(got[0], raws8, len(raws), ns, ms, align, bool(conflict_aware),
                                                    bool(pad_tail), np.asarray(weights, np.float64),
                                                    _np(out).reshape(-1), *_emit_flagged(got[0], e))
    return int(bad), int(nz), [int(c) for c in short], pairs, _emitted(bo, e)


def ca_merge_raw(base, raws, thresholds, weights, out, emit=None):
    """CA-magnitude in one pass over every model's chunk: in the models' order, model k keeps tau_k where |tau_k| >
    thresholds[k] (None: nothing) on the slots no earlier model kept, out = the weighted sum (every weight
    nonzero: a zero-weight model still takes slots, fed model by model), bitwise as threshold_prune and
    accumulate model after model. (non-finite flag, nonzeros of out, kept pairs as topk_merge_raw's, non-finite
    output flag or None (`emit`, as sum_raw)) or None when not run."""
    import numpy as np

    got = _one_pass(base, raws, out)
    if got is None or not all(weights):
        return None
    tv = np.array([np.inf if t is None else t for t in thresholds], np.float64)
    e = _emit_args(base, emit)
    bad, nz, pairs, bo = _mod().ca_merge_raw(got[0], got[1], tv, np.asarray(weights, np.float64),
                                             _np(out).reshape(-1), *_emit_flagged(got[0], e))
    return int(bad), int(nz), pairs, _emitted(bo, e)


CA_THRESHOLDS = {"tried": 0, "found": 0}  # ca_thresholds run, and those whose thresholds all lay in their windows


def ca_thresholds(base, raws, ks, buf=None, release=None):
    """CA-magnitude's thresholds for every model (in the models' order) in one pass over all of them, in place of
    its scan model by model (a histogram pass over each tau, then a pass marking the slots each keeps): model k's
    threshold is the ks[k]-th largest |x_k|, x_k = tau_k = float32(raws[k]) - base zeroed where an earlier model
    kept (|x_j| > its threshold), as radix_select_tau(raws[k], base, [ks[k]], taken) gives it. A sample of the
    tensor run through the same rule names each model's window (bucket_windows); the pass counts, per model, the
    slots no earlier model can have kept whose |x_k| lies above the window, and stores the elements where a model
    meets its window on such a slot (:func:`_kernels_numba.ca_scan`); the thresholds then come model after model
    from those entries (ca_candidates). The list of thresholds (float32 values), or None: not run (a
    tensor below WINDOW_MIN elements or past 2^31, a k outside (0, n), mixed dtypes, more than MAX_ONE_PASS models,
    a window at bucket 0 or holding too many elements, a threshold outside its window, a non-finite element): the
    per-model scans decide then. `buf(key, numel, torch dtype, spare)` and `release(a, b)` as topk_merge_deferred's
    (the pass goes segment by segment)."""
    import numpy as np

    got = _ca_entries(base, raws, None, ks, buf, False, WINDOW_MIN)
    if got is None:
        return None
    b, rs, his, los, wds, segs, caps, _, pat, vals, buf = got
    km = _mod()
    CA_THRESHOLDS["tried"] += 1
    got = _ca_pass(rs, ks, his, los, wds, segs, caps, pat, vals, buf, release,
                   lambda a, z, f, c, done: km.ca_scan(b[a:z], tuple(r[a:z] for r in rs), his, los, wds,
                                                       pat[f:f + c], vals[:, f:f + c], done))
    if got is None:
        return None
    CA_THRESHOLDS["found"] += 1
    return [float(t) for t in got[0].view(np.float32)]


def _ca_entries(base, raws, out, ks, buf, positions: bool, least: int):
    """The inputs, windows and entry buffers of ca_thresholds' pass (and ca_merge_deferred's, `out` its output):
    (the base's and models' flat arrays, window ends, first bits, widths, then _entry_buffers' segments,
    capacities, positions (`positions`), patterns, values and `buf`), or None where the pass does not run (as
    _one_pass, a tensor below `least` elements or past 2^31, a k outside (0, n), no window)."""
    got = _one_pass(base, raws, *([] if out is None else [out]))
    if got is None:
        return None
    b, rs = got
    n = b.shape[0]
    if not least <= n < 1 << 31 or not all(0 < k < n for k in ks):
        return None
    wins = _ca_windows(b, rs, ks, n)
    if wins is None:
        return None
    los, wds, share = wins
    return (b, rs, los + wds, los, wds, *_entry_buffers(n, share, len(rs), base.dtype, buf, positions))


def _ca_pass(rs, ks, his, los, wds, segs, caps, pat, vals, buf, release, scan):
    """ca_thresholds' pass (or ca_merge_deferred's) segment by segment: scan(a, z, f, c, done) runs its loop over [a,
    z) of the tensor into the entry slots [f, f + c) and returns (failed, each model's count above its window, the
    pieces' first entries, their ends (-1: overflowed)); scan(a, z, f, c, done) with `done` = release shifted to the
    segment (each piece's range as it ends). Then the thresholds from the entries (_ca_select): (their bits, the
    regions' first entries, their ends), or None (a failed or overflowed segment, a threshold outside its window)."""
    import numpy as np

    above, first, ends, fill = np.zeros(len(rs), np.int64), [], [], 0
    for (a, z), c in zip(segs, caps):
        bad, ab, p0, p1 = scan(a, z, fill, c, _from(release, a))
        if bad or (p1 < 0).any():
            return None
        above += ab
        first.append(fill + p0)
        ends.append(fill + p1)
        fill += c
    first, ends = np.concatenate(first), np.concatenate(ends)
    thr = _ca_select(_mod(), vals, pat, first, ends, above, ks, his, los, wds, buf)
    return None if thr is None else (thr, first, ends)


def _ca_select(km, vals, pat, first, ends, above, ks, his, los, wds, buf):
    """Each model's threshold (its |tau| bits, uint32) from the entries of ca_scan or ca_merge_scan (regions [first[i],
    ends[i]) of pat and vals; above[k]: model k's free slots above its window), model after model (ca_candidates);
    None where one lies outside its window."""
    import numpy as np
    import torch

    K = len(ks)
    M = int((ends - first).sum())
    tk = _np(buf("ca_taken", M, torch.bool))
    tk[:] = False
    ub = _np(buf("ca_bits", M, torch.int32)).view(np.uint32)
    fl = _np(buf("ca_window", M, torch.bool))
    cand = _np(buf("ca_cand", M, torch.int32)).view(np.uint32)
    offs = np.concatenate([[0], np.cumsum(ends - first)[:-1]]).astype(np.int64)
    res = np.zeros((len(first), 2), np.int64)
    thr = np.zeros(K, np.uint32)
    for k in range(K):  # model k's ks[k]-th largest: the r-th largest of its entries in the window
        km.ca_candidates(vals, pat, first, ends, offs, tk, k, his[k], los[k], wds[k], ub, fl, cand, res,
                         thr[k - 1] if k else 0)  # model k - 1's keeps taken first
        got, c = res.sum(axis=0)
        r = ks[k] - above[k] - got
        if not 0 < r <= c:  # the threshold lies outside the window
            return None
        inw = np.concatenate([cand[o:o + m] for o, m in zip(offs, res[:, 1])])  # each region's, compacted
        inw.sort()  # not partition: |tau| ties by the 100,000 here (bf16), which made numpy's introselect take
        thr[k] = inw[c - r]  # 9-14 ms on 0.8-1.2M candidates, its sort 1 ms
    return thr


CA_DEFERRED = {"tried": 0, "found": 0}  # ca_merge_deferred run, and those whose thresholds held


def ca_merge_deferred(base, raws, ks, weights, out, emit=None, buf=None, release=None):
    """CA-magnitude's thresholds and merge in one pass over a whole tensor: ca_merge_raw with ca_thresholds'
    thresholds (ks as there), each input read once instead of twice. ca_thresholds' pass also merges every slot
    whose models' choices the windows decide (_kernels_numba.ca_merge_scan), and stores the others (its entries)
    with their positions; once the thresholds are found from the entries (_ca_select), those slots are merged by
    ca_merge_raw's own loop and written at their positions (ca_fix). Bitwise ca_merge_raw with ca_thresholds'
    thresholds. (ca_merge_raw's results, then the thresholds (float32 values)), or None: not run (where
    ca_thresholds or ca_merge_raw would not, or a weight is 0), a threshold outside its window, a non-finite
    element, result or output (then the scan and ca_merge_raw decide). `out`, `emit` as ca_merge_raw's for the
    whole tensor; `buf`, `release` as ca_thresholds'."""
    import numpy as np

    got = _ca_entries(base, raws, out, ks, buf, True, DEFER_MIN) if all(weights) else None
    if got is None:
        return None
    b, rs, his, los, wds, segs, caps, pos, pat, vals, buf = got
    K = len(rs)
    e = _emit_args(base, emit)
    o, (oraw, sc, emitting) = _np(out).reshape(-1), _emit_flagged(b, e)
    w = np.asarray(weights, np.float64)
    km = _mod()
    CA_DEFERRED["tried"] += 1
    hist, nz = np.zeros(256, np.int64), 0

    def scan(a, z, f, c, done):
        nonlocal hist, nz
        bad, ab, p0, p1, dnz, h, bo = km.ca_merge_scan(b[a:z], tuple(r[a:z] for r in rs), his, los, wds, w, o[a:z],
                                                       oraw[a:z] if emitting else oraw, sc, emitting, pos[f:f + c],
                                                       pat[f:f + c], vals[:, f:f + c], done)
        hist, nz = hist + h, nz + dnz
        for q0, q1 in zip(p0, p1):
            pos[f + q0:f + max(q0, q1)] += a  # the segment's positions, made the tensor's
        return bad or bo, ab, p0, p1

    got = _ca_pass(rs, ks, his, los, wds, segs, caps, pat, vals, buf, release, scan)
    if got is None:
        return None
    thr, first, ends = got
    bad, dnz, h, bo = km.ca_fix(vals, tuple(vals[1 + k] for k in range(K)), pos, first, ends, thr.view(np.float32),
                                w, o, oraw, sc, emitting)
    if bad or bo:
        return None
    CA_DEFERRED["found"] += 1
    return 0, int(nz + dnz), km.pairs_of_hist(hist + h, K), _emitted(0, e), [float(t) for t in thr.view(np.float32)]


def _ca_windows(b, rs, ks, n: int):
    """(first bits, widths in bits (uint32 arrays), the sample's share of elements in some window) of each model's
    window for ca_thresholds, from radix_select_tau's sample run through CA-magnitude (_kernels_numba.ca_sample:
    model k's |x_k| sampled with the slots the sample's earlier thresholds kept at 0, its own ks[k] / n quantile
    as its threshold), the window around each quantile (bucket_windows); None where a model gets no single window,
    one at bucket 0 (the zeros of the kept slots would count in it), or the windows hold more than _DEFER_MOST."""
    import numpy as np

    starts = _sample_starts(n)
    S, K = _SAMPLE_BLOCKS * _SAMPLE_WIDTH, len(rs)
    us, counts = np.empty((K, S), np.uint32), np.zeros((K, 1 << 15), np.int64)
    qs = np.array([min(S, max(1, round(k / n * S))) for k in ks], np.int64)
    _mod().ca_sample(b, rs, starts, _SAMPLE_WIDTH, qs, us, counts)
    los, wds = [], []
    for j, k in enumerate(ks):
        w = bucket_windows(counts[j], [k], n, most=1 << 15)  # no cap: the pass stores entries, no rows
        if len(w) != 1 or w[0][0] == 0:
            return None
        (s, width), = w
        los.append(s << 16)
        wds.append(width << 16)
    los, wds = np.array(los, np.uint32), np.array(wds, np.uint32)
    share = _mod().ca_share(us, los, wds) / S  # the slots taken are 0: outside any window (none at bucket 0)
    if share > _DEFER_MOST:
        return None
    return los, wds, share


def apply_raw(base, merged, lam: float, sign: int, out):
    """As :func:`apply` with the base chunk as read (bfloat16 or float32) instead of its float32 copy; nonzero
    where an output is not finite (0: all finite), or None when not run."""
    import torch

    if base.dtype not in (torch.bfloat16, torch.float32) or merged.dtype != torch.float32 \
            or out.dtype not in (torch.bfloat16, torch.float32) or not _ok(base, merged, out):
        return None
    return int(_mod().apply_raw(_np(base).reshape(-1), _np(merged).reshape(-1), _scale(lam, sign),
                                _np(out).reshape(-1)))
