"""The game families (spec "Games"): quadratic games F(x) = J x + h with blocks, and the Dirac-GAN-style
nonlinear game. Every random draw comes from `core.seed.derive`."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.files import check_input_file
from icmltools.core.seed import derive


@dataclass
class QuadGame:
    """F(x) = J x + h over players' blocks; x* = -J^-1 h (spec "Exact analysis")."""

    J: np.ndarray
    h: np.ndarray
    blocks: tuple
    names: tuple = ()
    sym_pd: bool = True
    x0: np.ndarray | None = None
    slices: list = field(init=False)

    def __post_init__(self):
        ends = np.cumsum((0,) + tuple(self.blocks))
        self.slices = [slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]
        self.D = np.zeros_like(self.J)
        for s in self.slices:
            self.D[s, s] = self.J[s, s]
        self.O = self.J - self.D
        self.xstar = -np.linalg.solve(self.J, self.h)
        if self.x0 is None:
            self.x0 = np.zeros_like(self.h)

    @property
    def n(self) -> int:
        return int(self.J.shape[0])

    def rho_br(self) -> float | None:
        """rho(D^-1 O): K -> infinity (exact best responses) converges iff < 1; None if D is singular."""
        try:
            return float(np.max(np.abs(np.linalg.eigvals(np.linalg.solve(self.D, self.O)))))
        except np.linalg.LinAlgError:
            return None

    def F(self, X):
        return X @ self.J.T + self.h

    def own_grads(self, Y, Xr):
        """Player i's gradient at (y_i, x_r,-i) for every i at once: D y + O x_r + h."""
        return Y @ self.D.T + Xr @ self.O.T + self.h


def _spd(rng, d: int, mu: float, L: float) -> np.ndarray:
    """Q diag(geomspace(mu, L, d)) Q' with a random orthogonal Q (sign-fixed QR of a Gaussian)."""
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    q = q * np.sign(np.diag(r))
    return (q * np.geomspace(mu, L, d)) @ q.T


def _unit_coupling(rng, d: int) -> np.ndarray:
    g = rng.standard_normal((d, d))
    return g / np.linalg.norm(g, 2)


def quadratic(dim: int, kappa: float, mu: float, coupling: float, seed: int) -> QuadGame:
    """Two-player SCSC game (spec `quadratic`): J = [[A, C], [-C', B]], h = (a, b); draws in the order
    Q_A, Q_B, G, a, b, so every coupling shares them (lambda_max(C) = coupling)."""
    rng = derive(seed, "dsgda", "game", "quadratic").numpy()
    A, B = _spd(rng, dim, mu, mu * kappa), _spd(rng, dim, mu, mu * kappa)
    C = coupling * _unit_coupling(rng, dim)
    a, b = rng.standard_normal(dim), rng.standard_normal(dim)
    J = np.block([[A, C], [-C.T, B]])
    return QuadGame(J, np.concatenate([a, b]), (dim, dim), ("u", "v"))


def nplayer(players: int, dim: int, kappa: float, mu: float, coupling: float, seed: int) -> QuadGame:
    """N-player pairwise zero-sum quadratic game: J_ii SPD, J_ij = c G/||G||_2 (i < j), J_ji = -J_ij'."""
    rng = derive(seed, "dsgda", "game", "nplayer").numpy()
    n = players * dim
    J = np.zeros((n, n))
    for i in range(players):
        J[i * dim:(i + 1) * dim, i * dim:(i + 1) * dim] = _spd(rng, dim, mu, mu * kappa)
    for i in range(players):
        for j in range(i + 1, players):
            G = coupling * _unit_coupling(rng, dim)
            J[i * dim:(i + 1) * dim, j * dim:(j + 1) * dim] = G
            J[j * dim:(j + 1) * dim, i * dim:(i + 1) * dim] = -G.T
    h = rng.standard_normal(n)
    return QuadGame(J, h, (dim,) * players, tuple(f"p{i}" for i in range(players)))


def _field(doc: dict, key: str, path: str):
    if key not in doc:
        raise BadInputError(f"{path}: missing key {key!r}", param="game")
    return doc[key]


def _finite_array(value, what: str, path: str, ndim: int) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise BadInputError(f"{path}: {what} must be numbers (a {'matrix' if ndim == 2 else 'vector'})",
                            param="game") from None
    if arr.ndim != ndim:
        raise BadInputError(f"{path}: {what} must be a {'matrix (list of rows)' if ndim == 2 else 'vector'}",
                            param="game")
    if not np.all(np.isfinite(arr)):
        raise BadInputError(f"{path}: {what} has non-finite values", param="game")
    return arr


