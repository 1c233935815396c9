"""k-sample objectives (pass@k, majority vote) as per-sample policy-gradient advantages.

Paper: Yunhao Tang, Kunhao Zheng, Gabriel Synnaeve, Remi Munos, "Optimizing Language Models for Inference
Time Objectives using Reinforcement Learning", ICML 2025 (arXiv 2503.19595; no official code).
Baselines: Walder & Karkhanis, "Pass@K Policy Optimization" (PKPO, arXiv 2505.15201).

For k i.i.d. samples y_1..y_k of a prompt and an objective f(y_1..y_k) (pass@k: max reward; maj@k: reward of
the most voted answer; mean: mean reward), the unbiased leave-one-out estimator gives sample i the advantage
A_i = f(y_1..y_k) - f(y_-i), and the gradient is sum_i A_i grad log pi(y_i).

Modules: `options` (lists, defaults, paper; stdlib only), `estimators` (vectorised numpy advantages, the
registry of objectives and estimators, brute force), `stream` (JSONL groups in, advantages out), `checks`
(the exact estimator checks), `demo` (the capacity-limited policy trained with each objective), `api` (what
the command calls). `from icmltools.kpass import advantages` loads numpy lazily; this file imports nothing heavy.
"""

__all__ = ["advantages", "evaluate"]


def __getattr__(name):  # lazy re-exports keep `import icmltools.kpass` light
    if name in __all__:
        from . import estimators

        return getattr(estimators, name)
    raise AttributeError(name)
