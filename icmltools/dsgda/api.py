"""What `icml dsgda` calls: resolve the configuration, build the games, run every method's step-size
search, summarise the regime split (plain arguments in, plain dicts out)."""
from __future__ import annotations

import functools
import logging
from dataclasses import asdict, replace

import numpy as np

from icmltools.core.errors import BadInputError

from . import games, maps, search
from .options import GAME_DEFAULTS, GAMES, LOCAL_METHODS, LR_GRID, RunConfig
from .sim import Noise

log = logging.getLogger("icmltools.dsgda")


def game_kind(game: str) -> str:
    return game if game in GAMES else "file"


def resolve(cfg: RunConfig) -> RunConfig:
    """Fill the fields left None from the game's defaults (options.GAME_DEFAULTS)."""
    defaults = GAME_DEFAULTS[game_kind(cfg.game)]
    return replace(cfg, **{k: v for k, v in defaults.items() if getattr(cfg, k) is None})


def _check(ok: bool, param: str, msg: str) -> None:
    if not ok:
        raise BadInputError(msg, param=param)


def validate(cfg: RunConfig) -> None:
    """Every numeric input in range (the library's own check; the CLI's types say the same)."""
    _check(0 < cfg.eps < 1, "eps", f"must be in (0, 1), got {cfg.eps}")
    _check(all(int(k) == k and k >= 1 for k in cfg.local_steps), "local_steps", "K must be integers >= 1")
    _check(cfg.kappa >= 1, "kappa", f"must be >= 1, got {cfg.kappa}")
    _check(cfg.mu > 0, "mu", f"must be > 0, got {cfg.mu}")
    _check(cfg.dim >= 1 and cfg.players >= 2, "dim", "dim must be >= 1 and players >= 2")
    _check(cfg.max_rounds >= 1 and cfg.seeds >= 1, "max_rounds", "max_rounds and seeds must be >= 1")
    _check(all(c is None or c >= 0 for c in cfg.coupling), "coupling", "couplings must be >= 0")
    _check(cfg.lr is None or all(x > 0 for x in cfg.lr), "lr", "step sizes must be > 0")
    _check(all(s >= 0 for s in cfg.sigma_self + cfg.sigma_off), "sigma_self", "noise levels must be >= 0")
    _check(game_kind(cfg.game) != "file" or cfg.coupling == (None,), "coupling",
           "a FILE.json game has its own coupling (J); drop this option")
    for name in cfg.methods:
        _check(name in maps.METHODS, "methods", f"unknown method {name!r}")


def build_game(cfg: RunConfig, coupling, seed: int):
    """One game of the family at this coupling (the draws do not depend on the coupling)."""
    kind = game_kind(cfg.game)
    if kind in ("quadratic", "noisy"):
        return games.quadratic(cfg.dim, cfg.kappa, cfg.mu, coupling, seed)
    if kind == "nplayer":
        return games.nplayer(cfg.players, cfg.dim, cfg.kappa, cfg.mu, coupling, seed)
    if kind == "dirac-gan":
        return games.dirac_gan(cfg.dim, coupling, seed)
    return games.from_json(cfg.game)


def _runs(cfg: RunConfig):
    """(method, K) pairs: local methods once per K, the others once."""
    for name in cfg.methods:
        for K in (cfg.local_steps if name in LOCAL_METHODS else (1,)):
            yield name, int(K)


def _sigma_vector(game, sigma_self: tuple) -> np.ndarray:
    if len(sigma_self) not in (1, len(game.blocks)):
        raise BadInputError(f"give one value or one per player ({len(game.blocks)})", param="sigma_self")
    per = sigma_self * len(game.blocks) if len(sigma_self) == 1 else sigma_self
    return np.concatenate([np.full(b, s) for b, s in zip(game.blocks, per)])


def _deterministic_rows(cfg, game, lrs, progress) -> list:
    searcher = search.affine_search if isinstance(game, games.QuadGame) else search.direct_search
    rows = []
    for name, K in _runs(cfg):
        rows.append(searcher(game, name, K, lrs, cfg.eps, cfg.max_rounds))
        progress()
    return rows


def _noisy_rows(cfg, game, lrs, seed, progress) -> list:
    rows, sig = [], _sigma_vector(game, cfg.sigma_self)
    for level in cfg.sigma_off:
        for name, K in _runs(cfg):
            noise = functools.partial(Noise, seed, cfg.seeds, game.n, sig, level)  # same streams for every method
            row = search.stochastic_search(game, name, K, lrs, cfg.eps, cfg.max_rounds, cfg.seeds, noise)
            rows.append({"sigma_off": level, **row})
            progress()
    return rows


def ratios_vs_gda(rows: list) -> list:
    """rounds / GDA's rounds at the same coupling (and noise level), for every other run."""
    out = []
    for r in rows:
        key = (r.get("coupling"), r.get("sigma_off"))
        base = [g for g in rows if g["method"] == "gda" and (g.get("coupling"), g.get("sigma_off")) == key]
        if not base or r["method"] == "gda":
            continue
        a, b = r["rounds_to_eps"], base[0]["rounds_to_eps"]
        out.append({"coupling": key[0], "method": r["method"], "K": r["K"],
                    "ratio": (a / b) if a is not None and b else None})
    return out


