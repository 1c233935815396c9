"""The embedded unlearning demo: generated classification task, memorising MLP, retrain gold standard,
27 forget-set fine-tunes, and every merge method side by side (SalUn-style metrics).

Nothing is downloaded: the data come from ``sklearn.datasets.make_classification``. Metrics, in percent:
accuracy on the retain, forget and test sets; MIA-efficacy (an RBF SVC on the true-class confidence,
trained to separate retain members from test non-members; the score is the fraction of forget samples
it calls non-members, SalUn's ``SVC_MIA``); Avg.Gap = mean |metric - Retrain's metric| over the four.

Every random stream comes from ``core.seed.derive(seed, stage, ...)`` (see :func:`run_seed`), so each stage
run alone gives the numbers it gives inside the demo; nothing reads or seeds the global generators.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import statistics
import time
from dataclasses import asdict
from typing import Callable

from icmltools.core.errors import BadInputError
from icmltools.core.seed import as_stream, derive

from . import merge as M
from . import search as S
from .options import DEMO_METHODS as MERGE_METHODS
from .options import DemoConfig

log = logging.getLogger(__name__)

__all__ = ["MERGE_METHODS", "DemoConfig", "make_data", "train_from_scratch", "finetune_on_forget", "Evaluator",
           "run_seed", "run_demo"]


# --------------------------------------------------------------------------------------------- data, model


def make_data(cfg: DemoConfig, seed: int, device: str = "cpu") -> dict:
    """Generated task: standardised features; test / retain / forget tensors.

    Streams: the task from ``derive(seed, "data", "generate")``, the test/forget splits from
    ``derive(seed, "data", "split")``."""
    import torch
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=cfg.n_samples, n_features=cfg.n_features, n_informative=cfg.n_informative,
                               n_redundant=cfg.n_redundant, n_classes=cfg.n_classes,
                               n_clusters_per_class=cfg.n_clusters_per_class, class_sep=cfg.class_sep,
                               flip_y=cfg.flip_y, random_state=derive(seed, "data", "generate").int(32))
    rng = derive(seed, "data", "split").numpy()
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


def _empty_mlp(cfg: DemoConfig, device: str = "cpu"):
    """The MLP with uninitialised weights (no random number drawn), to load a state_dict into."""
    import torch

    with torch.device("meta"):
        model = make_mlp(cfg)
    return model.to_empty(device=device)


def _mlp_from(cfg: DemoConfig, state: dict, device: str = "cpu"):
    """The MLP holding `state`."""
    model = _empty_mlp(cfg, device)
    model.load_state_dict(state)
    return model


def _batches(n: int, batch: int, gen, device):
    import torch

    perm = torch.randperm(n, generator=gen).to(device)
    for i in range(0, n, batch):
        yield perm[i:i + batch]


def _fit(model, opt, lossf, X, y, epochs: int, batch: int, gen, device, sched=None) -> dict:
    """`epochs` passes of minibatch steps over (X, y) in the order drawn from `gen`; returns the state_dict."""
    model.train()
    for _ in range(epochs):
        for idx in _batches(len(y), batch, gen, device):
            opt.zero_grad(set_to_none=True)
            lossf(model(X[idx]), y[idx]).backward()
            opt.step()
            if sched is not None:
                sched.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_from_scratch(cfg: DemoConfig, X, y, seed, device: str = "cpu"):
    """The memorising MLP (original on retain+forget, or retrain on retain only): Adam, cross-entropy.

    `seed` is an int or a Stream; the initial weights come from its child "init", the batch order from
    its child "batches" (the demo gives original and retrain the same stream: they differ only in data)."""
    import torch

    s = as_stream(seed)
    with s.child("init").torch_init():
        model = make_mlp(cfg)
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    return _fit(model, opt, torch.nn.CrossEntropyLoss(), X, y, cfg.epochs, cfg.batch, s.child("batches").torch(),
                device)


def finetune_on_forget(cfg: DemoConfig, original: dict, X, y, epochs: int, wd: float, ls: float, seed,
                       device: str = "cpu"):
    """One candidate: SGD(momentum) with per-step cosine decay on the forget set; `seed` (int or Stream)
    draws the batch order."""
    import torch

    model = _mlp_from(cfg, original, device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.ft_lr, momentum=cfg.ft_momentum, weight_decay=wd)
    steps = epochs * ((len(y) + cfg.ft_batch - 1) // cfg.ft_batch)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    lossf = torch.nn.CrossEntropyLoss(label_smoothing=ls)
    return _fit(model, opt, lossf, X, y, epochs, cfg.ft_batch, as_stream(seed).torch(), device, sched)


class Evaluator:
    """Accuracy and confidence of a state_dict on the demo's splits (one reusable module)."""

    def __init__(self, cfg: DemoConfig, data: dict, device: str = "cpu"):
        self.model = _empty_mlp(cfg, device).eval()
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
        """SalUn SVC_MIA (confidence): SVC on retain members vs test non-members; % of forget called non-member.

        The member subsample comes from ``derive(seed, "mia")``: the same for every model of a seed."""
        import numpy as np
        from sklearn.svm import SVC

        c_re, c_te, c_fo = (self.confidence(sd, s) for s in ("retain", "test", "forget"))
        rng = derive(seed, "mia").numpy()
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
    """SalUn's Avg.Gap: mean |metric - Retrain's metric| over retain/forget/test accuracy and MIA-efficacy."""
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


