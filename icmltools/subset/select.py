"""One-shot, class-balanced subset selection: RAM-APL and its baselines.

Every method takes K feature views (arrays or zero-argument callables that open one, e.g. a
memory-mapped `.npy`; only one view is opened at a time), integer labels 0..C-1 and a list of rates, and
returns, per rate, the sorted selected indices. Per-class budgets are Python `round(n_c * p)` as in the
official code (moderate-DS: `int(n_c * p)` as in its official code).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from icmltools.core.errors import BadInputError

from .engine import Engine

METHODS = ("ram-apl", "ram", "min", "concat", "moderate", "kcenter", "herding", "graphcut", "random")

CITATIONS = {
    "ram-apl": "Wan et al., Foundation Model Insights and a Multi-Model Approach for Superior Fine-Grained One-shot "
               "Subset Selection, ICML 2025 (RAM + APL, Sec. 4)",
    "ram": "Wan et al., ICML 2025: ranking mean (RAM) alone, the ablation without APL",
    "min": "Wan et al., ICML 2025 / Xia et al. 2023 'Moderate coreset' MIN baseline: closest to the class mean",
    "concat": "Wan et al., ICML 2025: naive multi-model fusion by feature concatenation (then MIN)",
    "moderate": "Xia et al., Moderate Coreset: A Universal Method of Data Selection for Real-world Data-efficient "
                "Deep Learning, ICLR 2023",
    "kcenter": "Sener & Savarese, Active Learning for Convolutional Neural Networks: A Core-Set Approach, ICLR 2018",
    "herding": "Welling, Herding Dynamical Weights to Learn, ICML 2009 (argmin form)",
    "graphcut": "Iyer et al., Submodular Combinatorial Information Measures, ALT 2021 (graph-cut, as in DeepCore, "
                "Guo et al. 2022)",
    "random": "uniform class-balanced sampling (DeepCore Uniform, balance=True)",
}

ViewLike = "np.ndarray | Callable[[], np.ndarray]"


def weights(p: float, a: float = 0.2, k: float = 1.0, sr: float = 0.5) -> tuple[float, float]:
    """RAM-APL weights (official `weight_functions`): W1 = a + (1-a) / (1 + exp(k (p - sr))), W2 = 1 - W1."""
    w1 = a + (1.0 - a) * (1.0 / (1.0 + math.exp(k * (p - sr))))
    return w1, 1.0 - w1


def budgets(counts: np.ndarray, p: float, rounding: str = "round") -> np.ndarray:
    """Per-class budgets: Python round(n_c * p) (banker's rounding), or int() for moderate-DS."""
    f = round if rounding == "round" else int
    return np.asarray([f(int(n) * p) for n in counts], dtype=np.int64)


def check_rate(p: float) -> float:
    p = float(p)
    if not (0.0 < p <= 1.0) or not math.isfinite(p):
        raise BadInputError(f"--rate {p}: must lie in (0, 1]")
    return p


def _open(view):
    return view() if callable(view) else view


@dataclass
class Context:
    """Labels and class structure shared by every method."""

    labels: np.ndarray
    n_classes: int
    counts: np.ndarray = field(init=False)
    groups: list = field(init=False)

    def __post_init__(self):
        self.labels = np.asarray(self.labels, dtype=np.int64)
        self.counts = np.bincount(self.labels, minlength=self.n_classes)
        order = np.argsort(self.labels, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(self.counts)])
        self.groups = [order[bounds[c]:bounds[c + 1]] for c in range(self.n_classes)]


def select_by_score(ctx: Context, score: np.ndarray, p: float) -> np.ndarray:
    """Per class, sort `score` ascending (stable, ties by index) and keep the first round(n_c p); sorted ids."""
    order = np.lexsort((score, ctx.labels))  # by label, then score; stable
    lab_sorted = ctx.labels[order]
    starts = np.concatenate([[0], np.cumsum(ctx.counts)[:-1]])
    pos = np.arange(len(order)) - starts[lab_sorted]
    keep = pos < budgets(ctx.counts, p)[lab_sorted]
    return np.sort(order[keep])


