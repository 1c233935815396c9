"""`icml kpass`: advantages for pass@k / majority-vote training (Tang et al., ICML 2025) as a stream transform,
the estimator checks, and a demo of the pass@1 / pass@k trade-off. Module level: click, stdlib, options only."""
from __future__ import annotations

import click

from icmltools.commands import common
from icmltools.kpass import options

TC, DC = options.TransformConfig, options.DemoConfig

GROUP_EPILOG = """Examples:

\b
  icml kpass | jq -c '.result.final_mean | to_entries[] | [.key, .value.pass1, .value.passk]'
  sampler | icml kpass transform --objective pass --k 8 | trainer
  icml kpass check | jq '.result.passed'
"""

TRANSFORM_EPILOG = """Examples:

\b
  echo '{"id": 1, "rewards": [0, 1, 0, 0]}' | icml kpass transform -q
  icml kpass transform --objective maj --in groups.jsonl.gz --out adv.jsonl.gz
  icml kpass transform --k 4 --estimator pkpo-loo --on-error skip < groups.jsonl
"""


@common.group("kpass", invoke_without_command=True, epilog=GROUP_EPILOG)
@common.quiet_options
@click.pass_context
def cli(ctx, quiet, verbose):
    """Advantages for pass@k and majority-vote training (k-sample objectives, leave-one-out).

    `transform` turns JSONL groups of scored samples into per-sample advantages for any policy-gradient
    trainer; `check` verifies the estimators (closed forms vs brute force, unbiasedness); `demo` (also the bare
    `icml kpass`) trains a capacity-limited policy with the mean, pass@k and maj@k objectives.
    """
    flags = ctx.ensure_object(dict)
    flags.update(quiet=bool(flags.get("quiet")) or quiet, verbose=(flags.get("verbose") or 0) + verbose)
    if ctx.invoked_subcommand is None:
        ctx.invoke(demo)


@common.command("transform", epilog=TRANSFORM_EPILOG, param_flags={"input": "--in"})
@click.option("--objective", type=click.Choice(options.OBJECTIVES), default=TC.objective,
              help="pass: max reward of k samples; maj: reward of the most voted answer; mean: ordinary RL (RLOO).")
@click.option("--k", type=click.IntRange(min=2), default=TC.k, help="Samples per objective evaluation "
              "(default: the group's size; groups larger than k use the exact U-statistic).")
@click.option("--estimator", type=click.Choice(options.ESTIMATORS), default=TC.estimator,
              help="loo: the paper's unbiased leave-one-out; centered: biased, lower variance; pkpo*: PKPO baselines.")
@click.option("--in", "in_path", default="-", show_default=True, help="Input JSONL ('-' stdin; .gz read as gzip).")
@click.option("--out", "out_path", default="-", show_default=True,
              help="Output JSONL ('-' stdout, streamed; a file is written whole, .gz as gzip).")
@click.option("--reward-key", default=TC.reward_key, help="Reward key inside each sample object.")
@click.option("--answer-key", default=TC.answer_key, help="Answer key inside each sample object (maj).")
@click.option("--scale", type=click.Choice(options.SCALES), default=TC.scale,
              help="std: divide by the group's reward std + 1e-6 (GRPO-style).")
@click.option("--answer-reward", type=click.Choice(options.ANSWER_REWARD), default=TC.answer_reward,
              help="Samples sharing an answer with different rewards: error, or use their mean.")
@click.option("--on-error", type=click.Choice(options.ON_ERROR), default=TC.on_error,
              help="A bad line: stop (after writing the lines before it) or skip it (counted in the summary).")
@common.standard_options(seed=True, threads=True)
@click.pass_context
def transform(ctx, objective, k, estimator, in_path, out_path, reward_key, answer_key, scale, answer_reward,
              on_error, seed, threads, quiet, verbose):
    """JSONL groups of scored samples in, per-sample advantages out (a shell-pipe stage before the trainer).

    Each line: {"samples": [{"reward": 1, "answer": "42"}, ...]} or {"rewards": [...], "answers": [...]};
    other keys pass through; "advantages", "objective" and "k" are added. To stdout the stream is pure JSONL
    and the summary goes to stderr; with --out FILE the JSON envelope (the summary) goes to stdout.
    """
    from icmltools.kpass import api

    cfg = TC(objective=objective, k=k, estimator=estimator, reward_key=reward_key, answer_key=answer_key,
             scale=scale, answer_reward=answer_reward, on_error=on_error, seed=seed)
    api.validate_transform(cfg)
    reader, name, sink = api.open_streams(in_path, out_path)
    to_file = out_path != "-"
    with common.CommandRun(ctx, "kpass", seed=seed, threads=threads, packages=("numpy",), seed_torch=False,
                           reference=options.REFERENCE, writes=to_file, param_flags={"input": "--in"}) as run:
        with run.timer.phase("transform_s"):
            summary = api.transform(cfg, reader, name, sink)
        run.result = {"input": name, "output": out_path, **summary}
        if to_file:
            run.artifacts["output"] = out_path
        else:
            run.log(f"kpass: {summary['groups']} groups written, {summary['skipped']} skipped, "
                    f"{summary['lines']} lines read")


