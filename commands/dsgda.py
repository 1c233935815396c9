"""`icml dsgda`: Decoupled SGDA for games with intermittent communication (Zindari et al., ICML 2025)."""
from __future__ import annotations

import click

from icmltools.dsgda import options
from icmltools.dsgda.options import RunConfig, SolveConfig

from . import common

GROUP_EPILOG = """Examples:

\b
  icml dsgda -q | jq -c '.result.regime[] | {method, K, stops_paying_off_at}'
  icml dsgda run --coupling 0.1,1,10,30 --local-steps 100 --plot rounds.png
  icml dsgda run --game noisy --seeds 3 | jq -c '.result.results[] | [.sigma_off, .method, .final_rel_err]'
  icml dsgda run --game mygame.json --methods decoupled,gda --local-steps 10,100
  icml dsgda solve mygame.json --local-steps 50 --device auto
"""

RUN_EPILOG = """Examples:

\b
  icml dsgda run | jq -c '.result.ratio_vs_gda[]'
  icml dsgda run --game nplayer --players 4 --coupling 0.1,1,10
  icml dsgda run --coupling 20 --local-steps 10000 --lr 0.01 --methods decoupled
"""

PARAM_FLAGS = {"local_steps": "--local-steps", "sigma_self": "--sigma-self", "sigma_off": "--sigma-off",
               "max_rounds": "--max-rounds"}
POSITIVE = click.FloatRange(min=0, min_open=True)


def _defaults(key: str) -> str:
    """'[default: quadratic, nplayer: X; noisy: Y; ...]' from options.GAME_DEFAULTS (no literal here)."""
    def fmt(v):
        return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) if isinstance(v, tuple) else f"{v:g}"
    groups: dict = {}
    for game in options.GAMES:
        groups.setdefault(fmt(options.GAME_DEFAULTS[game][key]), []).append(game)
    return "[default: " + "; ".join(f"{'/'.join(g)}: {v}" for v, g in groups.items()) + "]"


@common.group("dsgda", invoke_without_command=True, epilog=GROUP_EPILOG)
@common.standard_options(seed=True, threads=True)
@click.pass_context
def cli(ctx, seed, threads, quiet, verbose):
    """Decoupled SGDA: each player takes K local steps against the opponents' last communicated strategy.

    Compares it with GDA, alternating GDA, optimistic GDA, extragradient, Local SGDA (federated minimax) and
    the Ghost variant on quadratic games with a coupling knob, n-player games, a noisy game, a Dirac-GAN-style
    game and your own game (JSON), each with its best step size; counts communication rounds to eps. Without a
    subcommand it runs `run` with its defaults (the coupling sweep, a few seconds); --seed and --threads given
    here apply to that bare run (with a subcommand, give them after it).
    """
    flags = ctx.ensure_object(dict)
    flags.update(quiet=bool(flags.get("quiet")) or quiet, verbose=(flags.get("verbose") or 0) + verbose)
    if ctx.invoked_subcommand is None:
        ctx.invoke(run, seed=seed, threads=threads)


@common.command("run", epilog=RUN_EPILOG, param_flags=PARAM_FLAGS)
@click.option("--game", default=RunConfig.game, metavar="|".join(options.GAMES) + "|FILE.json",
              help="Game family, or a JSON file {blocks, J, h, names} (F(x) = J x + h).")
@click.option("--coupling", type=common.CommaList(kind=float), default=None,
              help="Couplings c = ||C||_2 (dirac-gan: lambda; not with a FILE.json) " + _defaults("coupling"))
@click.option("--kappa", type=click.FloatRange(min=1), default=None,
              help="Condition number L/mu of each player's block (quadratic, nplayer, noisy) " + _defaults("kappa"))
@click.option("--mu", type=POSITIVE, default=RunConfig.mu, help="Smallest eigenvalue of each player's block.")
@click.option("--dim", type=click.IntRange(min=1), default=RunConfig.dim, help="Dimension of each player.")
@click.option("--players", type=click.IntRange(min=2), default=RunConfig.players, help="nplayer: players.")
@click.option("--local-steps", "-K", "local_steps", type=common.CommaList(kind=float, positive=True), default=None,
              help="Local steps K per round for decoupled/ghost/localsgda " + _defaults("local_steps"))
@click.option("--methods", type=common.CommaList(options.METHODS, allow_all=True), default=None,
              help="Methods " + _defaults("methods"))
