"""The paper's tabular protocol (official `gs_*.py` then `cv_*.py`), on sklearn's bundled tables or a CSV.

1. Dummies for categorical columns, every feature min-max scaled to [0, 1] (regression targets too), as in
   `utils.preprocess_data` (scaled on the whole table before the split, as there).
2. Grid search of the classical net, depth x width (width = m * d), by k-fold CV (sklearn's unshuffled KFold,
   StratifiedKFold for classes: GridSearchCV's cv=k); accuracy or RMSE.
3. k-fold CV of the classical net and the low-rank net (r = int(W/3)) at the chosen depth/width, then the
   paired one-sided t-test (`ttest_rel(classical, lowrank, alternative=...)`: "classical better", the paper's
   test) and the reverse direction.
Training: AdamW lr 1e-3, 50 epochs, linear warm-up over 10 epochs then cosine (per epoch), batch min(n/10, 64).
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import torch

from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.core.files import check_input_file
from icmltools.core.seed import derive

from .approx import paired_test
from .nets import build_net, cost, epoch_schedule, parse_ratio, rank_for, train
from .options import DATASETS, UciConfig

SKLEARN = {"wine": ("load_wine", "classification"), "breast_cancer": ("load_breast_cancer", "classification"),
           "iris": ("load_iris", "classification"), "diabetes": ("load_diabetes", "regression")}
assert set(SKLEARN) == set(DATASETS)
MAX_CLASSES_AUTO = 10


def _float(s: str):
    try:
        x = float(s)
    except ValueError:
        return None
    return x


def read_csv(path, target: str | None) -> tuple[np.ndarray, list, list[str], str]:
    """(X with dummies, raw target column, feature names, target name); empty or non-finite cells are errors."""
    p = check_input_file(path)
    with open(p, newline="", encoding="utf-8-sig") as fh:
        rows = [r for r in csv.reader(fh) if any(c.strip() for c in r)]
    if len(rows) < 3:
        raise BadInputError(f"{p}: needs a header and at least two rows", param="csv")
    head, body = [h.strip() for h in rows[0]], rows[1:]
    tcol = target if target is not None else head[-1]
    if tcol not in head:
        raise BadInputError(f"{p}: no column {tcol!r} (columns: {', '.join(head)})", param="target")
    cols = {h: [] for h in head}
    for i, r in enumerate(body, start=2):
        if len(r) != len(head):
            raise BadInputError(f"{p}: line {i} has {len(r)} cells, the header {len(head)}", param="csv")
        for h, c in zip(head, r):
            if not c.strip():
                raise BadInputError(f"{p}: line {i}, column {h!r} is empty", param="csv")
            cols[h].append(c.strip())
    feats, names = [], []
    for h in head:
        if h == tcol:
            continue
        nums = [_float(c) for c in cols[h]]
        if all(x is not None for x in nums):
            bad = [i for i, x in enumerate(nums) if not math.isfinite(x)]
            if bad:
                raise BadInputError(f"{p}: line {bad[0] + 2}, column {h!r} is not finite", param="csv")
            feats.append(np.array(nums))
            names.append(h)
        else:  # categorical: one dummy column per level (pd.get_dummies)
            for lev in sorted(set(cols[h])):
                feats.append(np.array([c == lev for c in cols[h]], dtype=float))
                names.append(f"{h}={lev}")
    if not feats:
        raise BadInputError(f"{p}: no feature column besides the target {tcol!r}", param="csv")
    return np.stack(feats, 1), cols[tcol], names, tcol


def infer_task(y_raw: list, task: str) -> str:
    """auto: classification for non-numeric labels or <= 10 distinct integers, else regression."""
    if task != "auto":
        return task
    nums = [_float(str(v)) for v in y_raw]
    if any(x is None for x in nums):
        return "classification"
    ints = all(float(x).is_integer() for x in nums)
    return "classification" if ints and len(set(nums)) <= MAX_CLASSES_AUTO else "regression"


def encode_target(y_raw: list, task: str, source: str) -> np.ndarray:
    if task == "classification":
        levels = sorted(set(map(str, y_raw)))
        if len(levels) < 2:
            raise BadInputError(f"{source}: the target has one class", param="target")
        idx = {v: i for i, v in enumerate(levels)}
        return np.array([idx[str(v)] for v in y_raw], dtype=np.int64)
    nums = [_float(str(v)) for v in y_raw]
    if any(x is None or not math.isfinite(x) for x in nums):
        raise BadInputError(f"{source}: a regression target must be numeric and finite", param="target")
    return np.array(nums, dtype=float)


def minmax(a: np.ndarray) -> np.ndarray:
    lo, hi = a.min(0), a.max(0)
    return (a - lo) / np.where(hi > lo, hi - lo, 1.0)


def load(dataset: str | None, csv_path, target: str | None, task: str) -> dict:
    """Features scaled to [0,1], encoded targets (regression scaled to [0,1]), the task."""
    if csv_path is not None:
        x, y_raw, names, tname = read_csv(csv_path, target)
        source = str(csv_path)
    else:
        import sklearn.datasets as skd

        fn, native = SKLEARN[dataset]
        b = getattr(skd, fn)()
        x, y_raw, names, tname, source = b.data.astype(float), list(b.target), list(b.feature_names), "target", dataset
        task = native if task == "auto" else task
    task = infer_task(y_raw, task)
    y = encode_target(y_raw, task, source)
    if task == "regression":
        y = minmax(y[:, None])[:, 0]
    return {"x": minmax(x).astype(np.float32), "y": y, "task": task, "source": source, "features": names,
            "target": tname, "classes": int(y.max()) + 1 if task == "classification" else None}


def folds(data: dict, k: int, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import KFold, StratifiedKFold

    if k > n:
        raise BadInputError(f"{k} folds for {n} rows", param="folds")
    if data["task"] == "classification":
        least = np.bincount(data["y"]).min()
        if least < k:
            raise BadInputError(f"the smallest class has {least} rows, fewer than {k} folds", param="folds")
        return list(StratifiedKFold(k).split(data["x"], data["y"]))
    return list(KFold(k).split(data["x"]))


def warmup_epochs(cfg: UciConfig) -> int:
    """The official 10 of 50 warm-up epochs; shorter runs keep the same fifth (at least one epoch)."""
    return cfg.warmup_epochs if cfg.epochs >= UciConfig.epochs else max(1, min(cfg.warmup_epochs, cfg.epochs // 5))


def fit_fold(data: dict, tr, te, depth: int, width: int, rank, cfg: UciConfig, seed: int, fold: int, variant: str,
             device="cpu") -> float:
    """Train on fold `fold`'s training rows, score the held-out rows: accuracy or RMSE (scaled target)."""
    cls = data["task"] == "classification"
    x = torch.as_tensor(data["x"], device=device)
    y = torch.as_tensor(data["y"], dtype=torch.long if cls else torch.float32, device=device)
    y = y if cls else y[:, None]
    with derive(seed, "uci", "init", fold, depth, width, variant).torch_init():
        net = build_net(x.shape[1], data["classes"] if cls else 1, depth, width, rank).to(device)
    gen = derive(seed, "uci", "batches", fold, depth, width).torch(str(device))
    tri, tei = torch.as_tensor(tr, device=device), torch.as_tensor(te, device=device)
    batch = max(1, min(int(len(data["y"]) / 10), cfg.max_batch))
    train(net, x[tri], y[tri], loss="ce" if cls else "mse", epochs=cfg.epochs, lr=cfg.lr, batch=batch, gen=gen,
          schedule=epoch_schedule(cfg.epochs, warmup_epochs(cfg)))
    with torch.no_grad():
        out = net(x[tei])
    score = float((out.argmax(1) == y[tei]).float().mean()) if cls else float(((out - y[tei]) ** 2).mean().sqrt())
    if not math.isfinite(score):
        raise RuntimeFailure(f"training diverged (depth {depth}, width {width}, fold {fold})")
    return score


