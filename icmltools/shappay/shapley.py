"""Shapley values of the coalition game v(X), exact and by permutation Monte Carlo.

phi_i = sum_{X subset N \\ i} |X|! (n - |X| - 1)! / n! [v(X + i) - v(X)]   (Shapley 1953; the paper's M^Shap).

Both estimators are one weighted sum over coalitions X not containing i: exact uses all 2^(n-1) of them
with the Shapley weights; Monte Carlo uses, for each of m fixed random permutations, the set of agents
before i (weight 1/m), so the same permutations serve every agent and every profile (common random
numbers) and sum_i phi_i = v(N) exactly (each permutation's marginals telescope).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from icmltools.core.errors import BadInputError

from .options import MAX_EXACT


@dataclass
class Coalitions:
    """Per agent i: `masks[i]` (K, n) 0/1 rows of coalitions X without i and `weights[i]` (K,)."""

    n: int
    mode: str
    masks: list
    weights: list
    perms: int | None = None


def exact_coalitions(n: int) -> Coalitions:
    """All 2^(n-1) coalitions without i, weighted |X|!(n-|X|-1)!/n! (vectorised, no permutation loop)."""
    if n > MAX_EXACT:
        raise BadInputError(f"exact Shapley enumerates 2^n coalitions; n = {n} is above {MAX_EXACT} "
                            "(use Monte Carlo)", param="shapley")
    ids = np.arange(1 << n)
    bits = ((ids[:, None] >> np.arange(n)) & 1).astype(float)
    size = bits.sum(axis=1).astype(int)
    wsize = np.array([math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n) for k in range(n)])
    masks, weights = [], []
    for i in range(n):
        rows = bits[:, i] == 0
        masks.append(bits[rows])
        weights.append(wsize[size[rows]])
    return Coalitions(n, "exact", masks, weights)


def mc_coalitions(n: int, perms: int, rng) -> Coalitions:
    """For each of `perms` random permutations, the agents before i (weight 1/perms)."""
    if perms < 2:
        raise BadInputError("Monte Carlo needs at least 2 permutations", param="perms")
    order = rng.permuted(np.tile(np.arange(n), (perms, 1)), axis=1)
    pos = np.argsort(order, axis=1)  # pos[t, j]: place of agent j in permutation t
    masks = [(pos < pos[:, [i]]).astype(float) for i in range(n)]
    return Coalitions(n, "mc", masks, [np.full(perms, 1.0 / perms)] * n, perms)


def default_perms(n: int) -> int:
    """max(1000, ceil(n ln n)) (spec; the paper used floor(n ln n) at n = 30)."""
    return max(1000, math.ceil(n * math.log(max(n, 2))))


def coalitions(n: int, mode: str, perms: int | None, rng_stream) -> Coalitions:
    """`auto`: exact for n <= MAX_EXACT, Monte Carlo beyond; `rng_stream` is a core.seed Stream."""
    if mode == "exact" or (mode == "auto" and n <= MAX_EXACT):
        return exact_coalitions(n)
    return mc_coalitions(n, perms or default_perms(n), rng_stream.numpy())


def shapley(value_fn, coal: Coalitions):
    """phi (n,) and its standard error (n,; 0 when exact) for a value function on 0/1 mask rows."""
    n = coal.n
    phi, se = np.zeros(n), np.zeros(n)
    eye = np.eye(n)
    for i in range(n):
        M, w = coal.masks[i], coal.weights[i]
        marg = value_fn(M + eye[i]) - value_fn(M)
        phi[i] = w @ marg
        if coal.mode == "mc":
            se[i] = marg.std(ddof=1) / math.sqrt(len(marg))
    return phi, se


class AgentView:
    """Agent i's Shapley share in a curve game as a function of its own contribution x, others fixed at s:
    phi_i(x) and d phi_i / d x (both are sums over the same coalitions, computed without a matmul per x)."""

    def __init__(self, game, coal: Coalitions, i: int, s: np.ndarray):
        self.game, self.i, self.w = game, i, coal.weights[i]
        M = coal.masks[i]
        Mi = M.copy()
        Mi[:, i] = 1.0
        self.base = (M * s) @ game.W.T           # sum_{l in X} W_jl s_l, (K, n)
        self.scope_with = game.scope(Mi)          # whose gains count in v(X + i)
        self.v_without = game.value(M, s)         # v(X) does not depend on s_i

    def dphi(self, x: float) -> float:
        """d phi_i / d s_i at s_i = x (decreasing in x: the curves are concave)."""
        g, i = self.game, self.i
        d = g.alpha * g.beta * (self.base + g.W[:, i] * x + 1.0) ** (-g.beta - 1.0) * g.W[:, i]
        return float(self.w @ (d * self.scope_with).sum(axis=1))

    def phi(self, xs: np.ndarray, chunk: int = 1 << 22) -> np.ndarray:
        """phi_i(x) for every x in xs."""
        g, i = self.game, self.i
        out = np.empty(len(xs))
        step = max(1, chunk // self.base.size)
        for a in range(0, len(xs), step):
            x = np.asarray(xs[a:a + step], dtype=float)
            E = self.base[None] + g.W[:, i][None, None] * x[:, None, None]
            v_with = (g.alpha * (1.0 - (E + 1.0) ** (-g.beta)) * self.scope_with[None]).sum(axis=2)
            out[a:a + step] = (v_with - self.v_without[None]) @ self.w
        return out
