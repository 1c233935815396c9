"""Entry points for `icml cabs-merge`: the embedded demo, and merging real checkpoints on the shared engine.

Each mode resolves and checks every option first (`demo_config`, `prepare_files`), so the run folder is made
only for a run that can start, then runs (`run_demo`, `merge_files`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
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
    if nm is not None:
        n, m = P.resolve_nms(cfg.n_tasks, nm)[0]   # auto: m 32, n = 16 // 4 tasks = 4
        cfg = replace(cfg, nm=f"{n}:{m}")
    P.check_tail(tail)
    return cfg


def engine_plan(name: str, k: int, nms: Sequence[tuple[int, int]], tail: str = "pad", weights=None, seed: int = 0,
                chunk_elems: int | None = None, densities=None, options: dict | None = None, include=(), exclude=()):
    """The engine plan of method `name` for k models: n:m per model for CABS/BS, density n/m (or the given
    densities) for the others; task arithmetic takes neither."""
    from icmltools.merge import engine as E

    from . import methods as CM

    kw: dict = dict(weights=weights, seed=seed, chunk_elems=chunk_elems, include=tuple(include), exclude=tuple(exclude))
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
                "max_pairwise_overlap": s["overlap"]["max_pairwise"] if "overlap" in s else None,
                "overlap": s.get("overlap"), "tensor_density": [m["tensor_density"] for m in s.get("models", [])]}
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


# --------------------------------------------------------------------------------------------- files


@dataclass
class FileJob:
    """A checked file merge: readers, the plan, per-model n:m and lambdas, output format, warnings."""

    base: object
    models: list
    plan: object
    method: str
    nms: list
    lams: list
    tail: str
    fmt: str
    warnings: list = field(default_factory=list)
    source: dict = field(default_factory=dict)
    lam_grid: list | None = None
    eval_cmd: str | None = None
    eval_timeout: float | None = None
    out_dtype: str = "same"
    scale: float = 1.0   # the global scale of the merged vector (a mergekit config's lambda)

    def config(self) -> dict:
        return {"method": self.method, "base": str(self.base.path), "models": [str(m.path) for m in self.models],
                "nm": [f"{n}:{m}" for n, m in self.nms], "lam": self.lams, "tail": self.tail, "format": self.fmt,
                "dtype": self.out_dtype, "scale": self.scale,
                "plan": self.plan.describe(), "lam_grid": self.lam_grid, "eval_cmd": self.eval_cmd, **self.source}


def _lams(lam: Sequence[float], k: int) -> list[float]:
    lams = [float(x) for x in lam]
    if len(lams) == 1:
        return lams * k
    if len(lams) != k:
        raise BadInputError(f"{len(lams)} lambdas for {k} models (give one, or one per model in the model order)",
                            param="lam")
    return lams


def prepare_files(base: str, models: Sequence[str], *, method: str = "cabs", nm: str = "auto",
                  nm_for: Sequence[str] = (), lam: Sequence[float] = (1.0,), tail: str = "pad",
                  out_format: str = "same", chunk_elems: int | None = None, include: Sequence[str] = (),
                  exclude: Sequence[str] = (), out_dtype: str = "same",
                  seed: int = 0, densities: Sequence[float] | None = None, options: dict | None = None,
                  source: dict | None = None, lam_grid: str | None = None, eval_cmd: str | None = None,
                  eval_timeout: float | None = None, tensor_settings=None) -> FileJob:
    """Check every option and open every checkpoint lazily (keys, shapes, dtypes) before anything is written.
    The order of `models` is the pruning order; `out_dtype` names the floating tensors' output dtype ("same":
    each keeps its own; the merge computes in float32 either way); `tensor_settings` (``.bind(names)``, a config's
    per-tensor weights / densities) gives each of the base's tensors its own, checked with the rest. NaN/inf
    task-vector values are refused as the merge streams."""
    from icmltools.merge import engine as E
    from icmltools.merge.options import CHUNK_ELEMS
    from icmltools.taskvec import open_checkpoint, resolve_output_format

    from .options import METHODS

    if method not in METHODS:
        raise BadInputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}", param="method")
    if not models:
        raise BadInputError("no model given", param="models")
    E.check_model_paths(base, models, "models")
    k = len(models)
    nms = P.resolve_nms(k, nm, nm_for)
    P.check_tail(tail)
    lams = _lams(lam, k)
    grid = _grid(lam_grid, eval_cmd, eval_timeout)
    E.output_dtype(out_dtype)  # an unknown name fails before anything is opened
    warnings = []
    if method in ("cabs", "ca_magnitude") and (w := P.overfull_warning(nms)):
        warnings.append(w)
    plan = engine_plan(method, k, nms, tail, weights=lams, seed=seed, include=include, exclude=exclude, densities=densities,
                       chunk_elems=CHUNK_ELEMS if chunk_elems is None else chunk_elems, options=options)
    b = open_checkpoint(base)
    ms = [open_checkpoint(m) for m in models]
    if tensor_settings is not None:
        plan = replace(plan, tensor_params=tensor_settings.bind(list(b.specs)))
    warnings += E.open_and_check(b, ms, plan)
    return FileJob(b, ms, plan, method, nms, lams, tail, resolve_output_format(b, out_format), warnings,
                   dict(source or {}), grid, eval_cmd, eval_timeout, out_dtype or "same")


def _grid(lam_grid: str | None, eval_cmd: str | None, eval_timeout: float | None) -> list | None:
    """The global-scale grid of a search with the user's evaluation command (checked before any work)."""
    from icmltools.merge import search as MS

    if lam_grid is None and eval_cmd is None:
        return None
    if lam_grid is None or eval_cmd is None:
        raise BadInputError("a lambda grid needs an evaluation command and vice versa",
                            param="eval_cmd" if eval_cmd is None else "lam_grid")
    MS.CommandEvaluator(eval_cmd, timeout=eval_timeout, fields=("score",))  # a missing program fails now
    return MS.parse_grid(lam_grid)


