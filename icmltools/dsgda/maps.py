"""Exact round maps on a quadratic game F(x) = J x + h (spec "Exact analysis"; our derivation).

In error coordinates e = x - x*, one iteration of every method is linear: s' = M s, with s = e, or the
pair (e_t, e_{t-1}) for the methods that remember the previous point (optimistic GDA, Ghost). Each
method is a small class in `METHODS`: its matrices for a stack of step sizes, how many communication
rounds one iteration costs, and how many gradient evaluations per player.
"""
from __future__ import annotations

import abc

import numpy as np


def _eye(L: int, n: int) -> np.ndarray:
    return np.broadcast_to(np.eye(n), (L, n, n)).copy()


def _lr(lrs) -> np.ndarray:
    return np.asarray(lrs, dtype=float)[:, None, None]


class Method(abc.ABC):
    name = ""
    rounds_per_iter = 1
    memory = False          # state (e_t, e_{t-1})
    local = False           # K local steps per round

    def evals(self, K: int) -> int:
        """Gradient evaluations per player per iteration."""
        return K if self.local else 1

    @abc.abstractmethod
    def matrices(self, game, lrs, K: int) -> np.ndarray:
        """The affine round map's matrices, one per step size in `lrs`."""

    def lift(self, e0: np.ndarray) -> np.ndarray:
        return np.concatenate([e0, e0]) if self.memory else e0.copy()


class GDA(Method):
    """Simultaneous GDA: x' = x - lr F(x), M = I - lr J (one round per iteration)."""

    name = "gda"

    def matrices(self, game, lrs, K):
        return _eye(len(lrs), game.n) - _lr(lrs) * game.J


class AltGDA(Method):
    """Alternating (Gauss-Seidel) GDA: player i uses players < i's new strategies:
    (I + lr L) x' = (I - lr (D + U)) x, L/U the strict lower/upper block parts of J."""

    name = "altgda"

    def matrices(self, game, lrs, K):
        lower = np.zeros_like(game.J)
        for i, si in enumerate(game.slices):
            for sj in game.slices[:i]:
                lower[si, sj] = game.J[si, sj]
        eye, lr = _eye(len(lrs), game.n), _lr(lrs)
        return np.linalg.solve(eye + lr * lower, eye - lr * (game.J - lower))


class OGDA(Method):
    """Optimistic GDA: x' = x - lr (2 F(x) - F(x_prev)); state (e, e_prev)."""

    name = "ogda"
    memory = True

    def matrices(self, game, lrs, K):
        n, L, lr = game.n, len(lrs), _lr(lrs)
        M = np.zeros((L, 2 * n, 2 * n))
        M[:, :n, :n] = np.eye(n) - 2 * lr * game.J
        M[:, :n, n:] = lr * game.J
        M[:, n:, :n] = np.eye(n)
        return M


class EG(Method):
    """Extragradient: x' = x - lr F(x - lr F(x)), M = I - lr J + lr^2 J^2; two rounds per iteration."""

    name = "eg"
    rounds_per_iter = 2

    def evals(self, K):
        return 2

    def matrices(self, game, lrs, K):
        lr = _lr(lrs)
        return _eye(len(lrs), game.n) - lr * game.J + lr ** 2 * (game.J @ game.J)


class Decoupled(Method):
    """Decoupled SGDA (the paper's Algorithm, deterministic): each player takes K steps
    y <- y - lr (J_ii y + O_i x_r) against the opponents' communicated x_r; then x_{r+1} = y_K.
    M_K = P - (I - P) D^-1 O with P = blockdiag((I - lr J_ii)^K), computed as the K-th power of the
    augmented map [[I - lr D, -lr O], [0, I]] (valid for singular D too)."""

    name = "decoupled"
    local = True

    def matrices(self, game, lrs, K):
        n, L, lr = game.n, len(lrs), _lr(lrs)
        aug = _eye(L, 2 * n)
        aug[:, :n, :n] -= lr * game.D
        aug[:, :n, n:] = -lr * game.O
        power = np.linalg.matrix_power(aug, int(K))
        return power[:, :n, :n] + power[:, :n, n:]


class Ghost(Method):
    """Ghost SGDA (appendix heuristic; extrapolation ours): the opponents are extrapolated by their last
    displacement, x_ghost(k) = x_r + (k/K)(x_r - x_{r-1}); state (e_r, e_{r-1})."""

    name = "ghost"
    local = True
    memory = True

    def matrices(self, game, lrs, K):
        n, L, lr = game.n, len(lrs), _lr(lrs)
        step = _eye(L, n) - lr * game.D
        cur = np.concatenate([np.eye(n), np.zeros((n, n))], axis=1)
        diff = np.concatenate([np.eye(n), -np.eye(n)], axis=1)
        Y = np.broadcast_to(cur, (L, n, 2 * n)).copy()
        for k in range(int(K)):
            Y = step @ Y - lr * (game.O @ (cur + (k / K) * diff))
        M = np.zeros((L, 2 * n, 2 * n))
        M[:, :n] = Y
        M[:, n:, :n] = np.eye(n)
        return M


class LocalSGDA(Method):
    """Local SGDA (federated minimax): each player's machine runs K joint GDA steps with its own oracle,
    then the server averages the copies. Exact oracles make the copies equal: M = (I - lr J)^K."""

    name = "localsgda"
    local = True

    def matrices(self, game, lrs, K):
        return np.linalg.matrix_power(_eye(len(lrs), game.n) - _lr(lrs) * game.J, int(K))


METHODS = {cls.name: cls() for cls in (Decoupled, Ghost, GDA, AltGDA, OGDA, EG, LocalSGDA)}


def spectral_radius(M: np.ndarray) -> np.ndarray:
    """rho(M) for a stack of matrices."""
    return np.max(np.abs(np.linalg.eigvals(M)), axis=-1)
