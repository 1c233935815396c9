"""Vectorised advantages for k-sample objectives (Tang et al., ICML 2025, Sec. 3) and the PKPO baselines.

Every function works on a batch of groups of the same size: rewards R (G, n) float; for maj@k also answer
codes (G, n) int (-1: no vote; otherwise the index of the answer's first sample in the group) and the reward
of each code (G, n). The gradient these advantages feed is sum_i A_i grad log pi(y_i) (a sum, no 1/k).
"""
from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive

from .options import ENUM_LIMIT, OBJECTIVES, PKPO_ESTIMATORS, SAMPLED_SUBSETS, SCALES, STD_EPS

# ------------------------------------------------------------------------------------------------ pass@k


@lru_cache(maxsize=256)
def _max_weights(n: int, k: int):
    """Rank weights (ranks 1..n ascending, as float arrays) for sums of max over subsets, divided by C(n, k).

    own[j] = C(j-1, k-1): k-subsets whose max is rank j; up[j] = C(j-2, k-2): k-subsets holding a lower rank and
    rank j as max; lo_m[j] = C(j-1, m-1), hi_m[j] = C(j-2, m-1) for m-subsets of the other n-1 samples (m = k-1, k)."""
    tot = math.comb(n, k)
    j = range(1, n + 1)

    def w(f):
        return np.array([f(x) / tot for x in j], dtype=float)

    def comb(a, b):
        return math.comb(a, b) if a >= 0 and b >= 0 else 0

    return {"own": w(lambda x: comb(x - 1, k - 1)), "up": w(lambda x: comb(x - 2, k - 2)),
            "lo1": w(lambda x: comb(x - 1, k - 2)), "hi1": w(lambda x: comb(x - 2, k - 2)),
            "lo0": w(lambda x: comb(x - 1, k - 1)), "hi0": w(lambda x: comb(x - 2, k - 1))}


def _suffix(a):
    """s[:, i] = sum_{j > i} a[:, j]."""
    c = np.cumsum(a[:, ::-1], axis=1)[:, ::-1]
    return np.concatenate([c[:, 1:], np.zeros((a.shape[0], 1))], axis=1)


def _prefix(a):
    """p[:, i] = sum_{j < i} a[:, j]."""
    c = np.cumsum(a, axis=1)
    return np.concatenate([np.zeros((a.shape[0], 1)), c[:, :-1]], axis=1)


def _unsort(order, a):
    out = np.empty_like(a)
    np.put_along_axis(out, order, a, axis=1)
    return out


def _pass_parts(R, k: int):
    """(S, B_{k-1}, B_k, f) per sample, each / C(n, k): S_i = sum over k-subsets I containing i of max_I
    (PKPO's s_i, real rewards: rank form [C(i-1,k-1) g_(i) + sum_{j>i} C(j-2,k-2) g_(j)]); B_m,i = sum over
    m-subsets of the other samples of their max; f = the U-statistic of pass@k (max@k) for the group."""
    n = R.shape[1]
    w = _max_weights(n, k)
    order = np.argsort(R, axis=1, kind="stable")
    g = np.take_along_axis(R, order, axis=1)
    s = w["own"] * g + _suffix(w["up"] * g)
    b1 = _prefix(w["lo1"] * g) + _suffix(w["hi1"] * g)
    b0 = _prefix(w["lo0"] * g) + _suffix(w["hi0"] * g)
    f = (w["own"] * g).sum(axis=1)
    return _unsort(order, s), _unsort(order, b1), _unsort(order, b0), f


def pass_loo(R, k):
    """Eq. (LOO) for f = max: A_i = f(y) - f(y_-i) (n = k: the best sample gets r_(1) - r_(2), others 0);
    n > k: the U-statistic (1/C(n,k)) sum_{I contains i} [max_I - max_{I minus i}], in closed form."""
    s, b1, _, f = _pass_parts(R, k)
    return s - b1, f


