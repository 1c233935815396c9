"""Exact adversarial worst case of threshold rules (normalised prices in [1, theta]).

For a rule Phi and an instance (p*, y) the adversary's best sequence gives (spec, "Facts"):
    W(p*, y) = Phi(y)/p*  if p* >= Phi(y)   (it offers Phi(y), then p*)
             = 1/p*       otherwise         (nothing is accepted; the last price is m = 1)
Robustness r = inf W over all (p*, y); consistency c = inf_y W(y, y); the worst-case profile
g(e) = inf { W(p*, y) : E(y, p*) >= e } with E = min(y/p*, p*/y).

`profile` computes g(e) exactly, piece by piece: on each piece of Phi (continuous, non-decreasing, Phi(y)/y
non-increasing) the infimum over p* in [max(1, y e), min(theta, y/e)] is attained at closed-form points,
so g(e) reduces to bisections for the piece boundaries of {y/Phi(y) >= e} and {y e < Phi(y)}.
"""
from __future__ import annotations

import numpy as np

from icmltools.core.errors import BadInputError

from .options import ALGORITHMS, PLOT_POINTS, WORST_CASE_POINTS
from .rules import RuleParams, breakpoints, is_pareto_optimal, reaches, s_star, threshold

_TOL = 1e-9  # relative slack so float noise cannot flip the (in)equalities that split the pieces


def instance_ratio(name: str, p, y, theta: float, params: RuleParams):
    """W(p*, y): the adversary's worst ALG/OPT for maximum p* and prediction y (vectorised)."""
    p = np.asarray(p, dtype=float)
    phi = threshold(name, y, theta, params)
    return np.where(reaches(p, phi), phi / p, 1.0 / p)


def sequence_ratio(prices, phi: float) -> float:
    """ALG/OPT of a threshold rule on one explicit price sequence (last price taken if none qualifies)."""
    prices = np.asarray(prices, dtype=float)
    hit = np.nonzero(reaches(prices, phi))[0]
    alg = prices[hit[0]] if hit.size else prices[-1]
    return float(alg / prices.max())


def _bisect(f, lo: float, hi: float, n: int) -> np.ndarray:
    """Per element k of n: the smallest y in [lo, hi] with f(y)[k] True (f monotone False..True in y), inf
    where f(hi) is False. Geometric bisection: the precision is relative (1e-15) for any theta up to the
    largest float, in at most ~60 steps."""
    a, b = np.full(n, lo), np.full(n, hi)
    at_lo, at_hi = f(a), f(b)
    for _ in range(200):
        mid = a * np.sqrt(b / a)
        t = f(mid)
        b, a = np.where(t, mid, b), np.where(t, a, mid)
        if np.all(b - a <= 1e-15 * b):
            break
    return np.where(at_lo, lo, np.where(at_hi, b, np.inf))


def _over(y, e, theta: float):
    """b = min(theta, y/e): the largest maximum p* with prediction quality >= e (theta at e = 0)."""
    return np.minimum(theta, np.divide(y, e, out=np.full(np.shape(e), np.inf), where=e > 0))


def _piece_inf(phi, lo: float, hi: float, e: np.ndarray, theta: float) -> np.ndarray:
    """inf of W over y in the piece [lo, hi] (closure; phi is the piece's formula) and p* with E >= e, for
    every e of the array at once."""
    n = len(e)
    # A-branch: p* >= Phi(y) possible iff b = min(theta, y/e) >= Phi(y)  <=>  y/Phi(y) >= e (Phi <= theta).
    ya = _bisect(lambda y: y >= e * phi(y) * (1 - _TOL), lo, hi, n)
    y = np.minimum(np.maximum(theta * e, np.where(np.isfinite(ya), ya, hi)), hi)
    best = np.where(np.isfinite(ya), phi(y) / _over(y, e, theta), np.inf)
    # B-branch: p* < Phi(y) possible iff a = max(1, y e) < Phi(y); W = 1/p* with inf at p* -> min(b, Phi).
    # {y e < Phi} is a down-set of the piece, {Phi > 1} an up-set; B(y) is non-increasing in y, so the
    # infimum is the limit at the right end of their intersection.
    yb = _bisect(lambda y: y * e >= phi(y) * (1 - _TOL), lo, hi, n)
    y_end = np.where(np.isfinite(yb), yb, hi)
    y0 = float(_bisect(lambda y: phi(y) > 1.0 + _TOL, lo, hi, 1)[0])
    if np.isfinite(y0):
        whole = (y0 == hi) & ~np.isfinite(yb) & (float(phi(np.array([hi]))[0]) > 1)
        ok = (y0 < y_end) | whole
        best = np.minimum(best, np.where(ok, 1.0 / np.minimum(_over(y_end, e, theta), phi(y_end)), np.inf))
    return best


