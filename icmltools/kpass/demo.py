"""The capacity-limited policy of the spec trained with mean / pass@k / maj@k objectives (same seed, same draws).

Task `teacher`: X ~ N(0, I) (512 x 8), correct answer c = argmax(tanh(X T1) T2) over 16 answers (T1 8x32,
T2 32x16 ~ N(0, 1)). Task `modadd`: (a + b) mod 12 with one-hot operands (144 prompts, 24 features).
Policy softmax(X W), W zero-initialised: a linear policy cannot fit either teacher, so it must choose between
being right once (pass@1) and covering answers (pass@k). Each step: `batch` prompts with replacement, k samples
each, advantages from `estimators.evaluate`, g = batch mean of sum_i A_i grad log pi(y_i); Adam ascent.
"""
from __future__ import annotations

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive

from .estimators import evaluate
from .options import DEMO_RUNS, TASKS, DemoConfig


def task_teacher(s):
    rng = s.numpy()
    X = rng.standard_normal((512, 8))
    T1, T2 = rng.standard_normal((8, 32)), rng.standard_normal((32, 16))
    return X, np.argmax(np.tanh(X @ T1) @ T2, axis=1), 16


def task_modadd(s):
    a, b = np.divmod(np.arange(144), 12)
    X = np.concatenate([np.eye(12)[a], np.eye(12)[b]], axis=1)
    return X, (a + b) % 12, 12


TASK_FNS = {"teacher": task_teacher, "modadd": task_modadd}
assert set(TASK_FNS) == set(TASKS)


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def sample(P, u):
    """Inverse-CDF draws: P (B, m) probabilities, u (B, k) uniforms -> (B, k) answers."""
    cdf = np.cumsum(P, axis=1)
    return np.minimum((u[:, :, None] > cdf[:, None, :]).sum(axis=2), P.shape[1] - 1)


def sample_many(P, u):
    """Inverse-CDF draws for many uniforms per row: P (B, m), u (B, d) -> (B, d), one searchsorted over rows
    shifted by their index (row b's CDF lives in [b, b + 1])."""
    B, m = P.shape
    cdf = np.cumsum(P, axis=1)
    cdf[:, -1] = 1.0
    rows = np.arange(B)[:, None]
    idx = np.searchsorted((cdf + rows).ravel(), (u + rows).ravel(), side="right").reshape(u.shape)
    return np.clip(idx - rows * m, 0, m - 1)


def maj_at_k(P, c, k, votes, rng):
    """Monte Carlo maj@k per the spec's vote: `votes` votes of k samples per prompt; a tie credits 1/|tied|."""
    B, m = P.shape
    y = sample_many(P, rng.random((B, votes * k))).reshape(B, votes, k)
    cell = (np.arange(B * votes).reshape(B, votes, 1) * m + y).ravel()
    counts = np.bincount(cell, minlength=B * votes * m).reshape(B, votes, m)
    mx = counts.max(axis=2, keepdims=True)
    tied = counts == mx
    hit = tied[np.arange(B), :, c]                                   # (B, votes)
    return float((hit / tied.sum(axis=2)).mean())


def metrics(W, X, c, k, votes, rng):
    P = softmax(X @ W)
    pc = P[np.arange(len(c)), c]
    ent = -(P * np.log(np.clip(P, 1e-300, None))).sum(axis=1)
    return {"pass1": float(pc.mean()), "passk": float((1 - (1 - pc) ** k).mean()),
            "majk": maj_at_k(P, c, k, votes, rng), "entropy": float(ent.mean())}


def train(run: str, X, c, m, cfg: DemoConfig, s):
    """One run ("objective:estimator"): returns its curve [{step, pass1, passk, majk, entropy}]."""
    objective, estimator = run.split(":")
    W = np.zeros((X.shape[1], m))
    mom, vel = np.zeros_like(W), np.zeros_like(W)
    draws, evals = s.child("draws").numpy(), s.child("eval")
    curve = [{"step": 0, **metrics(W, X, c, cfg.k, cfg.maj_votes, evals.child(0).numpy())}]
    for t in range(1, cfg.steps + 1):
        idx = draws.integers(0, len(c), cfg.batch)
        P = softmax(X[idx] @ W)
        y = sample(P, draws.random((cfg.batch, cfg.k)))
        R = (y == c[idx, None]).astype(float)
        codes = rew = None
        if objective == "maj":  # the answer is the sampled class: code = first index of that class in the group
            codes = np.argmax(y[:, :, None] == y[:, None, :], axis=2)
            rew = R
        A, _ = evaluate(R, cfg.k, objective, estimator, codes, rew)
        G = (A[:, :, None] * (np.eye(m)[y] - P[:, None, :])).sum(axis=1)   # sum_i A_i dlogpi/dlogits
        g = X[idx].T @ G / cfg.batch
        mom = 0.9 * mom + 0.1 * g
        vel = 0.999 * vel + 0.001 * g * g
        W = W + cfg.lr * (mom / (1 - 0.9 ** t)) / (np.sqrt(vel / (1 - 0.999 ** t)) + 1e-8)
        if t % cfg.eval_every == 0 or t == cfg.steps:
            curve.append({"step": t, **metrics(W, X, c, cfg.k, cfg.maj_votes, evals.child(t).numpy())})
    return curve


def validate(cfg: DemoConfig):
    if cfg.task not in TASKS:
        raise BadInputError(f"unknown task {cfg.task!r}", param="task")
    bad = [r for r in cfg.runs if r not in DEMO_RUNS]
    if bad:
        raise BadInputError(f"unknown run {bad[0]!r}; choose from {', '.join(DEMO_RUNS)}", param="runs")
    if cfg.k < 2:
        raise BadInputError(f"k must be at least 2, got {cfg.k}", param="k")


def run_demo(cfg: DemoConfig, seed: int, progress=None) -> dict:
    """Every run on the same task and the same random draws per repetition; curves, finals, means over reps."""
    validate(cfg)
    reps = []
    for r in range(cfg.reps):
        s = derive(seed, "kpass-demo", cfg.task, r)
        X, c, m = TASK_FNS[cfg.task](s.child("task"))
        curves = {}
        for j, name in enumerate(cfg.runs):
            curves[name] = train(name, X, c, m, cfg, s.child("train"))
            if progress:
                progress("kpass demo", r * len(cfg.runs) + j + 1, cfg.reps * len(cfg.runs))
        reps.append({"rep": r, "curves": curves, "final": {n: cv[-1] for n, cv in curves.items()}})
    keys = ("pass1", "passk", "majk", "entropy")
    mean = {n: {key: float(np.mean([rp["final"][n][key] for rp in reps])) for key in keys} for n in cfg.runs}
    return {"reps": reps, "final_mean": mean, "init": reps[0]["curves"][cfg.runs[0]][0]}
