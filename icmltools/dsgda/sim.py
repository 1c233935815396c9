"""Direct simulation of every method, vectorised over step sizes (and seeds for stochastic runs).

Used for nonlinear games (Dirac-GAN), for the stochastic games, and to check the exact round maps
(`maps`). A state is a dict: `x` (the communicated strategies, shape (L, S, n): step sizes, seeds,
coordinates), `prev` (the previous round's, for Ghost) and `g` (the last gradient, for optimistic GDA).
Each method is one small round function in `ROUNDS`; the noise model is `Noise` (self-gradient noise
and, for Local SGDA's machines, noise on their estimate of the opponents' gradients).
"""
from __future__ import annotations

import numpy as np

from icmltools.core.seed import derive

from .options import DIVERGED


class Noise:
    """Gaussian oracle noise. Self noise (sigma_self per coordinate, from each seed's 'self' stream) on
    a player's own gradient; off-diagonal noise (sigma_off, from its own 'off' stream) on a machine's
    estimate of the other players' gradients (Local SGDA only: Decoupled never evaluates them)."""

    def __init__(self, seed: int, seeds: int, n: int, sigma_self: np.ndarray, sigma_off: float, key=()):
        self.n = n
        self.sigma_self = np.asarray(sigma_self, dtype=float)
        self.sigma_off = float(sigma_off)
        self.self_gens = [derive(seed, "dsgda", "noise", *key, "self", s).numpy() for s in range(seeds)]
        self.off_gens = [derive(seed, "dsgda", "noise", *key, "off", s).numpy() for s in range(seeds)]

    def own(self) -> np.ndarray:
        """(S, n): one self-noise draw per seed (the same for every step size: common random numbers)."""
        return np.stack([g.standard_normal(self.n) for g in self.self_gens]) * self.sigma_self

    def off(self, players: int) -> np.ndarray:
        """(players, S, n): machine i's noise on the gradients it estimates for the others."""
        return np.stack([g.standard_normal((players, self.n)) for g in self.off_gens], axis=1) * self.sigma_off


def _own(noise):
    return 0.0 if noise is None else noise.own()


def _gda(game, st, lr, K, noise):
    return {**st, "x": st["x"] - lr * (game.F(st["x"]) + _own(noise))}


def _altgda(game, st, lr, K, noise):
    x = st["x"].copy()
    eta = _own(noise)
    for s in game.slices:
        g = game.F(x) + eta
        x[..., s] -= lr * g[..., s]
    return {**st, "x": x}


def _ogda(game, st, lr, K, noise):
    g = game.F(st["x"]) + _own(noise)
    prev = st.get("g")
    prev = g if prev is None else prev
    return {**st, "x": st["x"] - lr * (2 * g - prev), "g": g}


def _eg(game, st, lr, K, noise):
    half = st["x"] - lr * (game.F(st["x"]) + _own(noise))
    return {**st, "x": st["x"] - lr * (game.F(half) + _own(noise))}


def _decoupled(game, st, lr, K, noise):
    """Decoupled SGDA round: K local steps y_i <- y_i - lr g_i(y_i, x_r,-i), then communicate."""
    xr, y = st["x"], st["x"].copy()
    for _ in range(K):
        y -= lr * (game.own_grads(y, xr) + _own(noise))
    return {**st, "x": y, "prev": xr}


def _ghost(game, st, lr, K, noise):
    """Ghost round: the opponents extrapolated, x_r + (k/K)(x_r - x_{r-1}) (extrapolation ours)."""
    xr, y = st["x"], st["x"].copy()
    prev = st.get("prev")
    step = 0.0 if prev is None else xr - prev
    for k in range(K):
        y -= lr * (game.own_grads(y, xr + (k / K) * step) + _own(noise))
    return {**st, "x": y, "prev": xr}


def _localsgda(game, st, lr, K, noise):
    """Local SGDA round: machine i runs K joint GDA steps (own block: self noise; other blocks: its
    off-diagonal estimate), then the server averages the copies."""
    N = len(game.slices)
    copies = np.broadcast_to(st["x"], (N,) + st["x"].shape).copy()
    mask = np.zeros((N, game.n))
    for i, s in enumerate(game.slices):
        mask[i, s] = 1.0
    mask = mask.reshape((N,) + (1,) * (st["x"].ndim - 1) + (game.n,))
    for _ in range(K):
        g = game.F(copies)
        if noise is not None:
            own, off = noise.own(), noise.off(N)     # (S, n), (N, S, n)
            g = g + mask * own + (1.0 - mask) * off[:, None]
        copies -= lr * g
    return {**st, "x": copies.mean(axis=0), "prev": st["x"]}


ROUNDS = {"gda": _gda, "altgda": _altgda, "ogda": _ogda, "eg": _eg, "decoupled": _decoupled, "ghost": _ghost,
          "localsgda": _localsgda}


def _subset(st: dict, keep: np.ndarray) -> dict:
    return {k: (v[keep] if isinstance(v, np.ndarray) else v) for k, v in st.items()}


def simulate(game, method: str, K: int, lrs, iters: int, seeds: int = 1, noise: Noise | None = None,
             stop_eps: float | None = None):
    """Run `iters` iterations for every step size from x0; returns (errs, alive) with errs of shape
    (iters + 1, L, S) = ||x_t - x*|| / ||x0 - x*|| (NaN once a step size diverged or was dropped).

    `stop_eps`: deterministic search: stop at the first iteration where some step size reaches it
    (fewer rounds cannot come from the others)."""
    lrs = np.asarray(lrs, dtype=float)
    L, fn = len(lrs), ROUNDS[method]
    e0 = float(np.linalg.norm(game.x0 - game.xstar))
    st = {"x": np.broadcast_to(game.x0, (L, seeds, game.n)).copy()}
    errs = np.full((iters + 1, L, seeds), np.nan)
    errs[0] = 1.0
    idx = np.arange(L)
    with np.errstate(all="ignore"):
        for t in range(1, iters + 1):
            st = fn(game, st, lrs[idx, None, None], K, noise)
            err = np.linalg.norm(st["x"] - game.xstar, axis=-1) / e0
            errs[t, idx] = err
            ok = np.all(np.isfinite(err) & (err < DIVERGED), axis=1)
            if not ok.all():
                errs[t, idx[~ok]] = np.inf
                idx, st = idx[ok], _subset(st, ok)
            if idx.size == 0 or (stop_eps is not None and np.any(err[ok] <= stop_eps)):
                return errs[:t + 1], idx
    return errs, idx
