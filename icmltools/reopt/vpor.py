"""VP-OR-style reoptimization of one new instance (paper, Stages 1-2), on one budget (`budget.Budget`).

Stage 1 predicts a solution space from the history (`predict`); Stage 2 runs Thompson sampling over which
variables to fix (`ts`), each fixing solved as a sub-MIP on a share of the budget. Ours, where the paper is
silent or the issue asked (issue 12):
- every sub-MIP outcome is a signal: an improved incumbent is a success (the posterior moves toward it, as
  the paper), a sub-MIP that ends without improving (solved to optimality, or stopped at its share) is a
  failure for the variables it fixed (their posterior moves back toward 1/2, so other fixings come next);
- widening: a sub-MIP that ends early (optimal) or stalls (no improvement) halves the fix ratio, which
  releases the least confident fixings; below `MIN_RATIO` nothing is fixed, and the full model, started
  from the incumbent, gets the rest of the budget, so VP-OR ends on the search plain SCIP would do;
- an infeasible sub-MIP releases its fixings one group (of 10, least confident first) at a time, as the paper.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from .budget import Budget
from .milp import milp_from_model, read_model
from .options import SolveConfig
from .predict import marginal_prediction
from .solve import NO_HISTORY, MethodResult, finish, open_run, values_of
from .ts import Prediction, ThompsonFixer, ts_stream

log = logging.getLogger(__name__)

MIN_RATIO = 0.1  # below this fix ratio, widening goes to the full model
WIDEN = 0.5      # each widening step multiplies the fix ratio by this
FAIL_STEP = 0.5  # posterior step of a failure (a success moves by 1, as the paper's reward)


@dataclass
class _Instance:
    """The new instance as VP-OR sees it: variables, kinds (B/I/C) and original bounds (+-inf for none)."""

    vars_: list
    names: list
    kind: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    obj: np.ndarray
    offset: float
    inf: float
    sense: str

    @classmethod
    def of(cls, model) -> _Instance:
        vars_ = model.getVars()
        kind = np.array(["B" if v.vtype() == "BINARY" else "I" if v.vtype() == "INTEGER" else "C" for v in vars_])
        inf = model.infinity()
        lb = np.array([v.getLbOriginal() for v in vars_], dtype=float)
        ub = np.array([v.getUbOriginal() for v in vars_], dtype=float)
        lb[lb <= -inf] = -math.inf
        ub[ub >= inf] = math.inf
        obj = np.array([v.getObj() for v in vars_], dtype=float)
        return cls(vars_, [v.name for v in vars_], kind, lb, ub, obj, float(model.getObjoffset()), inf,
                   model.getObjectiveSense())

    def scip_bound(self, v: float) -> float:
        return float(v) if np.isfinite(v) else (self.inf if v > 0 else -self.inf)

    def objective(self, x: np.ndarray) -> float:
        return float(self.obj @ x + self.offset)


def _train_offline(history: list, history_milps: list | None, cfg: SolveConfig):
    """The GNN learns from the history only, so it is trained before the new instance arrives (offline, as
    in the paper); its training time is reported, its prediction is inside the clock. (None, None) unless
    the GNN predictor is asked for with the history MILPs."""
    if cfg.predictor != "gnn" or history_milps is None:
        return None, None
    from .predict import train_gnn

    return train_gnn(history_milps, history, cfg.device, cfg.decay, seed=cfg.seed,
                     deadline=time.perf_counter() + max(5.0, 2 * cfg.time_limit))


def _stage1(model, inst: _Instance, path, history: list, cfg: SolveConfig, trained) -> tuple[Prediction, dict]:
    """Paper, Stage 1: the predicted solution space (P(x=1) for binaries, intervals for integers)."""
    net, gnn_info = trained
    known = [h for h in history if h is not None]
    if gnn_info is None:
        return marginal_prediction(inst.names, inst.kind, inst.lb, inst.ub, known, cfg.decay), {}
    from .predict import predict_gnn

    pred = predict_gnn(net, milp_from_model(model, str(path)), history, cfg.device, cfg.decay)
    aligned = [_align(a, pred.names, inst.names) for a in (pred.p, pred.lo, pred.hi)]
    return Prediction(inst.names, inst.kind, *aligned, inst.lb, inst.ub), {"gnn": gnn_info}


def _align(arr, src_names, dst_names):
    pos = {n: i for i, n in enumerate(src_names)}
    return np.array([arr[pos[n]] for n in dst_names])


class _VporSearch:
    """Paper, Stage 2 (with our widening and failure signals, see the module docstring)."""

    def __init__(self, model, inst: _Instance, ts: ThompsonFixer, cfg: SolveConfig, budget: Budget, clock):
        self.model, self.inst, self.ts, self.cfg, self.budget, self.clock = model, inst, ts, cfg, budget, clock
        # a sub-MIP's share: submip_limit seconds (default a fifth of the limit, at least 0.5 s); with a
        # deterministic budget, a fifth of it (or submip_limit's fraction of the time limit)
        if budget.kind == "wall":
            self.sub_share = cfg.submip_limit or max(0.5, cfg.time_limit / 5)
        else:
            self.sub_share = budget.fraction(min(1.0, cfg.submip_limit / cfg.time_limit) if cfg.submip_limit else 0.2)
        self.ratio = cfg.fix_ratio
        self.best_x, self.best_obj = None, None
        self.optimal = False
        self.proven = None  # 'infeasible' / 'unbounded' / ... when the unrestricted instance says so
        self.n_sub, self.relaxations, self.rewards, self.failures, self.widenings = 0, 0, 0, 0, 0
        self.fixed_counts: list = []
        self.full_model = False  # the last phase: nothing fixed, the rest of the budget

    def run(self, with_history: bool) -> None:
        """Iterate until the budget is spent, a proof of optimality, or a proof the instance has no optimum.
        Without history nothing is fixed: the first sub-MIP is the instance itself, on the whole budget."""
        if not with_history:
            self.ratio = 0.0
        while not self.budget.exhausted() and self.proven is None and not self.optimal:
            if self._phase_left() <= 0:
                self.ratio = 0.0  # the rest is the full model's (cfg.full_share)
            self.full_model = self.ratio <= 0
            sel = self.ts.sample(self.ratio)
            groups = sel.groups(self.cfg.groups)
            found, released, st = self._relax_until_solved(sel, groups)
            if found is not None:
                self._learn(found, released, st, sel, groups)
            if self.full_model:  # the full model had the rest of the budget
                break

    def _relax_until_solved(self, sel, groups: list):
        """Solve with every group fixed, then release the least confident group after each sub-MIP without
        a solution. Returns ((x, proven optimal) or None, groups released, SCIP status)."""
        released, st = 0, None
        while not self.budget.exhausted():
            keep = np.sort(np.concatenate([np.zeros(0, dtype=int)] + groups[released:])).astype(int)
            st, x = self._submip(sel, keep)
            if st == "unbounded":  # a restriction of the instance is unbounded: so is the instance
                self.proven = "unbounded"
                break
            if x is not None:
                return (x, st == "optimal" and len(keep) == 0), released, st
            if len(keep) == 0:  # the unrestricted instance has no solution
                if st in ("infeasible", "unbounded", "inforunbd"):
                    self.proven = {"infeasible": "infeasible", "unbounded": "unbounded"}.get(
                        st, "infeasible_or_unbounded")
                break
            released += 1
            self.relaxations += 1
            self.ts.penalize(sel, groups[released - 1], FAIL_STEP)  # their fixings made it infeasible
        return None, released, st

    def _phase_left(self) -> float:
        """What the sub-MIP phase may still spend: all but the full model's reserved share (cfg.full_share)."""
        b = self.budget
        spent = b.used if b.deterministic else b.wall - b.wall_left()
        return (1.0 - self.cfg.full_share) * b.amount - spent

    def _fix(self, sel, keep: np.ndarray, restore: bool) -> None:
        inst, model = self.inst, self.model
        for k in keep:
            j = sel.idx[k]
            lo = inst.lb[j] if restore else max(sel.new_lb[k], inst.lb[j])
            hi = inst.ub[j] if restore else min(sel.new_ub[k], inst.ub[j])
            model.chgVarLb(inst.vars_[j], inst.scip_bound(lo))
            model.chgVarUb(inst.vars_[j], inst.scip_bound(hi))

    def _submip(self, sel, keep: np.ndarray):
        """One sub-MIP: fixings `keep` (positions in `sel`) applied, the incumbent as a start when it is
        consistent with them; bounds restored afterwards. Nothing fixed = the instance itself: it gets the
        rest of the budget (restarting it every share would only throw its search away). Returns (SCIP
        status, values or None)."""
        model, inst = self.model, self.inst
        self._fix(sel, keep, restore=False)
        if self.best_x is not None and self.ts.consistent(sel, self.best_x, keep):
            s = model.createSol()
            for v, val in zip(inst.vars_, self.best_x):
                model.setSolVal(s, v, float(val))
            model.addSol(s, free=True)
        share = None if len(keep) == 0 else max(min(self.sub_share, self._phase_left()), 0.01 * self.sub_share)
        st = self.budget.solve(model, self.clock, share, self.cfg.verbose)
        self.n_sub += 1
        x = None if st in ("unbounded", "inforunbd", "infeasible") else values_of(model, inst.vars_)
        # SCIP keeps up to limits/maxorigsol solutions across freeTransform, sorted as if minimising: with a
        # full store, a better incumbent of a maximisation is then refused as a start. Keep none; the next
        # sub-MIP gets the incumbent explicitly (when its fixings allow it).
        model.setParam("limits/maxorigsol", 0)
        model.freeTransform()
        model.setParam("limits/maxorigsol", 10)
        self._fix(sel, keep, restore=True)
        self.fixed_counts.append(len(keep))
        return st, x

    def _learn(self, found, released: int, st: str, sel, groups: list) -> None:
        """Paper: reward 1 on an improved incumbent, posterior toward it. Ours: no improvement is a failure
        for the fixings kept (posterior back toward 1/2); a sub-MIP that ends early or stalls widens the
        space (`_widen`); after relaxations the ratio that worked is kept."""
        x, proven_optimal = found
        obj = self.inst.objective(x)
        improved = self._better(obj)
        if improved:
            self.best_x, self.best_obj = x, obj
            self.rewards += 1
            self.ts.update(x)
        elif len(sel.idx):
            self.failures += 1
            kept = np.concatenate([np.zeros(0, dtype=int)] + groups[released:]).astype(int)
            self.ts.penalize(sel, kept, FAIL_STEP)
        if proven_optimal:
            self.optimal = True
        elif released > 0:
            self.ratio = self.ratio * (1 - released / max(len(groups), 1))
        elif self.cfg.widen and (st == "optimal" or not improved):
            self._widen()  # the neighbourhood was searched to the end, or brought nothing

    def _widen(self) -> None:
        """Halve the fix ratio (the least confident fixings go first); below MIN_RATIO: the full model."""
        self.widenings += 1
        self.ratio = self.ratio * WIDEN if self.ratio * WIDEN >= MIN_RATIO else 0.0

    def _better(self, obj: float) -> bool:
        if self.best_obj is None:
            return True
        return obj < self.best_obj - 1e-9 if self.inst.sense == "minimize" else obj > self.best_obj + 1e-9

    def status(self) -> str:
        if self.proven is not None:
            return self.proven
        if self.best_x is None:
            return "no_solution"
        return "optimal" if self.optimal else "feasible"

    def details(self) -> dict:
        fc = self.fixed_counts
        return {"n_submips": self.n_sub, "relaxations": self.relaxations, "rewards": self.rewards,
                "failures": self.failures, "widenings": self.widenings, "full_model": self.full_model,
                "n_fixed": int(fc[0]) if fc else 0, "n_fixed_mean": round(float(np.mean(fc)), 2) if fc else 0.0,
                "fixed_sequence": [int(k) for k in fc], "final_fix_ratio": round(self.ratio, 4)}


