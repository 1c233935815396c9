"""The accuracy-curve game and input checks.

Theory accuracy (paper): a(s) = 1 - alpha (||s||_1 + 1)^-beta. Non-IID [inf]: a_i(s) = 1 - alpha_i
(sum_j W_ij s_j + 1)^-beta_i. A coalition X keeps only its members' data: s[X] = s with entries outside X
set to 0. Values are gains over the no-data model, so v(empty) = 0 and payments balance [inf].
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.files import check_input_file
from icmltools.core.seed import derive

from .options import COALITION_VALUES, GameConfig


@dataclass
class CurveGame:
    """n agents with accuracy curves a_i, data weights W, costs gamma_i s_i and caps s_max_i."""

    alpha: np.ndarray
    beta: np.ndarray
    W: np.ndarray
    gamma: np.ndarray
    s_max: np.ndarray
    coalition_value: str = "all"

    @property
    def n(self) -> int:
        return len(self.alpha)

    def acc(self, S: np.ndarray) -> np.ndarray:
        """a_j for every profile row of S (m, n) -> (m, n)."""
        return 1.0 - self.alpha * (S @ self.W.T + 1.0) ** (-self.beta)

    def acc0(self) -> np.ndarray:
        return 1.0 - self.alpha

    def gains(self, S: np.ndarray) -> np.ndarray:
        """a_j(S) - a_j(0), (m, n)."""
        return self.alpha * (1.0 - (S @ self.W.T + 1.0) ** (-self.beta))

    def dacc(self, S: np.ndarray, i: int) -> np.ndarray:
        """d a_j / d s_i at every profile row of S, (m, n)."""
        return self.alpha * self.beta * (S @ self.W.T + 1.0) ** (-self.beta - 1.0) * self.W[:, i]

    def scope(self, masks: np.ndarray) -> np.ndarray:
        """Whose gains count in v(X): everyone ('all') or the members of X ('members')."""
        return np.ones_like(masks) if self.coalition_value == "all" else masks

    def value(self, masks: np.ndarray, s: np.ndarray) -> np.ndarray:
        """v(X) = sum_j [a_j(s[X]) - a_j(0)] over the scope, for every mask row (K, n) -> (K,)."""
        return (self.gains(masks * s) * self.scope(masks)).sum(axis=1)

    def cost(self, s: np.ndarray) -> np.ndarray:
        return self.gamma * s


def _vector(doc: dict, key: str, n: int, src: str, required: bool = True, default=None) -> np.ndarray:
    if key not in doc:
        if required:
            raise BadInputError(f"{src}: missing key {key!r}", param="agents")
        return np.full(n, default, dtype=float)
    x = doc[key]
    try:
        arr = np.full(n, float(x)) if isinstance(x, (int, float)) else np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise BadInputError(f"{src}: {key!r} must be a number or a list of {n} numbers", param="agents") from None
    if arr.shape != (n,):
        raise BadInputError(f"{src}: {key!r} has shape {list(arr.shape)}, expected {n} values (one per agent; "
                            f"n comes from 'alpha')", param="agents")
    if not np.all(np.isfinite(arr)):
        raise BadInputError(f"{src}: {key!r} has a non-finite value", param="agents")
    return arr


def _matrix(doc: dict, n: int, src: str) -> np.ndarray:
    if "W" not in doc:
        return np.ones((n, n))
    try:
        W = np.asarray(doc["W"], dtype=float)
    except (TypeError, ValueError):
        raise BadInputError(f"{src}: 'W' must be an {n} x {n} list of lists of numbers", param="agents") from None
    if W.shape != (n, n):
        raise BadInputError(f"{src}: 'W' has shape {list(W.shape)}, expected {n} x {n}", param="agents")
    if not np.all(np.isfinite(W)) or np.any(W < 0):
        raise BadInputError(f"{src}: 'W' must be finite and non-negative", param="agents")
    return W


def check_game(g: CurveGame, src: str = "agents") -> CurveGame:
    """Concave increasing curves need 0 < alpha <= 1, beta > 0; costs and caps non-negative."""
    if g.coalition_value not in COALITION_VALUES:
        raise BadInputError(f"unknown coalition value {g.coalition_value!r}", param="coalition_value")
    checks = [(g.alpha, "alpha", lambda a: (a > 0) & (a <= 1), "in (0, 1]"), (g.beta, "beta", lambda b: b > 0, "> 0"),
              (g.gamma, "gamma", lambda c: c >= 0, ">= 0"), (g.s_max, "s_max", lambda m: m > 0, "> 0")]
    for arr, key, ok, want in checks:
        if not np.all(ok(arr)):
            raise BadInputError(f"{src}: every {key!r} must be {want}", param="agents")
    return g


def load_agents(path, coalition_value: str = "all", need_gamma: bool = True) -> CurveGame:
    """agents.json: {"alpha": [..], "beta": [..], "gamma": [..], "s_max": [..], "W": [[..]]}; alpha fixes n,
    the others are lists of n numbers or one number; W defaults to all ones (pooled data, the paper's model)."""
    p = check_input_file(path)
    doc = _read_json(p, "agents")
    if not isinstance(doc, dict) or "alpha" not in doc:
        raise BadInputError(f"{p}: expected a JSON object with at least 'alpha'", param="agents")
    a = doc["alpha"]
    n = len(a) if isinstance(a, list) else int(doc.get("n", 0))
    if n < 1:
        raise BadInputError(f"{p}: 'alpha' must be a list with one value per agent", param="agents")
    g = CurveGame(alpha=_vector(doc, "alpha", n, p), beta=_vector(doc, "beta", n, p),
                  W=_matrix(doc, n, p), gamma=_vector(doc, "gamma", n, p, required=need_gamma, default=0.0),
                  s_max=_vector(doc, "s_max", n, p, required=False, default=math.inf),
                  coalition_value=coalition_value)
    return check_game(g, str(p))


def _read_json(p, param: str):
    try:
        return json.loads(p.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadInputError(f"{p}: not valid JSON ({str(e).splitlines()[0]})", param=param) from None


def _refuse_constant(name: str):
    raise ValueError(f"non-finite number {name}")


def load_contrib(path, n: int | None = None) -> np.ndarray:
    """contrib.json: a list of n data contributions, or {"s": [..]}; finite and non-negative."""
    p = check_input_file(path)
    doc = _read_json(p, "contrib")
    if isinstance(doc, dict):
        doc = doc.get("s")
    try:
        s = np.asarray(doc, dtype=float)
    except (TypeError, ValueError):
        s = np.zeros(0)
    if s.ndim != 1 or s.size == 0:
        raise BadInputError(f"{p}: expected a list of numbers (or {{\"s\": [...]}})", param="contrib")
    return check_contrib(s, n, str(p))


def check_contrib(s, n: int | None = None, src: str = "contributions") -> np.ndarray:
    s = np.asarray(s, dtype=float)
    if not np.all(np.isfinite(s)):
        raise BadInputError(f"{src}: contributions must be finite", param="contrib")
    if np.any(s < 0):
        raise BadInputError(f"{src}: contributions must be non-negative (agent {int(np.argmax(s < 0))} "
                            f"has {s[s < 0][0]:g})", param="contrib")
    if n is not None and s.size != n:
        raise BadInputError(f"{src}: {s.size} contributions for {n} agents", param="contrib")
    return s


def default_game(cfg: GameConfig, seed: int, coalition_value: str = "all") -> CurveGame:
    """The embedded default (spec [inf]): groups i mod G, W = rho_in within / rho_out across, W_ii = 1,
    gamma_i ~ U(gamma_low, gamma_high) from derive(seed) (bitwise numpy's default generator for that seed, the stream of the
    spec's prototype, so its reference table reproduces; the package's other streams carry stage keys)."""
    if cfg.n < 1:
        raise BadInputError("must be at least 1", param="n")
    grp = np.arange(cfg.n) % cfg.groups
    W = np.where(grp[:, None] == grp[None, :], cfg.rho_in, cfg.rho_out)
    np.fill_diagonal(W, 1.0)
    gamma = derive(seed).numpy().uniform(cfg.gamma_low, cfg.gamma_high, size=cfg.n)
    g = CurveGame(alpha=np.full(cfg.n, cfg.alpha), beta=np.full(cfg.n, cfg.beta), W=W.astype(float),
                  gamma=gamma, s_max=np.full(cfg.n, cfg.s_max), coalition_value=coalition_value)
    return check_game(g, "default game")


def load_vector(path, param: str) -> list:
    """A JSON list of finite numbers (shape checks are the caller's)."""
    p = check_input_file(path)
    doc = _read_json(p, param)
    try:
        arr = np.asarray(doc, dtype=float)
    except (TypeError, ValueError):
        arr = np.zeros((0, 0))
    if arr.ndim != 1:
        raise BadInputError(f"{p}: expected a JSON list of numbers", param=param)
    return arr.tolist()