def _piece_formula(name: str, theta: float, params: RuleParams, lo: float, hi: float):
    """Phi on the closed piece [lo, hi] by the piece's own formula: at a jump of Phi (an end of the piece),
    the limit from inside. The inside point is a relative 1e-12 step in (never beyond a quarter of the piece
    in log units), so the step is equally small at y = 1 and at y = theta for every theta."""
    step = min(1e-12, 0.25 * np.log(hi / lo))
    lo_in = max(lo * np.exp(step), np.nextafter(lo, np.inf))
    hi_in = min(hi * np.exp(-step), np.nextafter(hi, -np.inf))
    if lo_in > hi_in:
        lo_in = hi_in = lo * np.sqrt(hi / lo)

    def phi(y):
        at = threshold(name, y, theta, params)
        inside = threshold(name, np.clip(y, lo_in, hi_in), theta, params)
        return np.where(np.abs(at - inside) <= 1e-9 * np.maximum(at, inside), at, inside)

    return phi


def profile(name: str, theta: float, params: RuleParams, errors) -> np.ndarray:
    """Exact g(e) = inf { W(p*, y) : E(y, p*) >= e } for each e in `errors` (ALG/OPT, higher is better): the
    paper's worst-case ratio as a function of the prediction error, computed piece by piece (vectorised over
    `errors`; y handled in log units, so exact for any theta up to the largest float)."""
    e = np.asarray(errors, dtype=float).reshape(-1)
    pts = breakpoints(name, theta, params)
    best = np.full(len(e), np.inf)
    for lo, hi in zip(pts[:-1], pts[1:]):
        if hi > lo:
            best = np.minimum(best, _piece_inf(_piece_formula(name, theta, params, lo, hi), lo, hi, e, theta))
    return best


def robustness_consistency(name: str, theta: float, params: RuleParams) -> tuple[float, float]:
    """(r, c) exactly: r = g(0), c = g(1)."""
    r, c = profile(name, theta, params, [0.0, 1.0])
    return float(r), float(c)


def smoothness_bound(r: float, c: float, theta: float, errors) -> np.ndarray:
    """The paper's lower bound max(r, c * E^{s*}) that no Pareto-optimal rule can beat (s* = ln theta/ln(1/c) - 2)."""
    e = np.asarray(errors, dtype=float)
    return np.maximum(r, c * e ** s_star(c, theta))


def pareto_front(theta: float, n: int = 11) -> list[dict]:
    """Points of the Pareto front c * r = 1/theta for r in [1/theta, theta^-1/2] (the paper's
    consistency-robustness trade-off; OPT/ALG form C = theta / R)."""
    rs = np.exp(np.linspace(np.log(1 / theta), np.log(theta ** -0.5), n))
    return [{"robustness": float(r), "consistency": float(1 / (r * theta)),
             "robustness_opt_over_alg": float(1 / r), "consistency_opt_over_alg": float(r * theta)} for r in rs]


def brittleness_witness(name: str, theta: float, params: RuleParams, rel_error: float = 1e-3) -> dict | None:
    """An instance where a tiny relative prediction error drops the ratio from >= c to about r.

    Scans predictions y on a fine grid plus the rule's breakpoints with p* = y / (1 + rel_error): the largest
    drop between W(y, y) and W(y/(1+rel_error), y) is returned. None when theta < 1 + rel_error (no such p*).
    """
    ys = np.unique(np.concatenate([np.exp(np.linspace(0, np.log(theta), 4001)), breakpoints(name, theta, params)]))
    ys = ys[ys / (1 + rel_error) >= 1.0]
    if ys.size == 0:
        return None
    exact = instance_ratio(name, ys, ys, theta, params)
    off = instance_ratio(name, ys / (1 + rel_error), ys, theta, params)
    k = int(np.argmax(exact - off))
    return {"y": float(ys[k]), "p_star": float(ys[k] / (1 + rel_error)), "relative_error": rel_error,
            "ratio_exact_prediction": float(exact[k]), "ratio_with_error": float(off[k]),
            "error_E": float(1 / (1 + rel_error))}


