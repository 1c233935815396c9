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

from icmltools.core.errors import BadInputError, RuntimeFailure
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
            "consistency_opt_over_alg": 1 / c, "pareto_optimal": rules.is_pareto_optimal(r, c, theta)}


def validate_config(cfg: OneMaxConfig) -> None:
    cfg = resolve(cfg)
    if cfg.mode not in MODES:
        raise BadInputError(f"unknown mode {cfg.mode!r}; choose from {', '.join(MODES)}", param="mode")
    declared = (cfg.m is not None and cfg.M is not None and 0 < cfg.m < cfg.M
                and options.THETA_MIN <= cfg.M / cfg.m <= options.THETA_MAX)  # else data.check_bounds says why
    # the theta the rules run at: --theta, the declared M/m, or (look-ahead) each window's own: checked there
    rules.validate(cfg.theta if cfg.mode != "empirical" else (cfg.M / cfg.m if declared else None), cfg.params)
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


LOOKAHEAD_WARNING = (
    "look-ahead: no bounds declared, so each window's own min and max serve as m and M and the trader knows the "
    "future maximum; predictions above it are capped at exactly that maximum and score 1.000 (e.g. trust on the "
    "'over' rows); declare m and M for results an online trader could get")


def _window_bounds(cfg: OneMaxConfig):
    """Per-window m and M: the declared bounds, or each window's own min / max (a look-ahead)."""
    if cfg.m is None:
        return (lambda i0, i1, x: x.min(axis=1)), (lambda i0, i1, x: x.max(axis=1))
    return (lambda i0, i1, x: np.full(len(x), cfg.m)), (lambda i0, i1, x: np.full(len(x), cfg.M))


def _prev_max_plan(cfg: OneMaxConfig, n_prices: int, starts: np.ndarray, source: str):
    """(noise models to run, mask of the windows that have a full previous window, {model: why not available}).
    prev-max is scored on the windows starting at least one window length in; the other models keep every
    window. A series too short for prev-max drops it (and says why), unless it is the only model asked for."""
    T = cfg.window
    if "prev-max" not in cfg.noise:
        return cfg.noise, None, {}
    has_prev = starts >= T
    if has_prev.any():
        return cfg.noise, has_prev, {}
    why = (f"{source}: {n_prices} prices; prev-max predicts a window's maximum from the {T} prices before it, "
           + (f"so it needs at least 2 x window = {2 * T} prices" if n_prices < 2 * T else
              f"and no window starts {T} or more prices in (stride {cfg.stride})"))
    if tuple(cfg.noise) == ("prev-max",):
        raise BadInputError(why, param="window")
    return tuple(n for n in cfg.noise if n != "prev-max"), None, {"prev-max": why}


def run_empirical(cfg: OneMaxConfig, series: np.ndarray, seed: int = 0, source: str = "prices",
                  progress=None) -> dict:
    """Sliding windows (length `window`, step `stride`) over one price series; predictions from
    `derive(seed, "onemax", "empirical", "predictions")`. Every noise model but prev-max is scored on every
    window; prev-max on the windows that have a previous window (each row's `n`)."""
    cfg = resolve(cfg)
    validate_config(cfg)
    data.check_bounds(series, cfg.m, cfg.M, source)
    T, s = cfg.window, cfg.stride
    if len(series) < T:
        raise BadInputError(f"{source}: {len(series)} prices, fewer than the window length {T}", param="window")
    sw = np.lib.stride_tricks.sliding_window_view(series, T)
    starts = np.arange(0, len(series) - T + 1, s)
    noise, has_prev, not_available = _prev_max_plan(cfg, len(series), starts, source)

    def prev_fn(i0, i1):
        ok = has_prev[i0:i1]
        prev = np.ones(i1 - i0)
        prev[ok] = sw[starts[i0:i1][ok] - T].max(axis=1)
        return prev, ok

    lookahead = cfg.m is None
    m_fn, M_fn = _window_bounds(cfg)
    rng = derive(seed, "onemax", "empirical", "predictions").numpy()
    emp = simulate.simulate_windows(lambda i0, i1: sw[starts[i0:i1]], len(starts), m_fn, M_fn, cfg.params,
                                    cfg.algorithms, simulate.noise_grid(noise, cfg.errors), rng, cfg.chunk,
                                    progress, prev_fn if has_prev is not None else None)
    theta_ref = max(_median_window_theta(sw, starts, cfg.chunk) if lookahead else cfg.M / cfg.m, options.THETA_MIN)
    warnings = ([LOOKAHEAD_WARNING] if lookahead else []) + [f"{k} not available: {v}" for k, v in not_available.items()]
    return {
        "mode": "empirical", "source": source, "n_prices": int(len(series)), "n_windows": int(len(starts)),
        "window": T, "stride": s,
        "warnings": warnings,
        "bounds": {"m": cfg.m, "M": cfg.M, "lookahead": lookahead,
                   "note": "bounds taken from each window (look-ahead: the trader is told m and M of the future)"
                   if lookahead else "declared bounds"},
        "theta": theta_ref, "theta_is_median_of_windows": lookahead,
        "noise_not_available": not_available,
        "algorithms": [dict(_theory(a, theta_ref, cfg.params), empirical=emp[a]) for a in cfg.algorithms],
    }


