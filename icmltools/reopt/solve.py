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

from icmltools.core.errors import BadInputError, IcmlError
from icmltools.core.seed import derive

from .milp import (
    c_stdout_silenced,
    check_instance_path,
    milp_from_model,
    read_milp,
    read_model,
    scip_errors,
    scip_reason,
)
from .options import METHODS, SolveConfig  # noqa: F401  (SolveConfig re-exported: its home is options)
from .predict import check_names, marginal_prediction
from .ts import Prediction, ThompsonFixer, ts_stream

log = logging.getLogger(__name__)

CATCH_CTRL_C = True
"""SCIP catches SIGINT during a solve and stops with status 'userinterrupt', which `optimize` raises as
KeyboardInterrupt. `--jobs` workers set this to False (and ignore SIGINT): their parent stops them."""
NO_HISTORY = "no history solutions"


def check_methods(methods) -> list:
    """The method names in order without repeats; `all` stands for every method."""
    names = list(METHODS) if "all" in methods else list(dict.fromkeys(methods))
    for m in names:
        if m not in METHODS:
            raise BadInputError(f"unknown {m!r}; choose from {', '.join(METHODS)}", param="methods")
    return names


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


def scip_seed(seed: int) -> int:
    """SCIP's `randomization/randomseedshift` for a run seeded with `seed` (the same for every method, so
    they face the same solver randomness)."""
    return derive(seed, "reopt", "scip").int(31)


def _setup(model, cfg: SolveConfig):
    model.setParam("randomization/randomseedshift", scip_seed(cfg.seed))
    model.setParam("timing/clocktype", 2)  # wall clock
    model.setParam("parallel/maxnthreads", 1)
    model.setParam("lp/threads", 1)


def _open(model, cfg: SolveConfig):
    """Set `model` up for a method's run and attach an incumbent recorder; returns the recorder."""
    _setup(model, cfg)
    rec = _make_recorder()
    model.includeEventhdlr(rec, "icml_incumbents", "records incumbents on wall-clock time")
    return rec


def optimize(model, verbose: bool = False) -> str:
    """`model.optimize()`, then SCIP's status; Ctrl-C during the solve (SCIP's 'userinterrupt') is raised
    as KeyboardInterrupt, so nothing is reported, written or cached from a solve cut short. Unless
    `verbose`, what SCIP prints on C stdout (its Ctrl-C notice) is dropped."""
    model.setParam("misc/catchctrlc", CATCH_CTRL_C)
    with c_stdout_silenced(not verbose):
        model.optimize()
    st = model.getStatus()
    if st == "userinterrupt":
        raise KeyboardInterrupt
    return st


def _timed_optimize(model, rec, vars_, time_limit: float, verbose: bool = False):
    """Solve under `time_limit` with the recorder's clock restarted: (seconds, values or None, status)."""
    model.setParam("limits/time", time_limit)
    rec.records = []
    rec.t0 = time.perf_counter()
    optimize(model, verbose)
    elapsed = time.perf_counter() - rec.t0
    x = _values(model, vars_)
    st = _final_status(model, x)
    return elapsed, (None if st in _NO_OPTIMUM else x), st


_NO_OPTIMUM = ("infeasible", "unbounded", "infeasible_or_unbounded")


def _values(model, vars_) -> np.ndarray | None:
    """The best solution's values, or None (no solution, or SCIP's 'solution' of an unbounded model, which
    holds infinite values)."""
    if model.getNSols() == 0:
        return None
    sol = model.getBestSol()
    x = np.array([model.getSolVal(sol, v) for v in vars_], dtype=float)
    return x if np.all(np.abs(x) < model.infinity()) else None


def _status(model) -> str:
    s = model.getStatus()
    return {"optimal": "optimal", "infeasible": "infeasible", "unbounded": "unbounded",
            "inforunbd": "infeasible_or_unbounded"}.get(s, s)