def grid_search(data, splits, cfg: UciConfig, seed: int, device="cpu", progress=None) -> dict:
    """Step 2: the classical net's depth x width grid by CV; the best mean score wins (GridSearchCV's rank 1)."""
    d, cls = data["x"].shape[1], data["task"] == "classification"
    grid, total = [], len(cfg.depths) * len(cfg.width_mults) * len(splits)
    for depth in cfg.depths:
        for m in cfg.width_mults:
            scores = [fit_fold(data, tr, te, depth, m * d, None, cfg, seed, f, "classical", device)
                      for f, (tr, te) in enumerate(splits)]
            grid.append({"depth": depth, "width": m * d, "mean": float(np.mean(scores)), "scores": scores})
            if progress:
                progress("grid", len(grid) * len(splits), total)
    best = max(grid, key=lambda g: g["mean"]) if cls else min(grid, key=lambda g: g["mean"])
    return {"grid": grid, "depth": best["depth"], "width": best["width"]}


def compare(data, splits, depth: int, width: int, cfg: UciConfig, seed: int, device="cpu", progress=None) -> dict:
    """Step 3: classical vs low-rank on the same folds, paired one-sided t-tests."""
    cls = data["task"] == "classification"
    rank = rank_for(width, parse_ratio(cfg.ratio))
    res = {}
    for variant, r in (("classical", None), ("lowrank", rank)):
        res[variant] = [fit_fold(data, tr, te, depth, width, r, cfg, seed, f, "classical" if r is None else "lowrank",
                                 device) for f, (tr, te) in enumerate(splits)]
        if progress:
            progress("cv", len(res) * len(splits), 2 * len(splits))
    c, lr = res["classical"], res["lowrank"]
    test = paired_test([-s for s in c], [-s for s in lr]) if cls else paired_test(c, lr)  # lower is better
    d_out = data["classes"] if cls else 1
    return {"metric": "accuracy" if cls else "rmse", "depth": depth, "width": width, "rank": rank,
            "classical": {"mean": float(np.mean(c)), "sd": float(np.std(c, ddof=1)), "scores": c,
                          **cost(build_net(data["x"].shape[1], d_out, depth, width))},
            "lowrank": {"mean": float(np.mean(lr)), "sd": float(np.std(lr, ddof=1)), "scores": lr,
                        **cost(build_net(data["x"].shape[1], d_out, depth, width, rank))},
            "t_test": test}


def run(cfg: UciConfig, seed: int, csv_path=None, target=None, depth=None, width=None, device="cpu",
        progress=None) -> dict:
    """Load, grid-search (unless depth and width are given), compare."""
    if (depth is None) != (width is None):
        raise BadInputError("give both depth and width, or neither (grid search)", param="depth")
    if csv_path is not None and not Path(csv_path).exists():
        raise BadInputError(f"{csv_path}: no such file", param="csv")
    data = load(cfg.dataset, csv_path, target, cfg.task)
    n = len(data["y"])
    splits = folds(data, cfg.folds, n)
    gs = None
    if depth is None:
        gs = grid_search(data, splits, cfg, seed, device, progress)
        depth, width = gs["depth"], gs["width"]
    out = compare(data, splits, depth, width, cfg, seed, device, progress)
    return {"source": data["source"], "task": data["task"], "rows": n, "features": len(data["features"]),
            "folds": cfg.folds, "epochs": cfg.epochs, "grid_search": gs, **out}
