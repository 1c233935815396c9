"""Stage 2 of VP-OR: Thompson sampling over which variables to fix (no SCIP needed here).

Beta(alpha_j, beta_j) per eligible variable, initialised from the Stage-1 prediction
(alpha = 1 + K p, beta = 1 + K (1 - p)). Each iteration samples mu ~ Beta and fixes the fraction P of
eligible variables with the smallest min(mu, 1 - mu) to round(mu); general integers are tightened to
their predicted interval (their Beta models "the value lies in the interval", score 1 - mu). A reward
(improved incumbent) moves the posterior of every variable toward the new incumbent; no update on
reward 0 (paper). Ours (issue 12): a sub-MIP that ends without improving is a failure for the fixings
it kept, which moves their posterior back toward 1/2 (`penalize`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import Stream, derive


def ts_stream(seed: int) -> Stream:
    """The Thompson-sampling stream of a VP-OR solve (Beta draws and tie-breaking)."""
    return derive(seed, "reopt", "thompson")


@dataclass
class Prediction:
    """Per-variable Stage-1 output, aligned with `names`.

    kind: 'B' binary (p = P(x=1)), 'I' general integer (interval [lo, hi], p = confidence), 'C' never
    fixed. lb/ub: the new instance's bounds, which every fixing respects.
    """

    names: list
    kind: np.ndarray
    p: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    lb: np.ndarray
    ub: np.ndarray


@dataclass
class Selection:
    """Variables to fix this iteration: indices (most confident first), new bounds, and scores."""

    idx: np.ndarray
    new_lb: np.ndarray
    new_ub: np.ndarray
    score: np.ndarray

    def groups(self, k: int) -> list:
        """Split into k groups, least confident first (the order in which they are released)."""
        order = np.arange(len(self.idx))[::-1]
        return [g for g in np.array_split(order, k) if len(g)] if len(order) else []


class ThompsonFixer:
    """Paper, Stage 2: a Beta posterior per eligible variable; `sample` picks the fixings of one iteration,
    `update` is the reward-1 posterior step. `rng` defaults to `ts_stream(seed)`."""

    def __init__(self, pred: Prediction, fix_ratio: float = 0.7, prior_strength: float = 10.0,
                 rng: np.random.Generator | None = None, step: float = 1.0, seed: int = 0):
        if not (0.0 <= fix_ratio <= 1.0):
            raise BadInputError(f"must be in [0, 1], got {fix_ratio}", param="fix_ratio")
        if prior_strength < 0:
            raise BadInputError(f"must be >= 0, got {prior_strength}", param="prior_strength")
        self.pred = pred
        self.fix_ratio = fix_ratio
        self.step = step
        self.rng = rng if rng is not None else ts_stream(seed).numpy()
        p = np.clip(np.nan_to_num(pred.p.astype(float), nan=0.5), 0.0, 1.0)
        self.alpha = 1.0 + prior_strength * p
        self.beta = 1.0 + prior_strength * (1.0 - p)
        kind = pred.kind
        lb, ub = pred.lb, pred.ub
        binary_ok = (kind == "B") & (lb < ub) & (lb <= 0) & (ub >= 1)
        lo = np.maximum(pred.lo, lb)
        hi = np.minimum(pred.hi, ub)
        int_ok = (kind == "I") & np.isfinite(lo) & np.isfinite(hi) & (lo <= hi) & ((lo > lb) | (hi < ub))
        self.eligible = np.where(binary_ok | int_ok)[0]
        self._lo, self._hi = lo, hi

    @property
    def n_eligible(self) -> int:
        return len(self.eligible)

    def n_select(self, ratio: float | None = None) -> int:
        r = self.fix_ratio if ratio is None else ratio
        return int(round(r * self.n_eligible))

    def sample(self, ratio: float | None = None) -> Selection:
        """mu ~ Beta(alpha, beta); fix the `ratio` share of eligible variables with the smallest
        min(mu, 1 - mu) (binaries, to round(mu)) or 1 - mu (integers, to their predicted interval)."""
        e = self.eligible
        if len(e) == 0:
            z = np.zeros(0)
            return Selection(np.zeros(0, dtype=int), z, z, z)
        mu = self.rng.beta(self.alpha[e], self.beta[e])
        is_bin = self.pred.kind[e] == "B"
        score = np.where(is_bin, np.minimum(mu, 1.0 - mu), 1.0 - mu)
        tie = self.rng.permutation(len(e))  # random tie-breaking, reproducible with the seed
        order = np.lexsort((tie, score))
        take = order[: self.n_select(ratio)]
        idx = e[take]
        val = (mu[take] >= 0.5).astype(float)
        b = is_bin[take]
        new_lb = np.where(b, val, self._lo[idx])
        new_ub = np.where(b, val, self._hi[idx])
        return Selection(idx=idx, new_lb=new_lb, new_ub=new_ub, score=score[take])

    def consistent(self, sel: Selection, x: np.ndarray, active: np.ndarray | None = None, tol: float = 1e-6) -> bool:
        """Does solution `x` (aligned with names) satisfy the fixings of `sel` (restricted to `active`)?"""
        k = np.arange(len(sel.idx)) if active is None else active
        v = x[sel.idx[k]]
        return bool(np.all(v >= sel.new_lb[k] - tol) and np.all(v <= sel.new_ub[k] + tol))

    def update(self, x: np.ndarray) -> None:
        """Reward 1 (an improved incumbent): alpha += step * hit, beta += step * (1 - hit) for every eligible
        variable, hit = x_j (binaries) or [x_j in the predicted interval] (integers); no update on reward 0."""
        e = self.eligible
        v = x[e]
        is_bin = self.pred.kind[e] == "B"
        inside = (v >= self._lo[e] - 1e-6) & (v <= self._hi[e] + 1e-6)
        hit = np.where(is_bin, np.clip(np.round(v), 0, 1), inside.astype(float))
        self.alpha[e] += self.step * hit
        self.beta[e] += self.step * (1.0 - hit)

    def penalize(self, sel: Selection, active: np.ndarray, step: float = 0.5) -> None:
        """A failure (ours): the fixings `active` (positions in `sel`) led to no improvement, so their variables
        become less confident: a binary fixed to v gains `step` on the count of 1 - v, an integer on the
        count of 'outside its interval'. Other variables are untouched."""
        active = np.asarray(active, dtype=int)
        if len(active) == 0 or step <= 0:
            return
        idx = sel.idx[active]
        to_one = (self.pred.kind[idx] == "B") & (sel.new_lb[active] < 0.5)  # fixed to 0: evidence for 1
        np.add.at(self.alpha, idx[to_one], step)
        np.add.at(self.beta, idx[~to_one], step)
