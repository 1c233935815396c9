"""Series mode (MIPcc23-style `.test` files) and the side-by-side bench with its summary."""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from icmltools.core.errors import BadInputError

from .history import pool_map, solve_history
from .milp import check_instance_path, read_milp
from .solve import METHODS, SolveConfig, score, solve_one

log = logging.getLogger(__name__)

GEO_SHIFT = 1e-4  # shifted geometric mean of gaps (a gap of 0 is common)


def parse_test_file(path) -> dict:
    """`[TIMEOUT] t`, optional `[KEY] value` lines (e.g. `[VARYING] rhs`), then instance paths.

    Paths are resolved against the `.test` folder, then its ancestors (MIPcc23 writes them relative to
    its repository root), then the working directory."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"{p}: no such .test file")
    timeout, meta, inst = None, {}, []
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
            raise BadInputError(f"{p}: line {ln}: instance {s!r} not found (looked next to the .test file, in its "
                                "parent folders and in the working directory)")
        inst.append(check_instance_path(found))
    if len(inst) < 2:
        raise BadInputError(f"{p}: a series needs at least 2 instances, found {len(inst)}")
    return {"timeout": timeout, "meta": meta, "instances": inst}


def _method_job(args):
    method, path, history, cfg, history_paths, with_milps = args
    milps = [read_milp(h) for h in history_paths] if (with_milps and method == "vpor") else None
    return solve_one(method, path, history, cfg, history_paths=history_paths, history_milps=milps)


def better(a, b, sense):
    return a < b if sense == "minimize" else a > b


def run_series(test_path, methods=("vpor", "scip", "warm", "reopt"), cfg: SolveConfig | None = None, *,
               first: int = 1, max_instances: int | None = None, history_limit: float | None = None,
               cache_dir=None, jobs: int = 1, on_record=None, progress=None, label: str | None = None) -> dict:
    """Solve instances `first`.. of a series with every method; instance i uses 0..i-1 as history.

    History solutions (and a reference for the gap) come from plain-SCIP solves of every instance under
    `history_limit` (cached by file hash); the reference of an instance is the best objective among that
    solve and all methods. `on_record(dict)` receives one record per solved instance."""
    cfg = cfg or SolveConfig()
    for m in methods:
        if m not in METHODS:
            raise BadInputError(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    spec = parse_test_file(test_path)
    paths = spec["instances"][: max_instances] if max_instances else spec["instances"]
    if not (1 <= first < len(paths)):
        raise BadInputError(f"--first {first} must be in [1, {len(paths) - 1}] for a series of {len(paths)} instances")
    from .milp import read_model
    from .predict import check_names

    def names(path):
        model = read_model(path)
        out = [v.name for v in model.getVars()]
        del model
        return out

    first_names = names(paths[0])
    for p in paths[1:]:
        check_names(first_names, names(p), f"series instance {paths[0]}", f"series instance {p}")
    hl = history_limit or cfg.time_limit
    hist = solve_history(paths, hl, cfg.seed, cache_dir, jobs, progress)
    sols = [h["values"] if h.get("feasible") else None for h in hist]
    sense0 = read_milp(paths[0]).sense
    records = []
    for i in range(first, len(paths)):
        jobs_i = [(m, str(paths[i]), sols[:i], replace(cfg), [str(p) for p in paths[:i]], cfg.predictor == "gnn")
                  for m in methods]
        results = pool_map(_method_job, jobs_i, jobs)
        cands = [r.objective for r in results if r.feasible] + \
                ([hist[i]["objective"]] if hist[i].get("feasible") else [])
        ref = None
        for c in cands:
            if ref is None or better(c, ref, sense0):
                ref = c
        for r in results:
            score(r, ref, cfg.time_limit)
        rec = {"type": "instance", "series": label or str(test_path), "index": i, "instance": str(paths[i]),
               "reference": ref, "reference_source": "best of a plain-SCIP history solve "
               f"({hl:g} s) and all methods", "results": [r.to_dict(with_trajectory=False) for r in results]}
        records.append(rec)
        if on_record:
            on_record(rec)
        if progress:
            progress("series", i - first + 1, len(paths) - first)
    return {"series": label or str(test_path), "timeout_in_test_file": spec["timeout"], "meta": spec["meta"],
            "n_instances": len(paths), "first": first, "history_limit": hl,
            "history_cached": sum(bool(h.get("cached")) for h in hist), "records": records}


def summarize(records: list, methods, baseline: str = "scip", target: str = "vpor") -> dict:
    """Per method: wins (ties count for each), median and shifted geometric-mean primal gap, mean
    primal integral, median time to first feasible, feasibility counts; ratios target vs baseline."""
    per = {m: {"gaps": [], "pi": [], "ttf": [], "feasible": 0, "n": 0, "wins": 0, "no_solution": 0} for m in methods}
    for rec in records:
        rs = [r for r in rec["results"] if r["status"] != "not_applicable" and r["primal_gap"] is not None]
        if not rs:
            continue
        best = min(r["primal_gap"] for r in rs)
        for r in rs:
            d = per[r["method"]]
            d["n"] += 1
            d["gaps"].append(r["primal_gap"])
            if r["primal_integral"] is not None:
                d["pi"].append(r["primal_integral"])
            if r["time_to_first"] is not None:
                d["ttf"].append(r["time_to_first"])
            d["feasible"] += bool(r["feasible"])
            d["no_solution"] += r["objective"] is None
            d["wins"] += r["primal_gap"] <= best + 1e-9
    out = {}
    for m, d in per.items():
        if d["n"] == 0:
            out[m] = {"n": 0}
            continue
        g = np.array(d["gaps"])
        out[m] = {"n": d["n"], "wins": d["wins"], "feasible": d["feasible"], "no_solution": d["no_solution"],
                  "median_gap": float(np.median(g)), "mean_gap": float(g.mean()),
                  "geomean_gap": max(0.0, round(float(np.exp(np.mean(np.log(g + GEO_SHIFT))) - GEO_SHIFT), 12)),
                  "mean_primal_integral": float(np.mean(d["pi"])) if d["pi"] else None,
                  "median_time_to_first": float(np.median(d["ttf"])) if d["ttf"] else None}
    ratios = {}
    if target in out and out[target].get("n"):
        for b in methods:
            if b == target or not out[b].get("n"):
                continue
            pairs = [(r1["primal_gap"], r2["primal_gap"]) for rec in records
                     for r1 in rec["results"] for r2 in rec["results"]
                     if r1["method"] == target and r2["method"] == b and r1["primal_gap"] is not None
                     and r2["primal_gap"] is not None and r2["status"] != "not_applicable"]
            if not pairs:
                continue
            a = np.array(pairs)
            ratios[f"{b}/{target}"] = {
                "instances": len(pairs),
                f"{target}_better": int(np.sum(a[:, 0] < a[:, 1] - 1e-9)),
                f"{b}_better": int(np.sum(a[:, 1] < a[:, 0] - 1e-9)),
                "median_gap_ratio": _ratio(np.median(a[:, 1]), np.median(a[:, 0])),
                "geomean_gap_ratio": _ratio(np.exp(np.mean(np.log(a[:, 1] + GEO_SHIFT))),
                                            np.exp(np.mean(np.log(a[:, 0] + GEO_SHIFT)))),
            }
    return {"methods": out, "ratios": ratios, "geomean_shift": GEO_SHIFT}


def _ratio(num, den):
    num, den = float(num), float(den)
    if den <= 0:
        return math.inf if num > 0 else 1.0
    return num / den


def methods_for_mode(methods, mode: str) -> list:
    """SCIP's reoptimization is only valid on objective-only series; drop it elsewhere."""
    return [m for m in methods if m != "reopt" or mode == "obj"]