@contextlib.contextmanager
def _timed(times: dict, key: str):
    t0 = time.perf_counter()
    yield
    times[key] = time.perf_counter() - t0


def train_pair(cfg: DemoConfig, data: dict, seed: int, device: str = "cpu", progress: Callable | None = None):
    """(original, retrain): the MLP on retain + forget, and the gold standard on retain only; both from
    the stream ``derive(seed, "train")`` (same initial weights and batch order, different data)."""
    import torch

    prog = progress or (lambda *a: None)
    (Xr, yr), (Xf, yf) = data["retain"], data["forget"]
    prog("train original + retrain", 0, 2)
    original = train_from_scratch(cfg, torch.cat([Xr, Xf]), torch.cat([yr, yf]), derive(seed, "train"), device)
    prog("train original + retrain", 1, 2)
    retrain = train_from_scratch(cfg, Xr, yr, derive(seed, "train"), device)
    prog("train original + retrain", 2, 2)
    return original, retrain


def candidate_grid(cfg: DemoConfig) -> list[dict]:
    """The candidates' fine-tuning hyperparameters: epochs x weight decay x label smoothing, in that order."""
    return [{"epochs": ep, "weight_decay": wd, "label_smoothing": ls}
            for ep, wd, ls in itertools.product(cfg.ft_epochs, cfg.ft_weight_decay, cfg.ft_label_smoothing)]


def finetune_candidates(cfg: DemoConfig, original: dict, data: dict, seed: int, device: str = "cpu",
                        progress: Callable | None = None) -> list[dict]:
    """The N candidates (forget-set fine-tunes of `original`); candidate i's batches from
    ``derive(seed, "finetune", i)``."""
    prog = progress or (lambda *a: None)
    Xf, yf = data["forget"]
    grid = candidate_grid(cfg)
    cands = []
    for i, hp in enumerate(grid):
        cand = finetune_on_forget(cfg, original, Xf, yf, hp["epochs"], hp["weight_decay"], hp["label_smoothing"],
                                  derive(seed, "finetune", i), device)
        _check_diverged(cand, i, hp)
        cands.append(cand)
        prog("fine-tune candidates", i + 1, len(grid))
    return cands


def _check_diverged(state: dict, i: int, hp: dict) -> None:
    """A fine-tune whose weights went NaN/inf (a weight decay too large for the learning rate) is the
    pool's fault: refused, naming the candidate, before it reaches a merge."""
    from icmltools.taskvec import all_finite

    if all(all_finite(v) for v in state.values() if v.is_floating_point()):
        return
    raise BadInputError(f"candidate {i} (epochs {hp['epochs']}, weight decay {hp['weight_decay']:g}, label "
                        f"smoothing {hp['label_smoothing']:g}) diverged to NaN/inf weights; use a smaller weight "
                        "decay", param="pool")


class LambdaSearch:
    """The official rule on the demo's built-in evaluator: theta = theta_pre - lam * tau over cfg.lam_grid,
    lowest forget accuracy with retain >= ratio x the original's (:func:`search.search`)."""

    def __init__(self, cfg: DemoConfig, ev: Evaluator, original: dict):
        self.cfg, self.ev, self.original = cfg, ev, original
        self.orig_sel = ev.selection(original)
        self.grid = list(cfg.lam_grid)

    def __call__(self, tau):
        def evaluate(lam):
            if lam == 0:
                return dict(self.orig_sel)
            return self.ev.selection(M.apply_to_state_dict(self.original, tau, lam))

        return S.search(evaluate, self.grid, self.orig_sel["retain_acc"], self.cfg.retain_ratio,
                        patience=self.cfg.patience)


def search_single_task_vectors(search: LambdaSearch, cands: list, hps: list, device: str = "cpu",
                               progress: Callable | None = None) -> list[dict]:
    """Each candidate alone (task arithmetic) with its own lambda search: one row per candidate."""
    prog = progress or (lambda *a: None)
    rows_out = []
    for i, c in enumerate(cands):
        tau, _ = merge_in_memory(search.original, [c], M.MergeConfig("task_arithmetic"), device)
        rows, sel = search(tau)
        r = rows[sel.index]
        rows_out.append({"index": i, **hps[i], "lam": sel.lam, "feasible": sel.feasible,
                         "lam_at_grid_end": sel.lam == search.grid[-1],
                         "sel_forget_acc": r["forget_acc"], "sel_retain_acc": r["retain_acc"], "_tau": tau})
        prog("lambda search: single task vectors", i + 1, len(cands))
    return rows_out


