"""`icml goskill`: GO-Skill offline multi-task RL on MetaWorld (collect -> extract -> enhance -> policy ->
baselines -> evaluate), one JSON summary on stdout."""
from __future__ import annotations

import click

from icmltools.goskill import options

from . import common

EPILOG = """Examples:

\b
  icml goskill | jq '.result.methods[] | {method, success}'
  icml goskill --preset cpu --out runs/mt10 --stages collect
  icml goskill --run-dir runs/mt10 --stages extract,enhance,policy,baselines,evaluate
  icml goskill --data ./mt50_data --tasks reach-v3,push-v3 --split sub --preset gpu --device cuda
  icml goskill --tasks Reach-V3,push-v3 --decoder mlp -H 5 --methods goskill,mtbc
"""

CFG = options.GoSkillConfig


def _explicit(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


def _check_usage(ctx, run_dir, out, data, stages):
    """Conflicting options (exit 2 before anything runs)."""
    if run_dir is not None:
        for name, flag in (("out", "--out"), ("data", "--data"), ("preset", "--preset"), ("seed", "--seed")):
            if ctx.params.get(name) is not None and (name in ("out", "data") or _explicit(ctx, name)):
                raise click.UsageError(f"--run-dir resumes a run with its own folder, data, preset and seed; "
                                       f"do not combine it with {flag}")
        return
    if stages is not None and data is not None and "collect" in stages:
        raise click.UsageError("--stages collect cannot be combined with --data (the data is given)")
    if stages is not None and data is None and "collect" not in stages:
        raise click.UsageError("a new run without --data must include the collect stage in --stages "
                               "(or resume a run with --run-dir)")


@common.command("goskill", epilog=EPILOG)
@click.option("--preset", type=click.Choice(options.PRESET_NAMES, case_sensitive=False), default=options.DEFAULT_PRESET,
              help=f"{options.DEFAULT_PRESET} (the default, what the bare command runs): small, ~4 min on 2 cores; "
                   "cpu: the benchmark size; gpu: the paper's sizes.")
@click.option("--stages", type=common.CommaList(options.STAGES, allow_all=True), default=None,
              help="Stages to run. Default: all for a new run (without collect with --data); the remaining ones "
                   "with --run-dir.")
@click.option("--methods", type=common.CommaList(options.METHODS, allow_all=True),
              default=",".join(options.DEFAULT_METHODS),
              help="Methods to train/evaluate (goskill_noenh = GO-Skill without enhancement).")
@click.option("--tasks", default=None, metavar="mt10|mt50|LIST",
              help=f"MetaWorld -v3 tasks, any case (default {CFG.tasks}).")
@click.option("--data", type=click.Path(exists=True, file_okay=False), default=None,
              help="A user dataset in the official <task>/<i>.npz layout instead of collecting.")
@click.option("--run-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Resume a run folder with its own configuration, data and seed; size options given here "
                   "override its configuration.")
@click.option("--split", type=click.Choice(options.SPLITS), default=None,
              help=f"near-optimal = all episodes, sub-optimal = first half (default {CFG.split}).")
@click.option("--episodes", type=click.IntRange(min=1), default=None,
              help="Episodes collected per task (default: the preset's).")
@click.option("--max-steps", type=click.IntRange(min=1, max=CFG.max_ep_len - 1), default=None,
              help="Steps per episode (default: the preset's).")
@click.option("-H", "--horizon", "H", type=click.IntRange(min=1, max=50), default=None,
              help=f"Skill horizon H (goal = s_{{t+H}} - s_t; default {CFG.H}, as the paper).")
@click.option("--decoder", type=click.Choice(options.DECODERS), default=None,
              help=f"Skill decoder: causal transformer over the in-skill history (paper) or an MLP "
                   f"(default {CFG.decoder}).")
@click.option("--conditioning", type=click.Choice(options.CONDITIONINGS), default=None,
              help=f"High level identifies the task by a trajectory prompt (paper) or a task-id embedding "
                   f"(default {CFG.conditioning}).")
@click.option("--extract-iters", type=click.IntRange(min=0), default=None, help="Phase-1 steps (default: the preset's).")
@click.option("--enhance-iters", type=click.IntRange(min=0), default=None,
              help="Decoder-only enhancement steps (presets: = --policy-iters; the official loop takes one per "
                   "high-level step).")
@click.option("--policy-iters", type=click.IntRange(min=0), default=None,
              help="High-level steps (default: the preset's).")
@click.option("--bc-iters", type=click.IntRange(min=0), default=None, help="Baseline steps (default: the preset's).")
@click.option("--eval-episodes", type=click.IntRange(min=1), default=None,
              help="Evaluation episodes per task (default: the preset's).")
@click.option("--envs-per-task", type=click.IntRange(min=1), default=None,
              help="Parallel environments per task in the vectorised evaluation (default: the preset's).")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Processes for data collection.")
@common.out_option()
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def cli(ctx, preset, stages, methods, tasks, data, run_dir, split, episodes, max_steps, H, decoder, conditioning,
        extract_iters, enhance_iters, policy_iters, bc_iters, eval_episodes, envs_per_task, workers, out,
        seed, device, threads, quiet, verbose):
    """GO-Skill (He et al., ICML 2025): goal-oriented skills (VQ over s_{t+H} - s_t), class-balanced skill
    enhancement and a return-conditioned high-level policy, against MT-BC and MT-BC-RTG, on MetaWorld.

    With no arguments: the quick preset (the default) on MT10, collected with MetaWorld's scripted experts
    behind a random-to-expert quality ramp, evaluated on vectorised envs. The run folder holds the data,
    checkpoints, config.json, result.json and pipeline.json (resume state); `.result.methods[]` has method,
    success, return, per_task.
    """
    from icmltools.goskill import api

    _check_usage(ctx, run_dir, out, data, stages)
    overrides = dict(tasks=tasks, split=split, episodes=episodes, max_steps=max_steps, H=H, decoder=decoder,
                     conditioning=conditioning, extract_iters=extract_iters, enhance_iters=enhance_iters,
                     policy_iters=policy_iters, bc_iters=bc_iters, eval_episodes=eval_episodes,
                     envs_per_task=envs_per_task, workers=workers)
    packages = ("numpy", "torch", "gymnasium", "metaworld", "mujoco")
    with common.CommandRun(ctx, "goskill", seed=seed, device=device, threads=threads, packages=packages,
                           reference=options.REFERENCE) as run:
        plan = api.plan(preset=preset, run_dir=run_dir, data=data, stages=stages, methods=methods, seed=seed,
                        overrides=overrides)
        run.seed = plan.seed   # a resumed run keeps its folder's seed
        root = run.make_dir(run_dir or out, allow_existing=run_dir is not None, config=plan.config_dict(),
                            resumable=True)   # Ctrl-C keeps a folder holding finished stages (docs: Decisions)
        with run.progress() as cb:
            run.result = api.execute(plan, root, device=run.device, progress=cb, timer=run.timer)
        for name in ("pipeline.json", "stages.json", "evaluation.json", "dataset.json"):
            if (root / name).exists():
                run.artifacts[name.split(".")[0]] = str(root / name)
