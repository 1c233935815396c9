"""Series mode (MIPcc23-style `.test` files, the benchmark format of the spec) and the side-by-side bench
with its summary (wins, median / shifted geometric-mean primal gap, primal integral, ratios to VP-OR)."""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from icmltools.core.errors import BadInputError

from .history import HistoryLimit, SolutionSet, pool_map, solve_history
from .milp import SUPPORTED_SUFFIXES, check_instance_path, read_model
from .options import FIRST, METHODS, BenchConfig, SeriesSpec, SolveConfig, check_budget
from .solve import check_methods, method_job, score

log = logging.getLogger(__name__)

GEO_SHIFT = 1e-4  # shifted geometric mean of gaps (a gap of 0 is common)


def parse_test_file(path) -> dict:
    """`[TIMEOUT] t`, optional `[KEY] value` lines (e.g. `[VARYING] rhs`), then instance paths.

    Paths are resolved against the `.test` folder, then its ancestors (MIPcc23 writes them relative to
    its repository root), then the working directory. Instances not found are listed in `missing` (line,
    path) and left out: a series works on the instances present (at least 2)."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"{p}: no such .test file")
    timeout, meta, inst, missing = None, {}, [], []
    for ln, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("["):
            key, _, val = s[1:].partition("]")
            key, val = key.strip().upper(), val.strip()
            if key == "TIMEOUT":
                try:
                    timeout = float(val)
                except ValueError:
                    raise BadInputError(f"{p}: line {ln}: [TIMEOUT] {val!r} is not a number") from None
            else:
                meta[key.lower()] = val
            continue
        cands = [p.parent / s] + [a / s for a in p.resolve().parents] + [Path(s)]
        found = next((c for c in cands if c.is_file()), None)
        if found is None:
            missing.append({"line": ln, "path": s})
        else:
            inst.append(check_instance_path(found))
    if len(inst) < 2:
        gone = f" ({len(missing)} listed instance(s) not found, e.g. {missing[0]['path']!r} on line " \
               f"{missing[0]['line']})" if missing else ""
        raise BadInputError(f"{p}: a series needs at least 2 instances, found {len(inst)}{gone}")
    return {"timeout": timeout, "meta": meta, "instances": inst, "missing": missing}


def better(a, b, sense):
    return a < b if sense == "minimize" else a > b


def best_of(values, sense: str):
    """The best of `values` for the objective sense (None when there are none)."""
    best = None
    for v in values:
        if best is None or better(v, best, sense):
            best = v
    return best


def series_time_limit(time_limit: float | None, test_timeout: float | None, test_path) -> float:
    """`time_limit` if given, else the `.test` file's [TIMEOUT], else SolveConfig's default."""
    if time_limit is not None:
        if not (time_limit > 0) or not math.isfinite(time_limit):
            raise BadInputError(f"must be a positive number of seconds, got {time_limit}", param="time_limit")
        return float(time_limit)
    if test_timeout is None:
        return SolveConfig.time_limit
    if not (test_timeout > 0) or not math.isfinite(test_timeout):
        raise BadInputError(f"{test_path}: [TIMEOUT] {test_timeout:g} is not a positive number of seconds",
                            hint="give a time limit to override it")
    return float(test_timeout)


def _instance_record(i: int, paths: list, sols: list, hist: list, methods, cfg: SolveConfig, sense: str,
                     jobs: int, solutions: SolutionSet | None) -> dict:
    """Every method on instance i with the history 0..i-1; the reference is the best objective among the
    instance's plain-SCIP history solve and all methods. With `solutions`, each method's solution is
    written (`<instance>.<method>.sol`)."""
    jobs_i = [(m, str(paths[i]), sols[:i], replace(cfg), [str(p) for p in paths[:i]], cfg.predictor == "gnn")
              for m in methods]
    results = pool_map(method_job, jobs_i, jobs)
    ref = best_of([r.objective for r in results if r.feasible]
                  + ([hist[i]["objective"]] if hist[i].get("feasible") else []), sense)
    for r in results:
        score(r, ref, cfg)
    rec = {"index": i, "instance": str(paths[i]), "reference": ref,
           "results": [r.to_dict(with_trajectory=False) for r in results]}
    if solutions is not None:
        stem = instance_stem(paths[i])
        for r, d in zip(results, rec["results"]):
            if r.values is not None and r.feasible:
                d["solution_file"] = solutions.add(f"{stem}.{r.method}.sol", r.names, r.values, r.objective)
    return rec


def instance_stem(path) -> str:
    name = Path(path).name
    for suffix in SUPPORTED_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def history_limit_of(cfg: SolveConfig, history_limit: float | None, history_budget: float | None,
                     history_kind: str | None = None) -> HistoryLimit:
    """History solves: plain SCIP on `history_kind` (default: the methods' limit kind); `history_limit` wall
    seconds (default: the methods' time limit) and, for a deterministic kind, `history_budget` (default: the
    methods' budget when the kinds agree)."""
    kind = history_kind or cfg.limit_kind
    if kind == "wall":
        check_budget("wall", history_budget, "history_budget")
        budget = None
    else:
        budget = history_budget or (cfg.budget if kind == cfg.limit_kind else None)
    return HistoryLimit(float(history_limit or cfg.time_limit), kind, budget).validate()


def run_series(test_path, methods=METHODS, cfg: SolveConfig | None = None, *, first: int = FIRST,
               max_instances: int | None = None, history_limit: float | None = None,
               history_budget: float | None = None, history_kind: str | None = None, cache_dir=None, jobs: int = 1,
               on_record=None, progress=None,
               label: str | None = None, notice=None, solutions: SolutionSet | None = None) -> dict:
    """Solve instances `first`.. of a series with every method; instance i uses 0..i-1 as history.

    History solutions (and a reference for the gap) come from plain-SCIP solves of every instance
    (`history_limit_of`; cached by file hash, failed solves too); the reference of an instance is the best
    objective among that solve and all methods. Instances missing from disk are left out (listed in
    `missing`). `on_record(dict)` receives one record per solved instance."""
    cfg = (cfg or SolveConfig()).validate()
    methods = check_methods(methods)
    spec = parse_test_file(test_path)
    paths = spec["instances"][: max_instances] if max_instances else spec["instances"]
    if spec["missing"]:
        log.warning("%s: %d listed instance(s) not found, left out (e.g. %s); %d present", test_path,
                    len(spec["missing"]), spec["missing"][0]["path"], len(spec["instances"]))
    if not (1 <= first < len(paths)):
        raise BadInputError(f"must be in [1, {len(paths) - 1}] for a series of {len(paths)} instances, got {first}",
                            param="first")
    hl = history_limit_of(cfg, history_limit, history_budget, history_kind)
    first_model = read_model(paths[0])
    sense = first_model.getObjectiveSense()
    expect = ([v.name for v in first_model.getVars()], f"series instance {paths[0]}")  # every instance's names
    del first_model
    hist = solve_history(paths, hl, cfg.seed, cache_dir, jobs, progress, notice, expect)
    sols = [h["values"] if h.get("feasible") else None for h in hist]
    records = []
    for i in range(first, len(paths)):
        rec = {"type": "instance", "series": label or str(test_path),
               "reference_source": f"best of a plain-SCIP history solve ({hl.describe()}) and all methods",
               **_instance_record(i, paths, sols, hist, methods, cfg, sense, jobs, solutions)}
        records.append(rec)
        if on_record:
            on_record(rec)
        if progress:
            progress("series", i - first + 1, len(paths) - first)
    return {"series": label or str(test_path), "timeout_in_test_file": spec["timeout"], "meta": spec["meta"],
            "n_instances": len(paths), "missing": spec["missing"], "first": first, "history_limit": hl.describe(),
            "history_cached": sum(bool(h.get("cached")) for h in hist),
            "history_solutions": sum(s is not None for s in sols), "records": records}


def _tally(records: list, methods) -> tuple[dict, int]:
    """Per-method lists and counts over the records, and how many instances no method solved."""
    per = {m: {"gaps": [], "pi": [], "ttf": [], "feasible": 0, "n": 0, "wins": 0, "no_solution": 0, "fallback": 0}
           for m in methods}
    unsolved = 0
    for rec in records:
        ran = [r for r in rec["results"] if r["status"] != "not_applicable"]
        unsolved += not any(r["objective"] is not None for r in ran)
        gaps = [r["primal_gap"] for r in ran if r["primal_gap"] is not None]
        for r in ran:
            d = per[r["method"]]
            fallback = bool(r.get("fallback"))
            d["n"] += 1
            d["feasible"] += bool(r["feasible"])
            d["no_solution"] += r["objective"] is None
            d["fallback"] += fallback
            if r["primal_gap"] is None:
                continue
            d["gaps"].append(r["primal_gap"])
            if r["primal_integral"] is not None:
                d["pi"].append(r["primal_integral"])
            if r["time_to_first"] is not None:
                d["ttf"].append(r["time_to_first"])
            d["wins"] += (not fallback) and r["primal_gap"] <= min(gaps) + 1e-9  # a fallback never wins
    return per, unsolved


def _method_summary(d: dict) -> dict:
    out = {"n": d["n"], "wins": d["wins"], "feasible": d["feasible"], "no_solution": d["no_solution"],
           "fallback": d["fallback"]}
    if not d["gaps"]:
        return out
    g = np.array(d["gaps"])
    out.update(median_gap=float(np.median(g)), mean_gap=float(g.mean()),
               geomean_gap=max(0.0, round(float(np.exp(np.mean(np.log(g + GEO_SHIFT))) - GEO_SHIFT), 12)),
               mean_primal_integral=float(np.mean(d["pi"])) if d["pi"] else None,
               median_time_to_first=float(np.median(d["ttf"])) if d["ttf"] else None)
    return out


def _pair_ratios(records: list, target: str, other: str) -> dict | None:
    """Gap ratios other/target over the instances where both have a gap; an instance where the target ran as
    plain SCIP for want of history (fallback) is never counted as the target's win."""
    pairs = []
    for rec in records:
        by = {r["method"]: r for r in rec["results"] if r["status"] != "not_applicable"}
        a, b = by.get(target), by.get(other)
        if a is None or b is None or a["primal_gap"] is None or b["primal_gap"] is None:
            continue
        pairs.append((a["primal_gap"], b["primal_gap"], bool(a.get("fallback"))))
    if not pairs:
        return None
    g = np.array([(x, y) for x, y, _ in pairs])
    fb = np.array([f for _, _, f in pairs])
    return {"instances": len(pairs),
            f"{target}_better": int(np.sum((g[:, 0] < g[:, 1] - 1e-9) & ~fb)),
            f"{other}_better": int(np.sum(g[:, 1] < g[:, 0] - 1e-9)),
            f"{target}_fallback": int(fb.sum()),
            "median_gap_ratio": _ratio(np.median(g[:, 1]), np.median(g[:, 0])),
            "geomean_gap_ratio": _ratio(np.exp(np.mean(np.log(g[:, 1] + GEO_SHIFT))),
                                        np.exp(np.mean(np.log(g[:, 0] + GEO_SHIFT))))}


def summarize(records: list, methods, target: str = "vpor") -> dict:
    """Per method: n (instances it ran on), wins (best gap, ties count for each; a fallback run, plain SCIP
    for want of history, never wins), median and shifted geometric-mean primal gap, mean primal integral,
    median time to first feasible, feasible / no-solution / fallback counts. `instances` and
    `no_solution_instances` (no method found a solution). Ratios of other methods' gaps to the target's
    ("inf" when the target's is 0 and the other's is not)."""
    per, unsolved = _tally(records, methods)
    ratios = {}
    if target in per and per[target]["n"]:
        for b in methods:
            r = _pair_ratios(records, target, b) if b != target else None
            if r is not None:
                ratios[f"{b}/{target}"] = r
    return {"instances": len(records), "no_solution_instances": unsolved,
            "methods": {m: _method_summary(d) for m, d in per.items()}, "ratios": ratios, "geomean_shift": GEO_SHIFT}


def _ratio(num, den):
    """num / den; "inf" (a string: JSON has no infinity, and null would read as 'not available') when only
    the denominator is 0."""
    num, den = float(num), float(den)
    if den <= 0:
        return "inf" if num > 0 else 1.0
    return num / den


def methods_for_mode(methods, mode: str) -> list:
    """SCIP's reoptimization is only valid on objective-only series; drop it elsewhere."""
    return [m for m in methods if m != "reopt" or mode == "obj"]


def bench_specs(bench: BenchConfig, seed0: int = 0) -> list:
    """One `SeriesSpec` per (problem, mode, seed seed0 + s), s < bench.seeds."""
    return [SeriesSpec(p, m, bench.size, bench.instances, seed0 + s, bench.strength, bench.time_limit, True)
            for p in bench.problems for m in bench.modes for s in range(bench.seeds)]


def run_bench(bench: BenchConfig, methods, cfg: SolveConfig, out_dir, *, history_limit=None, history_budget=None,
              history_kind=None, cache_dir=None, jobs: int = 1, on_record=None, progress=None, notice=None) -> dict:
    """Generate each series of `bench` (seeds from cfg.seed on) into `out_dir`, run it with every method
    under bench.time_limit (wall seconds, or the wall cap of cfg's deterministic budget), and summarise per
    (problem, mode) group and overall."""
    from .generators import generate_series

    bench.validate()
    cfg = replace(cfg, time_limit=bench.time_limit).validate()
    methods = check_methods(methods)
    specs = bench_specs(bench, cfg.seed)
    groups: dict = {}
    all_records = []
    series_out = []
    for k, spec in enumerate(specs):
        gen = generate_series(spec, Path(out_dir) / f"{spec.problem}_{spec.mode}_{spec.size}_s{spec.seed}")
        ms = methods_for_mode(methods, spec.mode)
        label = f"{spec.problem}/{spec.mode}/{spec.size}/seed{spec.seed}"
        res = run_series(gen["test_file"], ms, cfg, first=bench.first, history_limit=history_limit,
                         history_budget=history_budget, history_kind=history_kind, cache_dir=cache_dir, jobs=jobs,
                         on_record=on_record,
                         label=label, notice=notice)
        groups.setdefault(f"{spec.problem}/{spec.mode}", {"methods": ms, "records": []})["records"].extend(
            res["records"])
        all_records.extend(res["records"])
        series_out.append({"series": label, "test_file": gen["test_file"], "n_vars": gen["n_vars"],
                           "n_cons": gen["n_cons"], "history_cached": res["history_cached"],
                           "history_solutions": res["history_solutions"]})
        if progress:
            progress("bench", k + 1, len(specs))
    summary = {key: summarize(g["records"], g["methods"]) for key, g in groups.items()}
    all_methods = [m for m in METHODS if any(m in g["methods"] for g in groups.values())]
    return {"time_limit": bench.time_limit, "limit_kind": cfg.limit_kind, "budget": cfg.budget,
            "series": series_out, "by_series_group": summary,
            "overall": summarize(all_records, all_methods), "n_instances": len(all_records)}
