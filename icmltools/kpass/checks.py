"""The exact estimator checks of the spec, runnable by a user (`icml kpass check`).

1. The spec's hand cases. 2. Closed forms == brute force over every k-subset (binary and real rewards, n = k and
n > k, every objective and estimator). 3. Unbiasedness of `loo` for pass@k by Monte Carlo (softmax over 4
answers, k = 3): mean of sum_i A_i grad log pi(y_i) vs the analytic k (1 - p_c)^(k-1) p_c (e_c - p), within
4 standard errors; `centered` is shrunk. 4. maj@4 over 4 answers: the exact expectation of the estimator by
enumerating all 4^4 sequences vs the finite-difference gradient of J = E f (loo equal to 1e-6; centered not).
"""
from __future__ import annotations

import itertools

import numpy as np

from icmltools.core.seed import derive

from .estimators import advantages, brute_force, encode_answers, evaluate

CASES = [  # (name, call kwargs, expected)
    ("loo r=[0,1,0,0]", dict(rewards=[0, 1, 0, 0]), [0, 1, 0, 0]),
    ("centered r=[0,1,0,0]", dict(rewards=[0, 1, 0, 0], estimator="centered"), [-0.25, 0.75, -0.25, -0.25]),
    ("maj answers [3,3,5,5,2], 3 correct", dict(rewards=[1, 1, 0, 0, 0], objective="maj", answers=[3, 3, 5, 5, 2]),
     [0.5, 0.5, -0.5, -0.5, 0]),
    ("pkpo g=[0,1,0,1,0,0] k=3", dict(rewards=[0, 1, 0, 1, 0, 0], k=3, estimator="pkpo"),
     [.35, .5, .35, .5, .35, .35]),
    ("pkpo-loo g=[0,1,0,1,0,0] k=3", dict(rewards=[0, 1, 0, 1, 0, 0], k=3, estimator="pkpo-loo"),
     [-.19, .14, -.19, .14, -.19, -.19]),
    ("pkpo-loo1 g=[0,1,0,1,0,0] k=3", dict(rewards=[0, 1, 0, 1, 0, 0], k=3, estimator="pkpo-loo1"),
     [0, .3, 0, .3, 0, 0]),
    ("mean (RLOO) r=[0,1,0,0]", dict(rewards=[0, 1, 0, 0], objective="mean"), [-1 / 3, 1, -1 / 3, -1 / 3]),
]

COMBOS = [("pass", e) for e in ("loo", "centered", "pkpo", "pkpo-loo", "pkpo-loo1")] + \
         [("maj", "loo"), ("maj", "centered"), ("mean", "loo"), ("mean", "centered")]


def exact_cases() -> list:
    out = []
    for name, kw, want in CASES:
        got = advantages(**kw)
        err = float(np.abs(got - np.asarray(want)).max())
        out.append({"check": f"exact: {name}", "max_abs_error": err, "tolerance": 1e-12, "passed": err <= 1e-12})
    return out


def _random_group(obj, n, rng, binary):
    r = (rng.random(n) < 0.4).astype(float) if binary else rng.normal(size=n)
    if obj != "maj":
        return r, None, None
    ans = rng.integers(0, 3, n).tolist()
    ans[0] = None
    vals = (rng.random(3) < 0.5).astype(float) if binary else rng.normal(size=3)
    r = np.array([vals[a] if a is not None else r[i] for i, a in enumerate(ans)])
    codes, rew = encode_answers([ans], r[None])
    return r, codes, rew


def brute_force_checks(seed: int, trials: int = 3) -> list:
    """Closed forms vs enumeration over every k-subset."""
    rng = derive(seed, "kpass-check", "brute").numpy()
    out = []
    for (obj, est), (n, k), binary in itertools.product(COMBOS, [(5, 5), (6, 3), (7, 4), (6, 2)], (True, False)):
        if est == "pkpo-loo" and n == k:
            continue
        err = 0.0
        for _ in range(trials):
            r, codes, rew = _random_group(obj, n, rng, binary)
            A, _ = evaluate(r[None], k, obj, est, codes, rew)
            B = brute_force(obj, est, r, k, None if codes is None else codes[0], None if rew is None else rew[0])
            err = max(err, float(np.abs(A[0] - B).max()))
        out.append({"check": f"brute force: {obj} {est} n={n} k={k} {'binary' if binary else 'real'}",
                    "max_abs_error": err, "tolerance": 1e-10, "passed": err <= 1e-10})
    return out