def _final_status(model, x) -> str:
    """optimal / feasible / no_solution, or the proof that there is no optimum (infeasible, unbounded,
    infeasible_or_unbounded: no solution is reported then)."""
    st = _status(model)
    if st in _NO_OPTIMUM:
        return st
    if x is not None:
        return "optimal" if st == "optimal" else "feasible"
    return "no_solution"


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


# ------------------------------------------------------------------------------------------ baselines


def _add_partial_start(model, vars_, start: dict) -> int:
    """The previous solution as a partial solution on the integer variables (SCIP's completesol
    heuristic repairs it if the modified instance made it infeasible); returns how many values were set."""
    x = _lookup(start, [v.name for v in vars_])
    psol = model.createPartialSol()
    nset = 0
    for v, val in zip(vars_, x):
        if v.vtype() != "CONTINUOUS" and np.isfinite(val):
            model.setSolVal(psol, v, float(val))
            nset += 1
    model.addSol(psol, free=True)
    return nset


def solve_scip(path, cfg: SolveConfig, start: dict | None = None, reference=None) -> MethodResult:
    """Plain SCIP (start=None) or SCIP warm-started with a previous solution (`warm`)."""
    model = read_model(path, cfg.verbose)
    rec = _open(model, cfg)
    vars_ = model.getVars()
    details = {} if start is None else {"start_values": _add_partial_start(model, vars_, start)}
    elapsed, x, st = _timed_optimize(model, rec, vars_, cfg.time_limit, cfg.verbose)
    res = MethodResult("scip" if start is None else "warm", st, solve_time=elapsed, values=x,
                       names=[v.name for v in vars_], details=details)
    return _finish(res, path, model.getObjectiveSense(), rec.records, cfg, reference)


def solve_reopt(path, prev_path, cfg: SolveConfig, reference=None) -> MethodResult:
    """SCIP's reoptimization: solve the previous instance with reoptimization enabled, then change the
    objective (chgReoptObjective) and solve the new one. Valid only when just the objective changed."""
    from pyscipopt import quicksum

    from .milp import changed_components

    if prev_path is None:
        return MethodResult("reopt", "not_applicable", details={"reason": "no history instance"})
    new = read_milp(path)
    prev_model = read_model(prev_path, cfg.verbose)
    prev = milp_from_model(prev_model, str(prev_path))
    check_names(new.var_names, prev.var_names, f"history instance {prev_path}", f"new instance {path}")
    changed = changed_components(prev, new)
    if not changed <= {"obj"}:
        return MethodResult("reopt", "not_applicable",
                            details={"reason": f"SCIP reoptimization supports objective changes only; changed: "
                                               f"{sorted(changed)}"})
    model = prev_model
    rec = _open(model, cfg)
    model.enableReoptimization()
    model.setParam("limits/time", cfg.reopt_history_limit or cfg.time_limit)
    optimize(model, cfg.verbose)
    vars_ = model.getVars()
    obj_by_name = dict(zip(new.var_names, new.obj))
    model.freeReoptSolve()
    model.chgReoptObjective(quicksum(float(obj_by_name[v.name]) * v for v in vars_ if obj_by_name[v.name] != 0),
                            sense=new.sense)
    elapsed, x, st = _timed_optimize(model, rec, vars_, cfg.time_limit, cfg.verbose)
    res = MethodResult("reopt", st, solve_time=elapsed, values=x, names=[v.name for v in vars_])
    return _finish(res, path, new.sense, rec.records, cfg, reference)


# ------------------------------------------------------------------------------------------ VP-OR


@dataclass
class _Instance:
    """The new instance as VP-OR sees it: variables, kinds (B/I/C) and original bounds (+-inf for none)."""

    vars_: list
    names: list
    kind: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
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
        return cls(vars_, [v.name for v in vars_], kind, lb, ub, inf, model.getObjectiveSense())

    def scip_bound(self, v: float) -> float:
        return float(v) if np.isfinite(v) else (self.inf if v > 0 else -self.inf)


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


