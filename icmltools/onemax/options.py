"""Choice lists, defaults and the paper of `icml onemax-sim`, kept once (standard library only).

The command imports this module at load time (no numpy, so `--help` stays fast); the library takes its
lists and defaults from here too.
"""
from __future__ import annotations

from dataclasses import dataclass

from icmltools.core.reference import paper

REFERENCE = paper("Pareto-Optimality, Smoothness, and Stochasticity in Learning-Augmented One-Max-Search",
                  "Ziyad Benomar, Lorenzo Croissant, Vianney Perchet, Spyros Angelopoulos", arxiv="2502.05720")

MODES = ("worst-case", "empirical", "stochastic")
ALGORITHMS = ("elyaniv", "trust", "sun", "smooth", "ora", "robust-mix")  # run by default
EXTRA_ALGORITHMS = ("smooth-rho",)
ALL_ALGORITHMS = ALGORITHMS + EXTRA_ALGORITHMS
NOISE_MODELS = ("exact", "over", "under", "lognormal", "prev-max")
MARKETS = ("walk", "uniform", "spikes")  # stochastic mode's random price processes

MARKET_BOUNDS = (50.0, 800.0)  # the embedded market's declared [m, M] (theta = 16)
MARKET_LENGTH = 40000  # prices in the embedded market
SIMULATION_ERRORS = (0.95, 0.9, 0.8, 0.6, 0.4)  # error levels E of the simulations when none are given
WORST_CASE_POINTS = 21  # worst-case mode without errors: the grid E = 0, 0.05, ..., 1
THETA_MIN = 1.0 + 1e-9  # below it every ratio lies within 1e-9 of 1; windows flatter than this are scored at it
THETA_MAX = 1e300  # above it 1/theta leaves the normal floats and OPT/ALG = theta overflows: refused
ACCEPT_RTOL = 1e-9  # a price within this relative distance below the threshold counts as reaching it (rounding)
PLOT_POINTS = 401  # the plot's first grid of E; jumps and steep parts are refined to 1e-6 in E


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
        """The common robustness r at `theta` (vectorised; numpy is imported by `rules`, not here)."""
        from .rules import common_robustness

        return common_robustness(self, theta)

    def lam_for(self, theta):
        """Sun's lambda at `theta` that gives the common robustness."""
        from .rules import common_lambda

        return common_lambda(self, theta)


@dataclass(frozen=True)
class OneMaxConfig:
    """One run. `errors` left as None is chosen by `api.resolve`: the WORST_CASE_POINTS grid in worst-case
    mode, SIMULATION_ERRORS otherwise. `prices` None in empirical mode means the embedded market
    (`market_length` prices, declared bounds MARKET_BOUNDS unless m and M are given)."""

    mode: str = "empirical"
    theta: float = 16.0
    params: RuleParams = RuleParams()
    algorithms: tuple[str, ...] = ALGORITHMS
    errors: tuple[float, ...] | None = None
    noise: tuple[str, ...] = NOISE_MODELS
    window: int = 200
    stride: int = 10
    m: float | None = None
    M: float | None = None
    market: str = "walk"
    n_windows: int = 20000
    chunk: int = 20000
    market_length: int = MARKET_LENGTH
    prices: str | None = None
    column: str | None = None
    plot: str | None = None