def default_errors() -> np.ndarray:
    """The worst-case mode's error grid E = 0, 0.05, ..., 1 (`options.WORST_CASE_POINTS` points)."""
    return np.round(np.linspace(0.0, 1.0, WORST_CASE_POINTS), 6)


def worst_case_report(theta: float, params: RuleParams, algorithms=ALGORITHMS, errors=None) -> dict:
    """Everything worst-case mode prints: per algorithm r, c, profile g(e), smoothness gap, brittleness.
    `s_star` is None where it is infinite (r = 1/theta, c = 1: the bound is then r for every E < 1)."""
    if errors is None:
        errors = default_errors()
    errors = np.asarray(errors, dtype=float)
    if np.any(~np.isfinite(errors)) or np.any(errors < 0) or np.any(errors > 1):
        raise BadInputError("values are E = min(y/p*, p*/y) and must lie in [0, 1]", param="errors")
    r_target = float(params.r(theta))
    c_target = 1.0 / (r_target * theta)
    bound = smoothness_bound(r_target, c_target, theta, errors)
    algs = []
    for name in algorithms:
        g = profile(name, theta, params, errors)
        r, c = robustness_consistency(name, theta, params)
        algs.append({
            "name": name,
            "robustness": r, "consistency": c,
            "robustness_opt_over_alg": 1.0 / r, "consistency_opt_over_alg": 1.0 / c,
            "pareto_optimal": is_pareto_optimal(r, c, theta),
            "profile": [{"error": float(e), "ratio": float(v), "opt_over_alg": float(1 / v)} for e, v in zip(errors, g)],
            "brittleness": brittleness_witness(name, theta, params),
        })
    s = float(s_star(c_target, theta))
    return {
        "theta": theta,
        "target_robustness": r_target, "target_consistency": c_target,
        "s_star": s if np.isfinite(s) else None,
        "smoothness_bound": [{"error": float(e), "ratio": float(b)} for e, b in zip(errors, bound)],
        "pareto_front": pareto_front(theta),
        "algorithms": algs,
    }


def _refine(e: np.ndarray, g: np.ndarray, fn, min_step: float, rise: float):
    """Insert midpoints where neighbours differ by more than `rise` (relative) until they are `min_step`
    apart: a jump ends up drawn as a (near) vertical segment at its exact E, a curve as fine as the figure."""
    for _ in range(60):
        gap = (np.abs(np.diff(g)) > rise * np.maximum(g[:-1], g[1:])) & (np.diff(e) > min_step)
        if not gap.any():
            break
        mid = 0.5 * (e[:-1][gap] + e[1:][gap])
        e, g = np.concatenate([e, mid]), np.concatenate([g, fn(mid)])
        order = np.argsort(e, kind="stable")
        e, g = e[order], g[order]
    return e


def plot_curves(theta: float, params: RuleParams, algorithms, points: int = PLOT_POINTS, min_step: float = 1e-6,
                rise: float = 0.003) -> dict:
    """The exact profiles g(E) as polylines for a plot: one common grid of E (a uniform grid, the bound's kink,
    and every rule's refinement around its jumps and steep parts), so every curve, and the smoothness bound,
    is exact at every vertex and coincident curves have identical vertices."""
    r = float(params.r(theta))
    c = 1.0 / (r * theta)
    s = float(s_star(c, theta))
    e = np.linspace(0.0, 1.0, points)
    grid = [e]
    if np.isfinite(s) and s > 0 and r < c:
        grid.append(np.array([(r / c) ** (1.0 / s)]))  # the bound's kink: c E^s* = r
    for name in algorithms:
        grid.append(_refine(e, profile(name, theta, params, e), lambda x, n=name: profile(n, theta, params, x),
                            min_step, rise))
    e = np.unique(np.concatenate(grid))
    return {"error": e, "theta": theta, "robustness": r, "consistency": c,
            "bound": smoothness_bound(r, c, theta, e),
            "curves": {name: profile(name, theta, params, e) for name in algorithms}}
