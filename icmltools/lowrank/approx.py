"""Error vs compute of classical and low-rank Swish nets on Hölder targets (spec (a), [inf]).

Every (width, ratio) is trained on the same target, data and batch order within a repetition, so classical and
low-rank runs pair up for the paired one-sided t-test across repetitions (the paper's test, `cv_*.py`).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.core.seed import derive

from .nets import build_net, cost, net_macs, parse_ratio, rank_for, step_schedule, train
from .options import FULL, ApproxConfig
from .targets import holder_target


def validate(cfg: ApproxConfig) -> list:
    for name, v in (("widths", cfg.widths), ("betas", cfg.betas), ("ratios", cfg.ratios)):
        if not v:
            raise BadInputError("give at least one value", param=name)
    if any(float(w) != int(w) or int(w) < 1 for w in cfg.widths):
        raise BadInputError(f"widths must be positive integers, got {', '.join(f'{w:g}' for w in cfg.widths)}",
                            param="widths")
    if cfg.depth < 2:
        raise BadInputError(f"must be >= 2 (a hidden-to-hidden layer to factor), got {cfg.depth}", param="depth")
    return [(str(r), parse_ratio(r)) for r in cfg.ratios]


def make_data(cfg: ApproxConfig, seed: int, rep: int, beta: float):
    """Train/test x ~ U[0,1]^d (one stream per rep) and y = f(x) for the rep's target."""
    f = holder_target(seed, rep, cfg.dim, beta)
    rng = derive(seed, "approx", "data", rep, cfg.dim).numpy()
    x = rng.uniform(0, 1, (cfg.n_train + cfg.n_test, cfg.dim))
    y = f(x)
    return x[:cfg.n_train], y[:cfg.n_train], x[cfg.n_train:], y[cfg.n_train:]


def fit_one(cfg: ApproxConfig, seed: int, rep: int, beta: float, width: int, ratio_name: str, ratio, data,
            device="cpu") -> dict:
    """Train one net; rel_rmse = RMSE / std(y_test)."""
    xtr, ytr, xte, yte = (torch.as_tensor(a, dtype=torch.float32, device=device) for a in data)
    rank = rank_for(width, ratio)
    with derive(seed, "approx", "init", rep, width, ratio_name).torch_init():
        net = build_net(cfg.dim, 1, cfg.depth, width, rank).to(device)
    tc = cfg.train
    gen = derive(seed, "approx", "batches", rep, width, f"{beta:g}").torch(str(device))
    t0 = time.perf_counter()
    train(net, xtr, ytr[:, None], loss="mse", epochs=tc.epochs, lr=tc.lr, batch=tc.batch, gen=gen,
          schedule=step_schedule(tc.epochs, tc.warmup), weight_decay=tc.weight_decay)
    secs = time.perf_counter() - t0
    with torch.no_grad():
        rmse = float(((net(xte)[:, 0] - yte) ** 2).mean().sqrt())
    rel = rmse / float(yte.std())
    if not np.isfinite(rel):
        raise RuntimeFailure(f"training diverged (width {width}, ratio {ratio_name}, beta {beta:g}): non-finite error")
    c = cost(net)
    assert c["macs"] == net_macs(cfg.dim, 1, cfg.depth, width, rank)
    return {"beta": beta, "width": width, "ratio": ratio_name, "rank": rank, "rep": rep, **c,
            "train_s": round(secs, 3), "rel_rmse": rel}


def pareto(points: list[tuple[float, float]]) -> list[bool]:
    """Non-dominated flags for (cost, error) pairs: no other point is <= in both and < in one."""
    return [not any((c2 <= c and e2 <= e) and (c2 < c or e2 < e) for c2, e2 in points) for c, e in points]


def paired_test(classical: list[float], lowrank: list[float]) -> dict | None:
    """The paper's dependent t-test on paired errors: p of 'classical lower' (their test) and of 'low-rank lower'."""
    if len(classical) < 2:
        return None
    from scipy.stats import ttest_rel

    if np.allclose(classical, lowrank):
        return {"p_classical_better": None, "p_lowrank_better": None, "n": len(classical)}
    less = ttest_rel(classical, lowrank, alternative="less")
    greater = ttest_rel(classical, lowrank, alternative="greater")
    return {"t": float(less.statistic), "p_classical_better": float(less.pvalue),
            "p_lowrank_better": float(greater.pvalue), "n": len(classical)}


