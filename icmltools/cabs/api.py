"""Entry points for `icml cabs-merge`: the embedded demo, and merging real checkpoints on the shared engine.

Each mode resolves and checks every option first (`demo_config`, `prepare_files`), so the run folder is made
only for a run that can start, then runs (`run_demo`, `merge_files`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from icmltools.core.errors import BadInputError

from . import prune as P
from .options import DEMO_METHODS, OWN_METHODS, DemoConfig

# --------------------------------------------------------------------------------------------- demo


def demo_config(methods: Sequence[str] | None = None, nm: str | None = None, tail: str = "pad") -> DemoConfig:
    """The demo's settings with the user's methods / n:m (checked before anything runs)."""
    cfg = DemoConfig()
    if methods:
        unknown = [m for m in methods if m not in DEMO_METHODS]
        if unknown:
            raise BadInputError(f"unknown method(s) {', '.join(unknown)}", param="methods")
        cfg = replace(cfg, methods=tuple(methods))
    if nm is not None and nm != "auto":
        P.parse_nm(nm)
        cfg = replace(cfg, nm=nm)
    P.check_tail(tail)
    return cfg


def engine_plan(name: str, k: int, nms: Sequence[tuple[int, int]], tail: str = "pad", weights=None, seed: int = 0,
                chunk_elems: int | None = None, densities=None, options: dict | None = None, exclude=()):
    """The engine plan of method `name` for k models: n:m per model for CABS/BS, density n/m (or the given
    densities) for the others; task arithmetic takes neither."""
    from icmltools.merge import engine as E

    from . import methods as CM

    kw: dict = dict(weights=weights, seed=seed, chunk_elems=chunk_elems, exclude=tuple(exclude))
    if name in ("cabs", "bs"):
        method = CM.for_plan(name, nms)
        kw.update(model_options=[{"n": n, "m": m} for n, m in nms], options={"tail": tail, **(options or {})})
    else:
        method = CM.for_plan(name) if name in OWN_METHODS else name
        if name != "task_arithmetic":
            kw["densities"] = list(densities) if densities is not None else [n / m for n, m in nms]
        if options:
            kw["options"] = options
    return E.make_plan(method, k, **kw)


def engine_demo_merge(name: str, nm: tuple[int, int], tail: str, seed: int) -> Callable:
    """A demo merge on the engine: f(base trunk, fine-tuned trunks) -> (lam -> theta_0 + lam * merged, stats).
    The merged task vector does not depend on lambda (one lambda for all models), so it is computed once."""

    def merge(base: dict, fts: list):
        from icmltools.merge import engine as E
        from icmltools.taskvec import MemoryReader

        plan = engine_plan(name, len(fts), [nm] * len(fts), tail, seed=seed)
        tau, stats = E.merged_task_vector(MemoryReader(base), [MemoryReader(f) for f in fts], plan)
        s = stats.summary(extended=True)
        info = {"kept_fraction": [m["kept_fraction"] for m in s.get("models", [])],
                "max_pairwise_overlap": s["overlap"]["max_pairwise"] if "overlap" in s else None}
        return (lambda lam: E.apply_to_state_dict(base, tau, lam, sign=1)), info

    return merge


def demo_merges(cfg: DemoConfig, tail: str = "pad", seed: int = 0) -> dict:
    """name -> merge function for every demo method, all at density d = n / m, on the shared engine."""
    nm = P.parse_nm(cfg.nm)
    return {name: engine_demo_merge(name, nm, tail, seed) for name in cfg.methods}


def run_demo(cfg: DemoConfig, seeds: Sequence[int] = (0, 1, 2, 3, 4), tail: str = "pad",
             progress: Callable | None = None) -> dict:
    """Every method on the same tasks, base and fine-tuned models, per seed, and the summary over seeds."""
    from . import demo as D

    per_seed = []
    for s in seeds:
        per_seed.append(D.run_seed(cfg, s, demo_merges(cfg, tail, s), progress))
    base = [r["base"]["avg"] for r in per_seed]
    ft = [r["finetuned"]["avg"] for r in per_seed]
    return {"settings": {"seeds": list(seeds), "nm": cfg.nm, "density": _density(cfg.nm), "tail": tail,
                         "n_tasks": cfg.n_tasks, "lam_grid": [cfg.lam_grid[0], cfg.lam_grid[-1], len(cfg.lam_grid)],
                         "lambda_rule": "one lambda for all models, best mean validation accuracy on the grid"},
            "base": {"avg": sum(base) / len(base), "per_seed": base},
            "finetuned": {"avg": sum(ft) / len(ft), "per_seed": ft},
            "summary": D.summarise(per_seed), "per_seed": per_seed}


def _density(nm: str) -> float:
    n, m = P.parse_nm(nm)
    return n / m


def demo_table(result: dict) -> tuple[list, list]:
    """The short table a person reads: mean test accuracy (and its standard error) per method."""
    cols = ["method", "test acc", "+- se", "vs base", "lambda", "max overlap"]
    rows = [["base", result["base"]["avg"], None, 0.0, None, None],
            ["fine-tuned (own task)", result["finetuned"]["avg"], None, result["finetuned"]["avg"] - result["base"]["avg"],
             None, None]]
    for r in result["summary"]:
        rows.append([r["name"], r["test_avg"], r["se"], r["test_avg"] - result["base"]["avg"],
                     "/".join(f"{x:g}" for x in r["lam"]), max((o or 0) for o in r["max_pairwise_overlap"])
                     if all(o is not None for o in r["max_pairwise_overlap"]) else None])
    return cols, rows
