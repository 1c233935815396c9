"""Solving one new instance: VP-OR-style reoptimization and the baselines (plain SCIP, warm-started
SCIP, SCIP's own reoptimization), incumbents recorded on wall-clock time by a BESTSOLFOUND event
handler, and a re-check of the returned solution on a freshly read original model.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from icmltools.core.errors import BadInputError

from .milp import check_instance_path, milp_from_model, read_model
from .predict import check_names, marginal_prediction
from .ts import Prediction, ThompsonFixer

log = logging.getLogger(__name__)

METHODS = ("vpor", "scip", "warm", "reopt")


@dataclass
class SolveConfig:
    time_limit: float = 10.0
    fix_ratio: float = 0.7          # paper: P = 0.7
    submip_limit: float | None = None  # default: time_limit / 5 (at least 0.5 s)
    groups: int = 10                # paper: release one of 10 groups at a time on infeasibility
    prior_strength: float = 10.0    # K in alpha = 1 + K p
    decay: float = 0.8              # recency weight of history solutions (ours)
    predictor: str = "marginal"
    device: str = "cpu"
    seed: int = 0
    threads: int = 1                # torch threads for the GNN predictor
    reopt_history_limit: float | None = None  # limit for the reopt baseline's solve of the previous instance
    verbose: bool = False

    def validate(self):
        if not (self.time_limit > 0) or not math.isfinite(self.time_limit):
            raise BadInputError(f"time limit must be a positive number of seconds, got {self.time_limit}")
        if not (0 <= self.fix_ratio <= 1):
            raise BadInputError(f"--fix-ratio must be in [0, 1], got {self.fix_ratio}")
        if self.submip_limit is not None and not self.submip_limit > 0:
            raise BadInputError(f"--submip-limit must be > 0, got {self.submip_limit}")
        if self.groups < 1:
            raise BadInputError("--groups must be >= 1")
        if self.predictor not in ("marginal", "gnn"):
            raise BadInputError(f"unknown predictor {self.predictor!r}")


# ------------------------------------------------------------------------------------------ metrics


def primal_gap(obj: float | None, ref: float | None) -> float | None:
    """|pb - ref| / max(|pb|, |ref|); 1 without a solution or with opposite signs; None without ref."""
    if ref is None or not math.isfinite(ref):
        return None
    if obj is None:
        return 1.0
    if abs(obj - ref) <= 1e-9:
        return 0.0
    if obj * ref < 0:
        return 1.0
    return abs(obj - ref) / max(abs(obj), abs(ref))


def primal_integral(trajectory: list, ref: float | None, time_limit: float, sense: str) -> float | None:
    """(1/T) * integral over [0, T] of the primal gap of the best incumbent so far (1 before the first)."""
    if ref is None:
        return None
    t_prev, g_prev, area = 0.0, 1.0, 0.0
    best = None
    for t, obj in sorted(trajectory):
        t = min(max(t, 0.0), time_limit)
        if best is None or (obj < best if sense == "minimize" else obj > best):
            area += g_prev * (t - t_prev)
            t_prev = t
            best = obj
            g_prev = primal_gap(best, ref)
    area += g_prev * (time_limit - t_prev)
    return area / time_limit


def monotone(trajectory: list, sense: str) -> list:
    out, best = [], None
    for t, obj in sorted(trajectory):
        if best is None or (obj < best - 1e-12 if sense == "minimize" else obj > best + 1e-12):
            best = obj
            out.append([round(t, 4), obj])
    return out


# ------------------------------------------------------------------------------------------ SCIP helpers


def _make_recorder():
    from pyscipopt import SCIP_EVENTTYPE, Eventhdlr

    class IncumbentRecorder(Eventhdlr):
        """BESTSOLFOUND -> (wall-clock seconds since the method started, objective in original space)."""

        def __init__(self):
            super().__init__()
            self.t0 = time.perf_counter()
            self.records: list = []

        def eventinit(self):
            self.model.catchEvent(SCIP_EVENTTYPE.BESTSOLFOUND, self)

        def eventexit(self):
            self.model.dropEvent(SCIP_EVENTTYPE.BESTSOLFOUND, self)

        def eventexec(self, event):
            sol = self.model.getBestSol()
            self.records.append((time.perf_counter() - self.t0, self.model.getSolObjVal(sol)))

    return IncumbentRecorder()


def _setup(model, cfg: SolveConfig, seed_shift: int = 0):
    model.setParam("randomization/randomseedshift", int((cfg.seed + seed_shift) % 2**31))
    model.setParam("timing/clocktype", 2)  # wall clock
    model.setParam("parallel/maxnthreads", 1)
    model.setParam("lp/threads", 1)


def _values(model, vars_) -> np.ndarray | None:
    if model.getNSols() == 0:
        return None
    sol = model.getBestSol()
    return np.array([model.getSolVal(sol, v) for v in vars_], dtype=float)


def _status(model) -> str:
    s = model.getStatus()
    return {"optimal": "optimal", "infeasible": "infeasible", "unbounded": "unbounded",
            "inforunbd": "infeasible_or_unbounded"}.get(s, s)


def _final_status(model, x) -> str:
    st = _status(model)
    if st in ("unbounded", "infeasible_or_unbounded"):
        return "unbounded" if x is not None else st
    if x is not None:
        return "optimal" if st == "optimal" else "feasible"
    return st if st in ("infeasible",) else "no_solution"


def recheck(path, names: list, x: np.ndarray | None) -> dict:
    """Check `x` on a freshly read original model (bounds, rows, integrality); objective recomputed."""
    if x is None:
        return {"feasible": None, "objective": None}
    m = read_model(path)
    vars_ = {v.name: v for v in m.getVars()}
    sol = m.createSol()
    for n, v in zip(names, x):
        if n not in vars_:
            return {"feasible": False, "objective": None, "reason": f"variable {n!r} not in {path}"}
        m.setSolVal(sol, vars_[n], float(v))
    ok = bool(m.checkSol(sol, printreason=False, completely=True, original=True))
    obj = m.getSolObjVal(sol, original=True)
    m.freeSol(sol)
    return {"feasible": ok, "objective": float(obj)}


def _lookup(sol: dict | None, names: list) -> np.ndarray | None:
    if sol is None:
        return None
    return np.array([sol.get(n, np.nan) for n in names], dtype=float)


@dataclass
class MethodResult:
    method: str
    status: str
    objective: float | None = None
    primal_gap: float | None = None
    primal_integral: float | None = None
    time_to_first: float | None = None
    feasible: bool | None = None
    solve_time: float = 0.0
    incumbents: list = field(default_factory=list)
    details: dict = field(default_factory=dict)
    values: np.ndarray | None = None
    names: list | None = None
    sense: str = "minimize"

    def to_dict(self, with_trajectory: bool = True) -> dict:
        d = {"method": self.method, "status": self.status, "objective": self.objective,
             "primal_gap": self.primal_gap, "primal_integral": self.primal_integral,
             "time_to_first": self.time_to_first, "feasible": self.feasible,
             "solve_time": round(self.solve_time, 4)}
        if with_trajectory:
            d["incumbents"] = self.incumbents
        d.update(self.details)
        return d

    def solution(self) -> dict | None:
        if self.values is None:
            return None
        return {n: float(v) for n, v in zip(self.names, self.values)}


def score(res: MethodResult, reference: float | None, time_limit: float) -> MethodResult:
    """Fill primal gap and primal integral against `reference` (None leaves them None)."""
    res.details["reference"] = reference
    if res.status == "not_applicable":
        return res
    ok = bool(res.feasible)
    res.primal_gap = primal_gap(res.objective if ok else None, reference)
    if reference is None:
        res.primal_integral = None
    elif ok:
        res.primal_integral = primal_integral([tuple(r) for r in res.incumbents], reference, time_limit, res.sense)
    else:
        res.primal_integral = 1.0
    return res


def _finish(res: MethodResult, path, sense, traj, cfg: SolveConfig, reference: float | None) -> MethodResult:
    chk = recheck(path, res.names or [], res.values)
    res.sense = sense
    res.feasible = chk["feasible"]
    if res.values is not None:
        res.objective = chk["objective"]
        if not chk["feasible"] and res.status in ("optimal", "feasible"):
            res.status = "infeasible_solution"
    res.incumbents = monotone(traj, sense)
    if res.values is not None and not res.incumbents:  # a start solution accepted before the clock
        res.incumbents = [[0.0, res.objective]]
    res.time_to_first = res.incumbents[0][0] if res.incumbents else None
    return score(res, reference, cfg.time_limit)


# ------------------------------------------------------------------------------------------ methods


def solve_scip(path, cfg: SolveConfig, start: dict | None = None, reference=None) -> MethodResult:
    """Plain SCIP (start=None) or SCIP warm-started with a previous solution (`warm`)."""
    model = read_model(path, cfg.verbose)
    _setup(model, cfg)
    vars_ = model.getVars()
    names = [v.name for v in vars_]
    rec = _make_recorder()
    model.includeEventhdlr(rec, "icml_incumbents", "records incumbents on wall-clock time")
    method = "scip" if start is None else "warm"
    details = {}
    if start is not None:
        x = _lookup(start, names)
        # the previous solution is given as a partial solution on the integer variables: SCIP's
        # completesol heuristic repairs it if the modified instance made it infeasible
        psol = model.createPartialSol()
        nset = 0
        for v, val in zip(vars_, x):
            if v.vtype() != "CONTINUOUS" and np.isfinite(val):
                model.setSolVal(psol, v, float(val))
                nset += 1
        model.addSol(psol, free=True)
        details["start_values"] = nset
    model.setParam("limits/time", cfg.time_limit)
    rec.t0 = time.perf_counter()
    model.optimize()
    elapsed = time.perf_counter() - rec.t0
    x = _values(model, vars_)
    st = _final_status(model, x)
    res = MethodResult(method, st, solve_time=elapsed, values=x, names=names, details=details)
    return _finish(res, path, model.getObjectiveSense(), rec.records, cfg, reference)


def solve_reopt(path, prev_path, cfg: SolveConfig, reference=None) -> MethodResult:
    """SCIP's reoptimization: solve the previous instance with reoptimization enabled, then change the
    objective (chgReoptObjective) and solve the new one. Valid only when just the objective changed."""
    from .milp import changed_components

    new_model = read_model(path)
    new = milp_from_model(new_model, str(path))
    if prev_path is None:
        return MethodResult("reopt", "not_applicable", details={"reason": "no history instance"})
    prev_model = read_model(prev_path, cfg.verbose)
    prev = milp_from_model(prev_model, str(prev_path))
    check_names(new.var_names, prev.var_names, f"history instance {prev_path}", f"new instance {path}")
    changed = changed_components(prev, new)
    if not changed <= {"obj"}:
        return MethodResult("reopt", "not_applicable",
                            details={"reason": f"SCIP reoptimization supports objective changes only; changed: "
                                               f"{sorted(changed)}"})
    model = prev_model
    _setup(model, cfg)
    rec = _make_recorder()
    model.includeEventhdlr(rec, "icml_incumbents", "records incumbents on wall-clock time")
    model.enableReoptimization()
    model.setParam("limits/time", cfg.reopt_history_limit or cfg.time_limit)
    model.optimize()
    vars_ = model.getVars()
    names = [v.name for v in vars_]
    obj_by_name = dict(zip(new.var_names, new.obj))
    from pyscipopt import quicksum

    model.freeReoptSolve()
    expr = quicksum(float(obj_by_name[v.name]) * v for v in vars_ if obj_by_name[v.name] != 0)
    model.chgReoptObjective(expr, sense=new.sense)
    model.setParam("limits/time", cfg.time_limit)
    rec.records = []
    rec.t0 = time.perf_counter()
    model.optimize()
    elapsed = time.perf_counter() - rec.t0
    x = _values(model, vars_)
    st = _final_status(model, x)
    res = MethodResult("reopt", st, solve_time=elapsed, values=x, names=names)
    return _finish(res, path, new.sense, rec.records, cfg, reference)


def solve_vpor(path, history: list, cfg: SolveConfig, history_milps: list | None = None,
               reference=None, rng: np.random.Generator | None = None) -> MethodResult:
    """VP-OR-style: Stage 1 prediction, then Thompson-sampling fixings solved as sub-MIPs with
    group-wise relaxation on infeasibility, until the time limit (paper, Stage 2)."""
    rng = rng if rng is not None else np.random.default_rng(cfg.seed)
    net, gnn_info = None, None
    if cfg.predictor == "gnn" and history_milps is not None:
        # the GNN learns from the history only, so it is trained before the new instance arrives (offline,
        # as in the paper); its training time is reported, the prediction itself is inside the clock
        import torch  # noqa: F401  (loading the library is not training)

        from .predict import train_gnn

        net, gnn_info = train_gnn(history_milps, history, cfg.device, cfg.decay, seed=cfg.seed,
                                  deadline=time.perf_counter() + max(5.0, 2 * cfg.time_limit), threads=cfg.threads)
    model = read_model(path, cfg.verbose)
    _setup(model, cfg)
    rec = _make_recorder()
    model.includeEventhdlr(rec, "icml_incumbents", "records incumbents on wall-clock time")
    t0 = rec.t0 = time.perf_counter()
    deadline = t0 + cfg.time_limit
    vars_ = model.getVars()
    names = [v.name for v in vars_]
    sense = model.getObjectiveSense()
    kind = np.array(["B" if v.vtype() == "BINARY" else "I" if v.vtype() == "INTEGER" else "C" for v in vars_])
    inf = model.infinity()
    lb0 = np.array([v.getLbOriginal() for v in vars_], dtype=float)
    ub0 = np.array([v.getUbOriginal() for v in vars_], dtype=float)
    lb0[lb0 <= -inf] = -math.inf
    ub0[ub0 >= inf] = math.inf
    hist = [h for h in history if h is not None]
    details = {"predictor": cfg.predictor, "history": len(hist)}
    if cfg.predictor == "gnn" and history_milps is not None:
        from .predict import predict_gnn

        new_milp = milp_from_model(model, str(path))
        pred = predict_gnn(net, new_milp, history, cfg.device, cfg.decay)
        info = gnn_info
        pred = Prediction(names, kind, _align(pred.p, pred.names, names), _align(pred.lo, pred.names, names),
                          _align(pred.hi, pred.names, names), lb0, ub0)
        details["gnn"] = info
    else:
        pred = marginal_prediction(names, kind, lb0, ub0, hist, cfg.decay)
    details["stage1_s"] = round(time.perf_counter() - t0, 4)
    ts = ThompsonFixer(pred, cfg.fix_ratio, cfg.prior_strength, rng)
    details["eligible"] = ts.n_eligible
    sub_limit = cfg.submip_limit or max(0.5, cfg.time_limit / 5)
    best_x, best_obj, status = None, None, None
    n_sub, relaxations, rewards, fixed_counts = 0, 0, 0, []
    ratio = cfg.fix_ratio
    proven = None  # 'infeasible' / 'unbounded' when the unrestricted problem says so

    def better(o):
        return best_obj is None or (o < best_obj - 1e-9 if sense == "minimize" else o > best_obj + 1e-9)

    while time.perf_counter() < deadline - 0.05 and proven is None:
        sel = ts.sample(ratio if hist else 0.0)
        groups = sel.groups(cfg.groups)
        released = 0
        found = None
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0.05:
                break
            keep = np.sort(np.concatenate([np.zeros(0, dtype=int)] + groups[released:])).astype(int)
            # groups hold positions in sel (least confident first); keep the rest fixed
            for k in keep:
                j = sel.idx[k]
                model.chgVarLb(vars_[j], float(max(sel.new_lb[k], lb0[j])))
                model.chgVarUb(vars_[j], float(min(sel.new_ub[k], ub0[j])))
            if best_x is not None and ts.consistent(sel, best_x, keep):
                s = model.createSol()
                for v, val in zip(vars_, best_x):
                    model.setSolVal(s, v, float(val))
                model.addSol(s, free=True)
            # nothing fixed = the instance itself: give it all the remaining time (restarting it every
            # sub-MIP limit would only throw its search away)
            model.setParam("limits/time", max(0.05, remaining if len(keep) == 0 else min(sub_limit, remaining)))
            model.optimize()
            n_sub += 1
            st = model.getStatus()
            x = _values(model, vars_)
            model.freeTransform()
            for k in keep:  # restore the instance's bounds
                j = sel.idx[k]
                model.chgVarLb(vars_[j], float(lb0[j]) if np.isfinite(lb0[j]) else -inf)
                model.chgVarUb(vars_[j], float(ub0[j]) if np.isfinite(ub0[j]) else inf)
            fixed_counts.append(len(keep))
            if x is not None:
                found = (x, st == "optimal" and len(keep) == 0)
                if st in ("unbounded", "inforunbd"):
                    proven = "unbounded"
                break
            if len(keep) == 0:  # the unrestricted instance
                if st in ("infeasible", "unbounded", "inforunbd"):
                    proven = {"infeasible": "infeasible", "unbounded": "unbounded"}.get(st, "infeasible_or_unbounded")
                break
            if st in ("unbounded", "inforunbd") and len(keep) > 0:
                pass  # restricted problem unbounded: release fixings too
            # infeasible (or no solution within the sub-MIP limit): release the next group
            released += 1
            relaxations += 1
        if found is not None:
            x, opt_full = found
            obj = float(model.getObjoffset() + sum(v.getObj() * val for v, val in zip(vars_, x)))
            if better(obj):
                best_x, best_obj = x, obj
                rewards += 1
                ts.update(x)  # reward 1: posterior toward the new incumbent
            elif released == 0 and st == "optimal":
                ratio = max(0.0, ratio - 0.1)  # ours: neighbourhood exhausted, fix fewer next time
            if opt_full:
                status = "optimal"
                break
            if released > 0:
                ratio = ratio * (1 - released / max(len(groups), 1))  # ours: keep the ratio that worked
    elapsed = time.perf_counter() - t0
    if proven is not None:
        status = proven
    elif best_x is not None:
        status = status or "feasible"
    else:
        status = "no_solution"
    details.update(n_submips=n_sub, relaxations=relaxations, rewards=rewards,
                   n_fixed=int(fixed_counts[0]) if fixed_counts else 0,
                   n_fixed_mean=round(float(np.mean(fixed_counts)), 2) if fixed_counts else 0.0,
                   final_fix_ratio=round(ratio, 4))
    res = MethodResult("vpor", status, solve_time=elapsed, values=best_x, names=names, details=details)
    return _finish(res, path, sense, rec.records, cfg, reference)


def _align(arr, src_names, dst_names):
    pos = {n: i for i, n in enumerate(src_names)}
    return np.array([arr[pos[n]] for n in dst_names])


def solve_one(method: str, path, history: list, cfg: SolveConfig, history_paths: list | None = None,
              history_milps: list | None = None, reference=None) -> MethodResult:
    """Run `method` on instance `path` with the history solutions (name -> value dicts, oldest first)."""
    cfg.validate()
    check_instance_path(path)
    if method == "scip":
        return solve_scip(path, cfg, None, reference)
    if method == "warm":
        last = next((h for h in reversed(history) if h is not None), None)
        if last is None:
            res = solve_scip(path, cfg, None, reference)
            res.method = "warm"
            res.details["note"] = "no history solution: ran plain SCIP"
            return res
        return solve_scip(path, cfg, last, reference)
    if method == "reopt":
        prev = history_paths[-1] if history_paths else None
        return solve_reopt(path, prev, cfg, reference)
    if method == "vpor":
        return solve_vpor(path, history, cfg, history_milps, reference)
    raise BadInputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
