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

from .options import ALGORITHMS, WORST_CASE_POINTS
from .rules import RuleParams, breakpoints, s_star, threshold

_TOL = 1e-9  # relative slack so float noise cannot flip the (in)equalities that split the pieces


def instance_ratio(name: str, p, y, theta: float, params: RuleParams):
    """W(p*, y): the adversary's worst ALG/OPT for maximum p* and prediction y (vectorised)."""
    p = np.asarray(p, dtype=float)
    phi = threshold(name, y, theta, params)
    return np.where(p >= phi, phi / p, 1.0 / p)


def sequence_ratio(prices, phi: float) -> float:
    """ALG/OPT of a threshold rule on one explicit price sequence (last price taken if none qualifies)."""
    prices = np.asarray(prices, dtype=float)
    hit = np.nonzero(prices >= phi)[0]
    alg = prices[hit[0]] if hit.size else prices[-1]
    return float(alg / prices.max())


def _bisect(f, lo: float, hi: float, iters: int = 200) -> float:
    """Smallest y in [lo, hi] with f(y) True, for f monotone False..True; returns hi+ if never True."""
    if f(lo):
        return lo
    if not f(hi):
        return np.inf
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if f(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-15 * hi:
            break
    return hi


def _piece_inf(phi, lo: float, hi: float, e: float, theta: float) -> float:
    """inf of W over y in the piece [lo, hi] (closure; phi is the piece's formula) and p* with E >= e."""
    best = np.inf
    # A-branch: p* >= Phi(y) possible iff b = min(theta, y/e) >= Phi(y)  <=>  y/Phi(y) >= e (Phi <= theta).
    ya = _bisect(lambda y: y >= e * phi(y) * (1 - _TOL), lo, hi)
    if np.isfinite(ya):
        y = min(max(theta * e, ya), hi)
        b = theta if e <= 0 else min(theta, y / e)
        best = min(best, phi(y) / b)
    # B-branch: p* < Phi(y) possible iff a = max(1, y e) < Phi(y); W = 1/p* with inf at p* -> min(b, Phi).
    # {y e < Phi} is a down-set of the piece, {Phi > 1} an up-set; B(y) is non-increasing in y, so the
    # infimum is the limit at the right end of their intersection.
    yb = _bisect(lambda y: y * e >= phi(y) * (1 - _TOL), lo, hi)
    y_end = hi if not np.isfinite(yb) else yb
    y0 = _bisect(lambda y: phi(y) > 1.0 + _TOL, lo, hi)
    if np.isfinite(y0) and (y0 < y_end or (y0 == y_end == hi and not np.isfinite(yb) and phi(hi) > 1)):
        b = theta if e <= 0 else min(theta, y_end / e)
        best = min(best, 1.0 / min(b, phi(y_end)))
    return best


def profile(name: str, theta: float, params: RuleParams, errors) -> np.ndarray:
    """Exact g(e) = inf { W(p*, y) : E(y, p*) >= e } for each e in `errors` (ALG/OPT, higher is better): the
    paper's worst-case ratio as a function of the prediction error, computed piece by piece."""
    pts = breakpoints(name, theta, params)
    out = np.empty(len(errors))
    for k, e in enumerate(np.asarray(errors, dtype=float)):
        best = np.inf
        for lo, hi in zip(pts[:-1], pts[1:]):
            if hi <= lo:
                continue
            d = (hi - lo) * 1e-12

            def phi(y, lo=lo, hi=hi, d=d):
                # the piece's own formula on its closure: at a jump of Phi, the limit from inside the piece
                at = float(threshold(name, y, theta, params))
                inside = float(threshold(name, min(max(y, lo + d), hi - d), theta, params))
                return at if abs(at - inside) <= 1e-9 * max(at, 1.0) else inside

            best = min(best, _piece_inf(phi, lo, hi, float(e), theta))
        out[k] = best
    return out


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
    drop between W(y, y) and W(y/(1+rel_error), y) is returned.
    """
    ys = np.unique(np.concatenate([np.exp(np.linspace(0, np.log(theta), 4001)), breakpoints(name, theta, params)]))
    ys = ys[ys / (1 + rel_error) >= 1.0]
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
    """Everything worst-case mode prints: per algorithm r, c, profile g(e), smoothness gap, brittleness."""
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
        wit = brittleness_witness(name, theta, params)
        algs.append({
            "name": name,
            "robustness": r, "consistency": c,
            "robustness_opt_over_alg": 1.0 / r, "consistency_opt_over_alg": 1.0 / c,
            "pareto_optimal": bool(abs(c * r - 1.0 / theta) < 1e-9),
            "profile": [{"error": float(e), "ratio": float(v), "opt_over_alg": float(1 / v)} for e, v in zip(errors, g)],
            "brittleness": wit,
        })
    return {
        "theta": theta,
        "target_robustness": r_target, "target_consistency": c_target,
        "s_star": float(s_star(c_target, theta)),
        "smoothness_bound": [{"error": float(e), "ratio": float(b)} for e, b in zip(errors, bound)],
        "pareto_front": pareto_front(theta),
        "algorithms": algs,
    }