def _peak_rss_gb() -> float:
    import resource
    import sys

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1e9 if sys.platform == "darwin" else r * 1024 / 1e9


def _tensor_ranges(job: FileJob) -> list[dict]:
    """Per model, [min, max] of the weights (and densities) its merged tensors got from per-tensor settings."""
    from icmltools.merge.engine import is_float_dtype

    plans = [job.plan.for_tensor(n) for n, s in job.base.specs.items()
             if is_float_dtype(s.dtype) and job.plan.selected(n)]
    out = []
    for i in range(len(job.models)):
        r = {"lam_range": [min(p.weights[i] for p in plans), max(p.weights[i] for p in plans)]}
        if job.plan.densities[i] is not None:
            r["density_range"] = [min(p.densities[i] for p in plans), max(p.densities[i] for p in plans)]
        out.append(r)
    return out


def _model_rows(job: FileJob, summary: dict, short: list | None) -> list[dict]:
    rows = []
    per = summary.get("models") or [{} for _ in job.models]
    ranges = _tensor_ranges(job) if job.plan.tensor_params is not None else None
    for i, (m, (n, mm), lam) in enumerate(zip(job.models, job.nms, job.lams)):
        r = {"path": str(m.path), "lam": lam}
        if job.method in ("cabs", "bs"):
            r.update(n=n, m=mm)
        if ranges is not None:
            r.update(ranges[i])
        elif job.method not in ("cabs", "bs") and job.plan.densities[i] is not None:
            r["density"] = job.plan.densities[i]
        r.update({k: per[i].get(k) for k in ("kept", "numel", "kept_fraction")})
        if short is not None:
            r["short_blocks"] = short[i]
        rows.append(r)
    return rows


def merge_files(job: FileJob, out_dir, *, device: str = "cpu", progress: Callable | None = None,
                allow_non_finite: bool = False) -> dict:
    """Stream theta = theta_0 + sum_k lambda_k * prune_k(tau_k) into `out_dir` (the base's format unless asked),
    tensor by tensor on the engine; the output appears only when complete."""
    import time
    from pathlib import Path

    from icmltools.merge import engine as E
    from icmltools.taskvec import default_output_name

    out_path = Path(out_dir) / default_output_name(job.base, job.fmt)
    record = {"tool": "icml cabs-merge", "method": job.method, "order": [str(m.path) for m in job.models],
              "nm": [f"{n}:{m}" for n, m in job.nms], "lam": job.lams, "tail": job.tail, "dtype": job.out_dtype,
              "operation": "theta_0 + scale * sum_k lam_k * prune_k(theta_k - theta_0)", "scale": job.scale,
              "base": str(job.base.path)}
    if job.plan.tensor_params is not None:
        record["tensor_params"] = job.plan.describe()["tensor_params"]
    t0 = time.perf_counter()
    search = None
    if job.lam_grid is None:
        stats = E.merge_to_checkpoint(job.base, job.models, job.plan, job.scale, out_path, fmt=job.fmt, device=device,
                                      record=record, sign=1, progress=progress, allow_non_finite=allow_non_finite,
                                      out_dtype=job.out_dtype)
    else:
        stats, search = _search(job, out_dir, out_path, record, device, progress, allow_non_finite)
    seconds = time.perf_counter() - t0
    s = stats.summary(extended=True)
    short = getattr(job.plan.method, "short", None)
    tensor_density = [m.get("tensor_density") for m in s.get("models", [])]
    return {"mode": "merge", "method": job.method, "order": [str(m.path) for m in job.models],
            "nm": [f"{n}:{m}" for n, m in job.nms] if job.method in ("cabs", "bs") else None, "tail": job.tail,
            "base": {"path": str(job.base.path), "format": job.base.format, "n_tensors": len(job.base.specs),
                     "bytes": job.base.nbytes},
            "models": _model_rows(job, s, short), "overlap": s.get("overlap"), "tensor_density": tensor_density,
            "kept_fraction": s["kept_fraction"], "non_finite_inputs": s["non_finite_inputs"], "skipped_non_float": s["skipped_non_float"],
            "excluded": s.get("excluded", []), "warnings": job.warnings, "output": str(out_path),
            "output_format": job.fmt, "output_dtype": job.out_dtype, "scale": job.scale, "bytes_read": s["bytes_read"],
            "seconds": seconds,
            "read_gb_per_s": s["bytes_read"] / 1e9 / seconds if seconds > 0 else None, "kernels": s["kernels"],
            "peak_rss_gb": _peak_rss_gb(),
            "lambda_search": search,
            **({"config": job.source} if job.source else {})}


