"""Choice lists, defaults and the paper for `icml shap-pay` (stdlib only: the command imports it for --help)."""
from __future__ import annotations

from dataclasses import dataclass

from icmltools.core.reference import paper

REFERENCE = paper("You Get What You Give: Reciprocally Fair Federated Learning",
                  "Aniket Murhekar, Jiaxin Song, Parnian Shahkar, Bhaskar Ray Chaudhury, Ruta Mehta",
                  url="https://openreview.net/forum?id=ZdmMDz33Io")

MECHANISMS = ("shap", "none", "proportional", "planner")   # the paper's mechanism first, then the baselines
SHAPLEY_MODES = ("auto", "exact", "mc")                    # auto: exact for n <= MAX_EXACT, else Monte Carlo
COALITION_VALUES = ("all", "members")                      # v(X) sums gains over every agent / over X only
DYNAMICS = ("br", "grad")                                  # exact best responses of k agents / projected gradient
VALUES = ("curve", "digits")                               # the paper's accuracy curve, or models on sklearn digits
MAX_EXACT = 15                                             # exact Shapley enumerates 2^n coalitions


@dataclass(frozen=True)
class GameConfig:
    """The embedded default game (spec, [inf]): n agents in `groups` groups (agent i in group i mod groups),
    a_i(s) = 1 - alpha (sum_j W_ij s_j + 1)^-beta with W_ij = rho_in within a group, rho_out across, W_ii = 1;
    linear costs gamma_i s_i with gamma_i ~ U(gamma_low, gamma_high) from the seed."""

    n: int = 8
    alpha: float = 0.9
    beta: float = 0.6
    groups: int = 2
    rho_in: float = 1.0
    rho_out: float = 0.5
    gamma_low: float = 0.002
    gamma_high: float = 0.02
    s_max: float = 200.0


@dataclass(frozen=True)
class ShapleyConfig:
    """How phi is computed: exact over 2^n coalitions, or `perms` fixed random permutations (common random
    numbers, also inside best responses). perms None = max(1000, ceil(n ln n))."""

    shapley: str = "auto"
    perms: int | None = None
    coalition_value: str = "all"


@dataclass(frozen=True)
class EquilibriumConfig:
    """Best-response dynamics: each round `k` random agents (None = ceil(n/4)) switch together to their exact
    best responses (bisection, `halvings` steps); stop when max_i |BR_i(s) - s_i| < tol."""

    mechanisms: tuple = MECHANISMS
    dynamics: str = "br"
    k: int | None = None
    tol: float = 1e-6
    max_rounds: int = 5000
    halvings: int = 60
    lr: float = 500.0                # --dynamics grad: step = lr * (marginal payoff - gamma_i), projected
    deviation_grid: int | None = None  # None: 1001 when cheap (see dynamics.deviation_gain), 0 = skip


@dataclass(frozen=True)
class DigitsConfig:
    """`--value digits` [inf]: agents hold class-skewed subsets of sklearn's bundled digits (`skew` of each
    agent's data from its 2 preferred classes); a_j = accuracy of logistic regression trained on the
    coalition's pooled data, on agent j's own skewed test set; a_j(empty) = 1 / classes (chance)."""

    n: int = 6
    skew: float = 0.7
    pool: int = 200                  # training points each agent holds (its s_max)
    test: int = 60                   # test points per agent
    fit_sizes: tuple = (10, 20, 40, 80, 160, 320, 640)
    fit_repeats: int = 3
    max_iter: int = 200


DEMO_CONTRIB = (20.0, 40.0, 60.0, 80.0, 100.0, 120.0)  # `payments --value digits` without --contrib
