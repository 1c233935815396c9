"""A real value function [inf]: logistic regression on agents' class-skewed subsets of sklearn's digits.

Agent j holds `pool` training points, a fraction `skew` of them from its two preferred classes (2j, 2j + 1
mod 10), and a test set skewed the same way from a held-out split. Contributing s_j means sharing the first
s_j points of its pool. a_j(X) = accuracy on agent j's test set of a model trained on the coalition's pooled
contributions; a_j(empty) = chance (0.1). `fit_curve` fits the paper's a(S) = 1 - (1 - 1/C)(S / tau + 1)^-beta
to pooled-subset accuracies.
"""
from __future__ import annotations

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive

from .options import DigitsConfig

CLASSES = 10


def _skewed(idx_by_class, prefer, count, skew, rng):
    k_pref = int(round(skew * count))
    pref = np.concatenate([idx_by_class[c] for c in prefer])
    rest = np.concatenate([idx_by_class[c] for c in range(CLASSES) if c not in prefer])
    take = np.concatenate([rng.choice(pref, k_pref, replace=False), rng.choice(rest, count - k_pref, replace=False)])
    return rng.permutation(take)


class DigitsData:
    """The split and every agent's pool and test set, from derive(seed, 'shappay', 'digits', ...)."""

    def __init__(self, cfg: DigitsConfig, seed: int):
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        self.X, self.y, self.cfg = X / 16.0, y, cfg
        perm = derive(seed, "shappay", "digits", "split").numpy().permutation(len(y))
        cut = int(0.7 * len(y))
        tr, te = perm[:cut], perm[cut:]
        by_tr = [tr[y[tr] == c] for c in range(CLASSES)]
        by_te = [te[y[te] == c] for c in range(CLASSES)]
        self.pools, self.tests = [], []
        for j in range(cfg.n):
            rng = derive(seed, "shappay", "digits", "agent", j).numpy()
            prefer = ((2 * j) % CLASSES, (2 * j + 1) % CLASSES)
            self.pools.append(_skewed(by_tr, prefer, cfg.pool, cfg.skew, rng))
            self.tests.append(_skewed(by_te, prefer, cfg.test, cfg.skew, rng))
        self.train_idx = tr
        self.seed = seed

    def accuracies(self, idx: np.ndarray) -> np.ndarray:
        """Every agent's test accuracy of a model trained on points `idx` (chance when idx is empty)."""
        n = self.cfg.n
        if len(idx) == 0:
            return np.full(n, 1.0 / CLASSES)
        classes = np.unique(self.y[idx])
        if len(classes) == 1:
            return np.array([float(np.mean(self.y[t] == classes[0])) for t in self.tests])
        from sklearn.linear_model import LogisticRegression

        model = LogisticRegression(max_iter=self.cfg.max_iter)
        model.fit(self.X[idx], self.y[idx])
        return np.array([float(np.mean(model.predict(self.X[t]) == self.y[t])) for t in self.tests])


class DigitsValue:
    """v(X) = sum_j over the scope of [a_j(X) - 0.1]; one model fit per coalition, cached."""

    def __init__(self, data: DigitsData, contrib: np.ndarray, coalition_value: str = "all"):
        if len(contrib) != data.cfg.n:
            raise BadInputError(f"{len(contrib)} contributions for {data.cfg.n} digits agents", param="contrib")
        if np.any(contrib > data.cfg.pool) or np.any(contrib != np.floor(contrib)):
            raise BadInputError(f"digits contributions are whole numbers of points, at most the pool "
                                f"({data.cfg.pool})", param="contrib")
        self.data, self.s = data, contrib.astype(int)
        self.all = coalition_value == "all"
        self.cache: dict = {}

    def acc(self, row: np.ndarray) -> np.ndarray:
        key = row.astype(bool).tobytes()
        if key not in self.cache:
            parts = [self.data.pools[j][: self.s[j]] for j in np.flatnonzero(row)]
            idx = np.concatenate(parts) if parts else np.zeros(0, dtype=int)
            self.cache[key] = self.data.accuracies(idx)
        return self.cache[key]

    def __call__(self, M: np.ndarray) -> np.ndarray:
        gains = np.array([self.acc(r) for r in M]) - 1.0 / CLASSES
        return (gains if self.all else gains * M).sum(axis=1)

    def gains(self) -> np.ndarray:
        return self.acc(np.ones(self.data.cfg.n)) - 1.0 / CLASSES

    @property
    def calls(self) -> int:
        return len(self.cache)


def fit_curve(data: DigitsData, seed: int) -> dict:
    """Least squares fit of a(S) = 1 - (1 - 1/C)(S / tau + 1)^-beta to the mean accuracy, over every agent's
    test set, of models on random pooled subsets of size S (grid search over log tau and beta; concave,
    a(0) = chance)."""
    cfg = data.cfg
    rng = derive(seed, "shappay", "digits", "fit").numpy()
    sizes = np.array([S for S in cfg.fit_sizes if S <= len(data.train_idx)], dtype=float)
    acc = np.array([np.mean([data.accuracies(rng.choice(data.train_idx, int(S), replace=False)).mean()
                             for _ in range(cfg.fit_repeats)]) for S in sizes])
    alpha = 1.0 - 1.0 / CLASSES
    taus = np.exp(np.linspace(np.log(0.5), np.log(2000.0), 240))
    betas = np.linspace(0.05, 3.0, 240)
    T, B = np.meshgrid(taus, betas, indexing="ij")
    pred = 1.0 - alpha * (sizes[None, None, :] / T[..., None] + 1.0) ** (-B[..., None])
    sse = ((pred - acc) ** 2).sum(axis=2)
    a, b = np.unravel_index(int(np.argmin(sse)), sse.shape)
    return {"alpha": alpha, "tau": float(taus[a]), "beta": float(betas[b]), "rmse": float(np.sqrt(sse[a, b] / len(sizes))),
            "sizes": sizes.tolist(), "accuracy": acc.tolist()}
