"""The embedded demo: four generated classification tasks on a shared trunk, merged with CABS and its baselines.

Per seed: four tasks from scikit-learn's ``make_classification`` (each standardised on its train split, 1000
train / 500 val / 500 test); a trunk 64-128-128-128 (ReLU) with one 128->4 head per task is trained on the
union (the base: single-task batches, shuffled), then fine-tuned per task (trunk and that task's head). The
trunks are merged (theta_0 = the base trunk, theta_k = task k's fine-tuned trunk) with every method at the same
density d = n / m, lambda picked on the grid by mean validation accuracy, and each task is scored on its test
split with its own fine-tuned head. Every random stream comes from ``derive(seed, "cabs-demo", ...)``.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from icmltools.core.seed import derive

from .options import DemoConfig


def make_tasks(cfg: DemoConfig, seed: int) -> list[dict]:
    """Per task: standardised float32 tensors X/y for train, val and test."""
    import numpy as np
    import torch
    from sklearn.datasets import make_classification

    tasks = []
    for t in range(cfg.n_tasks):
        X, y = make_classification(n_samples=cfg.n_samples, n_features=cfg.n_features, n_informative=cfg.n_informative,
                                   n_redundant=0, n_classes=cfg.n_classes, n_clusters_per_class=cfg.n_clusters_per_class,
                                   class_sep=cfg.class_sep, flip_y=cfg.flip_y,
                                   random_state=derive(seed, "cabs-demo", "data", t).int(32))
        perm = derive(seed, "cabs-demo", "split", t).numpy().permutation(len(y))
        X, y = X[perm], y[perm]
        a, b = cfg.n_train, cfg.n_train + cfg.n_val
        mu, sd = X[:a].mean(0), X[:a].std(0) + 1e-8
        X = ((X - mu) / sd).astype(np.float32)
        parts = {k: (torch.from_numpy(X[s]), torch.from_numpy(y[s].astype(np.int64)))
                 for k, s in (("train", slice(0, a)), ("val", slice(a, b)), ("test", slice(b, None)))}
        tasks.append(parts)
    return tasks


def build_model(cfg: DemoConfig, seed: int):
    """Trunk (Linear+ReLU layers) and one head per task, initialised from the derived stream."""
    import torch.nn as nn

    with derive(seed, "cabs-demo", "init").torch_init():
        layers, width = [], cfg.n_features
        for h in cfg.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        trunk = nn.Sequential(*layers)
        heads = nn.ModuleList([nn.Linear(width, cfg.n_classes) for _ in range(cfg.n_tasks)])
    return nn.ModuleDict({"trunk": trunk, "heads": heads})


def _batches(n: int, batch: int, gen) -> list:
    import torch

    perm = torch.randperm(n, generator=gen)
    return [perm[i:i + batch] for i in range(0, n, batch)]


def train_base(cfg: DemoConfig, tasks: list[dict], seed: int):
    """The base: Adam on the union of the tasks, single-task batches in a shuffled order."""
    import torch
    import torch.nn.functional as F

    model = build_model(cfg, seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.base_lr)
    gen = derive(seed, "cabs-demo", "base-batches").torch()
    for _ in range(cfg.base_epochs):
        plan = [(t, idx) for t, task in enumerate(tasks) for idx in _batches(len(task["train"][1]), cfg.batch, gen)]
        for j in torch.randperm(len(plan), generator=gen).tolist():
            t, idx = plan[j]
            X, y = tasks[t]["train"]
            loss = F.cross_entropy(model["heads"][t](model["trunk"](X[idx])), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def finetune(cfg: DemoConfig, base, tasks: list[dict], t: int, seed: int):
    """Task t's fine-tuned model: the base's trunk and head t trained on task t alone."""
    import copy

    import torch
    import torch.nn.functional as F

    model = copy.deepcopy(base)
    params = list(model["trunk"].parameters()) + list(model["heads"][t].parameters())
    opt = torch.optim.Adam(params, lr=cfg.ft_lr)
    gen = derive(seed, "cabs-demo", "finetune", t).torch()
    X, y = tasks[t]["train"]
    for _ in range(cfg.ft_epochs):
        for idx in _batches(len(y), cfg.batch, gen):
            loss = F.cross_entropy(model["heads"][t](model["trunk"](X[idx])), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def _trunk_state(model) -> dict:
    return {k: v.detach().clone() for k, v in model["trunk"].state_dict().items()}


class Scorer:
    """Accuracy of a trunk state with each task's head, on val or test."""

    def __init__(self, cfg: DemoConfig, tasks: list[dict], heads: Sequence, seed: int):
        self.trunk = build_model(cfg, seed)["trunk"]
        self.tasks, self.heads = tasks, heads

    def __call__(self, trunk_state: dict, split: str) -> list[float]:
        import torch

        self.trunk.load_state_dict(trunk_state)
        out = []
        with torch.no_grad():
            for t, task in enumerate(self.tasks):
                X, y = task[split]
                out.append(float((self.heads[t](self.trunk(X)).argmax(1) == y).float().mean()))
        return out


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def search_lambda(cfg: DemoConfig, merge: Callable, scorer: Scorer) -> tuple[float, float]:
    """The grid lambda of best mean validation accuracy (the first on ties): (lambda, val mean)."""
    best = (None, -1.0)
    for lam in cfg.lam_grid:
        v = _mean(scorer(merge(lam), "val"))
        if v > best[1]:
            best = (lam, v)
    return best


