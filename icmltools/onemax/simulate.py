"""Vectorised simulation of threshold rules on price windows (empirical and stochastic modes).

A window is a row of prices; every rule accepts the first price >= its threshold (up to rounding:
`rules.reaches`), else the last price.
With the running maximum cm of each row, the first accepted index is #(cm < Phi), so each extra rule costs one
comparison pass over the chunk. Ratios are ALG/OPT (paper convention); OPT is the window's maximum.
"""
from __future__ import annotations

import numpy as np

from icmltools.core.errors import BadInputError

from . import options
from .rules import RuleParams, threshold

NOISE_MODELS = options.NOISE_MODELS


def accept_ratio(x: np.ndarray, cm: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """ALG/OPT per row for thresholds `phi` (same units as x), given cm = running max of x. A price reaches
    the threshold up to a relative `options.ACCEPT_RTOL` (`rules.reaches`), so a threshold equal to the
    maximum cannot miss it by rounding."""
    T = x.shape[1]
    idx = np.count_nonzero(cm < phi[:, None] * (1.0 - options.ACCEPT_RTOL), axis=1)
    last = x[:, -1]
    alg = np.where(idx < T, np.take_along_axis(x, np.minimum(idx, T - 1)[:, None], axis=1)[:, 0], last)
    return alg / cm[:, -1], alg


# prediction y of the window maximum p* for a target error E = `level` (the paper's E(y, p*) = min(y/p*, p*/y)),
# with z = ln(y/p*) from the model itself, so the realised E = exp(-|z|) stays exact when y over/underflows
# (an extreme E makes y = +inf or 0, which every rule handles exactly: see `rules.threshold`).
def _exact(level, pstar, rng, prev):
    return pstar.copy(), np.zeros_like(pstar)                                   # E = 1


def _over(level, pstar, rng, prev):
    return pstar / level, np.full_like(pstar, -np.log(level))                  # y = p*/E


def _under(level, pstar, rng, prev):
    return pstar * level, np.full_like(pstar, np.log(level))                   # y = p* E


def _lognormal(level, pstar, rng, prev):
    z = -np.log(level) * rng.standard_normal(pstar.shape)                      # y = p* exp(sigma Z), sigma = -ln E
    return pstar * np.exp(z), z


def _prev_max(level, pstar, rng, prev):
    if prev is None:
        raise BadInputError("noise model prev-max needs consecutive windows", param="noise")
    return prev, np.log(prev) - np.log(pstar)                                  # the previous window's maximum


_PREDICTORS = {"exact": _exact, "over": _over, "under": _under, "lognormal": _lognormal, "prev-max": _prev_max}
assert tuple(_PREDICTORS) == options.NOISE_MODELS


def predictions(noise: str, level: float, pstar: np.ndarray, rng: np.random.Generator,
                prev_max: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Predictions y of the maximum for one noise model and their log-ratios z = ln(y/p*); `level` is the
    target error E in (0, 1] (lognormal: y = p* exp(sigma Z) with sigma = -ln E)."""
    fn = _PREDICTORS.get(noise)
    if fn is None:
        raise BadInputError(f"unknown noise model {noise!r}; choose from {', '.join(NOISE_MODELS)}", param="noise")
    with np.errstate(over="ignore", under="ignore"):
        return fn(level, pstar, rng, prev_max)


class _Chunk:
    """One chunk of windows in normalised units (prices / m, so an exact prediction equals the window maximum
    bit for bit). Windows flatter than `options.THETA_MIN` are scored at theta = THETA_MIN: every ratio there
    lies within 1e-9 of 1 whatever the rule does."""

    def __init__(self, x: np.ndarray, lo: np.ndarray, hi: np.ndarray):
        self.x, self.lo = x, lo
        self.xn = x / lo[:, None]
        self.cm = np.maximum.accumulate(self.xn, axis=1)
        self.pstar = x.max(axis=1)
        self.theta = np.maximum(hi / lo, options.THETA_MIN)

    def rows(self, mask):
        """The chunk restricted to the windows in `mask` (itself when every window is in)."""
        if mask is None or mask.all():
            return self
        sub = object.__new__(_Chunk)
        for k in ("x", "lo", "xn", "cm", "pstar", "theta"):
            setattr(sub, k, getattr(self, k)[mask])
        return sub


class _Sums:
    """Sum of ALG and of OPT for the ratio of means, held relative to the largest OPT seen (no overflow)."""

    def __init__(self):
        self.alg = self.opt = 0.0
        self.scale = 0.0

    def add(self, alg: np.ndarray, opt: np.ndarray) -> None:
        top = float(opt.max())
        if top > self.scale:
            self.alg, self.opt = self.alg * (self.scale / top), self.opt * (self.scale / top)
            self.scale = top
        self.alg += float((alg / self.scale).sum())
        self.opt += float((opt / self.scale).sum())


def _score(acc: dict, ch: _Chunk, noise: str, level: float, rng, prev, algorithms, params: RuleParams) -> None:
    y, z = predictions(noise, level, ch.pstar, rng, prev)
    with np.errstate(over="ignore", under="ignore"):
        yn = ch.cm[:, -1] if noise == "exact" else y / ch.lo
    err = np.exp(-np.abs(z))
    for name in algorithms:
        ratio, alg_n = accept_ratio(ch.xn, ch.cm, threshold(name, yn, ch.theta, params))
        a = acc.setdefault((name, noise, level), {"ratios": [], "sums": _Sums(), "err": 0.0, "n": 0})
        a["ratios"].append(ratio)  # float64: a ratio near 1/theta underflows float32 at large theta
        a["sums"].add(alg_n * ch.lo, ch.pstar)
        a["err"] += float(err.sum())
        a["n"] += len(ratio)


def simulate_windows(windows_fn, n_windows: int, m, M, params: RuleParams, algorithms, noise_levels,
                     rng: np.random.Generator, chunk: int = 20000, progress=None, prev_max_fn=None) -> dict:
    """Run every algorithm on every (noise, level) over windows produced chunk by chunk.

    windows_fn(i0, i1) -> (n, T) real prices; m, M: per-window arrays via callables (i0, i1, x).
    prev_max_fn(i0, i1) -> (previous-window maxima, mask of the windows that have a previous window): the
    prev-max model is scored on those windows only, every other model on all of them (each row's `n`).
    Returns {algorithm: [rows]} where each row holds noise, level, realised error and ratio statistics.
    """
    acc: dict = {}
    for i0 in range(0, n_windows, chunk):
        i1 = min(n_windows, i0 + chunk)
        x = np.asarray(windows_fn(i0, i1), dtype=float)
        ch = _Chunk(x, m(i0, i1, x), M(i0, i1, x))
        prev, has_prev = prev_max_fn(i0, i1) if prev_max_fn is not None else (None, None)
        for noise, level in noise_levels:
            if noise == "prev-max":
                if has_prev is not None and has_prev.any():
                    _score(acc, ch.rows(has_prev), noise, level, rng,
                           prev if has_prev.all() else prev[has_prev], algorithms, params)
                continue
            _score(acc, ch, noise, level, rng, None, algorithms, params)
        if progress is not None:
            progress("windows", i1, n_windows)
    return _summarise(acc, algorithms, noise_levels)


def _summarise(acc: dict, algorithms, noise_levels) -> dict:
    """Rows per algorithm in the order of `noise_levels` (a model with no scored window has no row)."""
    out: dict = {name: [] for name in algorithms}
    for name in algorithms:
        for noise, level in noise_levels:
            a = acc.get((name, noise, level))
            if a is None:
                continue
            r = np.concatenate(a["ratios"])
            q = np.quantile(r, [0.05, 0.5])
            out[name].append({"noise": noise, "error_level": None if noise in ("exact", "prev-max") else level,
                              "mean_error_E": a["err"] / a["n"], "n": a["n"],
                              "mean_ratio": float(r.mean()), "ratio_of_means": a["sums"].alg / a["sums"].opt,
                              "min_ratio": float(r.min()), "q05_ratio": float(q[0]), "median_ratio": float(q[1])})
    return out


def noise_grid(noise: tuple[str, ...], errors: tuple[float, ...]) -> list[tuple[str, float]]:
    grid = []
    for nm in noise:
        if nm in ("exact", "prev-max"):
            grid.append((nm, 1.0))
        else:
            grid.extend((nm, float(e)) for e in errors)
    return grid