def run_bench(specs: list, methods, cfg: SolveConfig, out_dir, *, first: int = 3, history_limit=None,
              cache_dir=None, jobs: int = 1, on_record=None, progress=None) -> dict:
    """Generate each series (`SeriesSpec`), run it, and summarise per series group and overall."""
    from .generators import generate_series

    groups: dict = {}
    all_records = []
    series_out = []
    for k, spec in enumerate(specs):
        d = Path(out_dir) / f"{spec.problem}_{spec.mode}_{spec.size}_s{spec.seed}"
        gen = generate_series(spec, d)
        ms = methods_for_mode(methods, spec.mode)
        label = f"{spec.problem}/{spec.mode}/{spec.size}/seed{spec.seed}"
        res = run_series(gen["test_file"], ms, cfg, first=first, history_limit=history_limit, cache_dir=cache_dir,
                         jobs=jobs, on_record=on_record, label=label)
        key = f"{spec.problem}/{spec.mode}"
        groups.setdefault(key, {"methods": ms, "records": []})["records"].extend(res["records"])
        all_records.extend(res["records"])
        series_out.append({"series": label, "test_file": gen["test_file"], "n_vars": gen["n_vars"],
                           "n_cons": gen["n_cons"], "history_cached": res["history_cached"]})
        if progress:
            progress("bench", k + 1, len(specs))
    summary = {key: summarize(g["records"], g["methods"]) for key, g in groups.items()}
    all_methods = [m for m in METHODS if any(m in g["methods"] for g in groups.values())]
    return {"series": series_out, "by_series_group": summary, "overall": summarize(all_records, all_methods),
            "n_instances": len(all_records)}
