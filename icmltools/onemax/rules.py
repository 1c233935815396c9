"""Threshold rules for one-max search, in normalised units (prices divided by m, so they lie in [1, theta]).

A deterministic threshold rule accepts the first price >= Phi(y), where y is the prediction of the maximum
price (if no price qualifies, the last price is taken). Every function here is vectorised over `y` and
`theta` (numpy arrays that broadcast).

Rules (spec `onemax-sim.md`, section "Algorithms"):

* ``elyaniv`` - Phi = sqrt(theta), El-Yaniv et al.'s robust optimum, prediction-free.
* ``trust``   - Phi = y (consistency 1, robustness 1/theta).
* ``sun``     - Sun et al. (NeurIPS 2021), distrust parameter lambda in [0, 1]: gamma solves
  lambda*g^2 + (1-lambda)*g - theta = 0, eta = theta/gamma; Phi = eta below eta, lambda*gamma + (1-lambda)*y/eta
  on [eta, gamma), gamma above. Pareto-optimal with robustness 1/gamma, brittle at y = gamma.
* ``smooth``  - this paper's Pareto-optimal smooth family, intended to match A_r^1 (Section 3): Phi = r*theta
  for y <= r*theta, else r*theta * (y/(r*theta))^sigma with sigma = 2 + ln(theta)/ln(r). Robustness exactly r,
  consistency exactly 1/(r*theta), worst-case ratio exactly max(r, c*E^{s*}) (Theorem on smoothness), i.e. it
  meets the lower bound s* = ln(theta)/ln(1/c) - 2. r = theta^-1/2 gives El-Yaniv, r = 1/theta gives trust.
* ``smooth-rho`` - a rho-family between the Pareto upper envelope clip(y, r*theta, 1/r) (rho = 1) and
  ``smooth`` (rho = 0), interpolated geometrically; every member stays Pareto-optimal at robustness r (the
  Pareto conditions are pointwise bounds, preserved by geometric means), trading smoothness for
  average-case aggressiveness.
* ``ora`` and ``robust-mix`` - Angelopoulos, Kamali, Zhang (AAAI 2022): reservation price (1-H_n)*y; robust-mix
  uses it when (1+H_p)/(1-H_n) <= sqrt(theta), else sqrt(theta). H_n / H_p bound the prediction's
  under/over-estimation.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from icmltools.core.errors import BadInputError

ALGORITHMS = ("elyaniv", "trust", "sun", "smooth", "ora", "robust-mix")
EXTRA_ALGORITHMS = ("smooth-rho",)
PARETO_OPTIMAL = {"sun": True, "smooth": True, "smooth-rho": True, "trust": True, "elyaniv": True,
                  "ora": False, "robust-mix": False}


def sun_gamma(lam, theta):
    """Sun et al.'s gamma(lambda, theta): the positive root of lam*g^2 + (1-lam)*g - theta = 0 (gamma = theta at 0)."""
    lam = np.asarray(lam, dtype=float)
    theta = np.asarray(theta, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = (np.sqrt((1 - lam) ** 2 + 4 * lam * theta) - (1 - lam)) / (2 * lam)
    return np.where(lam <= 0, theta, g)


def lam_from_robustness(r, theta):
    """Invert r = 1/gamma(lambda, theta): lambda = (theta - gamma) / (gamma^2 - gamma)."""
    g = 1.0 / np.asarray(r, dtype=float)
    theta = np.asarray(theta, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = (theta - g) / (g * g - g)
    return np.clip(np.where(g >= theta, 0.0, lam), 0.0, 1.0)


def smooth_sigma(r, theta):
    """Exponent of the smooth rule: sigma = 2 + ln(theta)/ln(r)."""
    return 2.0 + np.log(theta) / np.log(r)


def s_star(c, theta):
    """Smoothness lower bound exponent s* = ln(theta)/ln(1/c) - 2 for a Pareto-optimal rule of consistency c."""
    return np.log(theta) / np.log(1.0 / c) - 2.0


def prediction_error(y, p):
    """E(y, p*) = min(y/p*, p*/y) in (0, 1]; 1 is a perfect prediction."""
    y = np.asarray(y, dtype=float)
    p = np.asarray(p, dtype=float)
    return np.minimum(y / p, p / y)


@dataclass(frozen=True)
class RuleParams:
    """Parameters shared by the rules. Pareto-optimal rules are compared at equal robustness: `lam` (Sun's
    distrust) fixes r = 1/gamma(lam, theta), or `robustness` fixes r directly (then lam follows)."""

    lam: float | None = 0.5
    robustness: float | None = None
    rho: float = 0.5
    hn: float = 0.1
    hp: float = 0.1

    def r(self, theta):
        theta = np.asarray(theta, dtype=float)
        if self.robustness is not None:
            return np.clip(self.robustness, 1.0 / theta, 1.0 / np.sqrt(theta))
        return 1.0 / sun_gamma(self.lam, theta)

    def lam_for(self, theta):
        if self.robustness is not None:
            return lam_from_robustness(self.r(theta), theta)
        return np.broadcast_to(np.asarray(self.lam, dtype=float), np.shape(theta))


def validate(theta: float | None = None, params: RuleParams | None = None) -> None:
    if theta is not None and not (np.isfinite(theta) and theta > 1):
        raise BadInputError(f"--theta must be > 1 (M/m), got {theta}")
    if params is None:
        return
    if params.lam is not None and not (0.0 <= params.lam <= 1.0):
        raise BadInputError(f"--lam must lie in [0, 1], got {params.lam}")
    if params.robustness is not None:
        if not (0.0 < params.robustness < 1.0):
            raise BadInputError(f"--robustness must lie in (0, 1), got {params.robustness}")
        if theta is not None and not (1.0 / theta - 1e-12 <= params.robustness <= theta ** -0.5 + 1e-12):
            raise BadInputError(f"--robustness must lie in [1/theta, theta^-1/2] = [{1 / theta:.4f}, {theta ** -0.5:.4f}]")
    if not (0.0 <= params.rho <= 1.0):
        raise BadInputError(f"--rho must lie in [0, 1], got {params.rho}")
    if not (0.0 <= params.hn < 1.0) or params.hp < 0.0:
        raise BadInputError("--hn must lie in [0, 1) and --hp must be >= 0")


def threshold(name: str, y, theta, params: RuleParams):
    """Phi(y) in normalised units for rule `name`, clipped to [1, theta]. Vectorised over y and theta."""
    y = np.asarray(y, dtype=float)
    theta = np.asarray(theta, dtype=float)
    if name == "elyaniv":
        phi = np.sqrt(theta) * np.ones_like(y)
    elif name == "trust":
        phi = y
    elif name == "sun":
        lam = params.lam_for(theta)
        g = sun_gamma(lam, theta)
        eta = theta / g
        phi = np.where(y < eta, eta, np.where(y < g, lam * g + (1 - lam) * y / eta, g))
    elif name in ("smooth", "smooth-rho"):
        r = params.r(theta)
        rt = r * theta
        sigma = smooth_sigma(r, theta)
        ys = np.minimum(y, theta)  # a prediction above M is known to overshoot: beyond theta Phi stays 1/r
        with np.errstate(divide="ignore", invalid="ignore"):
            phi = np.where(ys <= rt, rt, rt * (np.maximum(ys, rt) / rt) ** sigma)
        if name == "smooth-rho":
            env = np.clip(y, rt, 1.0 / r)
            phi = phi ** (1.0 - params.rho) * env ** params.rho
    elif name == "ora":
        phi = (1.0 - params.hn) * y
    elif name == "robust-mix":
        use_pred = (1.0 + params.hp) / (1.0 - params.hn) <= np.sqrt(theta)
        phi = np.where(use_pred, (1.0 - params.hn) * y, np.sqrt(theta))
    else:
        raise BadInputError(f"unknown algorithm {name!r}; choose from {', '.join(ALGORITHMS + EXTRA_ALGORITHMS)}")
    return np.clip(phi, 1.0, theta)


def breakpoints(name: str, theta: float, params: RuleParams) -> list[float]:
    """Points of [1, theta] where the rule's formula changes (pieces are smooth, non-decreasing and
    Phi(y)/y is non-increasing within each piece)."""
    pts = [1.0, theta]
    r = float(params.r(theta))
    if name == "sun":
        g = float(sun_gamma(params.lam_for(theta), theta))
        pts += [theta / g, g]
    elif name == "smooth":
        pts += [r * theta]
    elif name == "smooth-rho":
        pts += [r * theta, 1.0 / r]
    elif name == "trust":
        pass
    elif name == "ora":
        pts += [1.0 / (1.0 - params.hn)]
    elif name == "robust-mix":
        pts += [1.0 / (1.0 - params.hn)]
    return sorted({min(max(p, 1.0), theta) for p in pts})