def pkpo(R, k):
    """PKPO s_i (Walder & Karkhanis Thm. 3/5): (1/C(n,k)) sum_{I contains i} max_I."""
    s, _, _, f = _pass_parts(R, k)
    return s, f


def pkpo_loo(R, k):
    """PKPO leave-one-out: s_i - (k/(n-1)) * (unbiased max@k estimate from the other n-1 samples); n > k."""
    n = R.shape[1]
    s, _, b0, f = _pass_parts(R, k)
    return s - (k / (n - 1)) * b0 * (math.comb(n, k) / math.comb(n - 1, k)), f


def pkpo_loo1(R, k):
    """PKPO leave-one-out with k-1: s_i - (k/n) * (mean over (k-1)-subsets of the others of their max);
    binary: C(n-c, k-1)/C(n, k) if correct else 0. Equals `loo` for pass@k."""
    n = R.shape[1]
    s, b1, _, f = _pass_parts(R, k)
    mean_b = b1 * math.comb(n, k) / math.comb(n - 1, k - 1)
    return s - (k / n) * mean_b, f


# ------------------------------------------------------------------------------------------------ maj@k


def vote_value(counts, rew):
    """f of a vote: reward of the most voted answer; ties -> mean reward of the tied answers; no vote -> 0."""
    mx = counts.max(axis=-1, keepdims=True)
    tied = (counts == mx) & (mx > 0)
    nt = tied.sum(axis=-1)
    val = (tied * rew).sum(axis=-1)
    return np.where(nt > 0, val / np.maximum(nt, 1), 0.0)


def _onehot(codes, width):
    oh = (codes[..., None] == np.arange(width)).astype(np.int32)
    return oh  # code -1 gives a zero row


def _maj_subsets(codes, rew, k, subsets, weight):
    """sum over the given k-subsets (S, k) of [f(I) - f(I minus i)] for i in I, times weight; and mean f(I)."""
    G, n = codes.shape
    A = np.zeros((G, n))
    fsum = np.zeros(G)
    for lo in range(0, len(subsets), 2048):
        sub = subsets[lo:lo + 2048]                       # (S, k)
        oh = _onehot(codes[:, sub], n)                    # (G, S, k, n)
        counts = oh.sum(axis=2)                           # (G, S, n)
        r = rew[:, None, :]
        f_all = vote_value(counts, r)                     # (G, S)
        f_minus = vote_value(counts[:, :, None, :] - oh, r[:, :, None, :])  # (G, S, k)
        d = (f_all[:, :, None] - f_minus) * weight
        for p in range(k):
            np.add.at(A, (slice(None), sub[:, p]), d[:, :, p])
        fsum += f_all.sum(axis=1) * weight
    return A, fsum


def maj_loo(R, k, codes=None, rew=None, seed=0):
    """Eq. (LOO) for f = majority vote: A_i = f(y) - f(y_-i), non-zero only where removing y_i changes the
    vote. n > k: the U-statistic over all k-subsets while C(n, k) <= ENUM_LIMIT, else over SAMPLED_SUBSETS
    uniform k-subsets (E[1{i in I} d(I, i)] is the same sum: still unbiased)."""
    G, n = R.shape
    if n == k:
        oh = _onehot(codes, n)
        counts = oh.sum(axis=1)
        f = vote_value(counts, rew)
        f_minus = vote_value(counts[:, None, :] - oh, rew[:, None, :])
        return f[:, None] - f_minus, f
    total = math.comb(n, k)
    if total <= ENUM_LIMIT:
        subsets = np.array(list(itertools.combinations(range(n), k)), dtype=np.int64)
        return _maj_subsets(codes, rew, k, subsets, 1.0 / total)
    rng = derive(seed, "kpass", "subsets", n, k).numpy()
    subsets = np.argsort(rng.random((SAMPLED_SUBSETS, n)), axis=1)[:, :k]
    return _maj_subsets(codes, rew, k, subsets, 1.0 / SAMPLED_SUBSETS)


# ------------------------------------------------------------------------------------------------ mean


