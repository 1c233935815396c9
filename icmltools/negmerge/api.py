"""Entry points for the command: the embedded demo, and merging real checkpoints (fixed lambda or a grid).

The command calls only this module. Each mode resolves and checks every option first (`demo_config`,
`prepare_files`), so the run folder is made only for a run that can start, then runs (`run_demo`,
`merge_files`).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from icmltools.core.errors import BadInputError
from icmltools.merge.engine import check_model_paths
from icmltools.merge.search import search_files
from icmltools.taskvec import default_output_name, open_checkpoint, resolve_output_format

from . import demo as D
from . import merge as M
from . import search as S
from .options import DEFAULT_PRESET, DEMO_METHODS, DEMO_N_SEEDS, FILE_PATIENCE, RETAIN_RATIO, DemoConfig, MergeConfig

log = logging.getLogger(__name__)


def resolve_grid(lam: float | None = None, lam_grid: str | Sequence[float] | None = None) -> list[float] | None:
    """A fixed `lam` as a one-point grid, or `lam_grid` (a `start:stop:step` / comma-list string or numbers)."""
    if lam is not None and lam_grid is not None:
        raise BadInputError("give a fixed lam or a grid, not both", param="lam_grid")
    if lam is not None:
        return [float(lam)]
    if isinstance(lam_grid, str):
        return S.parse_grid(lam_grid)
    return None if lam_grid is None else [float(x) for x in lam_grid]


# --------------------------------------------------------------------------------------------- demo


def parse_pool(text: str) -> dict:
    """`EPOCHS;WD;LS` (three comma lists) -> the demo's candidate grid (ft_epochs x ft_weight_decay x
    ft_label_smoothing); at least 2 candidates in all."""
    parts = text.split(";")
    if len(parts) != 3:
        raise BadInputError(f"{text!r}: give three ';'-separated comma lists, epochs;weight decay;label smoothing",
                            param="pool", hint="e.g. '5,10,20;0,5e-4,5e-3;0,0.05,0.1'")
    out = {}
    for key, part, conv in (("ft_epochs", parts[0], int), ("ft_weight_decay", parts[1], float),
                            ("ft_label_smoothing", parts[2], float)):
        try:
            vals = tuple(conv(v) for v in part.split(",") if v.strip())
        except ValueError:
            raise BadInputError(f"{text!r}: cannot read {part!r} as a comma list of numbers", param="pool") from None
        if not vals or len(set(vals)) != len(vals):
            raise BadInputError(f"{text!r}: {key.split('_', 1)[1].replace('_', ' ')} list is empty or repeats a value",
                                param="pool")
        if key == "ft_epochs" and min(vals) < 1 or key == "ft_weight_decay" and min(vals) < 0 or \
                key == "ft_label_smoothing" and not all(0 <= v < 1 for v in vals):
            raise BadInputError(f"{text!r}: out-of-range value in {part!r} (epochs >= 1, wd >= 0, 0 <= ls < 1)",
                                param="pool")
        out[key] = vals
    if len(out["ft_epochs"]) * len(out["ft_weight_decay"]) * len(out["ft_label_smoothing"]) < 2:
        raise BadInputError(f"{text!r}: the merges need at least 2 candidates", param="pool")
    return out


def demo_config(*, preset: str = DEFAULT_PRESET, methods: Sequence[str] = DEMO_METHODS, lam: float | None = None,
                lam_grid: str | Sequence[float] | None = None, ties_k: float = MergeConfig.ties_k,
                dare_p: float = MergeConfig.dare_p, retain_ratio: float = RETAIN_RATIO, patience: int | None = None,
                pool: str | dict | None = None) -> DemoConfig:
    """The demo's config: the preset's, with every option given on top (each checked, named on error)."""
    bad = [m for m in methods if m not in DEMO_METHODS]
    if bad or not methods:
        raise BadInputError(f"unknown merge {bad[0]!r}; choose from {', '.join(DEMO_METHODS)}" if bad
                            else "give at least one merge", param="methods")
    MergeConfig(ties_k=ties_k, dare_p=dare_p).validate(2)
    kw: dict = dict(methods=tuple(methods), ties_k=ties_k, dare_p=dare_p, retain_ratio=retain_ratio)
    grid = resolve_grid(lam, lam_grid)
    if grid is not None:
        kw["lam_grid"] = tuple(grid)
    if patience is not None:
        kw["patience"] = patience
    if pool is not None:
        kw.update(parse_pool(pool) if isinstance(pool, str) else pool)
    return DemoConfig.preset(preset, **kw)


def run_demo(cfg: DemoConfig, *, seed: int = 0, n_seeds: int = DEMO_N_SEEDS, device: str = "cpu",
             progress: Callable | None = None, export_dir: str | None = None) -> dict:
    """The embedded demo over seeds seed .. seed+n_seeds-1 (see :mod:`icmltools.negmerge.demo`); with
    `export_dir`, the first seed's models are written there as .safetensors (an empty or new folder)."""
    if n_seeds < 1:
        raise BadInputError("must be >= 1", param="n_seeds")
    if export_dir is not None:
        folder = Path(export_dir)
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise BadInputError(f"{folder}: exists and is not an empty folder", param="export_demo")
    res = D.run_demo(cfg, list(range(seed, seed + n_seeds)), device=device, progress=progress,
                     keep_models=export_dir is not None)
    if export_dir is not None:
        res["exported"] = export_demo(res, Path(export_dir))
    return res


