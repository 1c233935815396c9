"""The embedded unlearning demo: generated classification task, memorising MLP, retrain gold standard,
27 forget-set fine-tunes, and every merge method side by side (SalUn-style metrics).

Nothing is downloaded: the data come from ``sklearn.datasets.make_classification``. Metrics, in percent:
accuracy on the retain, forget and test sets; MIA-efficacy (an RBF SVC on the true-class confidence,
trained to separate retain members from test non-members; the score is the fraction of forget samples
it calls non-members, SalUn's ``SVC_MIA``); Avg.Gap = mean |metric - Retrain's metric| over the four.
"""
from __future__ import annotations

import itertools
import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from . import merge as M
from . import search as S

log = logging.getLogger(__name__)

MERGE_METHODS = ("negmerge", "uniform", "ties", "magmax")


@dataclass(frozen=True)
class DemoConfig:
    # data (spec: make_classification, standardised, 1000 test, forget 10 % of train)
    n_samples: int = 4000
    n_features: int = 64
    n_informative: int = 24
    n_redundant: int = 8
    n_classes: int = 10
    n_clusters_per_class: int = 2
    class_sep: float = 1.2
    flip_y: float = 0.02
    n_test: int = 1000
    forget_frac: float = 0.10
    # original / retrain: MLP 64-256-256-10, Adam 1e-3, 40 epochs
    hidden: int = 256
    epochs: int = 40
    lr: float = 1e-3
    batch: int = 128
    # candidates: SGD momentum 0.9, cosine, lr 0.05, batch 32, epochs x weight decay x label smoothing
    ft_epochs: tuple = (5, 10, 20)
    ft_weight_decay: tuple = (0.0, 5e-4, 5e-3)
    ft_label_smoothing: tuple = (0.0, 0.05, 0.1)
    ft_lr: float = 0.05
    ft_batch: int = 32
    ft_momentum: float = 0.9
    # lambda search and merges
    # 0 .. 10 step 0.05: the selection rule needs a grid fine enough to resolve where each method's retain
    # accuracy crosses 0.95 x the original's (from ~0.3 for MagMax to ~9 for the weakest candidates) and wide
    # enough not to stop the weak candidates at the grid's end; a coarse grid (0 .. 6 step 0.25) picked
    # MagMax at its first non-zero point and stopped 4 of the 27 candidates at its end (seed 0).
    lam_grid: tuple = tuple(round(0.05 * i, 2) for i in range(201))
    retain_ratio: float = 0.95
    patience: int = 3             # stop a lambda search after 3 consecutive grid points below the retain threshold
    methods: tuple = MERGE_METHODS
    ties_k: float = 0.2
    dare_p: float = 0.0

    @classmethod
    def preset(cls, name: str, **overrides) -> "DemoConfig":
        """`quick` (the spec's demo, the default) or `tiny` (a seconds-long smoke run: smaller task,
        8 candidates, coarse grid)."""
        if name == "quick":
            return cls(**overrides)
        if name == "tiny":
            base = dict(n_samples=1500, n_test=400, hidden=128, epochs=30, ft_epochs=(5, 10), ft_weight_decay=(0.0, 5e-3),
                        ft_label_smoothing=(0.0, 0.1), lam_grid=tuple(0.5 * i for i in range(9)))
            base.update(overrides)
            return cls(**base)
        raise ValueError(f"unknown demo preset {name!r}")

    @property
    def n_candidates(self) -> int:
        return len(self.ft_epochs) * len(self.ft_weight_decay) * len(self.ft_label_smoothing)


# --------------------------------------------------------------------------------------------- data, model


def make_data(cfg: DemoConfig, seed: int, device: str = "cpu") -> dict:
    """Generated task: standardised features; test / retain / forget tensors."""
    import numpy as np
    import torch
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=cfg.n_samples, n_features=cfg.n_features, n_informative=cfg.n_informative,
                               n_redundant=cfg.n_redundant, n_classes=cfg.n_classes,
                               n_clusters_per_class=cfg.n_clusters_per_class, class_sep=cfg.class_sep,
                               flip_y=cfg.flip_y, random_state=seed)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    te, tr = perm[: cfg.n_test], perm[cfg.n_test:]
    mu, sd = X[tr].mean(0), X[tr].std(0) + 1e-8
    X = (X - mu) / sd
    n_forget = int(round(cfg.forget_frac * len(tr)))
    fperm = rng.permutation(len(tr))
    fo, re = tr[fperm[:n_forget]], tr[fperm[n_forget:]]

    def t(idx):
        return (torch.tensor(X[idx], dtype=torch.float32, device=device),
                torch.tensor(y[idx], dtype=torch.long, device=device))

    return {"retain": t(re), "forget": t(fo), "test": t(te)}


