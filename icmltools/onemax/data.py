"""Price series: parsing (CSV/TSV/one per line, file or stdin), validation, and the embedded synthetic market."""
from __future__ import annotations

import os

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive
from icmltools.core.table import read_column

from . import options


def _column_label(text: str, column) -> str:
    """How an error names the price column: the user's --column, or the last column of a file that has several
    (a one-value-per-line file has no column to name)."""
    if column is not None:
        return f", column {column!r}" if not str(column).lstrip("-").isdigit() else f", column {column}"
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    return ", last column" if any(d in first.strip() for d in "\t,;") or len(first.split()) > 1 else ""


def parse_prices(text: str, source: str = "<stdin>", column: str | int | None = None) -> np.ndarray:
    """Parse prices from CSV/TSV text or one number per line (see `core.table.read_column` for the column,
    header and delimiter rules). A price that is not a number, not finite (NaN, inf, or too large for a
    float) or not positive is an error naming the file, the line and (in a table) the column."""
    values, lines = read_column(text, source, column)
    out = np.empty(len(values))
    for k, (v, n) in enumerate(zip(values, lines)):
        try:
            out[k] = float(v)
        except ValueError:
            raise BadInputError(f"{source}: line {n}{_column_label(text, column)}: not a number: {v[:40]!r}") from None
        if not np.isfinite(out[k]):
            raise BadInputError(f"{source}: line {n}{_column_label(text, column)}: price {v[:40]!r} is not finite "
                                "(NaN, inf and numbers beyond the float range are not allowed)")
        if out[k] <= 0:
            raise BadInputError(f"{source}: line {n}{_column_label(text, column)}: price {v[:40]!r} is not positive "
                                "(prices must be > 0)")
    return out


def read_prices(path: str, stdin_text: str | None = None, column=None) -> np.ndarray:
    """Read prices from a file path, or from `stdin_text` when path is '-'."""
    if path == "-":
        return parse_prices(stdin_text or "", "<stdin>", column)
    if not os.path.exists(path):
        raise BadInputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise BadInputError(f"{path}: is a directory, not a price file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise BadInputError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise BadInputError(f"{path}: cannot read ({e.strerror or e})") from e
    return parse_prices(text, path, column)


def check_bounds(prices: np.ndarray, m: float | None, M: float | None, source: str = "prices") -> None:
    """Declared bounds: both or neither, 0 < m < M with M/m a finite float, every price inside. Without
    bounds (each window bounds itself), the prices' max/min must be a finite float."""
    if (m is None) != (M is None):
        raise BadInputError("give both m and M, or neither (then bounds come from each window, a look-ahead)",
                            param="m" if m is None else "M")
    if m is None:
        with np.errstate(over="ignore"):
            span = float(prices.max()) / float(prices.min())
        if span > options.THETA_MAX:
            raise BadInputError(f"{source}: the prices span max/min = {span:g} > 1e300, beyond what the ratios can "
                                "hold in floating point")
        return
    if not (0 < m < M):
        raise BadInputError(f"need 0 < m < M, got m={m}, M={M}", param="m")
    with np.errstate(over="ignore"):
        if M / m > options.THETA_MAX:
            raise BadInputError(f"M/m = {M / m:g} must be <= 1e300 (beyond, the ratios 1/theta leave the float "
                                "range)", param="M")
    lo, hi = float(prices.min()), float(prices.max())
    if lo < m or hi > M:
        k = int(np.nonzero((prices < m) | (prices > M))[0][0])
        raise BadInputError(f"{source}: price {prices[k]} at index {k} lies outside the declared [m, M] = [{m}, {M}]")
    if M / m < options.THETA_MIN:
        raise BadInputError(f"M/m = {M / m!r} must be >= 1 + 1e-9 (closer to 1 every ratio is within 1e-9 of 1)",
                            param="M")


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
