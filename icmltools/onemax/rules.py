"""Threshold rules for one-max search, in normalised units (prices divided by m, so they lie in [1, theta]).

Benomar, Croissant, Perchet, Angelopoulos, "Pareto-Optimality, Smoothness, and Stochasticity in
Learning-Augmented One-Max-Search", ICML 2025, arXiv 2502.05720 (`options.REFERENCE`).

A deterministic threshold rule accepts the first price >= Phi(y), where y is the prediction of the maximum
price (if no price qualifies, the last price is taken). Every function here is vectorised over `y` and
`theta` (numpy arrays that broadcast).

The Pareto front the rules are measured against (the paper's Pareto-optimality result): consistency c and
robustness r of any deterministic rule satisfy c * r <= 1/theta, with equality for r in [1/theta, theta^-1/2];
Phi is Pareto-optimal at robustness r iff r*theta <= Phi(y) <= 1/r for all y and y/(r*theta) <= Phi(y) <= y
for y >= r*theta.

Rules (each is one small function in `THRESHOLDS`, which cites its formula):

* ``elyaniv`` - Phi = sqrt(theta), El-Yaniv et al.'s robust optimum, prediction-free.
* ``trust``   - Phi = y (consistency 1, robustness 1/theta).
* ``sun``     - Sun et al. (NeurIPS 2021), distrust parameter lambda in [0, 1]: gamma solves
  lambda*g^2 + (1-lambda)*g - theta = 0, eta = theta/gamma; Phi = eta below eta, lambda*gamma + (1-lambda)*y/eta
  on [eta, gamma), gamma above. Pareto-optimal with robustness 1/gamma, brittle at y = gamma.
* ``smooth``  - this paper's Pareto-optimal smooth family A_r^rho (thresholds Phi_r^rho), our rule intended
  to match A_r^1, derived from first principles (no official code is published): Phi = r*theta
  for y <= r*theta, else r*theta * (y/(r*theta))^sigma with sigma = 2 + ln(theta)/ln(r). Robustness exactly r,
  consistency exactly 1/(r*theta), worst-case ratio exactly max(r, c*E^{s*}), i.e. it meets the paper's lower
  bound on the smoothness of any Pareto-optimal rule, s* = ln(theta)/ln(1/c) - 2. r = theta^-1/2 gives El-Yaniv, r = 1/theta gives trust.
* ``smooth-rho`` - a rho-family between the Pareto upper envelope clip(y, r*theta, 1/r) (rho = 1) and
  ``smooth`` (rho = 0), interpolated geometrically; every member stays Pareto-optimal at robustness r (the
  Pareto conditions are pointwise bounds, preserved by geometric means), trading smoothness for
  average-case aggressiveness.
* ``ora`` and ``robust-mix`` - Angelopoulos, Kamali, Zhang (AAAI 2022): reservation price (1-H_n)*y; robust-mix
  uses it when (1+H_p)/(1-H_n) <= sqrt(theta), else sqrt(theta). H_n / H_p bound the prediction's
  under/over-estimation.
"""
from __future__ import annotations

import numpy as np

from icmltools.core.errors import BadInputError, RuntimeFailure

from . import options
from .options import RuleParams

__all__ = ["ALGORITHMS", "EXTRA_ALGORITHMS", "RuleParams", "threshold", "breakpoints", "validate", "sun_gamma",
           "lam_from_robustness", "smooth_sigma", "s_star", "is_pareto_optimal", "prediction_error", "reaches"]

ALGORITHMS = options.ALGORITHMS
EXTRA_ALGORITHMS = options.EXTRA_ALGORITHMS
PARETO_OPTIMAL = {"sun": True, "smooth": True, "smooth-rho": True, "trust": True, "elyaniv": True,
                  "ora": False, "robust-mix": False}


def sun_gamma(lam, theta):
    """Sun et al.'s gamma(lambda, theta): the positive root of lam*g^2 + (1-lam)*g - theta = 0 (gamma = theta at 0).

    Written as g = theta / ((hypot(1-lam, 2 sqrt(lam theta)) + 1-lam) / 2), the rationalised root: no
    cancellation for small lam, no overflow for theta up to the largest float, no division by lam."""
    lam = np.asarray(lam, dtype=float)
    theta = np.asarray(theta, dtype=float)
    return theta / (0.5 * (np.hypot(1.0 - lam, 2.0 * np.sqrt(lam * theta)) + (1.0 - lam)))


