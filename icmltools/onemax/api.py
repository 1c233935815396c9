"""One entry point per mode; returns plain dicts for the JSON envelope.

Every algorithm appears as an object with "name", "robustness" and "consistency" (ALG/OPT, the paper's
convention) and the OPT/ALG values beside them ("robustness_opt_over_alg", "consistency_opt_over_alg").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from icmltools.core.errors import BadInputError

from . import data, rules, simulate, worstcase
from .rules import RuleParams

MODES = ("worst-case", "empirical", "stochastic")


@dataclass(frozen=True)
class OneMaxConfig:
    mode: str = "empirical"
    theta: float = 16.0
    params: RuleParams = RuleParams()
    algorithms: tuple[str, ...] = rules.ALGORITHMS
    errors: tuple[float, ...] = (0.95, 0.9, 0.8, 0.6, 0.4)
    noise: tuple[str, ...] = ("exact", "over", "under", "lognormal", "prev-max")
    window: int = 200
    stride: int = 50
    m: float | None = None
    M: float | None = None
    market: str = "walk"
    n_windows: int = 20000
    chunk: int = 20000


def _theory(name: str, theta: float, params: RuleParams) -> dict:
    r, c = worstcase.robustness_consistency(name, theta, params)
    return {"name": name, "robustness": r, "consistency": c, "robustness_opt_over_alg": 1 / r,
            "consistency_opt_over_alg": 1 / c, "pareto_optimal": bool(abs(c * r - 1 / theta) < 1e-9)}


def validate_config(cfg: OneMaxConfig) -> None:
    if cfg.mode not in MODES:
        raise BadInputError(f"unknown --mode {cfg.mode!r}; choose from {', '.join(MODES)}")
    rules.validate(cfg.theta if cfg.mode != "empirical" or cfg.m is not None else None, cfg.params)
    for a in cfg.algorithms:
        if a not in rules.ALGORITHMS + rules.EXTRA_ALGORITHMS:
            raise BadInputError(f"unknown algorithm {a!r}; choose from {', '.join(rules.ALGORITHMS + rules.EXTRA_ALGORITHMS)}")
    for e in cfg.errors:
        if not (0.0 < e <= 1.0):
            raise BadInputError(f"--errors values are E = min(y/p*, p*/y) and must lie in (0, 1], got {e}")
    for nm in cfg.noise:
        if nm not in simulate.NOISE_MODELS:
            raise BadInputError(f"unknown noise model {nm!r}; choose from {', '.join(simulate.NOISE_MODELS)}")
    if cfg.window < 2 or cfg.stride < 1:
        raise BadInputError("--window must be >= 2 and --stride >= 1")


def run_worst_case(cfg: OneMaxConfig, profile_errors=None) -> dict:
    rep = worstcase.worst_case_report(cfg.theta, cfg.params, cfg.algorithms, profile_errors)
    rep["mode"] = "worst-case"
    return rep


def run_empirical(cfg: OneMaxConfig, series: np.ndarray, rng: np.random.Generator, source: str,
                  progress=None) -> dict:
    """Sliding windows (length `window`, step `stride`) over one price series."""
    validate_config(cfg)
    data.check_bounds(series, cfg.m, cfg.M, source)
    T, s = cfg.window, cfg.stride
    if len(series) < T:
        raise BadInputError(f"{source}: {len(series)} prices, fewer than --window {T}")
    sw = np.lib.stride_tricks.sliding_window_view(series, T)
    starts = np.arange(0, len(series) - T + 1, s)
    use_prev = "prev-max" in cfg.noise
    if use_prev:
        starts = starts[starts >= T]  # each window needs the previous T prices for its prediction
        if starts.size == 0:
            raise BadInputError(f"{source}: too short for the prev-max predictor (needs 2 x --window prices)")
    lookahead = cfg.m is None
    if lookahead:
        m_fn = lambda i0, i1, x: x.min(axis=1)
        M_fn = lambda i0, i1, x: x.max(axis=1)
    else:
        m_fn = lambda i0, i1, x: np.full(len(x), cfg.m)
        M_fn = lambda i0, i1, x: np.full(len(x), cfg.M)
    prev_fn = (lambda i0, i1: sw[starts[i0:i1] - T].max(axis=1)) if use_prev else None
    emp = simulate.simulate_windows(lambda i0, i1: sw[starts[i0:i1]], len(starts), m_fn, M_fn, cfg.params,
                                    cfg.algorithms, simulate.noise_grid(cfg.noise, cfg.errors), rng, cfg.chunk,
                                    progress, prev_fn)
    if lookahead:
        thetas = sw[starts].max(axis=1) / sw[starts].min(axis=1)
        theta_ref = float(np.median(thetas))
    else:
        theta_ref = cfg.M / cfg.m
    theta_ref = max(theta_ref, 1.0 + 1e-9)
    return {
        "mode": "empirical", "source": source, "n_prices": int(len(series)), "n_windows": int(len(starts)),
        "window": T, "stride": s,
        "bounds": {"m": cfg.m, "M": cfg.M, "lookahead": lookahead,
                   "note": "bounds taken from each window (look-ahead: the trader is told m and M of the future)"
                   if lookahead else "declared bounds"},
        "theta": theta_ref, "theta_is_median_of_windows": lookahead,
        "algorithms": [dict(_theory(a, theta_ref, cfg.params), empirical=emp[a]) for a in cfg.algorithms],
    }


def run_stochastic(cfg: OneMaxConfig, rng: np.random.Generator, progress=None) -> dict:
    """Random price windows in [1, theta] and random predictions; E[ALG]/E[OPT] per algorithm."""
    validate_config(cfg)
    T = cfg.window
    noise = tuple(n for n in cfg.noise if n != "prev-max")
    gen_rng = np.random.default_rng(rng.integers(2**63))

    def windows(i0, i1):
        return data.random_windows(cfg.market, i1 - i0, T, cfg.theta, gen_rng)

    one = lambda i0, i1, x: np.ones(len(x))
    th = lambda i0, i1, x: np.full(len(x), cfg.theta)
    emp = simulate.simulate_windows(windows, cfg.n_windows, one, th, cfg.params, cfg.algorithms,
                                    simulate.noise_grid(noise, cfg.errors), rng, cfg.chunk, progress)
    return {"mode": "stochastic", "market": cfg.market, "n_windows": cfg.n_windows, "window": T,
            "theta": cfg.theta,
            "algorithms": [dict(_theory(a, cfg.theta, cfg.params), stochastic=emp[a]) for a in cfg.algorithms]}