def _check_blocks(blocks, n: int, path: str) -> tuple:
    if not isinstance(blocks, list) or not blocks or not all(isinstance(b, int) and not isinstance(b, bool)
                                                              and b >= 1 for b in blocks):
        raise BadInputError(f"{path}: blocks must be a list of positive integers", param="game")
    if sum(blocks) != n:
        raise BadInputError(f"{path}: blocks sum to {sum(blocks)}, J is {n} x {n}", param="game")
    if len(blocks) < 2:
        raise BadInputError(f"{path}: a game needs at least 2 players (blocks)", param="game")
    return tuple(blocks)


def from_json(path: str) -> QuadGame:
    """A user's game: {"blocks": [d1, ..], "J": [[..]], "h": [..], "names": [..]} (spec FILE.json)."""
    check_input_file(path)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh, parse_constant=lambda c: float(c))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInputError(f"{path}: not valid JSON ({str(e).splitlines()[0]})", param="game") from None
    if not isinstance(doc, dict):
        raise BadInputError(f"{path}: expected a JSON object with blocks, J, h", param="game")
    J = _finite_array(_field(doc, "J", path), "J", path, 2)
    if J.shape[0] != J.shape[1]:
        raise BadInputError(f"{path}: J must be square, got {J.shape[0]} x {J.shape[1]}", param="game")
    h = _finite_array(_field(doc, "h", path), "h", path, 1)
    if h.shape[0] != J.shape[0]:
        raise BadInputError(f"{path}: h has length {h.shape[0]}, J is {J.shape[0]} x {J.shape[0]}", param="game")
    blocks = _check_blocks(_field(doc, "blocks", path), J.shape[0], path)
    if np.linalg.cond(J) > 1e12:
        raise BadInputError(f"{path}: J is singular (condition number > 1e12): no unique equilibrium",
                            param="game")
    names = doc.get("names") or [f"p{i}" for i in range(len(blocks))]
    if not isinstance(names, list) or len(names) != len(blocks):
        raise BadInputError(f"{path}: names must list one name per block", param="game")
    sym = (J + J.T) / 2
    sym_pd = bool(np.min(np.linalg.eigvalsh(sym)) > 0)
    return QuadGame(J, h, blocks, tuple(map(str, names)), sym_pd=sym_pd)


@dataclass
class DiracGan:
    """f(t, p) = lam log sigmoid(t.p) + |t|^2/2 - |p|^2/2 (spec `dirac-gan`, ours): player t minimises,
    p maximises; x* = 0; F = (grad_t f, -grad_p f)."""

    dim: int
    lam: float
    x0: np.ndarray
    blocks: tuple = ()
    names: tuple = ("t", "p")

    def __post_init__(self):
        self.blocks = (self.dim, self.dim)
        self.xstar = np.zeros(2 * self.dim)
        self.slices = [slice(0, self.dim), slice(self.dim, 2 * self.dim)]
        half = self.lam / 2 * np.eye(self.dim)
        self.J = np.block([[np.eye(self.dim), half], [-half, np.eye(self.dim)]])  # Jacobian of F at x*
        self.D = np.eye(2 * self.dim)
        self.O = self.J - self.D

    @property
    def n(self) -> int:
        return 2 * self.dim

    def rho_br(self) -> float:
        return float(self.lam / 2)

    def _parts(self, t, p):
        s = 1.0 / (1.0 + np.exp(np.clip(np.sum(t * p, axis=-1, keepdims=True), -500, 500)))  # sigmoid(-t.p)
        return self.lam * s * p + t, -(self.lam * s * t) + p

    def F(self, X):
        gt, gp = self._parts(X[..., :self.dim], X[..., self.dim:])
        return np.concatenate([gt, gp], axis=-1)

    def own_grads(self, Y, Xr):
        gt, _ = self._parts(Y[..., :self.dim], Xr[..., self.dim:])
        _, gp = self._parts(Xr[..., :self.dim], Y[..., self.dim:])
        return np.concatenate([gt, gp], axis=-1)


def dirac_gan(dim: int, lam: float, seed: int) -> DiracGan:
    x0 = derive(seed, "dsgda", "game", "dirac-gan", "x0").numpy().standard_normal(2 * dim) / math.sqrt(dim)
    return DiracGan(dim, lam, x0)