class _VporSearch:
    """Paper, Stage 2: Thompson sampling over which variables to fix, each fixing solved as a sub-MIP with
    a short limit; an infeasible (or solution-less) sub-MIP releases the fixings one group at a time."""

    def __init__(self, model, inst: _Instance, ts: ThompsonFixer, cfg: SolveConfig, deadline: float):
        self.model, self.inst, self.ts, self.cfg, self.deadline = model, inst, ts, cfg, deadline
        self.sub_limit = cfg.submip_limit or max(0.5, cfg.time_limit / 5)
        self.ratio = cfg.fix_ratio
        self.best_x, self.best_obj = None, None
        self.optimal = False
        self.proven = None  # 'infeasible' / 'unbounded' / ... when the unrestricted instance says so
        self.n_sub, self.relaxations, self.rewards, self.fixed_counts = 0, 0, 0, []

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def run(self, with_history: bool) -> None:
        """Iterate until the time limit, a proof of optimality, or a proof the instance has no optimum.
        Without history nothing is fixed: the first sub-MIP is the instance itself."""
        while self.remaining() > 0.05 and self.proven is None and not self.optimal:
            sel = self.ts.sample(self.ratio if with_history else 0.0)
            groups = sel.groups(self.cfg.groups)
            found, released, st = self._relax_until_solved(sel, groups)
            if found is not None:
                self._learn(found, released, st, len(groups))

    def _relax_until_solved(self, sel, groups: list):
        """Solve with every group fixed, then release the least confident group after each sub-MIP without
        a solution. Returns ((x, proven optimal) or None, groups released, SCIP status)."""
        released, st = 0, None
        while self.remaining() > 0.05:
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
        return None, released, st

    def _submip(self, sel, keep: np.ndarray):
        """One sub-MIP: fixings `keep` (positions in `sel`) applied, the incumbent as a start when it is
        consistent with them; bounds restored afterwards. Returns (SCIP status, values or None)."""
        model, inst = self.model, self.inst
        remaining = self.remaining()
        for k in keep:
            j = sel.idx[k]
            model.chgVarLb(inst.vars_[j], float(max(sel.new_lb[k], inst.lb[j])))
            model.chgVarUb(inst.vars_[j], float(min(sel.new_ub[k], inst.ub[j])))
        if self.best_x is not None and self.ts.consistent(sel, self.best_x, keep):
            s = model.createSol()
            for v, val in zip(inst.vars_, self.best_x):
                model.setSolVal(s, v, float(val))
            model.addSol(s, free=True)
        # nothing fixed = the instance itself: give it all the remaining time (restarting it every sub-MIP
        # limit would only throw its search away)
        model.setParam("limits/time", max(0.05, remaining if len(keep) == 0 else min(self.sub_limit, remaining)))
        st = optimize(model, self.cfg.verbose)
        self.n_sub += 1
        x = None if st in ("unbounded", "inforunbd", "infeasible") else _values(model, inst.vars_)
        model.freeTransform()
        for k in keep:
            j = sel.idx[k]
            model.chgVarLb(inst.vars_[j], inst.scip_bound(inst.lb[j]))
            model.chgVarUb(inst.vars_[j], inst.scip_bound(inst.ub[j]))
        self.fixed_counts.append(len(keep))
        return st, x

    def _learn(self, found, released: int, st: str, n_groups: int) -> None:
        """Reward 1 only on an improved incumbent: posterior toward it (paper). Ours: an exhausted
        neighbourhood (optimal sub-MIP, no improvement) fixes 0.1 less next time; after relaxations the
        ratio that worked is kept."""
        x, proven_optimal = found
        obj = float(self.model.getObjoffset() + sum(v.getObj() * val for v, val in zip(self.inst.vars_, x)))
        if self._better(obj):
            self.best_x, self.best_obj = x, obj
            self.rewards += 1
            self.ts.update(x)
        elif released == 0 and st == "optimal":
            self.ratio = max(0.0, self.ratio - 0.1)
        if proven_optimal:
            self.optimal = True
        elif released > 0:
            self.ratio = self.ratio * (1 - released / max(n_groups, 1))

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
                "n_fixed": int(fc[0]) if fc else 0, "n_fixed_mean": round(float(np.mean(fc)), 2) if fc else 0.0,
                "final_fix_ratio": round(self.ratio, 4)}


