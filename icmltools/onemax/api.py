"""The one entry point of `icml onemax-sim`: `run(cfg, seed)` for every mode; returns plain dicts.

Every algorithm appears as an object with "name", "robustness" and "consistency" (ALG/OPT, the paper's
convention) and the OPT/ALG values beside them ("robustness_opt_over_alg", "consistency_opt_over_alg").
Random streams: the embedded market `derive(seed, "onemax", "market")`, empirical predictions
`derive(seed, "onemax", "empirical", "predictions")`, stochastic prices and predictions
`derive(seed, "onemax", "stochastic", "prices" | "predictions")`.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive

from . import data, options, rules, simulate, worstcase
from .options import OneMaxConfig, RuleParams

__all__ = ["OneMaxConfig", "RuleParams", "MODES", "resolve", "validate_config", "run", "run_worst_case",
           "run_empirical", "run_stochastic"]

MODES = options.MODES


def resolve(cfg: OneMaxConfig) -> OneMaxConfig:
    """Fill the error levels left open: the worst-case grid in worst-case mode, SIMULATION_ERRORS otherwise."""
    if cfg.errors is not None:
        return cfg
    if cfg.mode == "worst-case":
        return replace(cfg, errors=tuple(float(e) for e in worstcase.default_errors()))
    return replace(cfg, errors=options.SIMULATION_ERRORS)


def _theory(name: str, theta: float, params: RuleParams) -> dict:
    r, c = worstcase.robustness_consistency(name, theta, params)
    return {"name": name, "robustness": r, "consistency": c, "robustness_opt_over_alg": 1 / r,
            "consistency_opt_over_alg": 1 / c, "pareto_optimal": bool(abs(c * r - 1 / theta) < 1e-9)}


def validate_config(cfg: OneMaxConfig) -> None:
    cfg = resolve(cfg)
    if cfg.mode not in MODES:
        raise BadInputError(f"unknown mode {cfg.mode!r}; choose from {', '.join(MODES)}", param="mode")
    rules.validate(cfg.theta if cfg.mode != "empirical" or cfg.m is not None else None, cfg.params)
    for a in cfg.algorithms:
        if a not in options.ALL_ALGORITHMS:
            raise BadInputError(f"unknown algorithm {a!r}; choose from {', '.join(options.ALL_ALGORITHMS)}",
                                param="algorithms")
    lo_ok = (lambda e: 0.0 <= e) if cfg.mode == "worst-case" else (lambda e: 0.0 < e)
    for e in cfg.errors:
        if not (lo_ok(e) and e <= 1.0):
            span = "[0, 1]" if cfg.mode == "worst-case" else "(0, 1]"
            raise BadInputError(f"values are E = min(y/p*, p*/y) and must lie in {span}, got {e}", param="errors")
    for nm in cfg.noise:
        if nm not in options.NOISE_MODELS:
            raise BadInputError(f"unknown noise model {nm!r}; choose from {', '.join(options.NOISE_MODELS)}",
                                param="noise")
    if cfg.window < 2:
        raise BadInputError(f"must be >= 2, got {cfg.window}", param="window")
    if cfg.stride < 1:
        raise BadInputError(f"must be >= 1, got {cfg.stride}", param="stride")


def run_worst_case(cfg: OneMaxConfig, profile_errors=None) -> dict:
    """Worst-case mode: exact profiles g(E), r, c, Pareto front, smoothness bound (no data, no randomness)."""
    errors = profile_errors if profile_errors is not None else resolve(cfg).errors
    rep = worstcase.worst_case_report(cfg.theta, cfg.params, cfg.algorithms, errors)
    rep["mode"] = "worst-case"
    return rep


def _window_bounds(cfg: OneMaxConfig):
    """Per-window m and M: the declared bounds, or each window's own min / max (a look-ahead)."""
    if cfg.m is None:
        return (lambda i0, i1, x: x.min(axis=1)), (lambda i0, i1, x: x.max(axis=1))
    return (lambda i0, i1, x: np.full(len(x), cfg.m)), (lambda i0, i1, x: np.full(len(x), cfg.M))


