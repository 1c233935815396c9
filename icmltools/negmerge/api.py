"""Entry points for the CLI: the embedded demo, and merging real checkpoints (fixed lambda or a grid)."""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from icmltools.core.errors import BadInputError
from icmltools.taskvec import default_output_name, open_checkpoint, resolve_output_format

from . import demo as D
from . import merge as M
from . import search as S

log = logging.getLogger(__name__)


def run_demo(*, seed: int = 0, n_seeds: int = 1, methods: Sequence[str] = D.MERGE_METHODS,
             lam_grid: Sequence[float] | None = None, ties_k: float = 0.2, dare_p: float = 0.0,
             retain_ratio: float = 0.95, device: str = "cpu", progress: Callable | None = None,
             export_dir: str | None = None, preset: str = "quick", patience: int | None = None,
             pool: dict | None = None) -> dict:
    """The embedded demo over seeds seed .. seed+n_seeds-1 (see :mod:`icmltools.negmerge.demo`)."""
    bad = [m for m in methods if m not in D.MERGE_METHODS]
    if bad:
        raise BadInputError(f"--methods: unknown merge {bad[0]!r}; choose from {', '.join(D.MERGE_METHODS)}")
    if n_seeds < 1:
        raise BadInputError("--n-seeds must be >= 1")
    M.MergeConfig(ties_k=ties_k, dare_p=dare_p).validate(2)
    kw = dict(methods=tuple(methods), ties_k=ties_k, dare_p=dare_p, retain_ratio=retain_ratio)
    if lam_grid is not None:
        kw["lam_grid"] = tuple(lam_grid)
    if patience is not None:
        kw["patience"] = patience
    if pool is not None:
        kw.update(pool)
    if preset not in ("quick", "tiny"):
        raise BadInputError(f"--preset: unknown demo preset {preset!r}; choose quick or tiny")
    cfg = D.DemoConfig.preset(preset, **kw)
    res = D.run_demo(cfg, list(range(seed, seed + n_seeds)), device=device, progress=progress,
                     keep_models=export_dir is not None)
    if export_dir is not None:
        res["exported"] = export_demo(res, Path(export_dir))
    return res


def parse_pool(text: str) -> dict:
    """`EPOCHS;WD;LS` (three comma lists) -> the demo's candidate grid (ft_epochs x ft_weight_decay x
    ft_label_smoothing); at least 2 candidates in all."""
    parts = text.split(";")
    if len(parts) != 3:
        raise BadInputError(f"--pool {text!r}: give three ';'-separated comma lists, epochs;weight decay;label smoothing",
                            hint="e.g. --pool '5,10,20;0,5e-4,5e-3;0,0.05,0.1'")
    out = {}
    for key, part, conv in (("ft_epochs", parts[0], int), ("ft_weight_decay", parts[1], float),
                            ("ft_label_smoothing", parts[2], float)):
        try:
            vals = tuple(conv(v) for v in part.split(",") if v.strip())
        except ValueError:
            raise BadInputError(f"--pool {text!r}: cannot read {part!r} as a comma list of numbers") from None
        if not vals or len(set(vals)) != len(vals):
            raise BadInputError(f"--pool {text!r}: {key.split('_', 1)[1].replace('_', ' ')} list is empty or repeats a value")
        if key == "ft_epochs" and min(vals) < 1 or key == "ft_weight_decay" and min(vals) < 0 or \
                key == "ft_label_smoothing" and not all(0 <= v < 1 for v in vals):
            raise BadInputError(f"--pool {text!r}: out-of-range value in {part!r} (epochs >= 1, wd >= 0, 0 <= ls < 1)")
        out[key] = vals
    if len(out["ft_epochs"]) * len(out["ft_weight_decay"]) * len(out["ft_label_smoothing"]) < 2:
        raise BadInputError(f"--pool {text!r}: the merges need at least 2 candidates")
    return out


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
    base: object
    candidates: list
    cfg: M.MergeConfig
    fmt: str


