"""The round loop for a user's game given as gradient oracles (callables), numpy or torch.

A game is a list of callables, one per player: `grad_i(x_i, xs)` returns the gradient of player i's own
objective with respect to its own strategy x_i, where `xs` is the list of every player's last
communicated strategy (the callable reads the opponents from it and its own strategy from x_i). Only
`-`, `*` and the callables touch the strategies, so numpy arrays and torch tensors (any device) work.
"""
from __future__ import annotations

from typing import Callable, Sequence


def decoupled_round(grads: Sequence[Callable], xs: list, lr: float, K: int) -> list:
    """One Decoupled SGDA round (the paper's update): for every player i, K steps
    x_i <- x_i - lr grad_i(x_i, xs_r) against the communicated xs_r; then every player sends x_i once."""
    out = []
    for i, g in enumerate(grads):
        y = xs[i]
        for _ in range(K):
            y = y - lr * g(y, xs)
        out.append(y)
    return out


def gda_round(grads: Sequence[Callable], xs: list, lr: float, K: int = 1) -> list:
    """Simultaneous GDA: one step per round (Decoupled SGDA with K = 1)."""
    return decoupled_round(grads, xs, lr, 1)


def localsgda_round(grads: Sequence[Callable], xs: list, lr: float, K: int) -> list:
    """Local SGDA: machine m runs K joint steps on its copy of every strategy (it needs every player's
    oracle), then the copies are averaged."""
    copies = []
    for _ in grads:
        c = list(xs)
        for _ in range(K):
            c = [c[j] - lr * grads[j](c[j], c) for j in range(len(grads))]
        copies.append(c)
    return [sum(c[j] for c in copies) / len(copies) for j in range(len(grads))]


ORACLE_ROUNDS = {"decoupled": decoupled_round, "gda": gda_round, "localsgda": localsgda_round}


def solve(grads: Sequence[Callable], x0: list, *, method: str = "decoupled", lr: float, K: int = 10,
          rounds: int = 1000, residual: Callable | None = None, eps: float | None = None,
          callback: Callable | None = None) -> dict:
    """Run `rounds` communication rounds (or until residual(xs) <= eps residual(x0)); returns the final
    strategies, the number of rounds, gradient evaluations per player and the residual history."""
    step = ORACLE_ROUNDS[method]
    xs, hist = list(x0), []
    r0 = float(residual(xs)) if residual else None
    done = 0
    for r in range(1, rounds + 1):
        xs = step(grads, xs, lr, K)
        done = r
        if residual is not None:
            hist.append(float(residual(xs)) / r0 if r0 else 0.0)
        if callback is not None:
            callback(r, xs)
        if eps is not None and hist and hist[-1] <= eps:
            break
    evals = done * (1 if method == "gda" else K)  # a Local SGDA machine: K joint evaluations per round
    return {"x": xs, "rounds": done, "grad_evals_per_player": evals, "rel_residual": hist}
