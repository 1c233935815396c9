"""What `icml shap-pay` calls: `demo`, `equilibrium`, `payments` (plain arguments in, plain dicts out)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive

from . import dynamics
from . import game as game_mod
from . import shapley as sh
from .mechanisms import MECHANISM_CLASSES
from .options import (
    COALITION_VALUES,
    DEMO_CONTRIB,
    DYNAMICS,
    MAX_EXACT,
    SHAPLEY_MODES,
    EquilibriumConfig,
    GameConfig,
    ShapleyConfig,
)


def check_shapley(cfg: ShapleyConfig, n: int) -> None:
    if cfg.shapley not in SHAPLEY_MODES:
        raise BadInputError(f"unknown mode {cfg.shapley!r}", param="shapley")
    if cfg.coalition_value not in COALITION_VALUES:
        raise BadInputError(f"unknown coalition value {cfg.coalition_value!r}", param="coalition_value")
    if cfg.shapley == "exact" and n > MAX_EXACT:
        raise BadInputError(f"n = {n} agents is too many for exact Shapley (2^n coalitions; at most "
                            f"{MAX_EXACT}); use mc or auto", param="shapley")
    if cfg.perms is not None and cfg.perms < 2:
        raise BadInputError("must be at least 2", param="perms")


def make_coalitions(n: int, cfg: ShapleyConfig, seed: int) -> sh.Coalitions:
    """Exact or Monte Carlo coalitions; the permutations come from derive(seed, 'shappay', 'perms')."""
    check_shapley(cfg, n)
    return sh.coalitions(n, cfg.shapley, cfg.perms, derive(seed, "shappay", "perms"))


def _clean(d: dict) -> dict:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in d.items()}


def _game_doc(game) -> dict:
    return {"n": game.n, "alpha": game.alpha, "beta": game.beta, "gamma": game.gamma, "s_max": game.s_max,
            "W": game.W, "coalition_value": game.coalition_value}


def solve_mechanism(name: str, game, coal, cfg: EquilibriumConfig, seed: int, progress=None) -> dict:
    """One mechanism's equilibrium (the planner's optimum for 'planner') and its metrics."""
    if name == "planner":
        res = dynamics.planner(game, cfg)
        out = dynamics.metrics(None, game, coal, res["s"])
        out.update(rounds=res["rounds"], gap=res["gap"], converged=res["converged"], deviation_gain=None)
        return _clean(out)
    mech = MECHANISM_CLASSES[name]()
    rng = derive(seed, "shappay", "dynamics", name).numpy()
    res = dynamics.DYNAMICS[cfg.dynamics](mech, game, coal, cfg, rng, progress)
    out = dynamics.metrics(mech, game, coal, res["s"])
    grid = dynamics.auto_grid(mech, coal, game.n, cfg.deviation_grid)
    out.update(rounds=res["rounds"], gap=res["gap"], converged=res["converged"],
               deviation_gain=dynamics.deviation_gain(mech, game, coal, res["s"], grid) if grid else None)
    return _clean(out)


def equilibrium(game, shap: ShapleyConfig, cfg: EquilibriumConfig, seed: int, progress=None) -> dict:
    """Every requested mechanism on the same game and the same Shapley coalitions; gains vs M0."""
    if cfg.dynamics not in DYNAMICS:
        raise BadInputError(f"unknown dynamics {cfg.dynamics!r}", param="dynamics")
    unknown = [m for m in cfg.mechanisms if m not in MECHANISM_CLASSES and m != "planner"]
    if unknown:
        raise BadInputError(f"unknown mechanism {unknown[0]!r}", param="mechanism")
    if cfg.k is not None and not 1 <= cfg.k:
        raise BadInputError("must be at least 1", param="k")
    dynamics.check_equilibrium_game(game)
    coal = make_coalitions(game.n, shap, seed)
    mechs = {m: solve_mechanism(m, game, coal, cfg, seed, progress) for m in cfg.mechanisms}
    out = {"config": {"game": _clean(_game_doc(game)), "shapley": coal.mode, "perms": coal.perms,
                      "dynamics": cfg.dynamics, "k": min(game.n, cfg.k or -(-game.n // 4)), "tol": cfg.tol},
           "mechanisms": mechs}
    if "shap" in mechs and "none" in mechs:
        m0, ms = mechs["none"], mechs["shap"]
        out["data_gain"] = ms["total_data"] / m0["total_data"] if m0["total_data"] > 0 else None
        out["acc_gain"] = ms["mean_acc"] / m0["mean_acc"]
    return out


def demo(seed: int, progress=None, coalition_value: str = "all") -> dict:
    """The spec's embedded default: n = 8 in two groups, every mechanism, exact Shapley, k = 2."""
    game = game_mod.default_game(GameConfig(), seed, coalition_value)
    return equilibrium(game, ShapleyConfig(coalition_value=coalition_value), EquilibriumConfig(), seed, progress)