def prepare_files(base: str, candidates: Sequence[str], cfg: M.MergeConfig, out_format: str = "same") -> FileJob:
    """Open every checkpoint lazily and check keys, shapes, dtypes and options before anything is written."""
    if not candidates:
        raise BadInputError("no --candidate given", hint="pass each fine-tuned checkpoint with -c PATH")
    b = open_checkpoint(base)
    cands = [open_checkpoint(c) for c in candidates]
    M.open_and_check(b, cands, cfg)
    fmt = resolve_output_format(b, out_format)
    return FileJob(b, cands, cfg, fmt)


def _record(job: FileJob, lam, extra: dict | None = None) -> dict:
    return {**M.default_record(job.base, job.candidates, job.cfg, lam), **(extra or {})}


def merge_files(job: FileJob, out_dir: Path, *, lam: float | None = None, lam_grid: Sequence[float] | None = None,
                eval_cmd: str | None = None, eval_timeout: float | None = None, retain_ratio: float = 0.95,
                patience: int = 0,
                device: str = "cpu", per_tensor: bool = False, progress: Callable | None = None) -> dict:
    """Merge real checkpoints into `out_dir`: a fixed `lam` (streamed straight to disk) or a `lam_grid`
    searched with `eval_cmd` (merged task vector kept in memory, one temporary checkpoint per lambda)."""
    import time

    out_dir = Path(out_dir)
    out_path = out_dir / default_output_name(job.base, job.fmt)
    result = {"mode": "merge", "method": job.cfg.method, "base": {"path": str(job.base.path), "format": job.base.format,
              "n_tensors": len(job.base.specs), "bytes": job.base.nbytes},
              "candidates": [str(c.path) for c in job.candidates], "n_candidates": len(job.candidates),
              "output": str(out_path), "output_format": job.fmt}
    t0 = time.perf_counter()
    if lam is not None:
        stats = M.merge_to_checkpoint(job.base, job.candidates, job.cfg, lam, out_path, fmt=job.fmt, device=device,
                                      record=_record(job, lam), progress=progress)
        result.update(lam=lam, lambda_search=None)
    else:
        if eval_cmd is None:
            raise BadInputError("--lam-grid on your checkpoints needs --eval-cmd (the built-in evaluator is the demo's)")
        evaluator = S.CommandEvaluator(eval_cmd, timeout=eval_timeout)
        tau, stats = M.merged_task_vector(job.base, job.candidates, job.cfg, device=device, progress=progress)
        original = evaluator(job.base.path)
        grid_dir = out_dir / ".lambda_grid"
        grid_dir.mkdir(parents=True, exist_ok=True)

        def evaluate(lam_):
            if lam_ == 0:
                return dict(original)
            p = grid_dir / default_output_name(job.base, job.fmt)
            try:
                M.apply_task_vector(job.base, tau, lam_, p, fmt=job.fmt, record=_record(job, lam_))
                return evaluator(p)
            finally:
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                    Path(str(p) + ".json").unlink(missing_ok=True)

        try:
            rows, sel = S.search(evaluate, list(lam_grid), original["retain_acc"], retain_ratio, progress=progress,
                                 patience=patience)
        finally:
            shutil.rmtree(grid_dir, ignore_errors=True)
        search_doc = {"grid": list(lam_grid), "original": original, "rows": rows, "selected_lam": sel.lam,
                      "feasible": sel.feasible, "retain_threshold": sel.threshold, "retain_ratio": retain_ratio,
                      "eval_cmd": eval_cmd, "patience": patience, "rule": "lowest forget_acc with retain_acc >= ratio x original's"}
        M.apply_task_vector(job.base, tau, sel.lam, out_path, fmt=job.fmt,
                            record=_record(job, sel.lam, {"lambda_search": search_doc}))
        result.update(lam=sel.lam, lambda_search=search_doc)
    result["seconds"] = time.perf_counter() - t0
    result["kept_fraction"] = stats.kept_fraction
    result["stats"] = stats.summary(per_tensor=per_tensor)
    return result
