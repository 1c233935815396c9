"""Evaluation mode: train a target classifier on each subset, over rates and seeds; optional label noise."""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from icmltools.core.errors import BadInputError

from .data import inject_noise
from .engine import Engine
from .select import CITATIONS, Context, ram_apl_stats, run_method

log = logging.getLogger(__name__)

TARGETS = ("logreg", "mlp", "cnn")


def train_and_test(target: str, Xtr, ytr, Xte, yte, n_classes: int, seed: int, epochs: int = 300) -> float:
    """Fit the target model on (Xtr, ytr) and return accuracy on (Xte, yte).

    logreg: scikit-learn multinomial logistic regression (lbfgs, C=1) on the given inputs.
    mlp: one hidden layer of 256 ReLU units, Adam (lr 1e-2, weight decay 1e-4), full batch, `epochs` steps.
    cnn: two 3x3 conv layers (16, 32 channels) + linear head on image inputs (N, C, H, W), Adam, mini-batches.
    """
    ytr = np.asarray(ytr)
    classes = np.unique(ytr)
    if len(classes) == 1:  # a single class in the subset: the best any model can do is predict it
        return float(np.mean(yte == classes[0]))
    if target == "logreg":
        import warnings

        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf = LogisticRegression(C=1.0, max_iter=500, random_state=seed).fit(Xtr, ytr)
        return float(np.mean(clf.predict(Xte) == yte))
    import torch

    g = torch.Generator().manual_seed(int(seed))
    torch.manual_seed(int(seed))
    xtr = torch.as_tensor(np.asarray(Xtr), dtype=torch.float32)
    xte = torch.as_tensor(np.asarray(Xte), dtype=torch.float32)
    yt = torch.as_tensor(ytr, dtype=torch.long)
    if target == "mlp":
        xtr, xte = xtr.flatten(1), xte.flatten(1)
        model = torch.nn.Sequential(torch.nn.Linear(xtr.shape[1], 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, n_classes))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
        for _ in range(epochs):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xtr), yt).backward()
            opt.step()
    elif target == "cnn":
        if xtr.dim() == 3:
            xtr, xte = xtr[:, None], xte[:, None]
        if xtr.dim() != 4:
            raise BadInputError(f"--target cnn needs image inputs (N, C, H, W); got shape {tuple(xtr.shape)}")
        model = torch.nn.Sequential(
            torch.nn.Conv2d(xtr.shape[1], 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(128, n_classes))
        opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
        n = len(xtr)
        steps = max(epochs // 2, 50)
        for _ in range(steps):
            b = torch.randint(0, n, (min(n, 128),), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xtr[b]), yt[b]).backward()
            opt.step()
    else:
        raise BadInputError(f"unknown target {target!r}; choose from {', '.join(TARGETS)}")
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(xte[i:i + 4096]).argmax(1) for i in range(0, len(xte), 4096)]).numpy()
    return float(np.mean(pred == yte))


def evaluate(methods: Sequence[str], views: Sequence, labels: np.ndarray, n_classes: int, rates: Sequence[float],
             eval_train, eval_test, test_labels: np.ndarray, *, engine: Engine, seeds: Sequence[int],
             target: str = "logreg", noise: float = 0.0, view: int = 0, names=None, full_data: bool = True,
             progress=None, stream=None) -> dict:
    """For each seed: (optionally) inject symmetric label noise, select with every method at every rate,
    train the target on the subset (with its possibly noisy labels) and test on clean test labels.

    Returns {"evaluation": [one row per (method, rate) with test_acc mean/std over seeds, ...], "full_data": ...}.
    """
    progress = progress or (lambda d, i, n: None)
    rows: dict = {}
    full = []
    total = len(seeds) * len(methods)
    done = 0
    clean = np.asarray(labels, dtype=np.int64)
    for s in seeds:
        if noise > 0:
            y, noisy = inject_noise(clean, n_classes, noise, np.random.default_rng(10_000 + int(s)))
        else:
            y, noisy = clean, np.zeros(len(clean), dtype=bool)
        ctx = Context(y, n_classes)
        if np.any(ctx.counts < 2):
            raise BadInputError("a class has fewer than two samples after label noise; lower --noise")
        stats = ram_apl_stats(views, ctx, engine, names) if any(
            m in ("ram-apl", "ram", "min", "concat") for m in methods) else None
        if full_data:
            full.append(train_and_test(target, eval_train, y, eval_test, test_labels, n_classes, seed=s))
        for m in methods:
            sels = run_method(m, views, ctx, rates, engine=engine, seed=int(s), view=view, stats=stats, names=names)
            for sel in sels:
                idx = sel.indices
                acc = train_and_test(target, eval_train[idx], y[idx], eval_test, test_labels, n_classes, seed=s)
                r = rows.setdefault((m, sel.rate), {"method": m, "rate": sel.rate, "accs": [], "noisy": [],
                                                    "n_selected": int(len(idx))})
                r["accs"].append(acc)
                r["noisy"].append(float(noisy[idx].mean()) if len(idx) else 0.0)
                if stream is not None:
                    stream({"seed": int(s), "method": m, "rate": sel.rate, "test_acc": acc,
                            "n_selected": int(len(idx))})
            done += 1
            progress("evaluate", done, total)
    out = []
    for (m, p), r in rows.items():
        a = np.asarray(r["accs"])
        row = {"method": m, "rate": p, "test_acc": float(a.mean()), "test_acc_std": float(a.std(ddof=0)),
               "test_accs": [float(x) for x in a], "n_selected": r["n_selected"]}
        if noise > 0:
            row["noisy_fraction"] = float(np.mean(r["noisy"]))
        out.append(row)
    best = {}
    for p in sorted({r["rate"] for r in out}):
        cand = [r for r in out if r["rate"] == p]
        b = max(cand, key=lambda r: r["test_acc"])
        best[str(p)] = {"method": b["method"], "test_acc": b["test_acc"]}
    res = {"evaluation": out, "best_per_rate": best, "citations": {m: CITATIONS[m] for m in methods}}
    if full_data:
        res["full_data"] = {"test_acc": float(np.mean(full)), "test_acc_std": float(np.std(full)),
                            "n": int(len(clean))}
    return res