def within_class_rank(ctx: Context, dist: np.ndarray) -> np.ndarray:
    """Rank of each sample's distance within its class, 0 = closest (stable double argsort, vectorised)."""
    order = np.lexsort((dist, ctx.labels))
    starts = np.concatenate([[0], np.cumsum(ctx.counts)[:-1]])
    ranks = np.empty(len(dist), dtype=np.int64)
    ranks[order] = np.arange(len(order)) - starts[ctx.labels[order]]
    return ranks


@dataclass
class RamAplStats:
    """Per-sample RAM (mean rank / class size) and APL (fraction of extractors mislabelling the sample)."""

    ram: np.ndarray
    apl: np.ndarray
    dist: list  # per-view distance to own class mean (kept for MIN / concat)


def ram_apl_stats(views: Sequence, ctx: Context, engine: Engine, names: Sequence[str] | None = None) -> RamAplStats:
    """Stream the K views once each: class means, nearest-mean pseudo-labels (APL), within-class ranks (RAM).

    Official code (`ram_apl.py`): class means over all samples of the ground-truth class; APL_j = mean over
    extractors of [argmin_c ||f_k(x_j) - mu_{k,c}|| != y_j]; RAM_j = mean_k rank_k(j) / n_{y_j}.
    """
    n = len(ctx.labels)
    wrong = np.zeros(n, dtype=np.float64)
    rank_sum = np.zeros(n, dtype=np.float64)
    dists = []
    for k, v in enumerate(views):
        name = names[k] if names else f"view {k}"
        X = _open(v)
        means = engine.class_means(X, ctx.labels, ctx.n_classes, name=name)
        pred, own = engine.nearest_mean(X, ctx.labels, means, name=name)
        del X
        wrong += (pred != ctx.labels)
        rank_sum += within_class_rank(ctx, own)
        dists.append(own)
    K = len(views)
    ram = (rank_sum / K) / ctx.counts[ctx.labels]
    return RamAplStats(ram=ram, apl=wrong / K, dist=dists)


def ram_apl_score(stats: RamAplStats, p: float) -> np.ndarray:
    w1, w2 = weights(p)
    return w1 * stats.ram + w2 * stats.apl


# ------------------------------------------------------------------------------------------ the methods
@dataclass
class Selection:
    method: str
    rate: float
    indices: np.ndarray
    per_class: np.ndarray
    weights: dict | None = None


def _pack(method, p, idx, ctx, w=None) -> Selection:
    idx = np.sort(np.asarray(idx, dtype=np.int64))
    return Selection(method=method, rate=p, indices=idx,
                     per_class=np.bincount(ctx.labels[idx], minlength=ctx.n_classes), weights=w)