def run_seed(cfg: DemoConfig, seed: int, merges: dict, progress: Callable | None = None) -> dict:
    """One seed: data, base, fine-tuned models, every method's merge with its lambda and accuracies.

    `merges[name](base_trunk, ft_trunks)` -> (lam -> merged trunk state, the pruned vectors' stats)."""
    tasks = make_tasks(cfg, seed)
    base = train_base(cfg, tasks, seed)
    fts = [finetune(cfg, base, tasks, t, seed) for t in range(cfg.n_tasks)]
    b_trunk, ft_trunks = _trunk_state(base), [_trunk_state(m) for m in fts]
    base_acc = Scorer(cfg, tasks, list(base["heads"]), seed)(b_trunk, "test")
    ft_acc = [Scorer(cfg, tasks, [fts[t]["heads"][t] for t in range(cfg.n_tasks)], seed)(ft_trunks[t], "test")[t]
              for t in range(cfg.n_tasks)]
    scorer = Scorer(cfg, tasks, [fts[t]["heads"][t] for t in range(cfg.n_tasks)], seed)
    rows = []
    for name in cfg.methods:
        apply, info = merges[name](b_trunk, ft_trunks)
        lam, val = search_lambda(cfg, apply, scorer)
        test = scorer(apply(lam), "test")
        rows.append({"name": name, "lam": lam, "val_avg": val, "test_acc": test, "test_avg": _mean(test),
                     "normalized_avg": _mean([a / f for a, f in zip(test, ft_acc)]), **info})
        if progress is not None:
            progress(f"seed {seed}: merging", len(rows), len(cfg.methods))
    return {"seed": seed, "base": {"test_acc": base_acc, "avg": _mean(base_acc)},
            "finetuned": {"test_acc": ft_acc, "avg": _mean(ft_acc)}, "methods": rows}


def summarise(per_seed: list[dict]) -> list[dict]:
    """Per method over seeds: mean test accuracy, its standard error, lambdas, overlap."""
    names = [r["name"] for r in per_seed[0]["methods"]]
    out = []
    for i, name in enumerate(names):
        avgs = [s["methods"][i]["test_avg"] for s in per_seed]
        mu = _mean(avgs)
        se = math.sqrt(sum((a - mu) ** 2 for a in avgs) / (len(avgs) - 1) / len(avgs)) if len(avgs) > 1 else None
        out.append({"name": name, "test_avg": mu, "se": se, "per_seed": avgs,
                    "lam": [s["methods"][i]["lam"] for s in per_seed],
                    "max_pairwise_overlap": [s["methods"][i]["max_pairwise_overlap"] for s in per_seed]})
    return out
