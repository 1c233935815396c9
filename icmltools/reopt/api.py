"""Library entry points used by `icml reopt` (solve / series / generate / bench / demo)."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from icmltools.core.errors import BadInputError

from .generators import MODES, PROBLEMS, SIZES, SeriesSpec, generate_series  # noqa: F401
from .history import pool_map, read_solution_file, solve_history, write_solution_file
from .milp import check_instance_path, read_milp, read_model
from .predict import check_names
from .series import better, run_bench, run_series, summarize  # noqa: F401
from .solve import METHODS, SolveConfig, score, solve_one


def _var_names(path) -> list:
    model = read_model(path)  # keep the model alive while its variables are read
    names = [v.name for v in model.getVars()]
    del model
    return names


def _solve_job(args):
    method, path, history, cfg, hpaths, with_milps = args
    milps = [read_milp(h) for h in hpaths] if (with_milps and method == "vpor") else None
    return solve_one(method, path, history, cfg, history_paths=hpaths, history_milps=milps)


def solve_instance(new_path, history_paths=(), history_sol_paths=(), methods=("vpor",), cfg: SolveConfig | None = None,
                   *, history_limit: float | None = None, cache_dir=None, jobs: int = 1, reference: float | None = None,
                   write_sol=None, progress=None) -> dict:
    """Solve one new instance with each method, using the history instances (oldest first)."""
    cfg = cfg or SolveConfig()
    cfg.validate()
    new_path = check_instance_path(new_path)
    history_paths = [check_instance_path(p) for p in history_paths]
    if history_sol_paths and len(history_sol_paths) != len(history_paths):
        raise BadInputError(f"--history-sol given {len(history_sol_paths)} times but --history "
                            f"{len(history_paths)} times; give one solution per history instance (or none)")
    for m in methods:
        if m not in METHODS:
            raise BadInputError(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    names = _var_names(new_path)
    for h in history_paths:
        check_names(names, _var_names(h), f"history instance {h}", f"new instance {new_path}")
    name_set = set(names)
    if history_sol_paths:
        hist = []
        for sp in history_sol_paths:
            sol = read_solution_file(sp)
            unknown = [n for n in sol if n not in name_set]
            if unknown:
                raise BadInputError(f"{sp}: {len(unknown)} variable(s) not in {new_path}, e.g. {unknown[:3]}",
                                    hint="variables are matched by name")
            hist.append({n: float(sol.get(n, 0.0)) for n in names})  # .sol files omit zeros
        hist_info = [{"path": str(p), "source": str(s)} for p, s in zip(history_paths, history_sol_paths)]
    elif history_paths:
        solved = solve_history(history_paths, history_limit or cfg.time_limit, cfg.seed, cache_dir, jobs, progress)
        hist = [h["values"] if h.get("feasible") else None for h in solved]
        hist_info = [{"path": h["path"], "status": h["status"], "objective": h["objective"], "cached": h["cached"]}
                     for h in solved]
    else:
        hist, hist_info = [], []
    with_milps = cfg.predictor == "gnn"
    jobs_list = [(m, str(new_path), hist, replace(cfg), [str(p) for p in history_paths], with_milps) for m in methods]
    results = pool_map(_solve_job, jobs_list, jobs, progress, "methods")
    sense = next((r.sense for r in results if r.status != "not_applicable"), "minimize")
    if reference is not None:
        for r in results:
            score(r, reference, cfg.time_limit)
    best = None
    for r in results:
        if r.feasible and (best is None or better(r.objective, best.objective, sense)):
            best = r
    out = {"mode": "solve", "instance": str(new_path), "history": hist_info, "time_limit": cfg.time_limit,
           "reference": reference, "results": [r.to_dict() for r in results],
           "best_method": best.method if best else None, "best_objective": best.objective if best else None}
    if write_sol is not None:
        if best is None:
            out["solution_written"] = None
        else:
            write_solution_file(write_sol, best.names, best.values, best.objective)
            out["solution_written"] = str(write_sol)
    return out


def bench_specs(problems, modes, size: str, seeds: int, instances: int, strength: float, timeout: float,
                seed0: int = 0) -> list:
    specs = []
    for p in problems:
        if p not in PROBLEMS:
            raise BadInputError(f"unknown problem {p!r}; choose from {', '.join(PROBLEMS)}")
        for m in modes:
            if m not in MODES:
                raise BadInputError(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
            for s in range(seeds):
                specs.append(SeriesSpec(p, m, size, instances, seed0 + s, strength, timeout, True))
    return specs


def check_time_limit(t: float, what: str = "--time-limit") -> float:
    if t is None or not (t > 0) or not math.isfinite(t):
        raise BadInputError(f"{what} must be a positive number of seconds, got {t}")
    return float(t)


def solution_path(p) -> Path:
    return Path(p)
