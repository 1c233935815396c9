"""Evaluation mode: train a target classifier on each subset, over rates and repeats; optional label noise.

Repeat k draws everything from `derive(seed, "subset", "repeat", k)`: its label noise ("noise"), the int
seed of the DeepCore-style random choices ("select") and the target model's training ("train", the same
stream for every subset of the repeat, so methods are compared on common random numbers). A repeat run
alone gives the numbers it gives inside a longer evaluation.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.core.seed import Stream, as_stream, derive

from . import options
from .data import inject_noise
from .engine import Engine
from .select import CITATIONS, Context, check_budgets, ram_apl_stats, run_method

log = logging.getLogger(__name__)

TARGETS = options.TARGETS


def repeat_stream(seed: int, k: int) -> Stream:
    """The stream of evaluation repeat k."""
    return derive(seed, "subset", "repeat", k)


def _logreg(Xtr, ytr, Xte, yte, n_classes: int, st: Stream, epochs: int) -> float:
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = LogisticRegression(C=1.0, max_iter=500, random_state=st.int(32)).fit(Xtr, ytr)
    return float(np.mean(clf.predict(Xte) == yte))


def _mlp(xtr, n_classes: int):
    import torch

    return torch.nn.Sequential(torch.nn.Linear(xtr.shape[1], 256), torch.nn.ReLU(), torch.nn.Linear(256, n_classes))


def _cnn(xtr, n_classes: int):
    import torch

    nn = torch.nn
    return nn.Sequential(nn.Conv2d(xtr.shape[1], 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(128, n_classes))


def _torch_target(target: str, Xtr, ytr, Xte, yte, n_classes: int, st: Stream, epochs: int) -> float:
    """mlp: full-batch Adam (lr 1e-2), `epochs` steps; cnn: Adam (lr 3e-3) on mini-batches of 128 drawn from
    the stream, max(epochs // 2, 50) steps. Initial weights come from the same stream (`torch_init`)."""
    import torch

    xtr = torch.as_tensor(np.asarray(Xtr), dtype=torch.float32)
    xte = torch.as_tensor(np.asarray(Xte), dtype=torch.float32)
    yt = torch.as_tensor(ytr, dtype=torch.long)
    if target == "mlp":
        xtr, xte = xtr.flatten(1), xte.flatten(1)
    elif xtr.dim() == 3:
        xtr, xte = xtr[:, None], xte[:, None]
    if target == "cnn" and xtr.dim() != 4:
        raise BadInputError(f"cnn needs image inputs (N, C, H, W); got shape {tuple(xtr.shape)}", param="target")
    with st.child("init").torch_init():
        model = (_mlp if target == "mlp" else _cnn)(xtr, n_classes)
    lr, steps = (1e-2, epochs) if target == "mlp" else (3e-3, max(epochs // 2, 50))
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=1e-4)
    g = st.child("batches").torch()
    n = len(xtr)
    for _ in range(steps):
        b = torch.randint(0, n, (min(n, 128),), generator=g) if target == "cnn" else slice(None)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xtr[b]), yt[b])
        loss.backward()
        opt.step()
    if not bool(torch.isfinite(loss)):
        raise RuntimeFailure(f"the {target} target model diverged (training loss {float(loss)}); rescale its inputs")
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(xte[i:i + 4096]).argmax(1) for i in range(0, len(xte), 4096)]).numpy()
    return float(np.mean(pred == yte))


def train_and_test(target: str, Xtr, ytr, Xte, yte, n_classes: int, seed: int | Stream, epochs: int = 300) -> float:
    """Fit the target model on (Xtr, ytr) and return accuracy on (Xte, yte).

    logreg: scikit-learn multinomial logistic regression (lbfgs, C=1) on the given inputs.
    mlp: one hidden layer of 256 ReLU units, Adam (lr 1e-2, weight decay 1e-4), full batch, `epochs` steps.
    cnn: two 3x3 conv layers (16, 32 channels) + linear head on image inputs (N, C, H, W), Adam, mini-batches.
    `seed` is a derived stream (an int seed means `derive(seed, "subset", "train")`).
    """
    if target not in TARGETS:
        raise BadInputError(f"unknown target {target!r}; choose from {', '.join(TARGETS)}", param="target")
    st = seed if isinstance(seed, Stream) else as_stream(seed, "subset", "train")
    ytr = np.asarray(ytr)
    classes = np.unique(ytr)
    if len(classes) == 1:  # a single class in the subset: the best any model can do is predict it
        return float(np.mean(yte == classes[0]))
    if target == "logreg":
        return _logreg(Xtr, ytr, Xte, yte, n_classes, st, epochs)
    return _torch_target(target, Xtr, ytr, Xte, yte, n_classes, st, epochs)


def repeat_labels(clean: np.ndarray, n_classes: int, noise: float, rep: Stream):
    """Repeat k's training labels: the clean ones, or with symmetric noise from `rep.child("noise")`."""
    if noise > 0:
        return inject_noise(clean, n_classes, noise, rep.child("noise").numpy())
    return clean, np.zeros(len(clean), dtype=bool)


