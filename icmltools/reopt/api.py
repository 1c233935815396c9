"""Library entry points of `icml reopt`: solve / series / generate / bench / demo (one call each)."""
from __future__ import annotations

import logging
from dataclasses import asdict, replace
from pathlib import Path

from icmltools.core.errors import BadInputError

from .generators import generate_series
from .history import (
    SolutionSet,
    check_writable,
    default_cache_dir,
    pool_map,
    read_solution_file,
    solve_history,
    write_solution_file,
)
from .milp import check_instance_path, var_names
from .options import (
    DEFAULT_SOLVE_METHODS,
    DEMO,
    DEMO_BUDGET,
    DEMO_LIMIT_KIND,
    FIRST,
    METHODS,
    BenchConfig,
    SeriesSpec,
    SolveConfig,
)
from .predict import check_names
from .series import (
    best_of,
    history_limit_of,
    parse_test_file,
    run_bench,
    run_series,
    series_time_limit,
    summarize,
)
from .solve import check_methods, method_job, score

log = logging.getLogger(__name__)

__all__ = ["BenchConfig", "SeriesSpec", "SolveConfig", "bench", "demo", "generate", "series", "solve_instance"]


def _history_from_files(history_paths: list, history_sol_paths: list, names: list, new_path) -> tuple[list, list]:
    """History solutions read from files (.sol or JSON), one per history instance, zeros filled in."""
    if len(history_sol_paths) != len(history_paths):
        raise BadInputError(f"{len(history_sol_paths)} solution file(s) for {len(history_paths)} history "
                            "instance(s); give one solution per history instance (or none)", param="history_sol")
    name_set = set(names)
    hist = []
    for sp in history_sol_paths:
        sol = read_solution_file(sp)
        unknown = [n for n in sol if n not in name_set]
        if unknown:
            raise BadInputError(f"{sp}: {len(unknown)} variable(s) not in {new_path}, e.g. {unknown[:3]}",
                                hint="variables are matched by name")
        hist.append({n: float(sol.get(n, 0.0)) for n in names})  # .sol files omit zeros
    return hist, [{"path": str(p), "source": str(s)} for p, s in zip(history_paths, history_sol_paths)]


def _history_from_solves(history_paths: list, limit, cfg: SolveConfig, cache_dir, jobs: int, progress,
                         notice, expect) -> tuple[list, list]:
    """History solutions from plain-SCIP solves of the history instances (cached by file hash; names checked
    against the new instance's before each solve)."""
    solved = solve_history(history_paths, limit, cfg.seed, cache_dir, jobs, progress, notice, expect)
    hist = [h["values"] if h.get("feasible") else None for h in solved]
    return hist, [{"path": h["path"], "status": h["status"], "objective": h["objective"], "cached": h["cached"]}
                  for h in solved]


def _write_best(out: dict, best, write_sol) -> None:
    if best is None:
        out["solution_written"] = None
        log.warning("no method found a solution: nothing written to %s", write_sol)
    else:
        write_solution_file(write_sol, best.names, best.values, best.objective)
        out["solution_written"] = str(write_sol)


def _history_warnings(history_paths, hist: list, methods) -> list:
    """Decision (docs/reopt.md): a solve without history runs, with a warning on stderr and in the JSON;
    VP-OR's record carries `fallback` (it runs as plain SCIP)."""
    if not {"vpor", "warm"} & set(methods):
        return []
    if not history_paths:
        msg = "no history instances: VP-OR and warm-started SCIP have nothing to start from and run as plain SCIP"
    elif not any(h is not None for h in hist):
        msg = "no history solutions (every history solve ended without one): VP-OR and warm-started SCIP run as " \
              "plain SCIP"
    else:
        return []
    log.warning(msg)
    return [msg]


