"""Solving one new instance: the baselines (plain SCIP, warm-started SCIP, SCIP's own reoptimization) and
the dispatch to VP-OR (`vpor`), under one limit per method (`budget`: wall seconds or a deterministic budget),
incumbents recorded by an event handler, and a re-check of the returned solution on a freshly read model.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from icmltools.core.errors import BadInputError, IcmlError
from icmltools.core.seed import derive

from .budget import Budget, make_clock, optimize  # noqa: F401  (optimize re-exported)
from .milp import check_instance_path, milp_from_model, read_milp, read_model, scip_errors, scip_reason
from .options import METHODS, SolveConfig  # noqa: F401  (SolveConfig re-exported: its home is options)
from .predict import check_names

log = logging.getLogger(__name__)

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


def scip_seed(seed: int) -> int:
    """SCIP's `randomization/randomseedshift` for a run seeded with `seed` (the same for every method, so
    they face the same solver randomness)."""
    return derive(seed, "reopt", "scip").int(31)


def _setup(model, cfg: SolveConfig):
    model.setParam("randomization/randomseedshift", scip_seed(cfg.seed))
    model.setParam("timing/clocktype", 2)  # wall clock
    model.setParam("parallel/maxnthreads", 1)
    model.setParam("lp/threads", 1)


def open_run(model, cfg: SolveConfig, amount: float | None = None):
    """Set `model` up for a method's run: (its budget, a clock recording incumbents and enforcing it)."""
    _setup(model, cfg)
    clock = make_clock()
    model.includeEventhdlr(clock, "icml_clock", "records incumbents; enforces deterministic budgets")
    budget = Budget.of(cfg, amount)
    clock.t0 = budget.t0
    return budget, clock


def _budget_optimize(model, clock, budget: Budget, vars_, verbose: bool = False):
    """Solve on the whole (remaining) budget: (wall seconds, values or None, status)."""
    t = time.perf_counter()
    budget.solve(model, clock, None, verbose)
    elapsed = time.perf_counter() - t
    x = values_of(model, vars_)
    st = _final_status(model, x)
    return elapsed, (None if st in NO_OPTIMUM else x), st


NO_OPTIMUM = ("infeasible", "unbounded", "infeasible_or_unbounded")


def values_of(model, vars_) -> np.ndarray | None:
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
    if st in NO_OPTIMUM:
        return st
    if x is not None:
        return "optimal" if st == "optimal" else "feasible"
    return "no_solution"


def recheck(path, names: list, x: np.ndarray | None) -> dict:
    """Check `x` on a freshly read original model (bounds, rows, integrality); objective recomputed."""
    if x is None:
        return {"feasible": None, "objective": None}
    m = read_model(path, check=False)  # its numbers were checked when the method read it
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
    work_incumbents: list = field(default_factory=list)  # [work, objective]: deterministic budgets only

    def to_dict(self, with_trajectory: bool = True) -> dict:
        d = {"method": self.method, "status": self.status, "objective": self.objective,
             "primal_gap": self.primal_gap, "primal_integral": self.primal_integral,
             "time_to_first": self.time_to_first, "feasible": self.feasible,
             "solve_time": round(self.solve_time, 4)}
        if with_trajectory:
            d["incumbents"] = self.incumbents
            if self.work_incumbents:
                d["work_incumbents"] = self.work_incumbents
        d.update(self.details)
        return d

    def solution(self) -> dict | None:
        if self.values is None:
            return None
        return {n: float(v) for n, v in zip(self.names, self.values)}


def score(res: MethodResult, reference: float | None, cfg: SolveConfig) -> MethodResult:
    """Fill primal gap and primal integral against `reference` (None leaves them None). The integral runs
    over the method's limit: wall seconds, or its deterministic budget (work axis) when it has one."""
    res.details["reference"] = reference
    if res.status == "not_applicable":
        return res
    ok = bool(res.feasible)
    res.primal_gap = primal_gap(res.objective if ok else None, reference)
    if reference is None:
        res.primal_integral = None
    elif ok:
        det = cfg.limit_kind != "wall"
        traj = res.work_incumbents if det else res.incumbents
        res.primal_integral = primal_integral([tuple(r) for r in traj], reference,
                                              cfg.budget if det else cfg.time_limit, res.sense)
    else:
        res.primal_integral = 1.0
    return res


def finish(res: MethodResult, path, sense, clock, cfg: SolveConfig, reference: float | None,
           budget: Budget | None = None) -> MethodResult:
    """Re-check the solution on a freshly read model, the incumbent trajectories, the budget's record and
    the score."""
    chk = recheck(path, res.names or [], res.values)
    res.sense = sense
    res.feasible = chk["feasible"]
    if res.values is not None:
        res.objective = chk["objective"]
        if not chk["feasible"] and res.status in ("optimal", "feasible"):
            res.status = "infeasible_solution"
    else:
        clock.records = []  # a model proved unbounded/infeasible reports no incumbent
    res.incumbents = monotone([(t, o) for t, _, o in clock.records], sense)
    if budget is not None and budget.deterministic:
        res.work_incumbents = monotone([(w, o) for _, w, o in clock.records], sense)
        res.details.update(budget.to_dict())
        if budget.wall_cap_hit:
            log.warning("%s (%s): the wall-clock cap of %g s ended the solve before its %s budget: this result "
                        "is not reproducible (raise the time limit)", path, res.method, budget.wall, budget.kind)
    if res.values is not None and not res.incumbents:  # a start solution accepted before the clock
        res.incumbents = [[0.0, res.objective]]
        res.work_incumbents = [[0.0, res.objective]] if budget is not None and budget.deterministic else []
    res.time_to_first = res.incumbents[0][0] if res.incumbents else None
    return score(res, reference, cfg)


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
    budget, clock = open_run(model, cfg)
    vars_ = model.getVars()
    details = {} if start is None else {"start_values": _add_partial_start(model, vars_, start)}
    elapsed, x, st = _budget_optimize(model, clock, budget, vars_, cfg.verbose)
    res = MethodResult("scip" if start is None else "warm", st, solve_time=elapsed, values=x,
                       names=[v.name for v in vars_], details=details)
    return finish(res, path, model.getObjectiveSense(), clock, cfg, reference, budget)


