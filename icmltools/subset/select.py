"""One-shot, class-balanced subset selection: RAM-APL (Wan et al., ICML 2025) and its baselines.

Every method takes K feature views (arrays or zero-argument callables that open one, e.g. a
memory-mapped `.npy`; only one view is opened at a time), integer labels 0..C-1 and a list of rates, and
returns, per rate, the sorted selected indices. Per-class budgets are Python `round(n_c * p)` as in the
official code (moderate-DS: `int(n_c * p)` as in its official code).

Methods are small functions in a registry (`REGISTRY`, one `@method(name, cite)` line each, in the order
of `options.METHODS`); `run_method` looks the name up, never branches on it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from icmltools.core.errors import BadInputError

from . import options
from .engine import Engine
from .io import nonfinite_error

METHODS = options.METHODS


def weights(p: float, a: float = options.WEIGHT_A, k: float = options.WEIGHT_K,
            sr: float = options.WEIGHT_SR) -> tuple[float, float]:
    """RAM-APL's rate-dependent weights (official `weight_functions`; paper, RAM-APL score):
    W1 = a + (1 - a) / (1 + exp(k (p - sr))), W2 = 1 - W1, with a = 0.2, k = 1, sr = 0.5 (0.6 / 0.4 at p = 0.5)."""
    w1 = a + (1.0 - a) * (1.0 / (1.0 + math.exp(k * (p - sr))))
    return w1, 1.0 - w1


def budgets(counts: np.ndarray, p: float, rounding: str = "round") -> np.ndarray:
    """Per-class budgets: Python round(n_c * p) (banker's rounding), or int() for moderate-DS."""
    f = round if rounding == "round" else int
    return np.asarray([f(int(n) * p) for n in counts], dtype=np.int64)


def check_rate(p: float) -> float:
    p = float(p)
    if not (0.0 < p <= 1.0) or not math.isfinite(p):
        raise BadInputError(f"{p} must lie in (0, 1]", param="rates")
    return p


def _roundings(methods: Sequence[str]) -> tuple:
    """The budget roundings `methods` use: round() for all, int() for moderate-DS."""
    return ("round",) + (("int",) if "moderate" in methods else ())


def min_rate(n: int, methods: Sequence[str]) -> float:
    """The smallest rate with 3 significant digits at which every method keeps at least one of `n` samples
    (round(n p) >= 1 needs n p > 0.5: round(0.5) is 0; moderate-DS's int(n p) >= 1 needs n p >= 1)."""
    p = (1.0 if "moderate" in methods else 0.5) / n
    e = math.floor(math.log10(p)) - 2  # q = k * 10^e, written as the decimal number a user would type

    def dec(k: int) -> float:
        return k * 10.0 ** e if e >= 0 else k / 10 ** -e

    k = math.ceil(round(p / dec(1), 6))
    while dec(k) < 1.0 and any(budgets([n], dec(k), r)[0] < 1 for r in _roundings(methods)):
        k += 1
    return min(dec(k), 1.0)


def check_budgets(counts: np.ndarray, rates: Sequence[float], methods: Sequence[str], class_names=None,
                  after: str = "") -> None:
    """Refuse a rate at which some method keeps no sample of some class (a class-balanced subset without a
    class trains a classifier that cannot predict it; no sample at all cannot train one): the error names
    the class, its size and the smallest rate that keeps every class for this data."""
    counts = np.asarray(counts)
    c = int(np.argmin(counts))
    n = int(counts[c])
    for p in rates:
        for r in _roundings(methods):
            if budgets([n], p, r)[0] < 1:
                name = class_names[c] if class_names is not None else c
                f = "round" if r == "round" else "int"
                raise BadInputError(
                    f"{p:g} keeps no sample of class {name!r} ({n} samples{after}: {f}({n} x {p:g}) = 0); the "
                    f"smallest rate that keeps every class here is {min_rate(n, methods):g}", param="rates")


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

    Official code (`ram_apl.py`, `RAM_APL.select` and `get_distance_rank`): class means mu_{k,c} over all
    samples of the ground-truth class c; APL_j = (1/K) sum_k [argmin_c ||f_k(x_j) - mu_{k,c}|| != y_j] (the
    accuracy of pseudo-class labels, as an error fraction); RAM_j = (1/K) sum_k rank_k(j) / n_{y_j}, with
    rank_k(j) the 0-based rank of ||f_k(x_j) - mu_{k,y_j}|| within class y_j (ranking mean).
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
        if not np.all(np.isfinite(own)):
            raise _overflow(name, X, np.flatnonzero(~np.isfinite(own))[:1])
        del X
        wrong += (pred != ctx.labels)
        rank_sum += within_class_rank(ctx, own)
        dists.append(own)
    K = len(views)
    ram = (rank_sum / K) / ctx.counts[ctx.labels]
    return RamAplStats(ram=ram, apl=wrong / K, dist=dists)


def ram_apl_score(stats: RamAplStats, p: float) -> np.ndarray:
    """Score_j = W1(p) RAM_j + W2(p) APL_j (official `get_selected_idx`); the lowest scores are kept."""
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


@dataclass
class Job:
    """One method's inputs: the views, class structure, rates, engine, the int seed of the DeepCore-style
    random choices, the single-view baselines' view, and the shared RAM/APL pass when there is one."""

    name: str
    views: Sequence
    ctx: Context
    rates: list
    engine: Engine
    seed: int = 0
    view: int = 0
    names: Sequence[str] | None = None
    stats: RamAplStats | None = None
    graphcut_lambda: float = 1.0

    def view_name(self, k: int | None = None) -> str:
        k = self.view if k is None else k
        return self.names[k] if self.names else f"view {k}"

    def ram_apl(self) -> RamAplStats:
        if self.stats is None:
            self.stats = ram_apl_stats(self.views, self.ctx, self.engine, self.names)
        return self.stats

    def by_score(self, score: np.ndarray, w: Callable[[float], dict] | None = None) -> list[Selection]:
        """Per rate: the per-class lowest `score` (w(p) gives the weights to report)."""
        return [_pack(self.name, p, select_by_score(self.ctx, score, p), self.ctx, w(p) if w else None)
                for p in self.rates]

    def by_order(self, orders: list) -> list[Selection]:
        """Per rate: the first round(n_c p) of each class's greedy order (a smaller budget is a prefix)."""
        out = []
        for p in self.rates:
            b = budgets(self.ctx.counts, p)
            out.append(_pack(self.name, p, np.concatenate([o[:bc] for o, bc in zip(orders, b)]), self.ctx))
        return out


@dataclass(frozen=True)
class Method:
    name: str
    cite: str
    run: Callable[[Job], list]


REGISTRY: dict[str, Method] = {}


def method(name: str, cite: str):
    """Register a selection function `fn(job) -> [Selection per rate]` under `name` with its paper."""
    def deco(fn):
        REGISTRY[name] = Method(name, cite, fn)
        return fn
    return deco


def _ram_apl_weights(p: float) -> dict:
    w1, w2 = weights(p)
    return {"W1": w1, "W2": w2, "a": options.WEIGHT_A, "k": options.WEIGHT_K}


@method("ram-apl", "Wan et al., Foundation Model Insights and a Multi-Model Approach for Superior Fine-Grained "
                   "One-shot Subset Selection, ICML 2025 (RAM + APL)")
def _ram_apl(job: Job) -> list[Selection]:
    """RAM-APL: per class, the lowest W1(p) RAM + W2(p) APL (`ram_apl_score`)."""
    st = job.ram_apl()
    return [_pack(job.name, p, select_by_score(job.ctx, ram_apl_score(st, p), p), job.ctx, _ram_apl_weights(p))
            for p in job.rates]


@method("ram", "Wan et al., ICML 2025: ranking mean (RAM) alone, the ablation without APL")
def _ram(job: Job) -> list[Selection]:
    """RAM alone: per class, the lowest mean within-class distance rank over extractors."""
    return job.by_score(job.ram_apl().ram)


def _own_class_distance(job: Job, ks: Sequence[int]) -> np.ndarray:
    """sqrt(sum_k ||f_k(x) - mu_{k,y}||^2) over views `ks`, from the shared pass or one streaming pass."""
    if job.stats is not None:
        return np.sqrt(sum(job.stats.dist[k] ** 2 for k in ks))
    sq = None
    for k in ks:
        X = _open(job.views[k])
        means = job.engine.class_means(X, job.ctx.labels, job.ctx.n_classes, name=job.view_name(k))
        _, own = job.engine.nearest_mean(X, job.ctx.labels, means, name=job.view_name(k))
        if not np.all(np.isfinite(own)):
            raise _overflow(job.view_name(k), X, np.flatnonzero(~np.isfinite(own))[:1])
        del X
        sq = own * own if sq is None else sq + own * own
    return np.sqrt(sq)


@method("min", "Wan et al., ICML 2025 / Xia et al. 2023 'Moderate coreset' MIN baseline: closest to the class mean")
def _min(job: Job) -> list[Selection]:
    """MIN: per class, the samples closest to their class mean in one extractor (`view`)."""
    if job.stats is not None:
        return job.by_score(job.stats.dist[job.view])
    return job.by_score(_own_class_distance(job, [job.view]))


@method("concat", "Wan et al., ICML 2025: naive multi-model fusion by feature concatenation (then MIN)")
def _concat(job: Job) -> list[Selection]:
    """MIN on the concatenated features: ||[f_1; ...; f_K](x) - mu|| = sqrt(sum_k ||f_k(x) - mu_k||^2)."""
    return job.by_score(_own_class_distance(job, range(len(job.views))))


@method("moderate", "Xia et al., Moderate Coreset: A Universal Method of Data Selection for Real-world "
                    "Data-efficient Deep Learning, ICLR 2023")
def _moderate(job: Job) -> list[Selection]:
    """Moderate-DS (official): distance to the per-dimension median of the class; budget int(n_c p); keep the
    middle band sorted_idx[round(0.5 (n_c - b)) : +b]."""
    X = _open(job.views[job.view])
    ctx, vname = job.ctx, job.view_name()
    dist = [None] * ctx.n_classes
    for c, g in enumerate(ctx.groups):
        F = np.asarray(X[g], dtype=np.float64)
        _finite(F, vname, g)
        dist[c] = np.linalg.norm(F - np.median(F, axis=0), axis=1)
        job.engine.progress(f"moderate ({vname})", c + 1, ctx.n_classes)
    out = []
    for p in job.rates:
        b = budgets(ctx.counts, p, rounding="int")
        idx = []
        for c, g in enumerate(ctx.groups):
            srt = np.argsort(dist[c], kind="stable")
            lo = round(0.5 * (len(g) - b[c]))
            idx.append(g[srt[lo:lo + b[c]]])
        out.append(_pack(job.name, p, np.concatenate(idx), ctx))
    return out


def _greedy(job: Job, order_fn, center: bool = True) -> list[Selection]:
    """Per class, the greedy order up to the largest budget (`order_fn(Xc, budget, class_index, n_c)`)."""
    X = _open(job.views[job.view])
    ctx, vname, eng = job.ctx, job.view_name(), job.engine
    bmax = budgets(ctx.counts, max(job.rates))
    orders = []
    for c, g in enumerate(ctx.groups):
        Xc = eng.class_block(X, g, center=center)
        ok = eng.torch.isfinite((Xc * Xc).sum(dim=1))
        if not bool(ok.all()):
            _finite(np.asarray(X[g]), vname, g)
            raise _overflow(vname, X, g[(~ok).nonzero()[:1, 0].cpu().numpy()])
        orders.append(g[order_fn(Xc, int(bmax[c]), len(g))])
        eng.progress(f"{job.name} ({vname})", c + 1, ctx.n_classes)
    return job.by_order(orders)


@method("kcenter", "Sener & Savarese, Active Learning for Convolutional Neural Networks: A Core-Set Approach, "
                   "ICLR 2018")
def _kcenter(job: Job) -> list[Selection]:
    """k-center greedy per class. The first centre follows DeepCore (it seeds numpy's global generator with
    the seed, then `randint(0, n_c)`, per class): a fresh RandomState(seed), pinned by a parity test."""
    def order(Xc, budget, n):
        start = int(np.random.RandomState(job.seed % 2**32).randint(0, n))
        return job.engine.kcenter_order(Xc, budget, start)
    return _greedy(job, order)


@method("herding", "Welling, Herding Dynamical Weights to Learn, ICML 2009 (argmin form)")
def _herding(job: Job) -> list[Selection]:
    """Herding per class (argmin form; see `Engine.herding_order`)."""
    return _greedy(job, lambda Xc, budget, n: job.engine.herding_order(Xc, budget))


@method("graphcut", "Iyer et al., Submodular Combinatorial Information Measures, ALT 2021 (graph-cut, as in "
                    "DeepCore, Guo et al. 2022)")
def _graphcut(job: Job) -> list[Selection]:
    """Greedy graph-cut per class on cosine similarity (see `Engine.graphcut_order`)."""
    return _greedy(job, lambda Xc, budget, n: job.engine.graphcut_order(Xc, budget, lam=job.graphcut_lambda),
                   center=False)


@method("random", "uniform class-balanced sampling (DeepCore Uniform, balance=True)")
def _random(job: Job) -> list[Selection]:
    """DeepCore Uniform(balance=True): numpy's global generator seeded with the seed, then per class
    choice(round(p n_c)) without replacement; a fresh RandomState(seed) per rate, pinned by a parity test."""
    out = []
    for p in job.rates:
        rs = np.random.RandomState(job.seed % 2**32)
        b = budgets(job.ctx.counts, p)
        idx = [rs.choice(g, int(bc), replace=False) for g, bc in zip(job.ctx.groups, b)]
        out.append(_pack(job.name, p, np.concatenate(idx), job.ctx))
    return out


assert tuple(REGISTRY) == options.METHODS, "the registry and options.METHODS list the same methods in order"
CITATIONS = {name: m.cite for name, m in REGISTRY.items()}


def run_method(method: str, views: Sequence, ctx: Context, rates: Sequence[float], *, engine: Engine,
               seed: int = 0, view: int = 0, stats: RamAplStats | None = None, names=None,
               graphcut_lambda: float = 1.0) -> list[Selection]:
    """Select with `method` at every rate in `rates`. `view` picks the extractor for single-view baselines;
    `seed` (an int) drives the DeepCore-style random choices (random, k-center's first centre)."""
    rates = [check_rate(p) for p in rates]
    if method not in REGISTRY:
        raise BadInputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}", param="methods")
    if not 0 <= view < len(views):
        raise BadInputError(f"{view}: there are only {len(views)} feature views", param="view")
    job = Job(method, views, ctx, rates, engine, seed=int(seed), view=view, names=names, stats=stats,
              graphcut_lambda=graphcut_lambda)
    return REGISTRY[method].run(job)


