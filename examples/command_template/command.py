"""Template command module: a thin Click wrapper. Module level imports click, the standard library and the
method's stdlib-only `options` only (a test runs `--help` and checks no heavy module was imported).

Copy to `commands/<name>.py`, add one line to `commands/registry.py`, a `FAST_ARGS` entry in
tests/test_cli_foundation.py, a README example, `docs/<name>.md`, and regenerate `completions/`.
"""
from __future__ import annotations

import click

from icmltools.commands import common

from . import options  # in a real command: from icmltools.<pkg> import options

EPILOG = """Examples:

\b
  icml template | jq -c '.result.methods[] | [.method, .mean_abs_error]'
  icml template --distribution gaussian --blocks 5 --out runs/t1
"""


@common.command("template", epilog=EPILOG)
@click.option("--n", type=click.IntRange(min=1), default=options.Config.n, help="Sample size per trial.")
@click.option("--blocks", type=int, default=options.Config.blocks, help="Median-of-means blocks k.")
@click.option("--trials", type=click.IntRange(min=1), default=options.Config.trials, help="Independent trials.")
@click.option("--distribution", type=click.Choice(options.DISTRIBUTIONS), default=options.Config.distribution,
              help="Sampling distribution.")
@click.option("--methods", type=common.CommaList(options.METHODS, allow_all=True), default=",".join(options.METHODS),
              help="Methods to run, the paper's first.")
@common.out_option()
@common.standard_options(seed=True, threads=True)
@click.pass_context
def cli(ctx, n, blocks, trials, distribution, methods, out, seed, threads, quiet, verbose):
    """Median-of-means vs the empirical mean on heavy-tailed samples (the template every command follows)."""
    from . import api  # heavy imports inside the callback

    if out and trials > 10_000:  # conflicting options: click.UsageError, in the command
        raise click.UsageError("--out with more than 10000 trials writes too much")
    with common.CommandRun(ctx, "template", seed=seed, threads=threads, packages=("numpy",),
                           reference=options.REFERENCE) as run:
        if out:
            run.make_dir(out)  # config.json now, result.json on success, nothing left on failure
        cfg = options.Config(n=n, blocks=blocks, trials=trials, distribution=distribution, methods=methods)
        with run.timer.phase("compute_s"):
            run.result = api.run(cfg, seed)