def solve_vpor(path, history: list, cfg: SolveConfig, history_milps: list | None = None,
               reference=None, rng: np.random.Generator | None = None) -> MethodResult:
    """VP-OR-style (paper, Stages 1-2): predict the solution space from the history, then Thompson-sampling
    fixings solved as sub-MIPs with group-wise relaxation, until the time limit. Sampling uses `rng`, by
    default `ts_stream(cfg.seed)`."""
    trained = _train_offline(history, history_milps, cfg)
    model = read_model(path, cfg.verbose)
    rec = _open(model, cfg)
    t0 = rec.t0 = time.perf_counter()
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
    search = _VporSearch(model, inst, ts, cfg, deadline=t0 + cfg.time_limit)
    search.run(with_history=bool(hist))
    details.update(search.details())
    res = MethodResult("vpor", search.status(), solve_time=time.perf_counter() - t0,
                       values=search.best_x if search.proven is None else None, names=inst.names, details=details)
    return _finish(res, path, inst.sense, rec.records, cfg, reference)


def _align(arr, src_names, dst_names):
    pos = {n: i for i, n in enumerate(src_names)}
    return np.array([arr[pos[n]] for n in dst_names])


def _run_scip(path, history, cfg, history_paths, history_milps, reference):
    return solve_scip(path, cfg, None, reference)


def _run_warm(path, history, cfg, history_paths, history_milps, reference):
    last = next((h for h in reversed(history) if h is not None), None)
    if last is not None:
        return solve_scip(path, cfg, last, reference)
    res = solve_scip(path, cfg, None, reference)
    res.method = "warm"
    res.details["note"] = "no history solution: ran plain SCIP"
    return res


def _run_reopt(path, history, cfg, history_paths, history_milps, reference):
    return solve_reopt(path, history_paths[-1] if history_paths else None, cfg, reference)


def _run_vpor(path, history, cfg, history_paths, history_milps, reference):
    return solve_vpor(path, history, cfg, history_milps, reference)


RUNNERS = {"vpor": _run_vpor, "scip": _run_scip, "warm": _run_warm, "reopt": _run_reopt}


def solve_one(method: str, path, history: list, cfg: SolveConfig, history_paths: list | None = None,
               history_milps: list | None = None, reference=None) -> MethodResult:
    """Run `method` on instance `path` with the history solutions (name -> value dicts, oldest first).
    SCIP's own error messages are collected; a failing SCIP call becomes one error naming the file."""
    cfg.validate()
    check_instance_path(path)
    check_methods([method])
    with scip_errors() as errors:
        try:
            return RUNNERS[method](path, history, cfg, history_paths, history_milps, reference)
        except IcmlError:
            raise
        except Exception as e:
            if not (errors or str(e).startswith("SCIP")):
                raise
            raise BadInputError(f"{path}: SCIP failed on this instance ({scip_reason(errors, e)})") from None


def method_job(args) -> MethodResult:
    """`solve_one` on one tuple (method, path, history, cfg, history_paths, with_milps), for process pools;
    the GNN predictor's history MILPs are read in the worker."""
    method, path, history, cfg, history_paths, with_milps = args
    milps = [read_milp(h) for h in history_paths] if (with_milps and method == "vpor") else None
    return solve_one(method, path, history, cfg, history_paths=history_paths, history_milps=milps)
