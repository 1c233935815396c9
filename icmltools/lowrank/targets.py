"""Hölder-smooth targets on [0,1]^d (ours, spec (a) [inf]; the paper proves the theorem, it ships no generator).

f(x) = sum_{j<=6} a_j |w_j.x - t_j|^beta + sum_{k<=3} b_k exp(-|x - c_k|^2 / (2 h_k^2)), w_j unit Gaussian
directions, t_j = w_j.u_j with u_j ~ U[0.25, 0.75]^d (so every kink crosses the cube), a, b ~ N(0, 1),
c_k ~ U[0,1]^d, h_k ~ U(0.1, 0.3), divided by max|f| on 20000 probe points. For non-integer beta the ridge
terms are C^{floor(beta)} with a (beta - floor(beta))-Hölder top derivative: smoothness exactly beta at the kinks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive

N_RIDGES, N_BUMPS, N_PROBE = 6, 3, 20_000


@dataclass(frozen=True)
class HolderTarget:
    w: np.ndarray
    t: np.ndarray
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    h: np.ndarray
    beta: float
    scale: float = 1.0

    def raw(self, x: np.ndarray) -> np.ndarray:
        ridge = np.abs(x @ self.w.T - self.t) ** self.beta @ self.a
        d2 = ((x[:, None, :] - self.c[None]) ** 2).sum(-1)
        return ridge + np.exp(-d2 / (2 * self.h ** 2)) @ self.b

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.raw(x) / self.scale


def holder_target(seed: int, rep: int, dim: int, beta: float) -> HolderTarget:
    """The target of repetition `rep` (one stream per rep; the same coefficients for every beta)."""
    if not beta > 0:
        raise BadInputError(f"beta must be positive, got {beta}", param="betas")
    if dim < 1:
        raise BadInputError(f"must be >= 1, got {dim}", param="dim")
    rng = derive(seed, "approx", "target", rep, dim).numpy()
    w = rng.standard_normal((N_RIDGES, dim))
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    u = rng.uniform(0.25, 0.75, (N_RIDGES, dim))
    t = (w * u).sum(1)
    a, b = rng.standard_normal(N_RIDGES), rng.standard_normal(N_BUMPS)
    c, h = rng.uniform(0, 1, (N_BUMPS, dim)), rng.uniform(0.1, 0.3, N_BUMPS)
    f = HolderTarget(w, t, a, b, c, h, float(beta))
    probe = rng.uniform(0, 1, (N_PROBE, dim))
    return HolderTarget(w, t, a, b, c, h, float(beta), float(np.abs(f.raw(probe)).max()))