def lam_from_robustness(r, theta):
    """Invert r = 1/gamma(lambda, theta): lambda = (theta - gamma) / (gamma^2 - gamma), computed as
    (theta/gamma - 1) / (gamma - 1) so gamma^2 cannot overflow."""
    g = 1.0 / np.asarray(r, dtype=float)
    theta = np.asarray(theta, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = (theta / g - 1.0) / (g - 1.0)
    return np.clip(np.where(g >= theta, 0.0, lam), 0.0, 1.0)


def common_robustness(params: RuleParams, theta):
    """The robustness every Pareto-optimal rule is run at: `robustness` clipped to the front's range
    [1/theta, theta^-1/2], or Sun's 1/gamma(lam, theta)."""
    theta = np.asarray(theta, dtype=float)
    if params.robustness is not None:
        return np.clip(params.robustness, 1.0 / theta, 1.0 / np.sqrt(theta))
    return 1.0 / sun_gamma(params.lam, theta)


def common_lambda(params: RuleParams, theta):
    """Sun's lambda that gives the common robustness at `theta`."""
    if params.robustness is not None:
        return lam_from_robustness(common_robustness(params, theta), theta)
    return np.broadcast_to(np.asarray(params.lam, dtype=float), np.shape(theta))


def smooth_sigma(r, theta):
    """Exponent of the smooth rule: sigma = 2 + ln(theta)/ln(r)."""
    return 2.0 + np.log(theta) / np.log(r)


def s_star(c, theta):
    """The paper's smoothness lower bound exponent s* = ln(theta)/ln(1/c) - 2 for a Pareto-optimal rule of
    consistency c: no such rule guarantees more than max(r, c * E^s) with s < s*. +inf at c = 1 (r = 1/theta:
    the bound is r for every E < 1)."""
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(c >= 1.0 - 1e-12, np.inf, np.log(theta) / np.log(1.0 / np.minimum(c, 1.0 - 1e-12)) - 2.0)


def is_pareto_optimal(r: float, c: float, theta: float) -> bool:
    """Whether (r, c) lies on the front c * r = 1/theta (relative tolerance 1e-9, so it holds at any theta)."""
    return bool(abs(c * r * theta - 1.0) < 1e-9)


def prediction_error(y, p):
    """The paper's prediction error E(y, p*) = min(y/p*, p*/y) in (0, 1]; 1 is a perfect prediction."""
    y = np.asarray(y, dtype=float)
    p = np.asarray(p, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):  # y = 0 or inf (an extreme prediction) gives E = 0
        return np.minimum(y / p, p / y)


def reaches(price, phi):
    """Whether a price reaches threshold `phi`: price >= phi up to a relative `options.ACCEPT_RTOL`, so a
    threshold that equals a price mathematically (ORA's (1-H_n)*y with y = p*/(1-H_n), a price at sqrt(m M),
    at gamma, at 1/r) cannot miss it by a rounding error of the arithmetic that produced it."""
    return np.asarray(price) >= np.asarray(phi) * (1.0 - options.ACCEPT_RTOL)


def validate(theta: float | None = None, params: RuleParams | None = None) -> None:
    if theta is not None and not (options.THETA_MIN <= theta <= options.THETA_MAX):
        raise BadInputError(f"must lie in [1 + 1e-9, 1e300] (M/m; closer to 1 every ratio is within 1e-9 of 1, "
                            f"beyond 1e300 the ratios 1/theta leave the float range), got {theta!r}", param="theta")
    if params is None:
        return
    if params.lam is not None and not (0.0 <= params.lam <= 1.0):
        raise BadInputError(f"must lie in [0, 1], got {params.lam}", param="lam")
    if params.robustness is not None:
        if not (0.0 < params.robustness < 1.0):
            raise BadInputError(f"must lie in (0, 1), got {params.robustness}", param="robustness")
        lo, hi = 1.0 / theta if theta is not None else 0.0, theta ** -0.5 if theta is not None else 1.0
        if not (lo * (1 - 1e-9) <= params.robustness <= hi * (1 + 1e-9)):
            raise BadInputError(f"must lie in [1/theta, theta^-1/2] = [{lo:.4g}, {hi:.4g}], got {params.robustness}",
                                param="robustness")
    if not (0.0 <= params.rho <= 1.0):
        raise BadInputError(f"must lie in [0, 1], got {params.rho}", param="rho")
    if not (0.0 <= params.hn < 1.0):
        raise BadInputError(f"must lie in [0, 1), got {params.hn}", param="hn")
    if params.hp < 0.0:
        raise BadInputError(f"must be >= 0, got {params.hp}", param="hp")


# ------------------------------------------------------------------------------------------ the rules
def _elyaniv(y, theta, params: RuleParams):
    """El-Yaniv et al.'s robust optimum, prediction-free: Phi = sqrt(theta) (sqrt(m M) in prices)."""
    return np.sqrt(theta) * np.ones_like(y)


def _trust(y, theta, params: RuleParams):
    """Blind trust: Phi = y (consistency 1, robustness 1/theta)."""
    return y


def _sun(y, theta, params: RuleParams):
    """Sun et al. (NeurIPS 2021): eta = theta/gamma; Phi = eta for y < eta, lambda*gamma + (1-lambda)*y/eta on
    [eta, gamma), gamma above. Pareto-optimal at robustness 1/gamma, brittle at y = gamma."""
    lam = params.lam_for(theta)
    g = sun_gamma(lam, theta)
    eta = theta / g
    return np.where(y < eta, eta, np.where(y < g, lam * g + (1 - lam) * y / eta, g))


def _smooth(y, theta, params: RuleParams):
    """This paper's smooth Pareto-optimal rule (intended to match A_r^1): Phi = r*theta for y <= r*theta, else
    r*theta * (y/(r*theta))^sigma with sigma = 2 + ln(theta)/ln(r); worst case exactly max(r, c E^{s*}).
    A prediction above theta counts as theta (Phi = 1/r there), so robustness r holds for every y."""
    r = params.r(theta)
    rt = r * theta
    sigma = smooth_sigma(r, theta)
    ys = np.minimum(y, theta)  # a prediction above M is known to overshoot: beyond theta Phi stays 1/r
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ys <= rt, rt, rt * (np.maximum(ys, rt) / rt) ** sigma)