def _pass_grad_mc(estimator, theta, c, k, groups, rng):
    p = np.exp(theta) / np.exp(theta).sum()
    y = np.minimum((rng.random((groups, k))[:, :, None] > np.cumsum(p)).sum(axis=2), len(p) - 1)
    A, _ = evaluate((y == c).astype(float), k, "pass", estimator)
    per = (A[:, :, None] * (np.eye(len(p))[y] - p)).sum(axis=1)        # (groups, m)
    return per.mean(axis=0), per.std(axis=0, ddof=1) / np.sqrt(groups), p


def unbiased_pass(seed: int, groups: int = 200_000) -> list:
    """loo for pass@k: MC mean within 4 SE of the analytic gradient; centered visibly shrunk."""
    theta, c, k = np.array([0.5, 0.0, -0.5, 0.2]), 1, 3
    out = []
    for est in ("loo", "centered"):
        mean, se, p = _pass_grad_mc(est, theta, c, k, groups, derive(seed, "kpass-check", "mc").numpy())
        truth = k * (1 - p[c]) ** (k - 1) * p[c] * (np.eye(4)[c] - p)
        z = float(np.abs((mean - truth) / se).max())
        row = {"check": f"unbiased pass@{k} {est} ({groups} groups)", "estimate_e_c": float(mean[c]),
               "analytic_e_c": float(truth[c]), "max_abs_error": float(np.abs(mean - truth).max()),
               "max_z": z}
        row["passed"] = z <= 4 if est == "loo" else z > 4  # centered is biased: it must NOT match
        out.append(row)
    return out


def _maj_exact(theta, rew_of, k, estimator):
    """E[sum_i A_i grad log pi(y_i)] and J = E f by enumerating all m^k answer sequences."""
    m = len(theta)
    p = np.exp(theta) / np.exp(theta).sum()
    seqs = np.array(list(itertools.product(range(m), repeat=k)))
    prob = p[seqs].prod(axis=1)
    R = rew_of[seqs]
    codes = np.argmax(seqs[:, :, None] == seqs[:, None, :], axis=2)
    A, f = evaluate(R, k, "maj", estimator, codes, R)
    grad = (prob[:, None] * (A[:, :, None] * (np.eye(m)[seqs] - p)).sum(axis=1)).sum(axis=0)
    return grad, float((prob * f).sum())


def unbiased_maj(k: int = 4) -> list:
    """maj@k: exact expectation of the estimator vs central finite differences of J (h = 1e-5)."""
    theta, rew_of = np.array([0.3, 0.1, -0.2, 0.0]), np.array([1.0, 0.0, 0.5, 0.2])
    h = 1e-5
    fd = np.array([(_maj_exact(theta + h * e, rew_of, k, "loo")[1] - _maj_exact(theta - h * e, rew_of, k, "loo")[1])
                   / (2 * h) for e in np.eye(4)])
    out = []
    for est in ("loo", "centered"):
        g, _ = _maj_exact(theta, rew_of, k, est)
        err = float(np.abs(g - fd).max())
        ok = err <= 1e-6 if est == "loo" else err > 1e-3
        out.append({"check": f"unbiased maj@{k} {est} (exact, 4^{k} sequences)", "max_abs_error": err,
                    "tolerance": 1e-6, "passed": ok})
    return out


def run_checks(seed: int = 0, quick: bool = False) -> dict:
    rows = exact_cases() + brute_force_checks(seed, trials=1 if quick else 3)
    rows += unbiased_pass(seed, groups=20_000 if quick else 200_000) + unbiased_maj()
    return {"checks": rows, "passed": all(r["passed"] for r in rows), "n_checks": len(rows),
            "n_failed": sum(not r["passed"] for r in rows)}