def check_repeat_labels(drawn: list, n_classes: int, methods, rates, noise: float, class_names=None) -> None:
    """Before any training: every class keeps two samples in every repeat, and every rate keeps at least one
    sample of every class with every method (`select.check_budgets`, on the smallest size over repeats)."""
    counts = np.min([np.bincount(y, minlength=n_classes) for y, _ in drawn], axis=0)
    if np.any(counts < 2):
        c = int(np.argmin(counts))
        name = class_names[c] if class_names is not None else c
        if noise > 0:
            raise BadInputError(f"class {name!r} keeps {int(counts[c])} sample(s) after label noise in some repeat; "
                                "every class needs two: lower it", param="noise")
        raise BadInputError(f"class {name!r} has {int(counts[c])} sample(s) among the training rows; every class "
                            "needs two", param="labels")
    check_budgets(counts, rates, methods, class_names, after=" after label noise" if noise > 0 else "")


def _one_repeat(k: int, rep: Stream, methods, views, labels, n_classes, rates, eval_train, eval_test, test_labels,
                *, engine, target, view, names, full_data, record) -> float | None:
    """Repeat k on its drawn (y, noisy) `labels`: selection with every method at every rate, one fit per subset
    (`record` gets each)."""
    y, noisy = labels
    ctx = Context(y, n_classes)
    stats = ram_apl_stats(views, ctx, engine, names) if any(
        m in options.STATS_METHODS + ("min",) for m in methods) else None
    train = rep.child("train")
    full = train_and_test(target, eval_train, y, eval_test, test_labels, n_classes, train) if full_data else None
    sel_seed = rep.child("select").int(32)
    for m in methods:
        for sel in run_method(m, views, ctx, rates, engine=engine, seed=sel_seed, view=view, stats=stats,
                              names=names):
            idx = sel.indices
            acc = train_and_test(target, eval_train[idx], y[idx], eval_test, test_labels, n_classes, train)
            record(k, m, sel, acc, float(noisy[idx].mean()) if len(idx) else 0.0)
    return full


def _summarise(rows: dict, methods, noise: float) -> dict:
    out = []
    for (m, p), r in rows.items():
        a = np.asarray(r["accs"])
        per = r["n_selected"]
        row = {"method": m, "rate": p, "test_acc": float(a.mean()), "test_acc_std": float(a.std(ddof=0)),
               "test_accs": [float(x) for x in a],
               # the mean over repeats, as test_acc; an integer unless label noise changes the class sizes
               "n_selected": per[0] if len(set(per)) == 1 else float(np.mean(per)), "n_selected_per_seed": per}
        if noise > 0:
            row["noisy_fraction"] = float(np.mean(r["noisy"]))
        out.append(row)
    best = {}
    for p in sorted({r["rate"] for r in out}):
        b = max((r for r in out if r["rate"] == p), key=lambda r: r["test_acc"])
        best[str(p)] = {"method": b["method"], "test_acc": b["test_acc"]}
    return {"evaluation": out, "best_per_rate": best, "citations": {m: CITATIONS[m] for m in methods}}


def evaluate(methods: Sequence[str], views: Sequence, labels: np.ndarray, n_classes: int, rates: Sequence[float],
             eval_train, eval_test, test_labels: np.ndarray, *, engine: Engine, seed: int = 0,
             repeats: Sequence[int] = (0, 1, 2), target: str = "logreg", noise: float = 0.0, view: int = 0,
             names=None, full_data: bool = True, progress=None, stream=None, class_names=None) -> dict:
    """For each repeat k: (optionally) inject symmetric label noise, select with every method at every rate,
    train the target on the subset (with its possibly noisy labels) and test on clean test labels.

    Every repeat's labels are drawn, and checked (`check_repeat_labels`), before any training.
    Returns {"evaluation": [one row per (method, rate) with test_acc mean/std over repeats, n_selected (the mean
    size) and n_selected_per_seed, ...], "full_data": ...}.
    """
    progress = progress or (lambda d, i, n: None)
    rows: dict = {}
    clean = np.asarray(labels, dtype=np.int64)
    total = len(repeats) * len(methods) * len(rates)

    def record(k, m, sel, acc, noisy_frac):
        r = rows.setdefault((m, sel.rate), {"accs": [], "noisy": [], "n_selected": []})
        r["n_selected"].append(int(len(sel.indices)))
        r["accs"].append(acc)
        r["noisy"].append(noisy_frac)
        progress("evaluate", sum(len(v["accs"]) for v in rows.values()), total)
        if stream is not None:
            stream({"seed": int(k), "method": m, "rate": sel.rate, "test_acc": acc,
                    "n_selected": int(len(sel.indices))})

    streams = {int(k): repeat_stream(seed, int(k)) for k in repeats}
    drawn = {k: repeat_labels(clean, n_classes, noise, rep) for k, rep in streams.items()}
    check_repeat_labels(list(drawn.values()), n_classes, methods, rates, noise, class_names)
    full = []
    for k, rep in streams.items():
        f = _one_repeat(k, rep, methods, views, drawn[k], n_classes, rates, eval_train, eval_test, test_labels,
                        engine=engine, target=target, view=view, names=names, full_data=full_data, record=record)
        full.append(f)
    res = _summarise(rows, methods, noise)
    if full_data:
        res["full_data"] = {"test_acc": float(np.mean(full)), "test_acc_std": float(np.std(full)),
                            "n": int(len(clean))}
    return res