def run_empirical(cfg: OneMaxConfig, series: np.ndarray, seed: int = 0, source: str = "prices",
                  progress=None) -> dict:
    """Sliding windows (length `window`, step `stride`) over one price series; predictions from
    `derive(seed, "onemax", "empirical", "predictions")`."""
    cfg = resolve(cfg)
    validate_config(cfg)
    data.check_bounds(series, cfg.m, cfg.M, source)
    T, s = cfg.window, cfg.stride
    if len(series) < T:
        raise BadInputError(f"{source}: {len(series)} prices, fewer than the window length {T}", param="window")
    sw = np.lib.stride_tricks.sliding_window_view(series, T)
    starts = np.arange(0, len(series) - T + 1, s)
    use_prev = "prev-max" in cfg.noise
    if use_prev:
        starts = starts[starts >= T]  # each window needs the previous T prices for its prediction
        if starts.size == 0:
            raise BadInputError(f"{source}: too short for the prev-max predictor (needs 2 x the window length)",
                                param="window")
    lookahead = cfg.m is None
    m_fn, M_fn = _window_bounds(cfg)
    prev_fn = (lambda i0, i1: sw[starts[i0:i1] - T].max(axis=1)) if use_prev else None
    rng = derive(seed, "onemax", "empirical", "predictions").numpy()
    emp = simulate.simulate_windows(lambda i0, i1: sw[starts[i0:i1]], len(starts), m_fn, M_fn, cfg.params,
                                    cfg.algorithms, simulate.noise_grid(cfg.noise, cfg.errors), rng, cfg.chunk,
                                    progress, prev_fn)
    theta_ref = float(np.median(sw[starts].max(axis=1) / sw[starts].min(axis=1))) if lookahead else cfg.M / cfg.m
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


def run_stochastic(cfg: OneMaxConfig, seed: int = 0, progress=None) -> dict:
    """Random price windows in [1, theta] and random predictions; E[ALG]/E[OPT] per algorithm."""
    cfg = resolve(cfg)
    validate_config(cfg)
    T = cfg.window
    noise = tuple(n for n in cfg.noise if n != "prev-max")
    prices_rng = derive(seed, "onemax", "stochastic", "prices").numpy()

    def windows(i0, i1):
        return data.random_windows(cfg.market, i1 - i0, T, cfg.theta, prices_rng)

    one = lambda i0, i1, x: np.ones(len(x))
    th = lambda i0, i1, x: np.full(len(x), cfg.theta)
    emp = simulate.simulate_windows(windows, cfg.n_windows, one, th, cfg.params, cfg.algorithms,
                                    simulate.noise_grid(noise, cfg.errors),
                                    derive(seed, "onemax", "stochastic", "predictions").numpy(), cfg.chunk, progress)
    return {"mode": "stochastic", "market": cfg.market, "n_windows": cfg.n_windows, "window": T,
            "theta": cfg.theta,
            "algorithms": [dict(_theory(a, cfg.theta, cfg.params), stochastic=emp[a]) for a in cfg.algorithms]}


def load_series(cfg: OneMaxConfig, seed: int = 0, stdin_text: str | None = None):
    """The empirical mode's prices: a file, stdin ('-'), or the embedded market. Returns (series, source, cfg);
    the embedded market brings its declared bounds (`options.MARKET_BOUNDS`) unless m and M are given."""
    if cfg.prices is not None:
        series = data.read_prices(cfg.prices, stdin_text, cfg.column)
        return series, "<stdin>" if cfg.prices == "-" else cfg.prices, cfg
    series = data.synthetic_market(cfg.market_length, seed=seed)
    source = f"embedded synthetic market (seed {seed}, {cfg.market_length} prices)"
    if cfg.m is None and cfg.M is None:
        cfg = replace(cfg, m=options.MARKET_BOUNDS[0], M=options.MARKET_BOUNDS[1])
    return series, source, cfg


def _plot(cfg: OneMaxConfig, result: dict) -> str:
    """Write the worst-case profiles at the run's theta (the result itself in worst-case mode)."""
    from .plot import plot_profiles

    rep = result if cfg.mode == "worst-case" else run_worst_case(
        replace(cfg, mode="worst-case", theta=result["theta"], errors=None))
    return str(plot_profiles(rep, cfg.plot))


def run(cfg: OneMaxConfig, seed: int = 0, stdin_text: str | None = None, progress=None) -> tuple[dict, dict]:
    """The whole command: one mode, then the optional plot. Returns (result, artifacts)."""
    cfg = resolve(cfg)
    validate_config(cfg)
    if cfg.prices is not None and cfg.mode != "empirical":
        raise BadInputError(f"read only in empirical mode, not {cfg.mode}", param="prices")
    if cfg.mode == "worst-case":
        result = run_worst_case(cfg)
    elif cfg.mode == "stochastic":
        result = run_stochastic(cfg, seed, progress)
    else:
        series, source, cfg = load_series(cfg, seed, stdin_text)
        result = run_empirical(cfg, series, seed, source, progress)
    return result, ({"plot": _plot(cfg, result)} if cfg.plot else {})
