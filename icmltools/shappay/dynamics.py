"""Equilibria: best-response dynamics per mechanism, the welfare-maximising planner, and the metrics.

Paper: stochastic best response (Fed BR-Shap, Algorithm 1) -- each round some agents update. Ours [inf]:
k random agents per round switch together to exact best responses; stop when max_i |BR_i(s) - s_i| < tol.
"""
from __future__ import annotations

import math

import numpy as np

from icmltools.core.errors import BadInputError

from .mechanisms import Context, _bisect, best_response
from .shapley import shapley


def br_gap(mech, game, coal, s, halvings: int) -> float:
    """max_i |BR_i(s) - s_i| at profile s."""
    ctx = Context(game, coal, s)
    return max(abs(best_response(mech, ctx, i, halvings) - s[i]) for i in range(game.n))


def run_br(mech, game, coal, cfg, rng, progress=None) -> dict:
    """Each round: k agents drawn without replacement best-respond to the current profile together."""
    n = game.n
    k = min(n, cfg.k or math.ceil(n / 4))
    s = np.zeros(n)
    for r in range(1, cfg.max_rounds + 1):
        idx = rng.choice(n, size=k, replace=False)
        ctx = Context(game, coal, s)
        new = np.array([best_response(mech, ctx, int(i), cfg.halvings) for i in idx])
        change = float(np.max(np.abs(new - s[idx])))
        s = s.copy()
        s[idx] = new
        if progress:
            progress(f"best responses ({mech.name})", r, None)
        if change < cfg.tol:
            gap = br_gap(mech, game, coal, s, cfg.halvings)
            if gap < cfg.tol:
                return {"s": s, "rounds": r, "gap": gap, "converged": True}
    return {"s": s, "rounds": cfg.max_rounds, "gap": br_gap(mech, game, coal, s, cfg.halvings), "converged": False}


def _numeric_marginal(mech, ctx, i, h: float = 1e-4) -> float:
    x = ctx.s[i]
    lo, hi = max(x - h, 0.0), min(x + h, ctx.game.s_max[i])
    u = mech.payoff(ctx, i, [lo, hi])
    return float((u[1] - u[0]) / (hi - lo))


def run_grad(mech, game, coal, cfg, rng=None, progress=None) -> dict:
    """[inf] projected gradient play: every agent moves s_i += lr (d payoff_i / d s_i - gamma_i), clipped to
    [0, s_max_i]; stop when no step exceeds tol / 100 (a step is lr times the payoff slope, far larger than the
    distance to the best response when the payoff is flat). The reported gap is the best-response gap."""
    s = np.zeros(game.n)
    for r in range(1, cfg.max_rounds + 1):
        ctx = Context(game, coal, s)
        grad = np.array([(mech.marginal(ctx, i, s[i]) if mech.concave else _numeric_marginal(mech, ctx, i))
                         for i in range(game.n)]) - game.gamma
        new = np.clip(s + cfg.lr * grad, 0.0, game.s_max)
        step = float(np.max(np.abs(new - s)))
        s = new
        if progress:
            progress(f"gradient play ({mech.name})", r, cfg.max_rounds)
        if step < cfg.tol / 100:
            break
    gap = br_gap(mech, game, coal, s, cfg.halvings)
    return {"s": s, "rounds": r, "gap": gap, "converged": bool(gap < cfg.tol)}


DYNAMICS = {"br": run_br, "grad": run_grad}


def planner(game, cfg) -> dict:
    """Welfare-maximising profile (a reference, not a mechanism): coordinate ascent on the concave
    W(s) = sum_j a_j(s) - sum_j gamma_j s_j, each coordinate by bisection on dW/ds_i = gamma_i."""
    s = np.zeros(game.n)
    for sweep in range(1, cfg.max_rounds + 1):
        change = 0.0
        for i in range(game.n):
            def f(x, i=i):
                t = s.copy()
                t[i] = x
                return float(game.dacc(t[None], i)[0].sum() - game.gamma[i])
            hi = float(game.s_max[i])
            x = 0.0 if f(0.0) <= 0 else hi if f(hi) >= 0 else _bisect(f, 0.0, hi, cfg.halvings)
            change = max(change, abs(x - s[i]))
            s[i] = x
        if change < cfg.tol:
            return {"s": s, "rounds": sweep, "gap": change, "converged": True}
    return {"s": s, "rounds": cfg.max_rounds, "gap": change, "converged": False}


def deviation_gain(mech, game, coal, s, grid: int) -> float:
    """max_i [max_{x on a grid of [0, s_max_i]} u_i(x, s_-i) - u_i(s)]: <= 0 (up to tolerance) at an NE."""
    ctx = Context(game, coal, s)
    best = -math.inf
    for i in range(game.n):
        xs = np.append(np.linspace(0.0, game.s_max[i], grid), s[i])
        u = mech.payoff(ctx, i, xs) - game.gamma[i] * xs
        best = max(best, float(u[:-1].max() - u[-1]))
    return best


def auto_grid(mech, coal, n: int, requested: int | None) -> int:
    """1001 unless that check would cost over ~3e8 coalition terms (M^Shap at large n): then 0 (skipped)."""
    if requested is not None:
        return requested
    work = n * 1001 * (coal.masks[0].shape[0] * n if mech.name == "shap" else n)
    return 1001 if work <= 3e8 else 0


def metrics(mech, game, coal, s) -> dict:
    """The spec's metrics at a profile: data, accuracy, welfare (payments cancel), reciprocity
    min_i (a_i - a_i(0) + p_i) / phi_i over phi_i > 0, budget residual, free riders, utilities."""
    a = game.acc(s[None])[0]
    gains = a - game.acc0()
    phi, se = shapley(lambda M: game.value(M, s), coal)
    p = mech.payments(game, s, phi, gains) if mech is not None else np.zeros(game.n)
    util = a + p - game.cost(s)
    pos = phi > 1e-12
    recip = float(np.min((gains[pos] + p[pos]) / phi[pos])) if pos.any() else None
    out = {"s": s, "total_data": float(s.sum()), "mean_acc": float(a.mean()), "welfare": float((a - game.cost(s)).sum()),
           "reciprocity": recip, "budget_residual": float(abs(p.sum())),
           "free_riders": int(np.sum(s <= 1e-9 * np.maximum(game.s_max, 1.0))), "min_utility": float(util.min()),
           "phi": phi, "payments": p, "utilities": util, "accuracy": a}
    if coal.mode == "mc":
        out["phi_se"] = se
    return out


def check_equilibrium_game(game) -> None:
    if not np.all(np.isfinite(game.s_max)):
        raise BadInputError("every agent needs a finite 's_max' for the equilibrium", param="agents")
    if np.any(game.gamma <= 0):
        raise BadInputError("every agent needs a cost 'gamma' > 0 for the equilibrium", param="agents")