def export_demo(res: dict, folder: Path) -> dict:
    """Write the first seed's original, retrain and candidates as .safetensors (to try the file mode)."""
    from icmltools.taskvec import write_state_dict

    models = res.pop("_models", None)
    if models is None:
        raise BadInputError("internal: the demo's models were not kept for export")
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"original": str(write_state_dict(models["original"], folder / "original.safetensors")),
             "retrain": str(write_state_dict(models["retrain"], folder / "retrain.safetensors")),
             "candidates": [str(write_state_dict(c, folder / f"candidate_{i:02d}.safetensors"))
                            for i, c in enumerate(models["candidates"])]}
    return paths


# --------------------------------------------------------------------------------------------- files


@dataclass
class FileJob:
    """A checked file merge: opened checkpoints, the merge, the output format and the lambda settings."""

    base: object
    candidates: list
    cfg: MergeConfig
    fmt: str
    lam: float | None = None
    lam_grid: list | None = None
    eval_cmd: str | None = None
    eval_timeout: float | None = None
    retain_ratio: float = RETAIN_RATIO
    patience: int = FILE_PATIENCE
    allow_non_finite: bool = False

    def config(self) -> dict:
        """The resolved settings (the run folder's config)."""
        return {"merge": asdict(self.cfg), "base": str(self.base.path),
                "candidates": [str(c.path) for c in self.candidates], "output_format": self.fmt, "lam": self.lam,
                "lam_grid": self.lam_grid, "eval_cmd": self.eval_cmd, "eval_timeout": self.eval_timeout,
                "retain_ratio": self.retain_ratio, "patience": self.patience,
                "allow_non_finite": self.allow_non_finite}


def prepare_files(base: str, candidates: Sequence[str], *, method: str = MergeConfig.method,
                  index: int = MergeConfig.index, ties_k: float = MergeConfig.ties_k,
                  dare_p: float = MergeConfig.dare_p, seed: int = MergeConfig.seed, out_format: str = "same",
                  lam: float | None = None, lam_grid: str | Sequence[float] | None = None,
                  eval_cmd: str | None = None, eval_timeout: float | None = None,
                  retain_ratio: float = RETAIN_RATIO, patience: int | None = None,
                  allow_non_finite: bool = False) -> FileJob:
    """Check the options and open every checkpoint lazily (keys, shapes, dtypes) before anything is written.
    NaN/inf values are found while the merge streams (refused unless `allow_non_finite`)."""
    if not candidates:
        raise BadInputError("no candidate checkpoint given", param="candidates")
    check_model_paths(base, candidates, "candidates")
    grid = resolve_grid(lam, lam_grid)
    if grid is None:
        raise BadInputError("give a fixed lambda, or a grid with an evaluation command", param="lam")
    if lam is None and eval_cmd is None:
        raise BadInputError("a lambda grid on your checkpoints needs an evaluation command "
                            "(the built-in evaluator is the demo's)", param="eval_cmd")
    cfg = MergeConfig(method=method, ties_k=ties_k, dare_p=dare_p, index=index, seed=seed)
    cfg.validate(len(candidates))
    if eval_cmd is not None and lam is None:
        S.CommandEvaluator(eval_cmd, timeout=eval_timeout)  # parse it, find the program: fails before any work
    b = open_checkpoint(base)
    cands = [open_checkpoint(c) for c in candidates]
    M.open_and_check(b, cands, cfg)
    return FileJob(b, cands, cfg, resolve_output_format(b, out_format), lam=lam, lam_grid=None if lam is not None
                   else grid, eval_cmd=eval_cmd, eval_timeout=eval_timeout, retain_ratio=retain_ratio,
                   patience=FILE_PATIENCE if patience is None else patience, allow_non_finite=allow_non_finite)