def summarise(runs: list[dict], ratios: list) -> list[dict]:
    """Mean/sd over reps per (beta, width, ratio), the Pareto front per beta, the t-test against full."""
    rows = []
    keys = sorted({(r["beta"], r["width"], r["ratio"]) for r in runs}, key=lambda k: (k[0], k[1], [n for n, _ in ratios].index(k[2])))
    for beta, width, ratio in keys:
        sel = sorted((r for r in runs if (r["beta"], r["width"], r["ratio"]) == (beta, width, ratio)), key=lambda r: r["rep"])
        errs = [r["rel_rmse"] for r in sel]
        full = sorted((r for r in runs if (r["beta"], r["width"], r["ratio"]) == (beta, width, FULL)), key=lambda r: r["rep"])
        row = {"beta": beta, "width": width, "ratio": ratio, "rank": sel[0]["rank"], "params": sel[0]["params"],
               "macs": sel[0]["macs"], "rel_rmse": float(np.mean(errs)),
               "rel_rmse_sd": float(np.std(errs, ddof=1)) if len(errs) > 1 else None,
               "seeds": len(errs), "train_s": float(np.mean([r["train_s"] for r in sel]))}
        if ratio != FULL and len(full) == len(sel):
            row["vs_full"] = paired_test([r["rel_rmse"] for r in full], errs)
        rows.append(row)
    for beta in sorted({r["beta"] for r in rows}):
        sub = [r for r in rows if r["beta"] == beta]
        for r, on in zip(sub, pareto([(r["macs"], r["rel_rmse"]) for r in sub])):
            r["pareto"] = on
    return rows


def _warm_up(device) -> None:
    """One throw-away step so the first timed net does not pay torch's one-off kernel set-up (seconds)."""
    net = build_net(1, 1, 2, 4).to(device)
    net(torch.zeros(2, 1, device=device)).sum().backward()


def run(cfg: ApproxConfig, seed: int, device="cpu", progress=None) -> dict:
    """The sweep: betas x reps x widths x ratios, every net trained on its rep's data."""
    ratios = validate(cfg)
    _warm_up(device)
    runs, total = [], len(cfg.betas) * cfg.seeds * len(cfg.widths) * len(ratios)
    for beta in cfg.betas:
        for rep in range(cfg.seeds):
            data = make_data(cfg, seed, rep, beta)
            for width in cfg.widths:
                for name, ratio in ratios:
                    runs.append(fit_one(cfg, seed, rep, beta, int(width), name, ratio, data, device))
                    if progress:
                        progress("approx", len(runs), total)
    return {"dim": cfg.dim, "depth": cfg.depth, "epochs": cfg.train.epochs, "n_train": cfg.n_train,
            "summary": summarise(runs, ratios), "runs": runs}


def plot(result: dict, path) -> None:
    """rel_rmse vs MACs per beta, one marker per ratio, Pareto points circled."""
    from icmltools.core.jsonio import atomic_path

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        from icmltools.core.errors import MissingDependencyError
        raise MissingDependencyError("plotting needs matplotlib (pip install matplotlib)") from e
    fig, ax = plt.subplots(figsize=(6, 4))
    for (beta, ratio) in sorted({(r["beta"], r["ratio"]) for r in result["summary"]}):
        sub = [r for r in result["summary"] if (r["beta"], r["ratio"]) == (beta, ratio)]
        ax.plot([r["macs"] for r in sub], [r["rel_rmse"] for r in sub], "o-", label=f"beta {beta:g}, {ratio}")
    front = [r for r in result["summary"] if r.get("pareto")]
    ax.scatter([r["macs"] for r in front], [r["rel_rmse"] for r in front], s=160, facecolors="none", edgecolors="k",
               label="Pareto front")
    ax.set(xscale="log", yscale="log", xlabel="MACs per sample", ylabel="relative RMSE")
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path, suffix=".tmp.png") as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
