"""`icml shap-pay`: M^Shap, reciprocally fair payments for federated learning (payments and equilibria)."""
from __future__ import annotations

import click

from icmltools.commands import common
from icmltools.shappay import options
from icmltools.shappay.options import DigitsConfig, EquilibriumConfig, GameConfig, ShapleyConfig

GROUP_EPILOG = """Examples:

\b
  icml shap-pay | jq -c '.result.mechanisms | map_values({total_data, welfare, free_riders})'
  icml shap-pay equilibrium --agents agents.json --mechanism shap,none | jq .result.data_gain
  icml shap-pay payments --contrib s.json --agents agents.json | jq -c .result.payments
  icml shap-pay payments --values coalitions.csv | jq -c '[.result.phi, .result.payments]'
"""
PACKAGES = ("numpy",)


def shapley_options(f):
    opts = [
        click.option("--shapley", type=click.Choice(options.SHAPLEY_MODES), default=ShapleyConfig.shapley,
                     help=f"Exact over 2^n coalitions (n <= {options.MAX_EXACT}), permutation Monte Carlo, or auto."),
        click.option("--perms", type=click.IntRange(min=2), default=None,
                     help="Monte Carlo permutations [default: max(1000, n ln n)]."),
        click.option("--coalition-value", type=click.Choice(options.COALITION_VALUES),
                     default=ShapleyConfig.coalition_value,
                     help="v(X): gains of all agents from X's data, or of X's members only."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _shap(shapley, perms, coalition_value) -> ShapleyConfig:
    return ShapleyConfig(shapley=shapley, perms=perms, coalition_value=coalition_value)


@common.group("shap-pay", invoke_without_command=True, epilog=GROUP_EPILOG)
@common.standard_options(seed=True, threads=True)
@click.pass_context
def cli(ctx, seed, threads, quiet, verbose):
    """M^Shap (Murhekar et al., ICML 2025): pay each federated-learning agent its Shapley share of the
    collaboration's value minus what it gets anyway; payments sum to zero and at equilibrium every agent's
    payoff equals its contribution. Without a subcommand: the embedded 8-agent game, every mechanism, with a
    short table on stderr (--seed and --threads here apply to that bare run; subcommands take their own)."""
    flags = ctx.ensure_object(dict)
    flags.update(quiet=bool(flags.get("quiet")) or quiet, verbose=(flags.get("verbose") or 0) + verbose)
    if ctx.invoked_subcommand is None:
        ctx.invoke(equilibrium, seed=seed, threads=threads)


GAME_FLAGS = ("n", "groups", "rho_in", "rho_out", "s_max")


@common.command("equilibrium", epilog="""Examples:

\b
  icml shap-pay equilibrium --mechanism shap,none | jq .result.data_gain
  icml shap-pay equilibrium --n 30 --groups 3 --shapley mc --perms 400 --mechanism shap,none
  icml shap-pay equilibrium --agents agents.json --coalition-value members --out runs/eq1
  icml shap-pay equilibrium --value digits --fit --mechanism shap,none,planner
""")
@click.option("--agents", type=click.Path(dir_okay=False), default=None,
              help='agents.json {"alpha", "beta", "gamma", "s_max", "W"} [default: the embedded game].')
@click.option("--n", type=click.IntRange(min=1), default=GameConfig.n, help="Agents in the embedded game.")
@click.option("--groups", type=click.IntRange(min=1), default=GameConfig.groups, help="Data groups (agent i in i mod G).")
@click.option("--rho-in", type=click.FloatRange(min=0), default=GameConfig.rho_in, help="W within a group.")
@click.option("--rho-out", type=click.FloatRange(min=0), default=GameConfig.rho_out, help="W across groups.")
@click.option("--s-max", type=click.FloatRange(min=0, min_open=True), default=GameConfig.s_max, help="Data cap per agent.")
@click.option("--value", type=click.Choice(options.VALUES), default="curve",
              help="The accuracy curve, or models on sklearn digits (needs --fit).")
@click.option("--fit", is_flag=True, help="With --value digits: fit the paper's curve to digits, then solve it.")
@click.option("--mechanism", "mechanisms", type=common.CommaList(options.MECHANISMS, allow_all=True),
              default=",".join(EquilibriumConfig.mechanisms), help="Mechanisms, M^Shap first.")
@click.option("--dynamics", type=click.Choice(options.DYNAMICS), default=EquilibriumConfig.dynamics,
              help="Exact best responses of k agents per round, or projected gradient play.")
@click.option("--k", type=click.IntRange(min=1), default=None, help="Agents updating per round [default: ceil(n/4)].")
@click.option("--tol", type=click.FloatRange(min=0, min_open=True), default=EquilibriumConfig.tol,
              help="Stop when max_i |BR_i(s) - s_i| < tol.")
@click.option("--max-rounds", type=click.IntRange(min=1), default=EquilibriumConfig.max_rounds, help="Round limit.")
@click.option("--deviation-grid", type=click.IntRange(min=0), default=None,
              help="Grid points for the unilateral-deviation check [default: 1001 when cheap, else skipped]; 0 skips.")
@shapley_options
@common.out_option()
@common.standard_options(seed=True, threads=True)
@click.pass_context
def equilibrium(ctx, agents, n, groups, rho_in, rho_out, s_max, value, fit, mechanisms, dynamics, k, tol, max_rounds,
                deviation_grid, shapley, perms, coalition_value, out, seed, threads, quiet, verbose):
    """Equilibria of M^Shap, no payments (M0), a proportional rule and the welfare planner, side by side."""
    from icmltools.shappay import api

    src = click.core.ParameterSource.COMMANDLINE
    if agents and any(ctx.get_parameter_source(p) == src for p in GAME_FLAGS):
        raise click.UsageError("--n/--groups/--rho-in/--rho-out/--s-max shape the embedded game; not with --agents")
    if (value == "digits") != fit or (value == "digits" and agents):
        raise click.UsageError("--fit goes with --value digits (and not with --agents)")
    with common.CommandRun(ctx, "shap-pay", seed=seed, threads=threads, packages=PACKAGES,
                           reference=options.REFERENCE) as run:
        shap = _shap(shapley, perms, coalition_value)
        eq = EquilibriumConfig(mechanisms=mechanisms, dynamics=dynamics, k=k, tol=tol, max_rounds=max_rounds,
                               deviation_grid=deviation_grid)
        game = GameConfig(n=n, groups=groups, rho_in=rho_in, rho_out=rho_out, s_max=s_max)
        if out:
            run.make_dir(out)
        with run.timer.phase("equilibrium_s"), run.progress() as cb:
            run.result = api.equilibrium_for(agents, value, game, shap, eq, DigitsConfig(), seed, cb)
        run.table("shap-pay equilibrium", ["mechanism", "total data", "mean acc", "welfare", "reciprocity",
                                           "free riders", "rounds"], api.summary_rows(run.result))


SOURCE_FLAGS = {"agents": "--agents", "values": "--values", "value_cmd": "--value-cmd", "digits": "--value digits"}


@common.command("payments", epilog="""Examples:

\b
  icml shap-pay payments --contrib s.json --agents agents.json | jq -c .result.payments
  icml shap-pay payments --values coalitions.csv --gains gains.json
  icml shap-pay payments --contrib s.json --value-cmd 'python score.py' --shapley mc --perms 200
  icml shap-pay payments --value digits --contrib s.json --fit
""")
@click.option("--contrib", type=click.Path(dir_okay=False), default=None,
              help='Data contributions: a JSON list (or {"s": [...]}), one per agent.')
@click.option("--agents", type=click.Path(dir_okay=False), default=None, help="Value from the accuracy curves of agents.json.")
@click.option("--values", type=click.Path(dir_okay=False), default=None,
              help="Value from coalitions.csv (header members,value; members like 0;2;5).")
@click.option("--value-cmd", type=str, default=None,
              help='Value from a command: reads {"members", "contrib"} JSON on stdin, prints v (cached per coalition).')
@click.option("--value", type=click.Choice(options.VALUES), default="curve",
              help="digits: logistic regression on agents' skewed subsets of sklearn digits.")
@click.option("--fit", is_flag=True, help="With --value digits: also fit the paper's curve.")
@click.option("--gains", type=click.Path(dir_okay=False), default=None,
              help="a_i(s) - a_i(0) per agent (JSON list) for --values/--value-cmd [default: equal split of v(N)].")
@click.option("--subtract-empty", is_flag=True, help="Subtract a non-zero v(empty) instead of refusing it.")
@shapley_options
@common.out_option()
@common.standard_options(seed=True, threads=True)
@click.pass_context
def payments(ctx, contrib, agents, values, value_cmd, value, fit, gains, subtract_empty, shapley, perms, coalition_value,
             out, seed, threads, quiet, verbose):
    """M^Shap payments at given contributions: phi (+ standard errors), payments, utilities, reciprocity."""
    from icmltools.shappay import api

    given = {"agents": agents, "values": values, "value_cmd": value_cmd, "digits": value == "digits" or None}
    chosen = [k for k, v in given.items() if v]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one value model: --agents, --values, --value-cmd or --value digits")
    source = chosen[0]
    if fit and source != "digits":
        raise click.UsageError("--fit goes with --value digits")
    if gains and source not in ("values", "value_cmd"):
        raise click.UsageError("--gains goes with --values or --value-cmd (the other models know each agent's gain)")
    if source in ("agents", "value_cmd") and not contrib:
        raise click.UsageError(f"{SOURCE_FLAGS[source]} needs --contrib")
    spec = {"agents": agents, "values": values, "value_cmd": value_cmd, "digits": DigitsConfig()}[source]
    with common.CommandRun(ctx, "shap-pay", seed=seed, threads=threads, packages=PACKAGES,
                           reference=options.REFERENCE) as run:
        if out:
            run.make_dir(out)
        with run.timer.phase("payments_s"):
            run.result = api.payments_from_files(source, spec, contrib, gains, _shap(shapley, perms, coalition_value),
                                                 seed, subtract_empty=subtract_empty, fit=fit)
        r = run.result
        run.table("shap-pay payments", ["agent", "s", "phi", "payment", "utility"],
                  [[i, r["contrib"][i], r["phi"][i], r["payments"][i], r["utilities"][i]] for i in range(r["n"])])


for _cmd in (equilibrium, payments):
    cli.add_command(_cmd)