def _smooth_rho(y, theta, params: RuleParams):
    """Geometric interpolation between `smooth` (rho = 0) and the Pareto upper envelope clip(y, r*theta, 1/r)
    (rho = 1): Phi = Phi_smooth^(1-rho) * envelope^rho, Pareto-optimal at robustness r for every rho."""
    r = params.r(theta)
    env = np.clip(y, r * theta, 1.0 / r)
    return _smooth(y, theta, params) ** (1.0 - params.rho) * env ** params.rho


def _ora(y, theta, params: RuleParams):
    """Angelopoulos, Kamali, Zhang (AAAI 2022) ORA: reservation price (1 - H_n) * y."""
    return (1.0 - params.hn) * y


def _robust_mix(y, theta, params: RuleParams):
    """Angelopoulos et al. robust-mix: (1 - H_n) * y when (1 + H_p)/(1 - H_n) <= sqrt(theta), else sqrt(theta)."""
    use_pred = (1.0 + params.hp) / (1.0 - params.hn) <= np.sqrt(theta)
    return np.where(use_pred, (1.0 - params.hn) * y, np.sqrt(theta))


THRESHOLDS = {"elyaniv": _elyaniv, "trust": _trust, "sun": _sun, "smooth": _smooth, "ora": _ora,
              "robust-mix": _robust_mix, "smooth-rho": _smooth_rho}
assert tuple(THRESHOLDS) == options.ALL_ALGORITHMS


def threshold(name: str, y, theta, params: RuleParams):
    """Phi(y) in normalised units for rule `name`, clipped to [1, theta]. Vectorised over y and theta.

    y may be 0 or +inf (an extreme prediction): every rule is constant below 1 and above theta/(1-H_n), so
    these are exact; the formulas' unused branches may then hold inf or NaN (np.where discards them)."""
    fn = THRESHOLDS.get(name)
    if fn is None:
        raise BadInputError(f"unknown algorithm {name!r}; choose from {', '.join(options.ALL_ALGORITHMS)}",
                            param="algorithms")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        phi = np.clip(fn(np.asarray(y, dtype=float), np.asarray(theta, dtype=float), params), 1.0, theta)
    if np.isnan(phi).any():
        raise RuntimeFailure(f"{name}: the threshold is NaN at theta = {np.max(theta):g} (please report this)")
    return phi


# points of [1, theta] where each rule's formula changes (besides 1 and theta)
_BREAKS = {
    "elyaniv": lambda theta, p: [],
    "trust": lambda theta, p: [],
    "sun": lambda theta, p: (lambda g: [theta / g, g])(float(sun_gamma(p.lam_for(theta), theta))),
    "smooth": lambda theta, p: [float(p.r(theta)) * theta],
    "smooth-rho": lambda theta, p: [float(p.r(theta)) * theta, 1.0 / float(p.r(theta))],
    "ora": lambda theta, p: [1.0 / (1.0 - p.hn)],
    "robust-mix": lambda theta, p: [1.0 / (1.0 - p.hn)],
}


def breakpoints(name: str, theta: float, params: RuleParams) -> list[float]:
    """Points of [1, theta] where the rule's formula changes (pieces are smooth, non-decreasing and
    Phi(y)/y is non-increasing within each piece)."""
    pts = [1.0, theta] + list(_BREAKS.get(name, lambda t, p: [])(theta, params))
    return sorted({min(max(p, 1.0), theta) for p in pts})
