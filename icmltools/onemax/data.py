"""Price series: parsing (CSV/TSV/one per line, file or stdin), validation, and the embedded synthetic market."""
from __future__ import annotations

import os

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive
from icmltools.core.table import read_column

from . import options


def parse_prices(text: str, source: str = "<stdin>", column: str | int | None = None) -> np.ndarray:
    """Parse prices from CSV/TSV text or one number per line (see `core.table.read_column` for the column,
    header and delimiter rules). Non-numeric, non-finite or non-positive prices are errors naming the line."""
    values, lines = read_column(text, source, column)
    out = np.empty(len(values))
    for k, (v, n) in enumerate(zip(values, lines)):
        try:
            out[k] = float(v)
        except ValueError:
            raise BadInputError(f"{source}: row {n} is not a number: {v[:40]!r}") from None
        if not np.isfinite(out[k]):
            raise BadInputError(f"{source}: row {n} is not a finite number (NaN/inf prices are not allowed)")
        if out[k] <= 0:
            raise BadInputError(f"{source}: row {n}: prices must be positive, got {out[k]}")
    return out


def read_prices(path: str, stdin_text: str | None = None, column=None) -> np.ndarray:
    """Read prices from a file path, or from `stdin_text` when path is '-'."""
    if path == "-":
        return parse_prices(stdin_text or "", "<stdin>", column)
    if not os.path.exists(path):
        raise BadInputError(f"{path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise BadInputError(f"{path}: not a text file ({e.reason})") from e
    return parse_prices(text, path, column)


def check_bounds(prices: np.ndarray, m: float | None, M: float | None, source: str = "prices") -> None:
    if (m is None) != (M is None):
        raise BadInputError("give both m and M, or neither (then bounds come from each window, a look-ahead)",
                            param="m" if m is None else "M")
    if m is None:
        return
    if not (0 < m < M):
        raise BadInputError(f"need 0 < m < M, got m={m}, M={M}", param="m")
    lo, hi = float(prices.min()), float(prices.max())
    if lo < m or hi > M:
        k = int(np.nonzero((prices < m) | (prices > M))[0][0])
        raise BadInputError(f"{source}: price {prices[k]} at index {k} lies outside the declared [m, M] = [{m}, {M}]")


MARKET_BOUNDS = options.MARKET_BOUNDS  # the embedded market's declared [m, M] (theta = 16)


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Fold values into [lo, hi] by reflection at both ends."""
    w = hi - lo
    y = np.mod(x - lo, 2 * w)
    return lo + np.where(y > w, 2 * w - y, y)


def synthetic_market(n: int = options.MARKET_LENGTH, seed: int = 0, vol: float = 0.06, jump_prob: float = 0.004,
                     jump_scale: float = 0.5, bounds: tuple[float, float] = MARKET_BOUNDS) -> np.ndarray:
    """The embedded default market: a log random walk with rare jumps, reflected into the declared
    bounds [m, M] (so a trader who is told m and M is told the truth). Draws from
    `derive(seed, "onemax", "market")`, so the same seed gives the same market alone or inside a run."""
    rng = derive(seed, "onemax", "market").numpy()
    lo, hi = np.log(bounds[0]), np.log(bounds[1])
    steps = vol * rng.standard_normal(n)
    jumps = rng.random(n) < jump_prob
    steps[jumps] += jump_scale * rng.standard_normal(int(jumps.sum()))
    x = 0.5 * (lo + hi) + np.cumsum(steps)
    return np.exp(_reflect(x, lo, hi))


def _walk(n: int, T: int, lt: float, rng) -> np.ndarray:
    """Reflected log random walk from a uniform start, step sd 0.8 ln(theta)/sqrt(T)."""
    x = np.cumsum(rng.normal(0.0, lt / np.sqrt(T) * 0.8, (n, T)), axis=1) + rng.random((n, 1)) * lt
    return np.exp(_reflect(x, 0.0, lt))


def _uniform(n: int, T: int, lt: float, rng) -> np.ndarray:
    """Independent log-uniform prices on [1, theta]."""
    return np.exp(rng.random((n, T)) * lt)


def _spikes(n: int, T: int, lt: float, rng) -> np.ndarray:
    """Low log-uniform prices on [1, theta^0.3] with rare (2/T per step) log-uniform spikes on [1, theta]."""
    base = np.exp(rng.random((n, T)) * lt * 0.3)
    spike = rng.random((n, T)) < 2.0 / T
    return np.where(spike, np.exp(rng.random((n, T)) * lt), base)


_MARKETS = {"walk": _walk, "uniform": _uniform, "spikes": _spikes}
assert tuple(_MARKETS) == options.MARKETS


def random_windows(kind: str, n: int, T: int, theta: float, rng: np.random.Generator) -> np.ndarray:
    """Stochastic price windows in [1, theta]: 'walk' (reflected log random walk), 'uniform', 'spikes'."""
    fn = _MARKETS.get(kind)
    if fn is None:
        raise BadInputError(f"unknown stochastic market {kind!r}; use {', '.join(options.MARKETS)}", param="market")
    return fn(n, T, np.log(theta), rng)