def regime(rows: list) -> list:
    """Per local method and K: its rounds against the best single-step baseline (GDA, alt-GDA, OGDA, EG)
    at each coupling, and the first coupling where it stops paying off (null: not within the sweep)."""
    out = []
    for name, K in sorted({(r["method"], r["K"]) for r in rows if r["method"] in ("decoupled", "ghost")}):
        per, stops = [], None
        for c in sorted({r["coupling"] for r in rows if r["coupling"] is not None}):
            at = [r for r in rows if r["coupling"] == c]
            mine = next(r["rounds_to_eps"] for r in at if (r["method"], r["K"]) == (name, K))
            base = [r for r in at if r["method"] in ("gda", "altgda", "ogda", "eg") and r["rounds_to_eps"]]
            best = min(base, key=lambda r: r["rounds_to_eps"]) if base else None
            speedup = (best["rounds_to_eps"] / mine) if best and mine else None
            per.append({"coupling": c, "rho_br": at[0]["rho_br"], "rounds": mine,
                        "best_baseline": best["method"] if best else None,
                        "best_baseline_rounds": best["rounds_to_eps"] if best else None, "speedup": speedup})
            if stops is None and best and (mine is None or speedup <= 1):
                stops = c
        out.append({"method": name, "K": K, "per_coupling": per, "stops_paying_off_at": stops})
    return out


def run(cfg: RunConfig, seed: int, progress=None) -> tuple[dict, dict]:
    """The `run` subcommand: every coupling x method x K, each with its step-size search. Returns
    (result, artifacts)."""
    cfg = resolve(cfg)
    validate(cfg)
    lrs = np.asarray(cfg.lr if cfg.lr else LR_GRID, dtype=float)
    noisy = game_kind(cfg.game) == "noisy"
    per = len(list(_runs(cfg))) * (len(cfg.sigma_off) if noisy else 1)
    total, done, rows, warnings = per * len(cfg.coupling), [0], [], []

    def tick():
        done[0] += 1
        if progress:
            progress("dsgda", done[0], total)

    for c in cfg.coupling:
        game = build_game(cfg, c, seed)
        if not getattr(game, "sym_pd", True):
            warnings.append("the symmetric part of J is not positive definite: convergence is not guaranteed")
            log.warning(warnings[-1])
        head = {"coupling": c, "rho_br": game.rho_br()}
        found = _noisy_rows(cfg, game, lrs, seed, tick) if noisy else _deterministic_rows(cfg, game, lrs, tick)
        rows.extend({**head, **r} for r in found)
    result = {"config": {**asdict(cfg), "lr_grid": "2^(-j/2), j=0..35" if not cfg.lr else list(cfg.lr)},
              "results": rows, "ratio_vs_gda": ratios_vs_gda(rows), "warnings": warnings}
    if not noisy:
        result["regime"] = regime(rows)
    art = {}
    if cfg.plot:
        from .plot import plot_rounds

        art["plot"] = str(plot_rounds(result, cfg.plot))
    return result, art


def _torch_game(game, device):
    """The JSON game's oracles on a torch device: grad_i(y, xs) = J_i. [xs with y at i] + h_i."""
    import torch

    dtype = torch.float32 if str(device).startswith("mps") else torch.float64
    J = torch.as_tensor(game.J, dtype=dtype, device=device)
    h = torch.as_tensor(game.h, dtype=dtype, device=device)
    sl = game.slices

    def make(i):
        def grad(y, xs):
            full = torch.cat([y if j == i else xs[j] for j in range(len(sl))])
            return J[sl[i]] @ full + h[sl[i]]
        return grad

    def residual(xs):
        return torch.linalg.vector_norm(J @ torch.cat(xs) + h).item()

    x0 = [torch.zeros(s.stop - s.start, dtype=dtype, device=device) for s in sl]
    return [make(i) for i in range(len(sl))], x0, residual


def solve(cfg, device: str = "cpu", progress=None) -> dict:
    """The `solve` subcommand: one method on the user's JSON game through the gradient-oracle loop
    (`oracle.solve`), on a torch device; stops at ||F(x)|| <= eps ||F(x0)||."""
    from .oracle import solve as oracle_solve

    _check(0 < cfg.eps < 1, "eps", f"must be in (0, 1), got {cfg.eps}")
    _check(cfg.local_steps >= 1, "local_steps", "K must be >= 1")
    _check(cfg.rounds >= 1, "rounds", "must be >= 1")
    _check(cfg.lr is None or cfg.lr > 0, "lr", "must be > 0")
    game = games.from_json(cfg.game)
    lr = cfg.lr or 1.0 / max(np.linalg.norm(game.J[s, s], 2) for s in game.slices)
    grads, x0, residual = _torch_game(game, device)
    cb = (lambda r, xs: progress("rounds", r, cfg.rounds)) if progress else None
    out = oracle_solve(grads, x0, method=cfg.method, lr=lr, K=cfg.local_steps, rounds=cfg.rounds,
                       residual=residual, eps=cfg.eps, callback=cb)
    x = np.concatenate([t.detach().cpu().double().numpy() for t in out["x"]])
    hist = out["rel_residual"]
    if not np.all(np.isfinite(x)):
        from icmltools.core.errors import RuntimeFailure

        raise RuntimeFailure(f"{cfg.method} diverged at lr {lr:g}; try a smaller lr")
    reached = bool(hist and hist[-1] <= cfg.eps)
    return {"game": cfg.game, "names": list(game.names), "blocks": list(game.blocks), "method": cfg.method,
            "K": cfg.local_steps if cfg.method != "gda" else 1, "lr": lr, "rounds": out["rounds"],
            "rounds_to_eps": out["rounds"] if reached else None, "grad_evals": out["grad_evals_per_player"],
            "final_rel_residual": hist[-1] if hist else None,
            "final_rel_err": float(np.linalg.norm(x - game.xstar) / max(np.linalg.norm(game.xstar), 1e-300)),
            "rho_br": game.rho_br(), "sym_pd": game.sym_pd,
            "strategies": {n: x[s].tolist() for n, s in zip(game.names, game.slices)}}