@click.option("--eps", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=RunConfig.eps,
              help="Target ||x - x*|| <= eps ||x0 - x*||.")
@click.option("--max-rounds", type=click.IntRange(min=1), default=None,
              help="Round budget (noisy: rounds run) " + _defaults("max_rounds"))
@click.option("--seeds", type=click.IntRange(min=1), default=RunConfig.seeds, help="noisy: seeds averaged.")
@click.option("--lr", type=common.CommaList(kind=float, positive=True), default=None,
              help=f"Step sizes searched [default: the grid 2^(-j/2), j = 0..{len(options.LR_GRID) - 1}].")
@click.option("--sigma-self", type=common.CommaList(kind=float), default=",".join(map(str, RunConfig.sigma_self)),
              help="noisy: self-gradient noise, one value or one per player (imbalanced).")
@click.option("--sigma-off", type=common.CommaList(kind=float), default=None,
              help="noisy: off-diagonal noise levels compared " + _defaults("sigma_off"))
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write rounds vs coupling (noisy: error vs off-diagonal noise) to a PNG.")
@common.standard_options(seed=True, threads=True)
@click.pass_context
def run(ctx, game, coupling, kappa, mu, dim, players, local_steps, methods, eps, max_rounds, seeds, lr, sigma_self,
        sigma_off, plot, seed, threads, quiet, verbose):
    """Simulate every method on a game family across couplings, each with its best step size."""
    if local_steps is not None and any(k != int(k) for k in local_steps):
        raise click.UsageError("--local-steps: K must be whole numbers")
    with common.CommandRun(ctx, "dsgda", seed=seed, threads=threads, packages=("numpy",), seed_torch=False,
                           reference=options.REFERENCE, param_flags=PARAM_FLAGS) as cmd:
        from icmltools.dsgda import api

        cfg = RunConfig(game=game, coupling=coupling, kappa=kappa, mu=mu, dim=dim, players=players,
                        local_steps=tuple(int(k) for k in local_steps) if local_steps else None, methods=methods,
                        eps=eps, max_rounds=max_rounds, seeds=seeds, lr=lr, sigma_self=sigma_self,
                        sigma_off=sigma_off, plot=plot)
        with cmd.timer.phase("compute_s"), cmd.progress() as cb:
            cmd.result, art = api.run(cfg, seed, progress=cb)
        cmd.artifacts.update(art)
        cmd.table("dsgda: rounds to eps", ["coupling", "method", "K", "lr", "rounds", "rate", "rho"],
                  [[r["coupling"], r["method"], r["K"], r["lr"], r["rounds_to_eps"], r["rate"], r["rho"]]
                   for r in cmd.result["results"]])


@common.command("solve", param_flags=PARAM_FLAGS,
                epilog="Examples:\n\n\b\n  icml dsgda solve game.json --local-steps 50 | jq .result.rounds\n"
                       "  icml dsgda solve game.json --method gda --device cuda")
@click.argument("game", type=click.Path(dir_okay=False))
@click.option("--method", type=click.Choice(options.SOLVE_METHODS), default=SolveConfig.method, help="Method.")
@click.option("--local-steps", "-K", "local_steps", type=click.IntRange(min=1), default=SolveConfig.local_steps,
              help="Local steps K per round.")
@click.option("--lr", type=POSITIVE, default=SolveConfig.lr, help="Step size [default: 1 / max_i ||J_ii||_2].")
@click.option("--rounds", type=click.IntRange(min=1), default=SolveConfig.rounds, help="Round budget.")
@click.option("--eps", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=SolveConfig.eps,
              help="Stop at ||F(x)|| <= eps ||F(x0)||.")
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def solve(ctx, game, method, local_steps, lr, rounds, eps, seed, device, threads, quiet, verbose):
    """Solve your JSON game with one method through the gradient-oracle loop (torch, on --device)."""
    with common.CommandRun(ctx, "dsgda", seed=seed, device=device, threads=threads, packages=("numpy", "torch"),
                           reference=options.REFERENCE, param_flags=PARAM_FLAGS) as cmd:
        from icmltools.dsgda import api

        cfg = SolveConfig(game=game, method=method, local_steps=local_steps, lr=lr, rounds=rounds, eps=eps)
        with cmd.timer.phase("compute_s"), cmd.progress() as cb:
            cmd.result = api.solve(cfg, device=cmd.device, progress=cb)


cli.add_command(run)
cli.add_command(solve)
