"""Step-size search and the per-run figures (spec "Baselines": each method gets its best lr on the grid;
deterministic: fewest rounds to eps, stochastic: lowest final error)."""
from __future__ import annotations

import numpy as np

from . import maps
from .options import DIVERGED, TAIL_ROUNDS
from .sim import simulate


def affine_errors(M: np.ndarray, s0: np.ndarray, n: int, iters: int, stop_eps: float | None = None):
    """Iterate s_{t+1} = M s_t for a stack of maps M (L, m, m); returns (errs (T+1, L), alive indices) with
    errs = ||e_t|| / ||e_0||, inf at divergence, NaN after; stops early as `sim.simulate` does."""
    L = M.shape[0]
    e0 = float(np.linalg.norm(s0[:n]))
    s = np.broadcast_to(s0, (L, s0.size)).copy()
    errs = np.full((iters + 1, L), np.nan)
    errs[0] = 1.0
    idx = np.arange(L)
    with np.errstate(all="ignore"):
        for t in range(1, iters + 1):
            s = np.einsum("lij,lj->li", M[idx], s)
            err = np.linalg.norm(s[:, :n], axis=1) / e0
            errs[t, idx] = err
            ok = np.isfinite(err) & (err < DIVERGED)
            if not ok.all():
                errs[t, idx[~ok]] = np.inf
                idx, s = idx[ok], s[ok]
            if idx.size == 0 or (stop_eps is not None and np.any(err[ok] <= stop_eps)):
                return errs[:t + 1], idx
    return errs, idx


def measured_rate(errs: np.ndarray, rounds_per_iter: int = 1) -> float | None:
    """Per-round error ratio over the second half of a trajectory: (err_T / err_{T/2})^(1 / rounds)."""
    errs = np.asarray(errs, dtype=float)
    T = errs.size - 1
    if T < 2 or not np.all(np.isfinite(errs)) or errs[T // 2] <= 0 or errs[T] <= 0:
        return None
    return float((errs[T] / errs[T // 2]) ** (1.0 / ((T - T // 2) * rounds_per_iter)))


def _pick(final: np.ndarray, eps: float):
    """Winner among step sizes by their last error: (index, reached eps) or (None, False) if all diverged."""
    finite = np.isfinite(final)
    if not finite.any():
        return None, False
    best = int(np.nanargmin(np.where(finite, final, np.inf)))
    return best, bool(final[best] <= eps)


def _row(method, K, lr, iters, reached, status, final_err, final_grad, rate, rho) -> dict:
    m = maps.METHODS[method]
    return {"method": method, "K": int(K) if m.local else 1, "lr": lr,
            "rounds_to_eps": iters * m.rounds_per_iter if reached else None,
            "iterations": iters, "grad_evals": iters * m.evals(K), "final_rel_err": final_err,
            "final_rel_grad": final_grad, "rate": rate, "rho": rho, "status": status}


def _status(best, reached) -> str:
    return "diverged" if best is None else ("converged" if reached else "not_reached")


def _rho(game, method, K, lr) -> float | None:
    """Predicted per-round rate rho(M)^(1 / rounds per iteration) of the exact map (linearised at x*)."""
    m = maps.METHODS[method]
    M = m.matrices(game, [lr], K)
    return float(maps.spectral_radius(M)[0] ** (1.0 / m.rounds_per_iter))


def affine_search(game, method: str, K: int, lrs, eps: float, max_rounds: int) -> dict:
    """Deterministic quadratic game: iterate the exact round map of every step size, keep the first to eps."""
    m = maps.METHODS[method]
    M = m.matrices(game, lrs, K)
    s0 = m.lift(game.x0 - game.xstar)
    iters = max(1, max_rounds // m.rounds_per_iter)
    errs, _ = affine_errors(M, s0, game.n, iters, stop_eps=eps)
    best, reached = _pick(errs[-1], eps)
    if best is None:
        return _row(method, K, None, errs.shape[0] - 1, False, "diverged", None, None, None, None)
    traj, _ = affine_errors(M[best:best + 1], s0, game.n, errs.shape[0] - 1)
    T = traj.shape[0] - 1
    s = s0
    for _ in range(T):  # the final point, for ||F(x)|| / ||F(x0)||
        s = M[best] @ s
    grad = float(np.linalg.norm(game.J @ s[:game.n]) / np.linalg.norm(game.J @ s0[:game.n]))
    return _row(method, K, float(lrs[best]), T, reached, _status(best, reached), float(traj[-1, 0]), grad,
                measured_rate(traj[:, 0], m.rounds_per_iter), float(maps.spectral_radius(M[best:best + 1])[0]
                                                                       ** (1.0 / m.rounds_per_iter)))


def _grad_ratio(game, method, K, lr, iters) -> float:
    errs_x = _final_point(game, method, K, lr, iters)
    return float(np.linalg.norm(game.F(errs_x)) / np.linalg.norm(game.F(game.x0)))


def _final_point(game, method, K, lr, iters):
    from .sim import ROUNDS

    st = {"x": game.x0[None, None].copy()}
    for _ in range(iters):
        st = ROUNDS[method](game, st, np.array([[[lr]]]), K, None)
    return st["x"][0, 0]


def direct_search(game, method: str, K: int, lrs, eps: float, max_rounds: int) -> dict:
    """Deterministic nonlinear game: simulate every step size directly, keep the first to eps."""
    m = maps.METHODS[method]
    iters = max(1, max_rounds // m.rounds_per_iter)
    errs, _ = simulate(game, method, K, lrs, iters, stop_eps=eps)
    errs = errs[..., 0]
    best, reached = _pick(errs[-1], eps)
    T = errs.shape[0] - 1
    if best is None:
        return _row(method, K, None, T, False, "diverged", None, None, None, None)
    lr = float(lrs[best])
    return _row(method, K, lr, T, reached, _status(best, reached), float(errs[-1, best]),
                _grad_ratio(game, method, K, lr, T), measured_rate(errs[:, best], m.rounds_per_iter),
                _rho(game, method, K, lr))


def stochastic_search(game, method: str, K: int, lrs, eps: float, rounds: int, seeds: int, noise_fn) -> dict:
    """Stochastic game: every step size and seed for `rounds` rounds on the same noise; the best lr has the
    lowest mean relative error over the last TAIL_ROUNDS rounds (averaged over seeds)."""
    m = maps.METHODS[method]
    iters = max(1, rounds // m.rounds_per_iter)
    errs, _ = simulate(game, method, K, lrs, iters, seeds=seeds, noise=noise_fn())
    tail = errs[-max(1, TAIL_ROUNDS // m.rounds_per_iter):]
    score = np.where(np.all(np.isfinite(tail), axis=(0, 2)), tail.mean(axis=(0, 2)), np.inf)
    best, _ = _pick(score, eps)
    if best is None:
        return {**_row(method, K, None, iters, False, "diverged", None, None, None, None), "final_rel_err_sd": None}
    mean = errs[:, best].mean(axis=1)
    hit = np.nonzero(mean <= eps)[0]
    row = _row(method, K, float(lrs[best]), int(hit[0]) if hit.size else iters, bool(hit.size),
               "converged" if hit.size else "not_reached", float(score[best]), None, None,
               _rho(game, method, K, float(lrs[best])))
    row["final_rel_err_sd"] = float(tail[:, best].mean(axis=0).std())
    return row