def _median_window_theta(sw: np.ndarray, starts: np.ndarray, chunk: int) -> float:
    """The median over windows of max/min (chunk by chunk: no copy of every window at once)."""
    spans = [sw[starts[i:i + chunk]].max(axis=1) / sw[starts[i:i + chunk]].min(axis=1)
             for i in range(0, len(starts), chunk)]
    return float(np.median(np.concatenate(spans)))


STOCHASTIC_NO_PREV_MAX = "stochastic windows are drawn independently: there is no previous window to predict from"


def run_stochastic(cfg: OneMaxConfig, seed: int = 0, progress=None) -> dict:
    """Random price windows in [1, theta] and random predictions; E[ALG]/E[OPT] per algorithm. prev-max has no
    previous window here: it is listed in `noise_not_available` (and an error when it is the only model)."""
    cfg = resolve(cfg)
    validate_config(cfg)
    T = cfg.window
    noise = tuple(n for n in cfg.noise if n != "prev-max")
    if not noise:
        raise BadInputError(f"prev-max is not available in stochastic mode ({STOCHASTIC_NO_PREV_MAX})", param="noise")
    prices_rng = derive(seed, "onemax", "stochastic", "prices").numpy()

    def windows(i0, i1):
        return data.random_windows(cfg.market, i1 - i0, T, cfg.theta, prices_rng)

    one = lambda i0, i1, x: np.ones(len(x))
    th = lambda i0, i1, x: np.full(len(x), cfg.theta)
    emp = simulate.simulate_windows(windows, cfg.n_windows, one, th, cfg.params, cfg.algorithms,
                                    simulate.noise_grid(noise, cfg.errors),
                                    derive(seed, "onemax", "stochastic", "predictions").numpy(), cfg.chunk, progress)
    return {"mode": "stochastic", "market": cfg.market, "n_windows": cfg.n_windows, "window": T,
            "theta": cfg.theta, "warnings": [],
            "noise_not_available": {"prev-max": STOCHASTIC_NO_PREV_MAX} if "prev-max" in cfg.noise else {},
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


def _theta_note(cfg: OneMaxConfig, result: dict) -> str:
    """What the plot's theta is, in words."""
    if result.get("theta_is_median_of_windows"):
        return "the median of the windows' max/min (no bounds declared: each window bounds itself)"
    if result["mode"] == "empirical":
        return f"M/m of the declared bounds [{cfg.m:g}, {cfg.M:g}]"
    return ""


def _plot(cfg: OneMaxConfig, curves: dict, result: dict) -> str:
    """Write the exact worst-case profiles at the run's theta (for an empirical run without declared bounds,
    the median theta of the windows, which the figure says)."""
    from .plot import plot_profiles

    return str(plot_profiles(curves, cfg.plot, theta_note=_theta_note(cfg, result)))


def _finite(obj, where: str = "result") -> None:
    """No non-finite number leaves the command: a computation that turned non-finite is a runtime failure."""
    if isinstance(obj, float) and not np.isfinite(obj):
        raise RuntimeFailure(f"{where} is {obj} (a computation overflowed; please report this with the command)")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _finite(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _finite(v, f"{where}[{i}]")


def _compute(cfg: OneMaxConfig, seed: int, stdin_text: str | None, progress) -> tuple[dict, OneMaxConfig]:
    if cfg.mode == "worst-case":
        return run_worst_case(cfg), cfg
    if cfg.mode == "stochastic":
        return run_stochastic(cfg, seed, progress), cfg
    series, source, cfg = load_series(cfg, seed, stdin_text)
    return run_empirical(cfg, series, seed, source, progress), cfg


def run(cfg: OneMaxConfig, seed: int = 0, stdin_text: str | None = None, progress=None) -> tuple[dict, dict]:
    """The whole command: one mode, then the optional plot. Returns (result, artifacts).

    Floating-point overflow, division by zero or an invalid operation anywhere in the computation is a
    `RuntimeFailure` (the rules handle their expected extremes locally), and so is a non-finite number in the
    result: no RuntimeWarning leaks and no non-finite figure is returned."""
    cfg = resolve(cfg)
    validate_config(cfg)
    if cfg.prices is not None and cfg.mode != "empirical":
        raise BadInputError(f"read only in empirical mode, not {cfg.mode}", param="prices")
    if cfg.plot:
        from .plot import check_target

        check_target(cfg.plot)  # matplotlib present and the format known, before any work
    try:
        with np.errstate(over="raise", divide="raise", invalid="raise"):
            result, cfg = _compute(cfg, seed, stdin_text, progress)
            _finite(result)
            curves = worstcase.plot_curves(result["theta"], cfg.params, cfg.algorithms) if cfg.plot else None
    except FloatingPointError as e:
        raise RuntimeFailure(f"numerical failure ({e}); please report this with the command") from e
    return result, ({"plot": _plot(cfg, curves, result)} if cfg.plot else {})