def _log_proofs(path, results) -> None:
    """Say on stderr when SCIP proved that the instance has no optimum (the JSON status says it too)."""
    proofs = [r for r in results if r.status in ("infeasible", "unbounded", "infeasible_or_unbounded")]
    proof = min(proofs, key=lambda r: r.method != "scip", default=None)
    if proof is not None:
        log.warning("%s is %s (proved by %s): no solution to report", path, proof.status.replace("_", " "),
                    proof.method)


def _clock():
    import time

    t = [time.perf_counter()]

    def lap() -> float:
        now = time.perf_counter()
        dt, t[0] = now - t[0], now
        return round(dt, 4)
    return lap


def _history(new_path, history_paths, history_sol_paths, methods, cfg, limit, cache_dir, jobs, progress, notice,
             lap) -> tuple[list, list, dict]:
    """The history solutions, every history instance's variable names checked against the new instance's
    (from the history cache where it has them, else when the instance is read for its solve): (solutions,
    their record, timings)."""
    names = var_names(new_path)
    if history_sol_paths:
        for h in history_paths:
            check_names(names, var_names(h), f"history instance {h}", f"new instance {new_path}")
    timings = {"read_new_s": lap()}
    if history_sol_paths:
        hist, info = _history_from_files(history_paths, list(history_sol_paths), names, new_path)
    elif history_paths:
        hist, info = _history_from_solves(history_paths, limit, cfg, cache_dir, jobs, progress, notice,
                                          (names, f"new instance {new_path}"))
    else:
        hist, info = [], []
    timings["history_s"] = lap()
    return hist, info, timings


def solve_instance(new_path, history_paths=(), history_sol_paths=(), methods=DEFAULT_SOLVE_METHODS,
                   cfg: SolveConfig | None = None, *, history_limit: float | None = None,
                   history_budget: float | None = None, history_kind: str | None = None, cache_dir=None,
                   jobs: int = 1, reference: float | None = None,
                   write_sol=None, progress=None, notice=None) -> dict:
    """Solve one new instance with each method, using the history instances (oldest first): their
    solutions from `history_sol_paths`, else from plain-SCIP solves (`series.history_limit_of`) cached in
    `cache_dir` (default `default_cache_dir()`). `timings` says where the time outside the methods went."""
    lap = _clock()
    cfg = (cfg or SolveConfig()).validate()
    methods = check_methods(methods)
    new_path = check_instance_path(new_path)
    if write_sol is not None:
        check_writable(write_sol)
    history_paths = [check_instance_path(p) for p in history_paths]
    limit = history_limit_of(cfg, history_limit, history_budget, history_kind)
    hist, hist_info, timings = _history(new_path, history_paths, history_sol_paths, methods, cfg, limit,
                                        cache_dir or default_cache_dir(), jobs, progress, notice, lap)
    warnings = _history_warnings(history_paths, hist, methods)
    jobs_list = [(m, str(new_path), hist, replace(cfg), [str(p) for p in history_paths], cfg.predictor == "gnn")
                 for m in methods]
    results = pool_map(method_job, jobs_list, jobs, progress, "methods")
    timings["methods_s"] = lap()
    sense = next((r.sense for r in results if r.status != "not_applicable"), "minimize")
    if reference is not None:
        for r in results:
            score(r, reference, cfg)
    best_obj = best_of([r.objective for r in results if r.feasible], sense)
    best = next((r for r in results if r.feasible and r.objective == best_obj), None)
    _log_proofs(new_path, results)
    out = {"mode": "solve", "instance": str(new_path), "history": hist_info, "warnings": warnings,
           "time_limit": cfg.time_limit, "limit_kind": cfg.limit_kind, "budget": cfg.budget,
           "reference": reference, "results": [r.to_dict() for r in results],
           "best_method": best.method if best else None, "best_objective": best.objective if best else None,
           "timings": timings}
    if write_sol is not None:
        _write_best(out, best, write_sol)
    return out