def make_mlp(cfg: DemoConfig):
    import torch.nn as nn

    h = cfg.hidden
    return nn.Sequential(nn.Linear(cfg.n_features, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, cfg.n_classes))


def _batches(n: int, batch: int, gen, device):
    import torch

    perm = torch.randperm(n, generator=gen).to(device)
    for i in range(0, n, batch):
        yield perm[i:i + batch]


def train_from_scratch(cfg: DemoConfig, X, y, seed: int, device: str = "cpu"):
    """The memorising MLP (original on retain+forget, or retrain on retain only): Adam, cross-entropy."""
    import torch

    torch.manual_seed(seed)
    model = make_mlp(cfg).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(seed + 1)
    lossf = torch.nn.CrossEntropyLoss()
    model.train()
    for _ in range(cfg.epochs):
        for idx in _batches(len(y), cfg.batch, gen, device):
            opt.zero_grad(set_to_none=True)
            lossf(model(X[idx]), y[idx]).backward()
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def finetune_on_forget(cfg: DemoConfig, original: dict, X, y, epochs: int, wd: float, ls: float, seed: int,
                       device: str = "cpu"):
    """One candidate: SGD(momentum) with per-step cosine decay on the forget set."""
    import torch

    model = make_mlp(cfg).to(device)
    model.load_state_dict(original)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.ft_lr, momentum=cfg.ft_momentum, weight_decay=wd)
    steps = epochs * ((len(y) + cfg.ft_batch - 1) // cfg.ft_batch)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    gen = torch.Generator().manual_seed(seed)
    lossf = torch.nn.CrossEntropyLoss(label_smoothing=ls)
    model.train()
    for _ in range(epochs):
        for idx in _batches(len(y), cfg.ft_batch, gen, device):
            opt.zero_grad(set_to_none=True)
            lossf(model(X[idx]), y[idx]).backward()
            opt.step()
            sched.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Evaluator:
    """Accuracy and confidence of a state_dict on the demo's splits (one reusable module)."""

    def __init__(self, cfg: DemoConfig, data: dict, device: str = "cpu"):
        self.model = make_mlp(cfg).to(device).eval()
        self.data = data

    def _logits(self, sd, X):
        import torch

        self.model.load_state_dict(sd)
        with torch.no_grad():
            return self.model(X)

    def acc(self, sd, split: str) -> float:
        X, y = self.data[split]
        return float((self._logits(sd, X).argmax(1) == y).float().mean()) * 100.0

    def confidence(self, sd, split: str):
        import torch

        X, y = self.data[split]
        p = torch.softmax(self._logits(sd, X), dim=1)
        return p.gather(1, y[:, None]).squeeze(1).cpu().numpy()

    def selection(self, sd) -> dict:
        """The built-in evaluator of the lambda search: forget and retain (control) accuracy."""
        return {"forget_acc": self.acc(sd, "forget"), "retain_acc": self.acc(sd, "retain")}

    def mia_efficacy(self, sd, seed: int) -> float:
        """SalUn SVC_MIA (confidence): SVC on retain members vs test non-members; % of forget called non-member."""
        import numpy as np
        from sklearn.svm import SVC

        c_re, c_te, c_fo = (self.confidence(sd, s) for s in ("retain", "test", "forget"))
        rng = np.random.default_rng(seed)
        n = min(len(c_re), len(c_te))
        members = c_re[rng.choice(len(c_re), size=n, replace=False)]
        Xs = np.concatenate([members, c_te[:n]])[:, None]
        ys = np.concatenate([np.ones(n), np.zeros(n)])
        clf = SVC(C=3, gamma="auto", kernel="rbf")
        clf.fit(Xs, ys)
        return float((clf.predict(c_fo[:, None]) == 0).mean()) * 100.0

    def full(self, sd, seed: int) -> dict:
        return {"retain_acc": self.acc(sd, "retain"), "forget_acc": self.acc(sd, "forget"),
                "test_acc": self.acc(sd, "test"), "mia": self.mia_efficacy(sd, seed)}


GAP_KEYS = ("retain_acc", "forget_acc", "test_acc", "mia")


def avg_gap(m: dict, ref: dict) -> float:
    return sum(abs(m[k] - ref[k]) for k in GAP_KEYS) / len(GAP_KEYS)


def gap_summary(gaps: list[float]) -> dict:
    """Avg.Gap over the single task vectors (each at its own selected lambda): min, quartiles, median, max."""
    import numpy as np

    q = np.quantile(np.asarray(gaps, float), [0.0, 0.25, 0.5, 0.75, 1.0])
    return {"n": len(gaps), "avg_gap_min": float(q[0]), "avg_gap_q25": float(q[1]), "avg_gap_median": float(q[2]),
            "avg_gap_q75": float(q[3]), "avg_gap_max": float(q[4])}


# --------------------------------------------------------------------------------------------- the run


def merge_in_memory(base: dict, candidates: list, cfg: M.MergeConfig, device: str = "cpu"):
    """The same streamed merge as for files, over in-memory state_dicts."""
    from icmltools.taskvec import MemoryReader

    return M.merged_task_vector(MemoryReader(base), [MemoryReader(c) for c in candidates], cfg, device=device)


@dataclass
class SeedResult:
    seed: int
    methods: list
    candidates: list
    timing: dict = field(default_factory=dict)


def run_seed(cfg: DemoConfig, seed: int, device: str = "cpu", progress: Callable | None = None,
             keep_models: bool = False) -> dict:
    """One seed of the demo; returns {"methods": [...], "candidates": [...], ...} (metrics in percent)."""
    import torch

    prog = progress or (lambda *a: None)
    times = {}
    t0 = time.perf_counter()
    data = make_data(cfg, seed, device)
    Xr, yr = data["retain"]
    Xf, yf = data["forget"]
    Xtr, ytr = torch.cat([Xr, Xf]), torch.cat([yr, yf])
    prog("train original + retrain", 0, 2)
    original = train_from_scratch(cfg, Xtr, ytr, seed, device)
    prog("train original + retrain", 1, 2)
    retrain = train_from_scratch(cfg, Xr, yr, seed, device)
    prog("train original + retrain", 2, 2)
    times["train_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    grid = list(itertools.product(cfg.ft_epochs, cfg.ft_weight_decay, cfg.ft_label_smoothing))
    cands, hps = [], []
    for i, (ep, wd, ls) in enumerate(grid):
        cands.append(finetune_on_forget(cfg, original, Xf, yf, ep, wd, ls, seed * 1000 + i, device))
        hps.append({"epochs": ep, "weight_decay": wd, "label_smoothing": ls})
        prog("fine-tune candidates", i + 1, len(grid))
    times["finetune_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    ev = Evaluator(cfg, data, device)
    orig_sel = ev.selection(original)
    lam_grid = list(cfg.lam_grid)

    def searched(tau):
        def evaluate(lam):
            if lam == 0:
                return dict(orig_sel)
            return ev.selection(M.apply_to_state_dict(original, tau, lam))
        return S.search(evaluate, lam_grid, orig_sel["retain_acc"], cfg.retain_ratio, patience=cfg.patience)

    # single task vectors (task arithmetic), each with its own lambda search
    cand_rows = []
    for i, c in enumerate(cands):
        tau, st = merge_in_memory(original, [c], M.MergeConfig("task_arithmetic"), device)
        rows, sel = searched(tau)
        r = rows[sel.index]
        cand_rows.append({"index": i, **hps[i], "lam": sel.lam, "feasible": sel.feasible,
                          "lam_at_grid_end": sel.lam == lam_grid[-1],
                          "sel_forget_acc": r["forget_acc"], "sel_retain_acc": r["retain_acc"], "_tau": tau})
        prog("lambda search: single task vectors", i + 1, len(cands))
    # validation ranking: lowest forget accuracy at the selected lambda, then higher retain
    ranked = sorted(cand_rows, key=lambda r: (r["sel_forget_acc"], -r["sel_retain_acc"], r["index"]))
    best, median = ranked[0], ranked[(len(ranked) - 1) // 2]

    entries = []  # (name, state_dict or None for a single candidate, extra)
    entries.append(("original", original, {}))
    entries.append(("retrain", retrain, {}))
    for name, row in (("task_arithmetic_best", best), ("task_arithmetic_median", median)):
        # scored with the other single task vectors below (entry state None = take the candidate's metrics)
        entries.append((name, None,
                        {"lam": row["lam"], "candidate": row["index"], "feasible": row["feasible"],
                         "hyperparameters": hps[row["index"]]}))
    for j, meth in enumerate(cfg.methods):
        mc = M.MergeConfig(meth, ties_k=cfg.ties_k, dare_p=cfg.dare_p, seed=seed)
        tau, st = merge_in_memory(original, cands, mc, device)
        rows, sel = searched(tau)
        name = meth if cfg.dare_p == 0 else f"{meth}+dare"
        entries.append((name, M.apply_to_state_dict(original, tau, sel.lam),
                        {"lam": sel.lam, "feasible": sel.feasible, "kept_fraction": st.kept_fraction,
                         "lambda_curve": [{"lam": r["lam"], "forget_acc": r["forget_acc"],
                                           "retain_acc": r["retain_acc"]} for r in rows]}))
        prog("lambda search: merges", j + 1, len(cfg.methods))
    times["search_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    ref = ev.full(retrain, seed)
    # every single task vector at its own selected lambda, so a merge can be placed within the whole
    # distribution of "pick one candidate" outcomes (not only against the best and the median-ranked one)
    for r in cand_rows:
        m = ev.full(M.apply_to_state_dict(original, r["_tau"], r["lam"]), seed)
        r.update({**m, "avg_gap": avg_gap(m, ref)})
    cand_gaps = [r["avg_gap"] for r in cand_rows]
    methods = []
    for name, sd, extra in entries:
        if name == "retrain":
            m = ref
        elif sd is None:
            m = {k: cand_rows[extra["candidate"]][k] for k in GAP_KEYS}
        else:
            m = ev.full(sd, seed)
        row = {"method": name, **m, "avg_gap": avg_gap(m, ref)}
        row["beats_candidates"] = sum(g > row["avg_gap"] for g in cand_gaps) / len(cand_gaps)
        row.update(extra)
        methods.append(row)
    times["metrics_s"] = time.perf_counter() - t0
    out = {"seed": seed, "methods": methods,
           "candidates": [{k: v for k, v in r.items() if k != "_tau"} for r in cand_rows],
           "single_task_vectors": gap_summary(cand_gaps),
           "timing": times}
    if keep_models:
        out["_models"] = {"original": original, "retrain": retrain, "candidates": cands}
    return out


def aggregate(per_seed: list[dict]) -> list[dict]:
    """Mean (and sd over seeds) of every metric, per method, in the order of the first seed."""
    names = [m["method"] for m in per_seed[0]["methods"]]
    out = []
    for name in names:
        rows = [next(m for m in s["methods"] if m["method"] == name) for s in per_seed]
        agg = {"method": name}
        for k in GAP_KEYS + ("avg_gap",):
            vals = [r[k] for r in rows]
            agg[k] = statistics.fmean(vals)
            if len(vals) > 1:
                agg[k + "_sd"] = statistics.stdev(vals)
        agg["beats_candidates"] = statistics.fmean(r["beats_candidates"] for r in rows)
        for k in ("lam", "kept_fraction"):
            if k in rows[0]:
                agg[k] = [r[k] for r in rows] if len(rows) > 1 else rows[0][k]
        out.append(agg)
    return out


def run_demo(cfg: DemoConfig, seeds: list[int], device: str = "cpu", progress: Callable | None = None,
             keep_models: bool = False) -> dict:
    """The demo over `seeds`: per-seed tables and the mean per method ("methods", the contract for scripts)."""
    per_seed = [run_seed(cfg, s, device, progress, keep_models=keep_models and i == 0) for i, s in enumerate(seeds)]
    models = per_seed[0].pop("_models", None)
    methods = per_seed[0]["methods"] if len(per_seed) == 1 else aggregate(per_seed)
    single = per_seed[0]["single_task_vectors"] if len(per_seed) == 1 else {
        "n": per_seed[0]["single_task_vectors"]["n"],
        **{k: statistics.fmean(s["single_task_vectors"][k] for s in per_seed)
           for k in per_seed[0]["single_task_vectors"] if k != "n"}}
    cfgd = asdict(cfg)
    return {"mode": "demo", "units": "percent", "config": cfgd, "seeds": list(seeds), "methods": methods,
            "single_task_vectors": single,
            "per_seed": per_seed if len(per_seed) > 1 else None,
            "candidates": per_seed[0]["candidates"] if len(per_seed) == 1 else None,
            "selection_rule": f"lowest forget_acc with retain_acc >= {cfg.retain_ratio} x original's, over lam_grid",
            **({"_models": models} if models is not None else {})}
