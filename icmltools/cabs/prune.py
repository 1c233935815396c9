"""CABS as pure torch functions on tensors (one tensor at a time, never across tensors).

Notation: tau_k = theta_k - theta_0, k = 0..K-1 in the given order (the pruning order); d = n / m.

* BS, balanced sparsification (paper, method section; official ``n_m_block_pruning`` and mergekit's
  ``prune_n_m_structural``): flatten row-major, cut into consecutive blocks of m, keep the n largest |tau|
  of every block. The last partial block (numel % m = r > 0): ``pad`` keeps its top min(n, r) (mergekit
  zero-pads to m), ``drop`` prunes it all (the RoBERTa script skips it).
* CA, conflict-aware sparsification (official ``block_random_pruning``; mergekit's CABSTask loop): the
  models are pruned one after another, each only on the positions no earlier model kept
  (``taken |= mask_k``), so the pruned vectors are disjoint.
* The merge: theta = theta_0 + sum_k lambda_k * (tau_k * mask_k), never rescaled, in float32 (float64 for
  float64 tensors), the sum accumulated in order, added to theta_0 and cast once to the tensor's dtype; zero
  lambdas are skipped so that lambda = 0 returns theta_0 bitwise. (mergekit adds each term to theta_0 in the
  base's dtype; for CABS the terms are disjoint, so in float32 the two are bitwise equal.)

Selection rule: the official topk on |candidate| may pick zero-valued (even already taken) slots, whose
values are zero anyway. Here the score is |tau| with taken slots (and padding) set to -1; the top n are
taken and the picks with a negative score dropped: the kept values are the official ones (bitwise, on
tie-free data), and every block keeps exactly min(n, free slots) positions. When K * n > m the later models
get fewer slots (10:32 with K = 4: 10, 10, 10, 2).
"""
from __future__ import annotations

import math
from typing import Sequence

from icmltools.core.errors import BadInputError

from .options import AUTO_M, AUTO_NM, AUTO_TOTAL, TAILS

# --------------------------------------------------------------------------------------------- n:m settings


def parse_nm(text: str, param: str = "nm") -> tuple[int, int]:
    """'4:32' -> (4, 32); 1 <= n <= m."""
    parts = str(text).strip().split(":")
    try:
        n, m = (int(p) for p in parts)
    except ValueError:
        raise BadInputError(f"expected N:M with integers (e.g. 4:32), got {text!r}", param=param) from None
    if m < 1 or n < 1 or n > m:
        raise BadInputError(f"{text!r}: n:m needs 1 <= n <= m", param=param)
    return n, m