def series(test_file, methods=METHODS, cfg: SolveConfig | None = None, *, time_limit: float | None = None,
           first: int = FIRST, max_instances: int | None = None, history_limit: float | None = None,
           history_budget: float | None = None, history_kind: str | None = None, cache_dir=None, jobs: int = 1,
           keep_records: bool = True,
           write_sol=None, on_record=None, progress=None, notice=None) -> dict:
    """Run a MIPcc23-style series: the time limit is `time_limit`, else the file's [TIMEOUT], else
    SolveConfig's default; `keep_records=False` leaves the per-instance records out (streamed instead).
    `write_sol`: a folder that receives every method's solution of every instance (all written at the end,
    or none)."""
    spec = parse_test_file(test_file)
    cfg = replace(cfg or SolveConfig(), time_limit=series_time_limit(time_limit, spec["timeout"], test_file))
    methods = check_methods(methods)
    solutions = SolutionSet(write_sol) if write_sol is not None else None
    try:
        res = run_series(test_file, methods, cfg, first=first, max_instances=max_instances,
                         history_limit=history_limit, history_budget=history_budget, history_kind=history_kind,
                         cache_dir=cache_dir or default_cache_dir(), jobs=jobs, on_record=on_record,
                         progress=progress, notice=notice, solutions=solutions)
        written = solutions.commit() if solutions is not None else []
    except BaseException:
        if solutions is not None:
            solutions.discard()
        raise
    summary = summarize(res["records"], methods)
    if not keep_records:
        res.pop("records")
    out = {"mode": "series", "time_limit": cfg.time_limit, "limit_kind": cfg.limit_kind, "budget": cfg.budget,
           **res, "summary": summary}
    if write_sol is not None:
        out["solutions_written"] = len(written)
        out["solution_dir"] = str(write_sol)
    return out


def generate(spec: SeriesSpec, out_dir) -> dict:
    """Write an instance series (`generators.generate_series`)."""
    return {"mode": "generate", **generate_series(spec, out_dir)}


def bench(bench_cfg: BenchConfig, methods=METHODS, cfg: SolveConfig | None = None, out_dir=".", *,
          history_limit: float | None = None, history_budget: float | None = None, history_kind: str | None = None,
          cache_dir=None, jobs: int = 1,
          on_record=None, progress=None, notice=None, mode: str = "bench") -> dict:
    """Generated series, every method side by side (`series.run_bench`); history solves cached under
    `out_dir/cache` unless `cache_dir` is given."""
    res = run_bench(bench_cfg, methods, cfg or SolveConfig(), out_dir, history_limit=history_limit,
                    history_budget=history_budget, history_kind=history_kind,
                    cache_dir=cache_dir or Path(out_dir) / "cache", jobs=jobs,
                    on_record=on_record, progress=progress, notice=notice)
    return {"mode": mode, **res}


def demo_config(time_limit: float = DEMO.time_limit) -> BenchConfig:
    return replace(DEMO, time_limit=time_limit)


def demo_solver(cfg: SolveConfig | None = None, limit_kind: str = DEMO_LIMIT_KIND,
                budget: float | None = DEMO_BUDGET) -> SolveConfig:
    """The demo's solver config: `cfg` (seed, verbosity) on the demo's limit (a wall limit takes no budget)."""
    return replace(cfg or SolveConfig(), limit_kind=limit_kind, budget=None if limit_kind == "wall" else budget)


def demo(time_limit: float = DEMO.time_limit, cfg: SolveConfig | None = None, out_dir=".", **kwargs) -> dict:
    """What bare `icml reopt` runs: the `options.DEMO` bench (a small facility-location series whose demands
    change, every method) on `cfg`'s limit (`demo_solver`)."""
    return bench(demo_config(time_limit), METHODS, cfg or demo_solver(), out_dir, mode="demo", **kwargs)


def resolved(*configs) -> dict:
    """The configs of a run as one dict (for the run folder's config.json)."""
    return {type(c).__name__: asdict(c) for c in configs if c is not None}
