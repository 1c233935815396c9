"""`icml onemax-sim`: learning-augmented one-max search (Benomar et al., ICML 2025)."""
from __future__ import annotations

import click

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


def _csv(kind):
    def convert(ctx, param, value):
        if value is None:
            return None
        items = [v.strip() for v in value.split(",") if v.strip()]
        if kind is float:
            try:
                return tuple(float(v) for v in items)
            except ValueError:
                raise click.BadParameter(f"expected comma-separated numbers, got {value!r}")
        return tuple(items)
    return convert


@common.command("onemax-sim", epilog=EPILOG)
@click.option("--mode", type=click.Choice(["worst-case", "empirical", "stochastic"]), default="empirical",
              help="worst-case: exact profiles from the closed form; empirical: price series; stochastic: random markets.")
@click.option("--theta", type=click.FloatRange(min=1.0, min_open=True), default=16.0,
              help="M/m for worst-case and stochastic modes.")
@click.option("--lam", type=click.FloatRange(0.0, 1.0), default=0.5,
              help="Sun et al.'s distrust lambda; fixes the common robustness r = 1/gamma(lambda, theta).")
@click.option("--robustness", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), default=None,
              help="Fix the common robustness r in [1/theta, theta^-1/2] directly (overrides --lam).")
@click.option("--algorithms", default="elyaniv,trust,sun,smooth,ora,robust-mix", callback=_csv(str),
              help="Comma-separated: elyaniv, trust, sun, smooth, smooth-rho, ora, robust-mix.")
@click.option("--rho", type=click.FloatRange(0.0, 1.0), default=0.5,
              help="smooth-rho: 0 = smooth, 1 = the upper Pareto envelope.")
@click.option("--hn", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.1,
              help="ora/robust-mix: bound on the prediction's under-estimation H_n.")
@click.option("--hp", type=click.FloatRange(min=0.0), default=0.1,
              help="robust-mix: bound on the prediction's over-estimation H_p.")
@click.option("--errors", default=None, callback=_csv(float),
              help="Prediction-error levels E in (0, 1] (1 = exact). Default: 21-point grid (worst-case), "
                   "0.95,0.9,0.8,0.6,0.4 (simulations).")
@click.option("--noise", default="exact,over,under,lognormal,prev-max", callback=_csv(str),
              help="Prediction models: exact, over (y = p*/E), under (y = p*E), lognormal, prev-max.")
@click.option("--prices", "prices", default=None, metavar="FILE|-",
              help="Price series (CSV/TSV/one per line; '-' for stdin). Default: the embedded synthetic market.")
@click.option("--column", default=None, help="CSV column (name or 0-based index); default: the last column.")
@click.option("--window", type=click.IntRange(min=2), default=200, help="Window length (prices per instance).")
@click.option("--stride", type=click.IntRange(min=1), default=10, help="Step between window starts.")
@click.option("--m", "lower", type=float, default=None, help="Declared lower price bound m (with --M).")
@click.option("--M", "upper", type=float, default=None,
              help="Declared upper price bound M. Without both, each window's own min/max is used (look-ahead).")
@click.option("--market-length", type=click.IntRange(min=2), default=40000,
              help="Length of the embedded synthetic market (bounds [50, 800]).")
@click.option("--market", type=click.Choice(["walk", "uniform", "spikes"]), default="walk",
              help="Stochastic mode: the random price process.")
@click.option("--n-windows", type=click.IntRange(min=1), default=20000, help="Stochastic mode: number of windows.")
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
    from icmltools.onemax import api, data, plot as plotmod
    from icmltools.onemax.rules import RuleParams

    if prices is not None and mode != "empirical":
        raise click.UsageError("--prices is read only in --mode empirical")
    with common.CommandRun(ctx, "onemax-sim", seed=seed, packages=("numpy",), seed_torch=False) as run:
        params = RuleParams(lam=lam, robustness=robustness, rho=rho, hn=hn, hp=hp)
        base = dict(mode=mode, theta=theta, params=params, algorithms=algorithms, noise=noise, window=window,
                    stride=stride, m=lower, M=upper, market=market, n_windows=n_windows)
        if errors is not None and mode != "worst-case":
            base["errors"] = errors
        cfg = api.OneMaxConfig(**base)
        api.validate_config(cfg)
        with run.timer.phase("compute_s"), run.progress() as cb:
            if mode == "worst-case":
                run.result = api.run_worst_case(cfg, errors)
            elif mode == "stochastic":
                run.result = api.run_stochastic(cfg, run.rng, cb)
            else:
                if prices is None:
                    series = data.synthetic_market(market_length, seed=seed)
                    source = f"embedded synthetic market (seed {seed}, {market_length} prices)"
                    if lower is None and upper is None:
                        cfg = api.OneMaxConfig(**dict(base, m=data.MARKET_BOUNDS[0], M=data.MARKET_BOUNDS[1],
                                                      **({"errors": errors} if errors else {})))
                else:
                    stdin = click.get_text_stream("stdin").read() if prices == "-" else None
                    series = data.read_prices(prices, stdin, column)
                    source = "<stdin>" if prices == "-" else prices
                run.result = api.run_empirical(cfg, series, run.rng, source, cb)
        if plot:
            rep = run.result if mode == "worst-case" else api.run_worst_case(
                api.OneMaxConfig(mode="worst-case", theta=run.result["theta"], params=params, algorithms=algorithms))
            run.artifacts["plot"] = str(plotmod.plot_profiles(rep, plot))
