"""Choice lists, defaults and configs of `icml reopt`, kept once (stdlib only: the command imports this
module for its options without pulling numpy, scipy, torch or PySCIPOpt)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from icmltools.core.errors import BadInputError
from icmltools.core.reference import paper

# The spec gives the method's name and venue only; the title below is that of the framework's earlier
# version (ICLR 2025 submission, OpenReview); no arXiv id or author list is known to us.
REFERENCE = paper(
    "A Reoptimization Framework for Mixed Integer Linear Programming with Dynamic Parameters",
    authors="not recorded in our sources (the ICLR 2025 submission was anonymous)",
    venue="ICML 2025 (as VP-OR; the title is that of the ICLR 2025 submission)",
    url="https://openreview.net/forum?id=scdGzuwC9u",
)

METHODS = ("vpor", "scip", "warm", "reopt")
"""vpor: VP-OR-style; scip: plain SCIP; warm: SCIP started from the previous solution; reopt: SCIP's own
reoptimization (objective-only changes)."""
METHOD_LABELS = {"vpor": "VP-OR-style", "scip": "SCIP", "warm": "warm SCIP", "reopt": "SCIP reopt"}
DEFAULT_SOLVE_METHODS = ("vpor",)
PREDICTORS = ("marginal", "gnn")
PROBLEMS = ("setcover", "cauction", "facility", "indset")
MODES = ("obj", "rhs", "bnd", "mat", "mixed")
SIZES = ("tiny", "small", "medium")
FIRST = 1
"""First instance solved in a series (instance i uses instances 0..i-1 as history)."""
LIMIT_KINDS = ("wall", "det-time", "nodes", "lp-iterations")
"""What a method's limit counts: wall-clock seconds (`time_limit`), or, reproducible bit for bit, SCIP's
deterministic time (SCIPgetDeterministicTime: LP iterations, bound changes and stop checks weighted by the
matrix size), branch-and-bound nodes, or LP iterations (`budget`, summed over VP-OR's sub-MIPs)."""


def _positive_seconds(value, param: str) -> None:
    if value is None or not (value > 0) or not math.isfinite(value):
        raise BadInputError(f"must be a positive number of seconds, got {value}", param=param)


def check_budget(kind: str, budget, param: str) -> None:
    """A budget goes with a deterministic limit kind (and is then required); wall limits are seconds."""
    _choices((kind, LIMIT_KINDS, "limit_kind"))
    if kind == "wall":
        if budget is not None:
            raise BadInputError(f"is for the limit kinds {', '.join(LIMIT_KINDS[1:])}; a wall-clock limit is "
                                "given in seconds (time_limit)", param=param)
        return
    if budget is None or not (budget > 0) or not math.isfinite(budget):
        raise BadInputError(f"give a positive {kind} budget with limit kind {kind!r}, got {budget}", param=param)


def _choices(*checks) -> None:
    """(value, choices, param) triples: each value must be one of its choices."""
    for value, choices, param in checks:
        if value not in choices:
            raise BadInputError(f"unknown {value!r}; choose from {', '.join(choices)}", param=param)


@dataclass(frozen=True)
class SolveConfig:
    """How one new instance is solved (paper, Stage 1 and Stage 2; parameters the paper fixes are noted)."""

    time_limit: float = 10.0          # seconds per method (paper: 10 s)
    fix_ratio: float = 0.7            # P: fraction of eligible variables fixed per iteration (paper: 0.7)
    submip_limit: float | None = None  # seconds per sub-MIP; None: time_limit / 5, at least 0.5 s (ours)
    groups: int = 10                  # release one of 10 groups at a time on an infeasible sub-MIP (paper)
    prior_strength: float = 10.0      # K in alpha = 1 + K p, beta = 1 + K (1 - p) (ours)
    decay: float = 0.8                # recency weight decay^age of history solutions (ours)
    predictor: str = "marginal"       # Stage 1: history marginals (ours) or a bipartite GNN (as the paper)
    device: str = "cpu"               # torch device of the GNN predictor (SCIP runs on the CPU)
    seed: int = 0                     # root of every random stream (SCIP's seed shift, sampling, GNN)
    reopt_history_limit: float | None = None  # limit of the reopt baseline's solve of the previous instance
    verbose: bool = False             # SCIP's own output on stderr
    limit_kind: str = "wall"          # LIMIT_KINDS; other than wall, time_limit is a wall-clock cap (ours)
    budget: float | None = None       # the method's limit in limit_kind's unit (required unless wall)
    widen: bool = True                # widen the fixings when a sub-MIP ends early or stalls (ours, issue 12)
    full_share: float = 0.3           # budget share kept for the full model started from the incumbent (ours;
    #                                   0.3 chosen on tuning series, docs/reopt.md "Decisions")

    def validate(self) -> SolveConfig:
        _positive_seconds(self.time_limit, "time_limit")
        check_budget(self.limit_kind, self.budget, "budget")
        if not (0 <= self.fix_ratio <= 1):
            raise BadInputError(f"must be in [0, 1], got {self.fix_ratio}", param="fix_ratio")
        if self.submip_limit is not None:
            _positive_seconds(self.submip_limit, "submip_limit")
        if self.groups < 1:
            raise BadInputError(f"must be >= 1, got {self.groups}", param="groups")
        if not (self.prior_strength >= 0):
            raise BadInputError(f"must be >= 0, got {self.prior_strength}", param="prior_strength")
        if not (0 < self.decay <= 1):
            raise BadInputError(f"must be in (0, 1], got {self.decay}", param="decay")
        _choices((self.predictor, PREDICTORS, "predictor"))
        if not (0 <= self.full_share <= 1):
            raise BadInputError(f"must be in [0, 1], got {self.full_share}", param="full_share")
        return self

    @classmethod
    def from_params(cls, params: dict, **overrides) -> SolveConfig:
        """A config from a mapping that may hold other keys too (a command's parameters), then `overrides`."""
        names = {f.name for f in fields(cls)}
        merged = {**params, **overrides}
        return cls(**{k: v for k, v in merged.items() if k in names and v is not None})


@dataclass(frozen=True)
class SeriesSpec:
    """One generated series: family, perturbed component, size preset, and how many instances."""

    problem: str = "setcover"
    mode: str = "rhs"
    size: str = "tiny"
    n_instances: int = 10
    seed: int = 0
    strength: float = 0.2
    timeout: float = 10.0             # [TIMEOUT] written to the .test file
    gzip: bool = True

    def validate(self) -> SeriesSpec:
        _choices((self.problem, PROBLEMS, "problem"), (self.mode, MODES, "mode"), (self.size, SIZES, "size"))
        if self.n_instances < 2:
            raise BadInputError(f"must be >= 2 (a history and a new instance), got {self.n_instances}",
                                param="n_instances")
        if not (0 < self.strength < 1):
            raise BadInputError(f"must be in (0, 1), got {self.strength}", param="strength")
        _positive_seconds(self.timeout, "timeout")
        return self


@dataclass(frozen=True)
class BenchConfig:
    """Generated series run side by side: `seeds` series per (problem, mode), instances before `first`
    are history only, `time_limit` seconds per method and instance."""

    problems: tuple = ("setcover",)
    modes: tuple = ("rhs", "bnd", "obj")
    size: str = "small"
    seeds: int = 3
    instances: int = 6
    first: int = 3
    strength: float = SeriesSpec.strength
    time_limit: float = 5.0

    def validate(self) -> BenchConfig:
        if not self.problems or not self.modes:
            raise BadInputError("give at least one problem and one mode", param="problems")
        _choices(*[(p, PROBLEMS, "problems") for p in self.problems], *[(m, MODES, "modes") for m in self.modes],
                 (self.size, SIZES, "size"))
        if self.seeds < 1:
            raise BadInputError(f"must be >= 1, got {self.seeds}", param="seeds")
        if not (1 <= self.first < self.instances):
            raise BadInputError(f"must be in [1, instances - 1] = [1, {self.instances - 1}], got {self.first}",
                                param="first")
        _positive_seconds(self.time_limit, "time_limit")
        return self


DEMO = BenchConfig(problems=("facility",), modes=("rhs",), size="small", seeds=1, instances=4, first=2,
                   time_limit=120.0)
"""What bare `icml reopt` runs: a small capacitated-facility series whose demands change (100 customers x 100
facilities, 10,100 variables), instances 0-1 as history, 2-3 new; every method on the deterministic budget
below (time_limit is then a wall-clock cap). Plain SCIP does not finish within it; VP-OR-style does better
(seed 0: SCIP 5.0 % and 3.3 % above VP-OR's solutions)."""
DEMO_LIMIT_KIND = "lp-iterations"
DEMO_BUDGET = 5000.0