def solve_vpor(path, history: list, cfg: SolveConfig, history_milps: list | None = None,
               reference=None, rng: np.random.Generator | None = None) -> MethodResult:
    """VP-OR-style (paper, Stages 1-2): predict the solution space from the history, then Thompson-sampling
    fixings solved as sub-MIPs with group-wise relaxation and widening, until the budget is spent. Sampling
    uses `rng`, by default `ts_stream(cfg.seed)`. Stage 1 runs inside the wall clock (`stage1_s`); a
    deterministic budget counts SCIP's work only."""
    trained = _train_offline(history, history_milps, cfg)
    model = read_model(path, cfg.verbose)
    budget, clock = open_run(model, cfg)
    t0 = budget.t0
    inst = _Instance.of(model)
    hist = [h for h in history if h is not None]
    pred, extra = _stage1(model, inst, path, history, cfg, trained)
    details = {"predictor": cfg.predictor, "history": len(hist), **extra,
               "stage1_s": round(time.perf_counter() - t0, 4)}
    if not hist:
        details["fallback"] = NO_HISTORY
        log.info("%s: %s; VP-OR runs as plain SCIP (nothing to predict from)", path, NO_HISTORY)
    rng = rng if rng is not None else ts_stream(cfg.seed).numpy()
    ts = ThompsonFixer(pred, cfg.fix_ratio, cfg.prior_strength, rng)
    details["eligible"] = ts.n_eligible
    search = _VporSearch(model, inst, ts, cfg, budget, clock)
    search.run(with_history=bool(hist))
    details.update(search.details())
    res = MethodResult("vpor", search.status(), solve_time=time.perf_counter() - t0,
                       values=search.best_x if search.proven is None else None, names=inst.names, details=details)
    return finish(res, path, inst.sense, clock, cfg, reference, budget)