def summary_rows(result: dict) -> list:
    """Rows of the short stderr table: mechanism, total data, mean acc, welfare, reciprocity, free riders, rounds."""
    rows = []
    for name, m in result["mechanisms"].items():
        rows.append([name, m["total_data"], m["mean_acc"], m["welfare"], m["reciprocity"], m["free_riders"],
                     m["rounds"] if name != "planner" else "-"])
    return rows


# ------------------------------------------------------------------------------------------------ payments


def _src_agents(path, s, shap, seed, **_):
    game = game_mod.load_agents(path, shap.coalition_value, need_gamma=False)
    s = game_mod.check_contrib(s, game.n)
    return (lambda M: game.value(M, s)), game.n, s, game.gains(s[None])[0], game.gamma, {}


def _src_values(path, s, shap, seed, subtract_empty=False, **_):
    from . import values

    table = values.read_coalitions(path)
    n = len(s) if s is not None else max(max(k) for k in table if k) + 1
    s = game_mod.check_contrib(s if s is not None else np.zeros(n), n)
    check_shapley(shap, n)
    exact = shap.shapley == "exact" or (shap.shapley == "auto" and n <= MAX_EXACT)
    v = values.table_value(table, n, str(path), exact)
    v0 = v.check_empty(subtract_empty, "values")
    return v, n, s, None, np.zeros(n), {"v_empty": v0}


def _src_value_cmd(cmd, s, shap, seed, subtract_empty=False, **_):
    from . import values

    if s is None:
        raise BadInputError("a value command needs the contributions", param="contrib")
    s = game_mod.check_contrib(s)
    v = values.command_value(cmd, s)
    v0 = v.check_empty(subtract_empty, "value_cmd")
    return v, len(s), s, None, np.zeros(len(s)), {"v_empty": v0}


def _src_digits(cfg, s, shap, seed, fit=False, **_):
    from . import digits

    s = game_mod.check_contrib(np.asarray(s if s is not None else DEMO_CONTRIB[:cfg.n], dtype=float))
    if len(s) != cfg.n:
        cfg = replace(cfg, n=len(s))
    data = digits.DigitsData(cfg, seed)
    v = digits.DigitsValue(data, s, shap.coalition_value)
    extra = {"fit": digits.fit_curve(data, seed)} if fit else {}
    return v, cfg.n, s, None, np.zeros(cfg.n), extra


SOURCES = {"agents": _src_agents, "values": _src_values, "value_cmd": _src_value_cmd, "digits": _src_digits}


def _check_gains(gains, vN: float, n: int) -> np.ndarray:
    g = np.asarray(gains, dtype=float)
    if g.shape != (n,) or not np.all(np.isfinite(g)):
        raise BadInputError(f"expected {n} finite numbers (a_i(s) - a_i(0) per agent)", param="gains")
    if abs(g.sum() - vN) > 1e-9 * max(1.0, abs(vN)):
        raise BadInputError(f"the gains sum to {g.sum():.6g} but v(N) = {vN:.6g}; payments would not balance",
                            param="gains")
    return g