def run_method(method: str, views: Sequence, ctx: Context, rates: Sequence[float], *, engine: Engine,
               seed: int = 0, view: int = 0, stats: RamAplStats | None = None, names=None,
               graphcut_lambda: float = 1.0) -> list[Selection]:
    """Select with `method` at every rate in `rates`. `view` picks the extractor for single-view baselines."""
    rates = [check_rate(p) for p in rates]
    if method not in METHODS:
        raise BadInputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if not 0 <= view < len(views):
        raise BadInputError(f"--view {view}: there are only {len(views)} feature views")
    vname = names[view] if names else f"view {view}"
    out: list[Selection] = []
    if method in ("ram-apl", "ram"):
        st = stats if stats is not None else ram_apl_stats(views, ctx, engine, names)
        for p in rates:
            if method == "ram-apl":
                w1, w2 = weights(p)
                out.append(_pack(method, p, select_by_score(ctx, ram_apl_score(st, p), p), ctx,
                                 {"W1": w1, "W2": w2, "a": 0.2, "k": 1.0}))
            else:
                out.append(_pack(method, p, select_by_score(ctx, st.ram, p), ctx))
        return out
    if method in ("min", "concat"):
        if stats is not None:
            d = stats.dist[view] if method == "min" else np.sqrt(sum(x * x for x in stats.dist))
        else:
            sel = [views[view]] if method == "min" else list(views)
            sq = None
            for k, v in enumerate(sel):
                X = _open(v)
                nm = vname if method == "min" else (names[k] if names else f"view {k}")
                means = engine.class_means(X, ctx.labels, ctx.n_classes, name=nm)
                _, own = engine.nearest_mean(X, ctx.labels, means, name=nm)
                del X
                sq = own * own if sq is None else sq + own * own
            d = np.sqrt(sq)
        return [_pack(method, p, select_by_score(ctx, d, p), ctx) for p in rates]
    if method == "random":
        # DeepCore Uniform(balance=True): np.random.seed(seed); per class choice(round(p n_c)) without replacement.
        for p in rates:
            rs = np.random.RandomState(seed % 2**32)
            b = budgets(ctx.counts, p)
            idx = [rs.choice(g, int(bc), replace=False) for g, bc in zip(ctx.groups, b)]
            out.append(_pack(method, p, np.concatenate(idx), ctx))
        return out
    X = _open(views[view])
    if method == "moderate":
        # Moderate-DS (official): distance to the per-dimension median of the class; budget int(n_c p);
        # keep the middle band sorted_idx[round(0.5 (n_c - b)) : +b].
        dist = [None] * ctx.n_classes
        for c, g in enumerate(ctx.groups):
            F = np.asarray(X[g], dtype=np.float64)
            _finite(F, vname, g)
            med = np.median(F, axis=0)
            dist[c] = np.linalg.norm(F - med, axis=1)
            engine.progress(f"moderate ({vname})", c + 1, ctx.n_classes)
        for p in rates:
            b = budgets(ctx.counts, p, rounding="int")
            idx = []
            for c, g in enumerate(ctx.groups):
                srt = np.argsort(dist[c], kind="stable")
                lo = round(0.5 * (len(g) - b[c]))
                idx.append(g[srt[lo:lo + b[c]]])
            out.append(_pack(method, p, np.concatenate(idx), ctx))
        return out
    # greedy per-class methods: the selection at a smaller budget is a prefix of the greedy order
    bmax = budgets(ctx.counts, max(rates))
    orders = []
    for c, g in enumerate(ctx.groups):
        Xc = engine.class_block(X, g, center=(method != "graphcut"))
        if not bool(engine.torch.isfinite(Xc).all()):
            _finite(np.asarray(X[g]), vname, g)
        if method == "kcenter":
            # DeepCore: np.random.seed(seed) then randint(0, n_c) for the first centre, per class
            start = int(np.random.RandomState(seed % 2**32).randint(0, len(g)))
            o = engine.kcenter_order(Xc, int(bmax[c]), start)
        elif method == "herding":
            o = engine.herding_order(Xc, int(bmax[c]))
        else:
            o = engine.graphcut_order(Xc, int(bmax[c]), lam=graphcut_lambda)
        orders.append(g[o])
        engine.progress(f"{method} ({vname})", c + 1, ctx.n_classes)
    for p in rates:
        b = budgets(ctx.counts, p)
        out.append(_pack(method, p, np.concatenate([o[:bc] for o, bc in zip(orders, b)]), ctx))
    return out


def _finite(F: np.ndarray, name: str, rows: np.ndarray) -> None:
    ok = np.all(np.isfinite(F), axis=1)
    if not ok.all():
        raise BadInputError(f"{name}: row {int(rows[np.flatnonzero(~ok)[0]])} holds NaN or inf")


def select_many(methods: Sequence[str], views: Sequence, labels: np.ndarray, n_classes: int,
                rates: Sequence[float], *, engine: Engine, seed: int = 0, view: int = 0, names=None,
                keep_stats: bool = True) -> tuple[list[Selection], RamAplStats | None]:
    """Run several methods, sharing the one streaming RAM/APL pass between ram-apl, ram, min and concat."""
    ctx = Context(labels, n_classes)
    stats = None
    if keep_stats and any(m in ("ram-apl", "ram", "concat") for m in methods):
        stats = ram_apl_stats(views, ctx, engine, names)
    sels: list[Selection] = []
    for m in methods:
        sels.extend(run_method(m, views, ctx, rates, engine=engine, seed=seed, view=view, stats=stats, names=names))
    return sels, stats