cli.add_command(transform)


@common.command("check", epilog="Examples:\n\n\b\n  icml kpass check | jq '.result.passed'\n"
                "  icml kpass check --quick | jq -c '.result.checks[] | select(.passed | not)'")
@click.option("--quick", is_flag=True, help="Fewer Monte Carlo groups (2e4 instead of 2e5) and brute-force trials.")
@common.standard_options(seed=True, threads=True)
@click.pass_context
def check(ctx, quick, seed, threads, quiet, verbose):
    """The exact estimator checks: hand cases, closed forms vs brute force, unbiasedness (exits 1 on a failure)."""
    from icmltools.core.errors import RuntimeFailure
    from icmltools.kpass import api

    with common.CommandRun(ctx, "kpass", seed=seed, threads=threads, packages=("numpy",), seed_torch=False,
                           reference=options.REFERENCE) as run:
        with run.timer.phase("checks_s"):
            run.result = api.check(seed, quick)
        if not run.result["passed"]:
            bad = [r["check"] for r in run.result["checks"] if not r["passed"]]
            raise RuntimeFailure(f"{len(bad)} estimator check(s) failed: {'; '.join(bad[:3])}")


cli.add_command(check)


@common.command("demo", epilog="Examples:\n\n\b\n  icml kpass demo --reps 3 | jq '.result.final_mean'\n"
                "  icml kpass demo --task modadd --plot kpass.png")
@click.option("--task", type=click.Choice(options.TASKS), default=DC.task,
              help="teacher: 16 answers from a random tanh teacher; modadd: (a + b) mod 12.")
@click.option("--steps", type=click.IntRange(min=1), default=DC.steps, help="Adam steps per run.")
@click.option("--k", type=click.IntRange(min=2), default=DC.k, help="Samples per prompt (and k of pass@k, maj@k).")
@click.option("--batch", type=click.IntRange(min=1), default=DC.batch, help="Prompts per step.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=DC.lr, help="Adam learning rate.")
@click.option("--eval-every", type=click.IntRange(min=1), default=DC.eval_every, help="Steps between evaluations.")
@click.option("--maj-votes", type=click.IntRange(min=1), default=DC.maj_votes,
              help="Monte Carlo votes per prompt for maj@k.")
@click.option("--reps", type=click.IntRange(min=1), default=DC.reps, help="Repetitions (independent derived seeds).")
@click.option("--runs", type=common.CommaList(options.DEMO_RUNS, allow_all=True), default=",".join(DC.runs),
              help="objective:estimator runs, same seed and draws.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write the curves to this PNG.")
@common.standard_options(seed=True, threads=True)
@click.pass_context
def demo(ctx, task, steps, k, batch, lr, eval_every, maj_votes, reps, runs, plot, seed, threads, quiet, verbose):
    """Train a capacity-limited softmax policy with mean / pass@k / maj@k advantages: pass@1 vs pass@k."""
    from icmltools.kpass import api

    cfg = DC(task=task, steps=steps, k=k, batch=batch, lr=lr, eval_every=eval_every, maj_votes=maj_votes,
             reps=reps, runs=tuple(runs))
    with common.CommandRun(ctx, "kpass", seed=seed, threads=threads, packages=("numpy",), seed_torch=False,
                           reference=options.REFERENCE) as run:
        with run.progress() as progress, run.timer.phase("demo_s"):
            run.result = api.demo(cfg, seed, progress)
        if plot:
            api.plot(run.result, plot)
            run.artifacts["plot"] = plot
        fm = run.result["final_mean"]
        run.table(f"kpass demo ({task}, {steps} steps, k = {k}, mean of {reps} rep(s))",
                  ["run", "pass@1", f"pass@{k}", f"maj@{k}", "entropy"],
                  [[n, v["pass1"], v["passk"], v["majk"], v["entropy"]] for n, v in fm.items()])


cli.add_command(demo)