def mean_loo(R, k):
    """RLOO for the mean objective: A_i = r_i - mean_{j != i} r_j (= k * the LOO of f = mean; k-free)."""
    n = R.shape[1]
    tot = R.sum(axis=1, keepdims=True)
    return R - (tot - R) / (n - 1), R.mean(axis=1)


# ------------------------------------------------------------------------------------------------ registry

PASS = {"loo": pass_loo, "pkpo": pkpo, "pkpo-loo": pkpo_loo, "pkpo-loo1": pkpo_loo1}


def _base(objective, estimator, R, k, codes, rew, seed):
    name = "loo" if estimator == "centered" else estimator
    if objective == "pass":
        return PASS[name](R, k)
    if objective == "maj":
        return maj_loo(R, k, codes, rew, seed)
    return mean_loo(R, k)


def _check(objective, estimator, n, k, scale):
    if objective not in OBJECTIVES:
        raise BadInputError(f"unknown objective {objective!r}; choose from {', '.join(OBJECTIVES)}", param="objective")
    if estimator in PKPO_ESTIMATORS and objective != "pass":
        raise BadInputError(f"{estimator} is defined for the pass objective only", param="estimator")
    if estimator not in PKPO_ESTIMATORS + ("loo", "centered"):
        raise BadInputError(f"unknown estimator {estimator!r}", param="estimator")
    if scale not in SCALES:
        raise BadInputError(f"unknown scale {scale!r}", param="scale")
    if n < 2:
        raise BadInputError(f"a group needs at least 2 samples, got {n}", param="rewards")
    if k < 2 or n < k:
        raise BadInputError(f"need 2 <= k <= n (group size); got k = {k}, n = {n}", param="k")
    if estimator == "pkpo-loo" and n == k:
        raise BadInputError(f"pkpo-loo needs n > k (group size {n}, k = {k})", param="estimator")


def evaluate(R, k=None, objective="pass", estimator="loo", codes=None, rew=None, scale="none", seed=0):
    """(advantages (G, n), objective estimate f (G,)) for a batch of groups of equal size n; see `advantages`."""
    R = np.asarray(R, dtype=float)
    n = R.shape[1]
    k = n if k is None else int(k)
    _check(objective, estimator, n, k, scale)
    A, f = _base(objective, estimator, R, k, codes, rew, seed)
    if estimator == "centered":  # biased, lower variance: A_i - mean_j A_j (sums to 0 per group)
        A = A - A.mean(axis=1, keepdims=True)
    if scale == "std":  # GRPO-style: divide by the group's reward std (ddof 1) + eps
        A = A / (R.std(axis=1, ddof=1, keepdims=True) + STD_EPS)
    return A, np.asarray(f, dtype=float)


def encode_answers(answers, rewards, answer_reward="error"):
    """Per group: answer codes (first index of each distinct answer; -1 for None) and the reward of each code.

    Samples that share an answer must share its reward (else BadInputError naming the group), unless
    answer_reward == "mean" (the mean reward of the answer's samples)."""
    R = np.asarray(rewards, dtype=float)
    G, n = R.shape
    codes = np.full((G, n), -1, dtype=np.int64)
    rew = np.zeros((G, n))
    for g in range(G):
        _encode_group(answers[g], R[g], codes[g], rew[g], answer_reward, g)
    return codes, rew


def _encode_group(ans, r, codes, rew, answer_reward, g):
    first: dict = {}
    sums: dict = {}
    if len(ans) != len(r):
        raise BadInputError(f"group {g}: {len(ans)} answers for {len(r)} rewards", param="answers")
    for i, a in enumerate(ans):
        if a is None:
            continue
        key = (type(a).__name__, a) if not isinstance(a, float) else ("num", a)
        c = first.setdefault(key, i)
        codes[i] = c
        if c != i and r[i] != r[c] and answer_reward == "error":
            raise BadInputError(f"group {g}: answer {a!r} has rewards {r[c]:g} and {r[i]:g} "
                                "(samples sharing an answer must share its reward)", param="answers")
        s = sums.setdefault(c, [0.0, 0])
        s[0] += r[i]
        s[1] += 1
    for c, (tot, cnt) in sums.items():
        rew[c] = tot / cnt


