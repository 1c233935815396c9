"""`icml onemax-sim`: learning-augmented one-max search (Benomar et al., ICML 2025)."""
from __future__ import annotations

import click

from icmltools.onemax import options
from icmltools.onemax.options import OneMaxConfig, RuleParams

from . import common

EPILOG = """Examples:

\b
  icml onemax-sim --mode worst-case --theta 16 --lam 0.5 \\
    | jq '.result.algorithms[] | {name, robustness, consistency}'
  icml onemax-sim                                   # embedded synthetic market, every noise model
  icml onemax-sim --prices prices.csv --column close --window 100 --stride 10 --m 50 --M 800
  cat prices.txt | icml onemax-sim --prices - --noise exact,lognormal --errors 0.9,0.5
  icml onemax-sim --mode stochastic --market spikes --n-windows 100000
  icml onemax-sim --mode worst-case --robustness 0.2 --plot profiles.png
"""

_ERRORS_HELP = (f"Prediction-error levels E in (0, 1] (1 = exact). Default: {options.WORST_CASE_POINTS}-point grid "
                f"0..1 (worst-case), {','.join(map(str, options.SIMULATION_ERRORS))} (simulations).")


@common.command("onemax-sim", epilog=EPILOG, param_flags={"m": "--m", "M": "--M"})
@click.option("--mode", type=click.Choice(options.MODES), default=OneMaxConfig.mode,
              help="worst-case: exact profiles from the closed form; empirical: price series; stochastic: random markets.")
@click.option("--theta", type=click.FloatRange(min=1.0, min_open=True), default=OneMaxConfig.theta,
              help="M/m for worst-case and stochastic modes.")
@click.option("--lam", type=click.FloatRange(0.0, 1.0), default=RuleParams.lam,
              help="Sun et al.'s distrust lambda; fixes the common robustness r = 1/gamma(lambda, theta).")
@click.option("--robustness", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              default=RuleParams.robustness,
              help="Fix the common robustness r in [1/theta, theta^-1/2] directly (overrides --lam).")
@click.option("--algorithms", type=common.CommaList(options.ALL_ALGORITHMS, allow_all=True),
              default=",".join(OneMaxConfig.algorithms), help="Rules to compare (comma-separated).")
@click.option("--rho", type=click.FloatRange(0.0, 1.0), default=RuleParams.rho,
              help="smooth-rho: 0 = smooth, 1 = the upper Pareto envelope.")
@click.option("--hn", type=click.FloatRange(0.0, 1.0, max_open=True), default=RuleParams.hn,
              help="ora/robust-mix: bound on the prediction's under-estimation H_n.")
@click.option("--hp", type=click.FloatRange(min=0.0), default=RuleParams.hp,
              help="robust-mix: bound on the prediction's over-estimation H_p.")
@click.option("--errors", type=common.CommaList(kind=float), default=None, help=_ERRORS_HELP)
@click.option("--noise", type=common.CommaList(options.NOISE_MODELS, allow_all=True),
              default=",".join(OneMaxConfig.noise),
              help="Prediction models: exact, over (y = p*/E), under (y = p*E), lognormal, prev-max.")
@click.option("--prices", "prices", default=None, metavar="FILE|-",
              help="Price series (CSV/TSV/one per line; '-' for stdin). Default: the embedded synthetic market.")
@click.option("--column", default=None, help="CSV column (name or 0-based index); default: the last column.")
@click.option("--window", type=click.IntRange(min=2), default=OneMaxConfig.window,
              help="Window length (prices per instance).")
@click.option("--stride", type=click.IntRange(min=1), default=OneMaxConfig.stride, help="Step between window starts.")
@click.option("--m", "lower", type=float, default=None, help="Declared lower price bound m (with --M).")
@click.option("--M", "upper", type=float, default=None,
              help="Declared upper price bound M. Without both, each window's own min/max is used: a look-ahead "
                   "that caps over-predictions at the window maximum (a warning on stderr and in result.warnings).")
@click.option("--market-length", type=click.IntRange(min=2), default=OneMaxConfig.market_length,
              help=f"Length of the embedded synthetic market (bounds {list(options.MARKET_BOUNDS)}).")
@click.option("--market", type=click.Choice(options.MARKETS), default=OneMaxConfig.market,
              help="Stochastic mode: the random price process.")
@click.option("--n-windows", type=click.IntRange(min=1), default=OneMaxConfig.n_windows,
              help="Stochastic mode: number of windows.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write the worst-case profile curves to this PNG (needs matplotlib).")
@common.standard_options(seed=True)
@click.pass_context
def cli(ctx, mode, theta, lam, robustness, algorithms, rho, hn, hp, errors, noise, prices, column, window, stride,
        lower, upper, market_length, market, n_windows, plot, seed, quiet, verbose):
    """Learning-augmented one-max search: accept one price online, helped by a prediction of the maximum.

    Compares this paper's Pareto-optimal smooth rule (`smooth`, and the `smooth-rho` family) with El-Yaniv's
    robust rule, blind trust, Sun et al.'s Pareto-optimal rule and Angelopoulos et al.'s ORA/robust-mix, all
    Pareto-optimal rules at the same robustness. Ratios are ALG/OPT (higher is better); OPT/ALG is beside them.
    """
    if prices is not None and mode != "empirical":
        raise click.UsageError("--prices is read only in --mode empirical")
    with common.CommandRun(ctx, "onemax-sim", seed=seed, packages=("numpy",), seed_torch=False,
                           reference=options.REFERENCE) as run:
        from icmltools.onemax import api

        cfg = OneMaxConfig(mode=mode, theta=theta, params=RuleParams(lam=lam, robustness=robustness, rho=rho,
                                                                       hn=hn, hp=hp),
                           algorithms=algorithms, errors=errors, noise=noise, window=window, stride=stride,
                           m=lower, M=upper, market=market, n_windows=n_windows, market_length=market_length,
                           prices=prices, column=column, plot=plot)
        stdin_text = None
        if prices == "-":
            with click.open_file("-") as fh:
                stdin_text = fh.read()
        with run.timer.phase("compute_s"), run.progress() as cb:
            run.result, art = api.run(cfg, seed, stdin_text=stdin_text, progress=cb)
        run.artifacts.update(art)
        res = run.result
        if res["mode"] == "empirical":
            bounds = (f"declared [{res['bounds']['m']:g}, {res['bounds']['M']:g}]" if not res["bounds"]["lookahead"]
                      else "each window's own min/max (LOOK-AHEAD)")
            run.log(f"onemax-sim: {res['n_windows']} windows of {res['window']} prices from {res['source']}; "
                    f"bounds: {bounds}; theta {res['theta']:.4g}" + (" (median of the windows)" if
                                                                     res["theta_is_median_of_windows"] else ""))
        run.table(f"one-max search, theta = {res['theta']:.4g}: worst case over all price sequences (ALG/OPT)",
                  ["rule", "robustness", "consistency", "Pareto-optimal"],
                  [[a["name"], a["robustness"], a["consistency"], "yes" if a.get("pareto_optimal") else "no"]
                   for a in res["algorithms"]])
        for warning in res.get("warnings", []):  # also in the JSON: result.warnings
            run.log(f"Warning: {warning} (--m/--M)" if warning.startswith("look-ahead") else f"Warning: {warning}")