def solve_reopt(path, prev_path, cfg: SolveConfig, reference=None) -> MethodResult:
    """SCIP's reoptimization: solve the previous instance with reoptimization enabled, then change the
    objective (chgReoptObjective) and solve the new one. Valid only when just the objective changed.
    The previous instance's solve has its own limit (reopt_history_limit, else the method's)."""
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
    first, clock = open_run(model, cfg, cfg.reopt_history_limit if cfg.limit_kind == "wall" else None)
    model.enableReoptimization()
    first.solve(model, clock, None, cfg.verbose)
    vars_ = model.getVars()
    obj_by_name = dict(zip(new.var_names, new.obj))
    model.freeReoptSolve()
    model.chgReoptObjective(quicksum(float(obj_by_name[v.name]) * v for v in vars_ if obj_by_name[v.name] != 0),
                            sense=new.sense)
    budget = Budget.of(cfg)
    clock.t0, clock.records = budget.t0, []
    elapsed, x, st = _budget_optimize(model, clock, budget, vars_, cfg.verbose)
    res = MethodResult("reopt", st, solve_time=elapsed, values=x, names=[v.name for v in vars_])
    return finish(res, path, new.sense, clock, cfg, reference, budget)


def _run_scip(path, history, cfg, history_paths, history_milps, reference):
    return solve_scip(path, cfg, None, reference)


def _run_warm(path, history, cfg, history_paths, history_milps, reference):
    last = next((h for h in reversed(history) if h is not None), None)
    if last is not None:
        return solve_scip(path, cfg, last, reference)
    res = solve_scip(path, cfg, None, reference)
    res.method = "warm"
    res.details["fallback"] = NO_HISTORY  # no start: plain SCIP
    return res


def _run_reopt(path, history, cfg, history_paths, history_milps, reference):
    return solve_reopt(path, history_paths[-1] if history_paths else None, cfg, reference)


def _run_vpor(path, history, cfg, history_paths, history_milps, reference):
    from .vpor import solve_vpor

    return solve_vpor(path, history, cfg, history_milps, reference)


def solve_vpor(*args, **kwargs) -> MethodResult:
    """`vpor.solve_vpor` (VP-OR-style; kept here for callers of the earlier layout)."""
    from .vpor import solve_vpor as run

    return run(*args, **kwargs)


RUNNERS = {"vpor": _run_vpor, "scip": _run_scip, "warm": _run_warm, "reopt": _run_reopt}


@contextlib.contextmanager
def scip_failures(path):
    """SCIP's own error messages are collected; a failing SCIP call becomes one error naming the file."""
    with scip_errors() as errors:
        try:
            yield
        except IcmlError:
            raise
        except Exception as e:
            if not (errors or str(e).startswith("SCIP")):
                raise
            raise BadInputError(f"{path}: SCIP failed on this instance ({scip_reason(errors, e)})") from None


def solve_one(method: str, path, history: list, cfg: SolveConfig, history_paths: list | None = None,
               history_milps: list | None = None, reference=None) -> MethodResult:
    """Run `method` on instance `path` with the history solutions (name -> value dicts, oldest first)."""
    cfg.validate()
    check_instance_path(path)
    check_methods([method])
    with scip_failures(path):
        return RUNNERS[method](path, history, cfg, history_paths, history_milps, reference)


def solve_history_instance(path, cfg: SolveConfig, expect_names: list | None = None, label: str = "") -> MethodResult:
    """Plain SCIP on a history instance: one read, its variable names checked against `expect_names` (the new
    instance's) before any solving, and no re-check (the solution guides VP-OR; it is not returned)."""
    cfg.validate()
    with scip_failures(path):
        model = read_model(path, cfg.verbose)
        vars_ = model.getVars()
        names = [v.name for v in vars_]
        if expect_names is not None:
            check_names(expect_names, names, f"history instance {path}", label)
        budget, clock = open_run(model, cfg)
        elapsed, x, st = _budget_optimize(model, clock, budget, vars_, cfg.verbose)
        res = MethodResult("scip", st, solve_time=elapsed, values=x, names=names, details=budget.to_dict())
        if x is not None:
            res.objective, res.feasible = float(model.getSolObjVal(model.getBestSol())), True
        return res


def method_job(args) -> MethodResult:
    """`solve_one` on one tuple (method, path, history, cfg, history_paths, with_milps), for process pools;
    the GNN predictor's history MILPs are read in the worker."""
    method, path, history, cfg, history_paths, with_milps = args
    milps = [read_milp(h) for h in history_paths] if (with_milps and method == "vpor") else None
    return solve_one(method, path, history, cfg, history_paths=history_paths, history_milps=milps)
