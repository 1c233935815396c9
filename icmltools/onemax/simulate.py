"""Vectorised simulation of threshold rules on price windows (empirical and stochastic modes).

A window is a row of prices; every rule accepts the first price >= its threshold, else the last price.
With the running maximum cm of each row, the first accepted index is #(cm < Phi), so each extra rule costs one
comparison pass over the chunk. Ratios are ALG/OPT (paper convention); OPT is the window's maximum.
"""
from __future__ import annotations

import numpy as np

from icmltools.core.errors import BadInputError

from . import options
from .rules import RuleParams, prediction_error, threshold

NOISE_MODELS = options.NOISE_MODELS


def accept_ratio(x: np.ndarray, cm: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """ALG/OPT per row for thresholds `phi` (same units as x), given cm = running max of x."""
    T = x.shape[1]
    idx = np.count_nonzero(cm < phi[:, None], axis=1)
    last = x[:, -1]
    alg = np.where(idx < T, np.take_along_axis(x, np.minimum(idx, T - 1)[:, None], axis=1)[:, 0], last)
    return alg / cm[:, -1], alg


def _prev_max(level, pstar, rng, prev_max):
    if prev_max is None:
        raise BadInputError("noise model prev-max needs consecutive windows", param="noise")
    return prev_max


# prediction y of the window maximum p* for a target error E = `level` (the paper's E(y, p*) = min(y/p*, p*/y))
_PREDICTORS = {
    "exact": lambda level, pstar, rng, prev: pstar.copy(),                   # E = 1
    "over": lambda level, pstar, rng, prev: pstar / level,                   # y = p*/E
    "under": lambda level, pstar, rng, prev: pstar * level,                  # y = p* E
    "lognormal": lambda level, pstar, rng, prev: pstar * np.exp(-np.log(level) * rng.standard_normal(pstar.shape)),
    "prev-max": _prev_max,                                                   # the previous window's maximum
}
assert tuple(_PREDICTORS) == options.NOISE_MODELS


def predictions(noise: str, level: float, pstar: np.ndarray, rng: np.random.Generator,
                prev_max: np.ndarray | None = None) -> np.ndarray:
    """Predictions y of the maximum for one noise model; `level` is the target error E in (0, 1]
    (lognormal: y = p* exp(sigma Z) with sigma = -ln E)."""
    fn = _PREDICTORS.get(noise)
    if fn is None:
        raise BadInputError(f"unknown noise model {noise!r}; choose from {', '.join(NOISE_MODELS)}", param="noise")
    return fn(level, pstar, rng, prev_max)


def simulate_windows(windows_fn, n_windows: int, m, M, params: RuleParams, algorithms, noise_levels,
                     rng: np.random.Generator, chunk: int = 20000, progress=None, prev_max_fn=None) -> dict:
    """Run every algorithm on every (noise, level) over windows produced chunk by chunk.

    windows_fn(i0, i1) -> (n, T) real prices; m, M: scalars or per-window arrays via callables (i0, i1, x).
    Returns {(algorithm): [rows]} where each row holds noise, level, realised error and ratio statistics.
    """
    acc: dict = {}
    done = 0
    for i0 in range(0, n_windows, chunk):
        i1 = min(n_windows, i0 + chunk)
        x = np.asarray(windows_fn(i0, i1), dtype=float)
        lo, hi = m(i0, i1, x), M(i0, i1, x)
        # work in normalised units (prices / m): an exact prediction then equals the window maximum bit for bit
        xn = x / lo[:, None]
        cm = np.maximum.accumulate(xn, axis=1)
        pstar = x.max(axis=1)
        theta = hi / lo
        prev = prev_max_fn(i0, i1) if prev_max_fn is not None else None
        for noise, level in noise_levels:
            y = predictions(noise, level, pstar, rng, prev)
            err = prediction_error(y, pstar)
            yn = cm[:, -1] if noise == "exact" else y / lo
            for name in algorithms:
                phi = threshold(name, yn, theta, params)
                ratio, alg_n = accept_ratio(xn, cm, phi)
                alg = alg_n * lo
                key = (name, noise, level)
                a = acc.setdefault(key, {"ratios": [], "alg": 0.0, "opt": 0.0, "err": 0.0, "n": 0})
                a["ratios"].append(ratio.astype(np.float32))
                a["alg"] += float(alg.sum())
                a["opt"] += float(pstar.sum())
                a["err"] += float(err.sum())
                a["n"] += len(ratio)
        done = i1
        if progress is not None:
            progress("windows", done, n_windows)
    out: dict = {name: [] for name in algorithms}
    for (name, noise, level), a in acc.items():
        r = np.concatenate(a["ratios"]).astype(float)
        q = np.quantile(r, [0.05, 0.5])
        out[name].append({"noise": noise, "error_level": None if noise in ("exact", "prev-max") else level,
                          "mean_error_E": a["err"] / a["n"], "n": a["n"],
                          "mean_ratio": float(r.mean()), "ratio_of_means": a["alg"] / a["opt"],
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