def _record(job: FileJob, lam, extra: dict | None = None) -> dict:
    allowed = {"allow_non_finite": True} if job.allow_non_finite else {}
    return {**M.default_record(job.base, job.candidates, job.cfg, lam), **allowed, **(extra or {})}


def _search_lambda(job: FileJob, evaluator: S.CommandEvaluator, original: dict, tau: dict, tainted: set,
                   out_dir: Path, progress: Callable | None) -> dict:
    """The official rule over job.lam_grid with the user's evaluation command (the engine's search on files:
    one temporary checkpoint per lambda; lambda = 0 is the base, evaluated once, before the merge: `original`)."""
    thr = job.retain_ratio * original["retain_acc"]
    below = [0]

    def stop(row: dict) -> bool:  # patience: that many consecutive lambdas below the retain threshold
        below[0] = below[0] + 1 if row["retain_acc"] < thr else 0
        return bool(job.patience) and below[0] >= job.patience

    rows, sel = search_files(job.base, tau, job.lam_grid, evaluator, out_dir, fmt=job.fmt,
                             record=lambda lam_: _record(job, lam_), tainted=tainted, sign=-1, at_zero=original,
                             rule=lambda r: S.select_lambda(r, original["retain_acc"], job.retain_ratio),
                             progress=progress, patience=stop, out_name=default_output_name(job.base, job.fmt))
    return {"grid": list(job.lam_grid), "original": original, "rows": rows, "selected_lam": sel.lam,
            "feasible": sel.feasible, "retain_threshold": sel.threshold, "retain_ratio": job.retain_ratio,
            "eval_cmd": job.eval_cmd, "patience": job.patience,
            "rule": "lowest forget_acc with retain_acc >= ratio x original's"}


def merge_files(job: FileJob, out_dir: Path, *, device: str = "cpu", per_tensor: bool = False,
                progress: Callable | None = None) -> dict:
    """Merge real checkpoints into `out_dir`: theta = theta_pre - lam * tau (NegMerge Sec. 3) with a fixed
    `job.lam` (streamed straight to disk), or with lam searched over `job.lam_grid` by the user's evaluation
    command (the merged task vector kept in memory, one temporary checkpoint per lambda)."""
    out_dir = Path(out_dir)
    out_path = out_dir / default_output_name(job.base, job.fmt)
    result = {"mode": "merge", "method": job.cfg.method, "base": {"path": str(job.base.path), "format": job.base.format,
              "n_tensors": len(job.base.specs), "bytes": job.base.nbytes},
              "candidates": [str(c.path) for c in job.candidates], "n_candidates": len(job.candidates),
              "output": str(out_path), "output_format": job.fmt}
    t0 = time.perf_counter()
    if job.lam is not None:
        stats = M.merge_to_checkpoint(job.base, job.candidates, job.cfg, job.lam, out_path, fmt=job.fmt,
                                      device=device, record=_record(job, job.lam), progress=progress,
                                      allow_non_finite=job.allow_non_finite)
        result.update(lam=job.lam, lambda_search=None)
    else:
        evaluator = S.CommandEvaluator(job.eval_cmd, timeout=job.eval_timeout)
        original = evaluator(job.base.path, label=f"the base {job.base.path}")  # a broken command fails first
        tau, stats = M.merged_task_vector(job.base, job.candidates, job.cfg, device=device, progress=progress,
                                          allow_non_finite=job.allow_non_finite)
        search_doc = _search_lambda(job, evaluator, original, tau, stats.non_finite_tensors, out_dir, progress)
        M.apply_task_vector(job.base, tau, search_doc["selected_lam"], out_path, fmt=job.fmt,
                            record=_record(job, search_doc["selected_lam"], {"lambda_search": search_doc}),
                            tainted=stats.non_finite_tensors, param="lam_grid")
        result.update(lam=search_doc["selected_lam"], lambda_search=search_doc)
    result["seconds"] = time.perf_counter() - t0
    result["kept_fraction"] = stats.kept_fraction
    result["stats"] = stats.summary(per_tensor=per_tensor)
    return result