def _to_numpy(x):
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy(), x
    return np.asarray(x, dtype=float), None


def advantages(rewards, k=None, objective="pass", estimator="loo", answers=None, scale="none",
               answer_reward="error", seed=0):
    """Per-sample advantages for a k-sample objective (Tang et al. 2025, Sec. 3; PKPO baselines).

    rewards: (G, n) or (n,) numpy array, list or torch tensor (G groups of n samples of one prompt each).
    k: samples per objective evaluation (default n); n > k uses the U-statistic over k-subsets.
    objective: pass | maj | mean; estimator: loo | centered | pkpo | pkpo-loo | pkpo-loo1.
    answers: (G, n) answers (any hashable JSON value, None = no vote) for maj. Returns the same shape and
    kind as `rewards` (a torch tensor on its device and dtype if a tensor came in).
    """
    R, tensor = _to_numpy(rewards)
    one = R.ndim == 1
    R = R[None, :] if one else R
    if R.ndim != 2 or not np.isfinite(R).all():
        raise BadInputError("rewards must be a finite (G, n) or (n,) array", param="rewards")
    codes = rew = None
    if objective == "maj":
        if answers is None:
            raise BadInputError("the maj objective needs answers", param="answers")
        ans = [answers] if one else answers
        ans = ans.tolist() if hasattr(ans, "tolist") else ans
        codes, rew = encode_answers(ans, R, answer_reward)
    A, _ = evaluate(R, k, objective, estimator, codes, rew, scale, seed)
    A = A[0] if one else A
    if tensor is not None:
        import torch

        return torch.as_tensor(A, dtype=tensor.dtype if tensor.is_floating_point() else torch.float64,
                               device=tensor.device)
    return A


# ------------------------------------------------------------------------------------------------ brute force


def objective_value(objective, r, codes=None, rew=None):
    """f of one set of samples (1-D rewards; codes/rew for maj), straight from the definition."""
    r = np.asarray(r, dtype=float)
    if objective == "pass":
        return float(r.max())
    if objective == "mean":
        return float(r.mean())
    counts = np.zeros(len(rew))
    for c in codes:
        if c >= 0:
            counts[c] += 1
    return float(vote_value(counts[None], np.asarray(rew)[None])[0])


def brute_force(objective, estimator, r, k, codes=None, rew=None):
    """Advantages of one group by enumerating every k-subset (the definitions, no closed form)."""
    r = np.asarray(r, dtype=float)
    n = len(r)
    A = np.zeros(n)
    subsets = list(itertools.combinations(range(n), k))

    def f(idx):
        idx = list(idx)
        return objective_value(objective, r[idx], None if codes is None else np.asarray(codes)[idx], rew)

    if estimator in ("pkpo", "pkpo-loo", "pkpo-loo1"):
        return _brute_pkpo(estimator, r, k, f, subsets)
    for s in subsets:
        for i in s:
            A[i] += f(s) - f([j for j in s if j != i])
    A /= len(subsets)
    if objective == "mean":  # RLOO is n times the U-statistic LOO of f = mean (k-free)
        A = A * n
    if estimator == "centered":
        A -= A.mean()
    return A


def _brute_pkpo(estimator, r, k, f, subsets):
    n = len(r)
    s = np.zeros(n)
    for sub in subsets:
        for i in sub:
            s[i] += f(sub)
    s /= len(subsets)
    if estimator == "pkpo":
        return s
    m = k if estimator == "pkpo-loo" else k - 1
    scale = k / (n - 1) if estimator == "pkpo-loo" else k / n
    out = np.zeros(n)
    for i in range(n):
        others = [j for j in range(n) if j != i]
        subs = list(itertools.combinations(others, m))
        out[i] = s[i] - scale * np.mean([f(x) for x in subs])
    return out