def best_and_median(cand_rows: list[dict]) -> tuple[dict, dict]:
    """Validation ranking: lowest forget accuracy at the selected lambda, then higher retain, then index."""
    ranked = sorted(cand_rows, key=lambda r: (r["sel_forget_acc"], -r["sel_retain_acc"], r["index"]))
    return ranked[0], ranked[(len(ranked) - 1) // 2]


def search_merges(cfg: DemoConfig, search: LambdaSearch, cands: list, seed: int, device: str = "cpu",
                  progress: Callable | None = None) -> list[tuple]:
    """Every merge of cfg.methods with its lambda search: (name, unlearned state_dict, extra) per method."""
    prog = progress or (lambda *a: None)
    entries = []
    for j, meth in enumerate(cfg.methods):
        mc = M.MergeConfig(meth, ties_k=cfg.ties_k, dare_p=cfg.dare_p, seed=seed)
        tau, st = merge_in_memory(search.original, cands, mc, device)
        rows, sel = search(tau)
        name = meth if cfg.dare_p == 0 else f"{meth}+dare"
        entries.append((name, M.apply_to_state_dict(search.original, tau, sel.lam),
                        {"lam": sel.lam, "feasible": sel.feasible, "kept_fraction": st.kept_fraction,
                         "lambda_curve": [{"lam": r["lam"], "forget_acc": r["forget_acc"],
                                           "retain_acc": r["retain_acc"]} for r in rows]}))
        prog("lambda search: merges", j + 1, len(cfg.methods))
    return entries


def score_candidates(ev: Evaluator, original: dict, cand_rows: list[dict], ref: dict, seed: int) -> list[float]:
    """Every single task vector at its own selected lambda (full metrics and Avg.Gap into its row), so a merge
    can be placed within the whole distribution of "pick one candidate" outcomes; returns the Avg.Gaps."""
    for r in cand_rows:
        m = ev.full(M.apply_to_state_dict(original, r["_tau"], r["lam"]), seed)
        r.update({**m, "avg_gap": avg_gap(m, ref)})
    return [r["avg_gap"] for r in cand_rows]


def score_methods(ev: Evaluator, entries: list[tuple], cand_rows: list[dict], ref: dict, seed: int) -> list[dict]:
    """The method rows: metrics, Avg.Gap to retrain and the fraction of single task vectors each beats.
    An entry with state None is a single candidate (its row's metrics are reused)."""
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
    return methods


def run_seed(cfg: DemoConfig, seed: int, device: str = "cpu", progress: Callable | None = None,
             keep_models: bool = False) -> dict:
    """One seed of the demo; returns {"methods": [...], "candidates": [...], ...} (metrics in percent).

    Stages and their streams: data ``derive(seed, "data", ...)``, original and retrain ``(seed, "train")``,
    candidate i ``(seed, "finetune", i)``, DARE ``(seed, "dare", tensor, i)``, MIA ``(seed, "mia")``."""
    times: dict = {}
    with _timed(times, "train_s"):
        data = make_data(cfg, seed, device)
        original, retrain = train_pair(cfg, data, seed, device, progress)
    with _timed(times, "finetune_s"):
        hps = candidate_grid(cfg)
        cands = finetune_candidates(cfg, original, data, seed, device, progress)
    with _timed(times, "search_s"):
        ev = Evaluator(cfg, data, device)
        search = LambdaSearch(cfg, ev, original)
        cand_rows = search_single_task_vectors(search, cands, hps, device, progress)
        entries = [("original", original, {}), ("retrain", retrain, {})]
        for name, row in zip(("task_arithmetic_best", "task_arithmetic_median"), best_and_median(cand_rows)):
            # scored with the other single task vectors (state None = take the candidate's metrics)
            entries.append((name, None, {"lam": row["lam"], "candidate": row["index"], "feasible": row["feasible"],
                                         "hyperparameters": hps[row["index"]]}))
        entries += search_merges(cfg, search, cands, seed, device, progress)
    with _timed(times, "metrics_s"):
        ref = ev.full(retrain, seed)
        cand_gaps = score_candidates(ev, original, cand_rows, ref, seed)
        methods = score_methods(ev, entries, cand_rows, ref, seed)
    out = {"seed": seed, "methods": methods,
           "candidates": [{k: v for k, v in r.items() if k != "_tau"} for r in cand_rows],
           "single_task_vectors": gap_summary(cand_gaps), "timing": times}
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