def payments(source: str, spec, s, shap: ShapleyConfig, seed: int, gains=None, **kw) -> dict:
    """M^Shap payments at one profile: p_i = phi_i - (a_i(s) - a_i(0)) (budget balanced: sum_i p_i =
    v(N) - sum_i gains_i = 0); utilities gain_i + p_i - gamma_i s_i; reciprocity (gain_i + p_i) / phi_i."""
    s = None if s is None else np.asarray(s, dtype=float)
    value_fn, n, s, own_gains, gamma, extra = SOURCES[source](spec, s, shap, seed, **kw)
    coal = make_coalitions(n, shap, seed)
    phi, se = sh.shapley(value_fn, coal)
    vN = float(value_fn(np.ones((1, n)))[0])
    if own_gains is not None:
        g, g_src = own_gains, "model"
    elif gains is not None:
        g, g_src = _check_gains(gains, vN, n), "file"
    else:
        g, g_src = np.full(n, vN / n), "equal-split"
    p = phi - g
    pos = phi > 1e-12
    out = {"n": n, "source": source, "shapley": coal.mode, "perms": coal.perms, "contrib": s, "v_grand": vN,
           "phi": phi, "phi_se": se if coal.mode == "mc" else None, "gains": g, "gains_source": g_src,
           "payments": p, "utilities": g + p - gamma * s,
           "reciprocity": float(np.min((g[pos] + p[pos]) / phi[pos])) if pos.any() else None,
           "budget_residual": float(abs(p.sum())), "value_calls": getattr(value_fn, "calls", None)}
    out.update(extra)
    return _clean(out)


def digits_equilibrium(cfg, shap: ShapleyConfig, eq: EquilibriumConfig, game_cfg: GameConfig, seed: int,
                       progress=None) -> dict:
    """Fit the paper's curve to digits, then the equilibrium of that game [inf]: a_i(s) = 1 - 0.9 (sum_j s_j /
    tau + 1)^-beta (pooled data), s_max = pool, gamma_i ~ U(gamma_low, gamma_high) / tau per data point."""
    from . import digits

    data = digits.DigitsData(cfg, seed)
    fit = digits.fit_curve(data, seed)
    n = cfg.n
    gamma = derive(seed, "shappay", "digits", "gamma").numpy().uniform(game_cfg.gamma_low, game_cfg.gamma_high, n)
    game = game_mod.check_game(game_mod.CurveGame(
        alpha=np.full(n, fit["alpha"]), beta=np.full(n, fit["beta"]), W=np.full((n, n), 1.0 / fit["tau"]),
        gamma=gamma / fit["tau"], s_max=np.full(n, float(cfg.pool)), coalition_value=shap.coalition_value))
    out = equilibrium(game, shap, eq, seed, progress)
    out["fit"] = fit
    return out


def payments_from_files(source: str, spec, contrib_path, gains_path, shap: ShapleyConfig, seed: int, **kw) -> dict:
    """`payments` with the contributions and gains read from their JSON files (either may be None)."""
    s = game_mod.load_contrib(contrib_path) if contrib_path else None
    gains = game_mod.load_vector(gains_path, "gains") if gains_path else None
    return payments(source, spec, s, shap, seed, gains=gains, **kw)


def equilibrium_for(agents_path, value: str, game_cfg: GameConfig, shap: ShapleyConfig, eq: EquilibriumConfig,
                    digits_cfg, seed: int, progress=None) -> dict:
    """The game from agents.json, the embedded default (no file), or a curve fitted to digits; then every
    mechanism's equilibrium."""
    if value == "digits":
        return digits_equilibrium(digits_cfg, shap, eq, game_cfg, seed, progress)
    game = (game_mod.load_agents(agents_path, shap.coalition_value) if agents_path
            else game_mod.default_game(game_cfg, seed, shap.coalition_value))
    return equilibrium(game, shap, eq, seed, progress)
