"""Choice lists, defaults and the paper for `icml dsgda` (standard library only: the command imports it
for --help)."""
from __future__ import annotations

from dataclasses import dataclass

from icmltools.core.reference import paper

REFERENCE = paper("Decoupled SGDA for Games with Intermittent Strategy Communication",
                  "Ali Zindari, Parham Yazdkhasti, Anton Rodomanov, Tatjana Chavdarova, Sebastian U. Stich",
                  arxiv="2501.14652")

# The method first, then its variant, then the paper's baselines.
METHODS = ("decoupled", "ghost", "gda", "altgda", "ogda", "eg", "localsgda")
LOCAL_METHODS = ("decoupled", "ghost", "localsgda")   # methods with K local steps per round
GAMES = ("quadratic", "nplayer", "noisy", "dirac-gan")  # or a FILE.json
SOLVE_METHODS = ("decoupled", "gda", "localsgda")

# Step-size grid of the spec: 2^(-j/2), j = 0..35 (each method gets its best lr on it).
LR_GRID = tuple(2.0 ** (-j / 2) for j in range(36))
DIVERGED = 1e12          # ||e|| / ||e0|| above this (or non-finite) counts as diverged
TAIL_ROUNDS = 50         # stochastic runs: the error is the mean over the last 50 rounds


@dataclass(frozen=True)
class RunConfig:
    """`icml dsgda run`. Fields left None take the game's default (GAME_DEFAULTS, then these)."""

    game: str = "quadratic"
    coupling: tuple | None = None
    kappa: float | None = None
    mu: float = 1.0
    dim: int = 10
    players: int = 3
    local_steps: tuple | None = None
    methods: tuple | None = None
    eps: float = 1e-6
    max_rounds: int | None = None
    seeds: int = 3
    lr: tuple | None = None           # None: the LR_GRID search
    sigma_self: tuple = (1.0,)        # noisy game: self-gradient noise, one value or one per player
    sigma_off: tuple | None = None    # noisy game: off-diagonal noise levels compared
    plot: str | None = None


# Defaults per game (spec: the deterministic table, plus c = 30 where Decoupled stops paying off; the noisy game of Fig. 4 at kappa 10, c = 0.3, K = 10).
DETERMINISTIC_DEFAULTS = {"coupling": (0.1, 0.3, 1.0, 3.0, 10.0, 30.0), "kappa": 100.0, "local_steps": (10, 100),
                          "methods": METHODS, "max_rounds": 20000, "sigma_off": (0.0,)}
GAME_DEFAULTS = {
    "quadratic": DETERMINISTIC_DEFAULTS,
    "nplayer": DETERMINISTIC_DEFAULTS,
    "dirac-gan": {**DETERMINISTIC_DEFAULTS, "coupling": (0.1, 0.3, 1.0, 3.0), "kappa": 1.0, "local_steps": (10,),
                  "max_rounds": 5000},
    "file": {**DETERMINISTIC_DEFAULTS, "coupling": (None,)},
    "noisy": {"coupling": (0.3,), "kappa": 10.0, "local_steps": (10,), "methods": ("decoupled", "localsgda", "gda"),
              "max_rounds": 200, "sigma_off": (0.0, 1.0, 3.0, 10.0)},
}


@dataclass(frozen=True)
class SolveConfig:
    """`icml dsgda solve`: one method on a user's game through the gradient-oracle loop."""

    game: str = ""
    method: str = "decoupled"
    local_steps: int = 10
    lr: float | None = None           # None: 1 / (max block norm of J)
    rounds: int = 1000
    eps: float = 1e-6