def _finite(F: np.ndarray, name: str, rows: np.ndarray) -> None:
    ok = np.all(np.isfinite(F), axis=1)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise nonfinite_error(name, int(rows[i]), F[i])


def _overflow(name: str, X, rows) -> BadInputError:
    """Finite features whose distances overflow the working precision (float32 for float32 files)."""
    big = float(np.max(np.abs(np.asarray(X[np.asarray(rows)], dtype=np.float64))))
    return BadInputError(f"{name}: distances overflow (values up to {big:.3g} near row {int(rows[0])}); rescale "
                         "the features (or store them as float64)")


def select_many(methods: Sequence[str], views: Sequence, labels: np.ndarray, n_classes: int,
                rates: Sequence[float], *, engine: Engine, seed: int = 0, view: int = 0, names=None,
                keep_stats: bool = True) -> tuple[list[Selection], RamAplStats | None]:
    """Run several methods, sharing the one streaming RAM/APL pass between ram-apl, ram, min and concat."""
    ctx = Context(labels, n_classes)
    stats = None
    if keep_stats and any(m in options.STATS_METHODS for m in methods):
        stats = ram_apl_stats(views, ctx, engine, names)
    sels: list[Selection] = []
    for m in methods:
        sels.extend(run_method(m, views, ctx, rates, engine=engine, seed=seed, view=view, stats=stats, names=names))
    return sels, stats