def _search(job: FileJob, out_dir, out_path, record: dict, device: str, progress, allow_non_finite: bool):
    """The merged vector once (in memory), then theta_0 + s * merged for each s of the grid, scored by the user's
    command ({"score": x}, higher is better); the best s is written. Per-model lambdas stay relative weights."""
    from icmltools.merge import engine as E
    from icmltools.merge import search as MS

    evaluator = MS.CommandEvaluator(job.eval_cmd, timeout=job.eval_timeout, fields=("score",))
    tau, stats = E.merged_task_vector(job.base, job.models, job.plan, device=device, progress=progress,
                                      allow_non_finite=allow_non_finite)
    rows, sel = MS.search_files(job.base, tau, job.lam_grid, evaluator, out_dir, fmt=job.fmt, sign=1, skip_zero=True,
                                rule=lambda r: MS.select_max(r, "score"), progress=progress,
                                record=lambda s_: {**record, "scale": s_}, tainted=stats.non_finite_tensors,
                                out_name=out_path.name, out_dtype=job.out_dtype)
    E.apply_task_vector(job.base, tau, sel.lam, out_path, fmt=job.fmt, record={**record, "scale": sel.lam},
                        tainted=stats.non_finite_tensors, param="lam_grid", sign=1, skip_zero=True,
                        out_dtype=job.out_dtype)
    return stats, {"grid": list(job.lam_grid), "rows": rows, "selected_scale": sel.lam, "eval_cmd": job.eval_cmd,
                   "rule": "largest score; theta = theta_0 + scale * sum_k lam_k * pruned_k"}


def prepare_config(path, *, out_format: str = "same", chunk_elems: int | None = None, seed: int = 0,
                   tail: str = "pad", lam_grid: str | None = None, eval_cmd: str | None = None,
                   eval_timeout: float | None = None, include: Sequence[str] = (),
                   exclude: Sequence[str] = ()) -> FileJob:
    """A mergekit YAML config as a file merge (the methods both tools have)."""
    from . import mkconfig

    cfg = mkconfig.read_config(path)
    options = {k: v for k, v in cfg.params.items() if k != "lambda"}   # the rest are the method's options
    if cfg.params.get("lambda", 1.0) != 1.0 and lam_grid is not None:
        raise BadInputError(f"{path}: parameters.lambda is the global scale --lam-grid searches; drop one of them",
                            param="config")
    densities = [1.0 if d is None else d for d in cfg.densities]   # mergekit's default density is 1
    nm = f"{cfg.nms[0][0]}:{cfg.nms[0][1]}"
    nm_for = [f"{i}={n}:{m}" for i, (n, m) in enumerate(cfg.nms)]
    job = prepare_files(cfg.base, cfg.models, method=cfg.method, nm=nm, nm_for=nm_for, lam=cfg.weights, tail=tail,
                        out_format=out_format, chunk_elems=chunk_elems, seed=seed, densities=densities,
                        options=options or None, lam_grid=lam_grid, eval_cmd=eval_cmd, eval_timeout=eval_timeout,
                        include=include, exclude=exclude, out_dtype=cfg.out_dtype,
                        source={"file": str(path), "merge_method": cfg.mergekit_method,
                                **({"tokenizer_source": cfg.tokenizer_source} if cfg.tokenizer_source else {})},
                        tensor_settings=cfg.tensor)   # mkconfig checked every weight and density the engine would
    job.warnings.extend(cfg.warnings)
    if cfg.tokenizer_source is not None:   # the files exist and are compatible: now their vocabularies
        mkconfig.same_vocabulary(path, cfg)
    job.scale = float(cfg.params.get("lambda", 1.0))   # mergekit: theta_0 + lambda * the (normalized) merged sum
    if cfg.tensor is not None:   # filters / gradients: each tensor has its own weights (lam_range in the result)
        job.lams = [None] * len(job.models)
    return job