def auto_nm(k: int) -> tuple[int, int]:
    """The default pattern for K models: m = 32, n = max(1, 16 // K) (total density <= 50 %)."""
    return max(1, AUTO_TOTAL // max(1, k)), AUTO_M


def resolve_nms(k: int, nm: str = AUTO_NM, nm_for: Sequence[str] = ()) -> list[tuple[int, int]]:
    """Per-model (n, m): `nm` for all ('auto' or 'N:M'), overridden by `nm_for` entries 'I=N:M' (0-based I)."""
    base = auto_nm(k) if str(nm) == AUTO_NM else parse_nm(nm)
    out = [base] * k
    for item in nm_for:
        idx, sep, val = str(item).partition("=")
        try:
            i = int(idx)
        except ValueError:
            i = -1
        if not sep or not 0 <= i < k:
            raise BadInputError(f"{item!r}: expected I=N:M with a model index 0..{k - 1}", param="nm_for")
        out[i] = parse_nm(val, param="nm_for")
    return out


def check_tail(tail: str) -> None:
    if tail not in TAILS:
        raise BadInputError(f"unknown tail rule {tail!r}; choose one of {', '.join(TAILS)}", param="tail")


def overfull_warning(nms: Sequence[tuple[int, int]]) -> str | None:
    """With one m for all, sum_k n_k > m leaves the later models fewer than n slots per block: a warning."""
    ms = {m for _, m in nms}
    if len(ms) == 1 and sum(n for n, _ in nms) > next(iter(ms)):
        m = next(iter(ms))
        return (f"sum of n over the models ({sum(n for n, _ in nms)}) exceeds m = {m}: the later models in the "
                "order get fewer than n slots per block (conflict-aware pruning keeps the pruned vectors disjoint)")
    return None


# --------------------------------------------------------------------------------------------- masks


def _block_keep(score, n: int, short: list | None = None):
    """Rows of `score` (blocks): a bool mask of the top-n picks with score >= 0; `short[0]` += the rows keeping
    fewer than min(n, row length)."""
    import torch

    length = score.shape[1]
    k = min(n, length)
    if score.dtype == torch.float32:  # ties by lower index: rank on (score bits, -position), unique int64 keys
        pos = torch.arange(length - 1, -1, -1, dtype=torch.int64, device=score.device)
        score = score.view(torch.int32).to(torch.int64).mul_(length).add_(pos)
    vals, idx = torch.topk(score, k, dim=1, sorted=False)
    ok = vals >= 0
    keep = torch.zeros(score.shape, dtype=torch.bool, device=score.device)
    keep.scatter_(1, idx, ok)
    if short is not None:
        short[0] += int(torch.count_nonzero(ok.sum(1) < k))
    return keep


def nm_mask(tau, n: int, m: int, taken=None, tail: str = "pad", short: list | None = None):
    """Balanced n:m mask of one tensor (BS; with `taken`, the CA step too): row-major blocks of m, the n
    largest |tau| per block among the positions not in `taken`; the last partial block by `tail`. With
    `short` (a one-item list), its item grows by the blocks keeping fewer than n (min(n, r) for a padded tail)."""
    import torch

    flat = tau.reshape(-1)
    numel = flat.numel()
    score = flat.abs().to(torch.float64 if flat.dtype == torch.float64 else torch.float32)
    if taken is not None:
        score.masked_fill_(taken.reshape(-1), -1.0)
    full = numel // m * m
    if full == numel:   # no tail: the block mask is the mask
        return _block_keep(score.view(-1, m), n, short).view(tau.shape)
    mask = torch.zeros(numel, dtype=torch.bool, device=flat.device)
    if full:
        mask[:full] = _block_keep(score[:full].view(-1, m), n, short).view(-1)
    if full < numel and tail == "pad":
        mask[full:] = _block_keep(score[full:].view(1, -1), n, short).view(-1)
    return mask.view(tau.shape)


def magnitude_threshold(tau, density: float, taken=None):
    """The official RoBERTa ``topk_values_mask`` threshold: with s = 1 - d, (the ascending-sorted |x|)[int(s *
    numel)], x = tau zeroed where `taken` (None when nothing can be kept). On the CPU, in one copy of |x|: for
    float32 the engine's radix select (that element is the (numel - idx)-th largest; two histogram passes),
    else numpy's partition; ``torch.kthvalue`` elsewhere (it holds int64 indices too: 3x the memory of the
    copy)."""
    import torch

    from icmltools.merge import kernels as K

    a = tau.abs().reshape(-1)
    if taken is not None:
        a.masked_fill_(taken.reshape(-1), 0)
    idx = int((1 - density) * a.numel())
    if idx >= a.numel():
        return None
    sel = K.radix_select(a, a.numel() - idx) if a.device.type == "cpu" else None
    if sel is not None:
        return torch.tensor(sel[0], dtype=a.dtype)
    if a.device.type == "cpu" and a.dtype in (torch.float32, torch.float64):
        arr = a.numpy()
        arr.partition(idx)
        return torch.tensor(arr[idx], dtype=a.dtype)
    return torch.kthvalue(a, idx + 1).values


def magnitude_mask(tau, density: float, taken=None):
    """Top-d magnitude mask of one tensor by the RoBERTa rule: keep |x| > :func:`magnitude_threshold`; with
    `taken`, x is tau zeroed there first (the RoBERTa ``magnitude`` branch of ``block_random_pruning``:
    CA-magnitude; the threshold is >= 0, so taken slots are never kept)."""
    import torch

    thr = magnitude_threshold(tau, density, taken)
    if thr is None:
        return torch.zeros(tau.shape, dtype=torch.bool, device=tau.device)
    keep = tau.abs() > thr
    return keep if taken is None else keep.logical_and_(taken.logical_not())


def cabs_masks(taus: Sequence, nms: Sequence[tuple[int, int]], tail: str = "pad", taken=None) -> list:
    """CABS masks in the given order (CA + BS): mask_k = nm_mask(tau_k, n_k, m_k, taken), taken |= mask_k.
    `taken` (bool, updated in place) carries the positions kept so far; None starts empty."""
    import torch

    if taken is None:
        taken = torch.zeros(taus[0].shape, dtype=torch.bool, device=taus[0].device)
    masks = []
    for tau, (n, m) in zip(taus, nms):
        mk = nm_mask(tau, n, m, taken, tail)
        taken |= mk
        masks.append(mk)
    return masks


def bs_masks(taus: Sequence, nms: Sequence[tuple[int, int]], tail: str = "pad") -> list:
    """BS alone: each model's own n:m mask, no conflict-awareness."""
    return [nm_mask(t, n, m, None, tail) for t, (n, m) in zip(taus, nms)]


def ca_magnitude_masks(taus: Sequence, densities: Sequence[float], taken=None) -> list:
    """CA-magnitude (the RoBERTa ``magnitude`` branch, generalised to K models in order): each model's
    top-d magnitudes among the positions no earlier model kept."""
    import torch

    if taken is None:
        taken = torch.zeros(taus[0].shape, dtype=torch.bool, device=taus[0].device)
    masks = []
    for tau, d in zip(taus, densities):
        mk = magnitude_mask(tau, d, taken)
        taken |= mk
        masks.append(mk)
    return masks


MASKS = {  # method -> f(taus, nms, tail) -> masks; a new pruning rule is one line here
    "cabs": lambda taus, nms, tail: cabs_masks(taus, nms, tail),
    "bs": lambda taus, nms, tail: bs_masks(taus, nms, tail),
    "ca_magnitude": lambda taus, nms, tail: ca_magnitude_masks(taus, [n / m for n, m in nms]),
}


# --------------------------------------------------------------------------------------------- merge


def compute_dtype(dtype):
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def prune(tau, mask):
    """pruned = tau * mask, never rescaled (zeros where the mask is False)."""
    return tau.masked_fill(~mask, 0)


def merge_masked(base, taus: Sequence, masks: Sequence, lams: Sequence[float]):
    """theta = theta_0 + sum_k lambda_k * (tau_k * mask_k): the sum accumulated in order in float32 (float64),
    added to theta_0 once, cast once (the engine's arithmetic); all lambdas 0 returns theta_0 bitwise."""

    cd = compute_dtype(base.dtype)
    total = None
    for tau, mk, lam in zip(taus, masks, lams):
        if lam != 0:
            term = prune(tau.to(cd), mk)
            term = term if lam == 1.0 else term.mul_(lam)
            total = term if total is None else total.add_(term)
    if total is None:
        return base.clone()
    return (base.to(cd) + total).to(base.dtype)


def task_vectors(base, models: Sequence):
    """tau_k = theta_k - theta_0 in the compute dtype."""
    cd = compute_dtype(base.dtype)
    b = base.to(cd)
    return [m.to(cd) - b for m in models]


def merge_tensor(method: str, base, models: Sequence, nms: Sequence[tuple[int, int]], lams: Sequence[float],
                 tail: str = "pad", chunk_elems: int | None = None):
    """One tensor merged with `method` in MASKS ('cabs', 'bs', 'ca_magnitude'): (theta, masks).

    With `chunk_elems`, the n:m methods run over flat chunks whose length is a multiple of every m (block
    boundaries stay where they are, so the result is exact); CA-magnitude's threshold is per tensor and is
    never chunked."""
    if chunk_elems is not None and method in ("cabs", "bs"):
        return _merge_chunked(method, base, models, nms, lams, tail, chunk_elems)
    taus = task_vectors(base, models)
    masks = MASKS[method](taus, nms, tail)
    return merge_masked(base, taus, masks, lams), masks


def aligned_chunk(chunk_elems: int, ms: Sequence[int]) -> int:
    """The largest multiple of lcm(m_k) not above `chunk_elems` (at least one lcm)."""
    step = 1
    for m in ms:
        step = step * m // math.gcd(step, m)
    return max(step, chunk_elems // step * step)


def _merge_chunked(method, base, models, nms, lams, tail, chunk_elems):
    """The n:m methods over m-aligned flat chunks (the streamed engine's form; equal to the unchunked)."""
    import torch

    step = aligned_chunk(chunk_elems, [m for _, m in nms])
    flat_b = base.reshape(-1)
    flats = [m.reshape(-1) for m in models]
    out = torch.empty_like(flat_b)
    masks = [torch.zeros(flat_b.shape, dtype=torch.bool, device=flat_b.device) for _ in models]
    for s in range(0, flat_b.numel(), step):
        e = min(s + step, flat_b.numel())
        taus = task_vectors(flat_b[s:e], [f[s:e] for f in flats])
        part = MASKS[method](taus, nms, tail)
        out[s:e] = merge_masked(flat_b[s:e], taus, part, lams)
        for mk, p in zip(masks, part):
            mk[s:e] = p
    return out.view(base.shape), [mk.view(base.shape) for mk in masks]
