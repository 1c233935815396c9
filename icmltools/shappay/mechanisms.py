"""Payment rules and best responses. A new rule is one class and one registry line.

Utility under a mechanism with payments p: u_i(s) = a_i(s) + p_i(s) - gamma_i s_i (paper). Each class gives
the payments at a profile and agent i's payoff a_i + p_i as a function of its own contribution x (others
fixed); `concave` rules also give its derivative, so the best response is a bisection on
d payoff / d x = gamma_i.
"""
from __future__ import annotations

import numpy as np

from .shapley import AgentView


class Context:
    """One profile s of a curve game, with the Shapley coalitions; agent views are built once per agent."""

    def __init__(self, game, coal, s):
        self.game, self.coal, self.s = game, coal, np.asarray(s, dtype=float)
        self._views: dict = {}

    def view(self, i: int) -> AgentView:
        if i not in self._views:
            self._views[i] = AgentView(self.game, self.coal, i, self.s)
        return self._views[i]

    def profiles(self, i: int, xs) -> np.ndarray:
        S = np.tile(self.s, (len(xs), 1))
        S[:, i] = xs
        return S


class NoPayments:
    """M0: no payments; agent i keeps its own accuracy a_i(s) (free-riding at equilibrium, paper)."""

    name, concave = "none", True

    def payments(self, game, s, phi, gains):
        return np.zeros(game.n)

    def payoff(self, ctx, i, xs):
        return ctx.game.acc(ctx.profiles(i, xs))[:, i]

    def marginal(self, ctx, i, x):
        g, s = ctx.game, ctx.s
        e = g.W[i] @ s - g.W[i, i] * s[i] + g.W[i, i] * x
        return float(g.alpha[i] * g.beta[i] * (e + 1.0) ** (-g.beta[i] - 1.0) * g.W[i, i])


class ShapleyPayments:
    """M^Shap: p_i = phi_i(s) - (a_i(s) - a_i(0)), so a_i + p_i = a_i(0) + phi_i (payoff = Shapley share)."""

    name, concave = "shap", True

    def payments(self, game, s, phi, gains):
        return phi - gains

    def payoff(self, ctx, i, xs):
        return ctx.game.acc0()[i] + ctx.view(i).phi(np.asarray(xs, dtype=float))

    def marginal(self, ctx, i, x):
        return ctx.view(i).dphi(x)


class ProportionalPayments:
    """[inf] baseline: the total gain A(s) - A(0) shared in proportion to data, p_i = G s_i / sum s - gain_i.
    Not concave in s_i in general: best responses search a grid, then refine by golden section."""

    name, concave = "proportional", False

    def payments(self, game, s, phi, gains):
        tot = s.sum()
        share = s / tot if tot > 0 else np.zeros_like(s)
        return gains.sum() * share - gains

    def payoff(self, ctx, i, xs):
        S = ctx.profiles(i, xs)
        G = ctx.game.gains(S).sum(axis=1)
        tot = S.sum(axis=1)
        share = np.divide(S[:, i], tot, out=np.zeros(len(tot)), where=tot > 0)
        return ctx.game.acc0()[i] + G * share


MECHANISM_CLASSES = {c.name: c for c in (ShapleyPayments, NoPayments, ProportionalPayments)}


def _bisect(f, lo: float, hi: float, halvings: int) -> float:
    """Root of a decreasing f on [lo, hi] with f(lo) > 0 > f(hi)."""
    for _ in range(halvings):
        mid = 0.5 * (lo + hi)
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _golden_max(f, lo: float, hi: float, iters: int) -> float:
    r = (5 ** 0.5 - 1) / 2
    a, b = lo + (1 - r) * (hi - lo), lo + r * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(iters):
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + r * (hi - lo)
            fb = f(b)
        else:
            hi, b, fb = b, a, fa
            a = lo + (1 - r) * (hi - lo)
            fa = f(a)
    return 0.5 * (lo + hi)


def best_response(mech, ctx: Context, i: int, halvings: int = 60, grid: int = 257) -> float:
    """argmax_x in [0, s_max_i] of payoff_i(x) - gamma_i x (exact up to 2^-halvings of the range)."""
    g = ctx.game
    hi, gam = float(g.s_max[i]), float(g.gamma[i])
    if mech.concave:
        f = lambda x: mech.marginal(ctx, i, x) - gam  # noqa: E731
        if f(0.0) <= 0:
            return 0.0
        if f(hi) >= 0:
            return hi
        return _bisect(f, 0.0, hi, halvings)
    xs = np.linspace(0.0, hi, grid)
    u = mech.payoff(ctx, i, xs) - gam * xs
    k = int(np.argmax(u))
    lo_b, hi_b = xs[max(k - 1, 0)], xs[min(k + 1, grid - 1)]
    x = _golden_max(lambda y: float(mech.payoff(ctx, i, [y])[0] - gam * y), lo_b, hi_b, halvings)
    return x if mech.payoff(ctx, i, [x])[0] - gam * x >= u[k] else float(xs[k])
