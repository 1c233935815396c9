"""`icml goskill`: GO-Skill offline multi-task RL on MetaWorld (collect -> extract -> enhance -> policy ->
baselines -> evaluate), one JSON summary on stdout."""
from __future__ import annotations

from pathlib import Path

import click

from . import common

EPILOG = """Examples:

\b
  icml goskill | jq '.result.methods[] | {method, success}'
  icml goskill --preset cpu --out runs/mt10 --stages collect
  icml goskill --run-dir runs/mt10 --stages extract,enhance,policy,baselines,evaluate
  icml goskill --data ./mt50_data --tasks reach-v3,push-v3 --split sub --preset gpu --device cuda
  icml goskill --tasks reach-v3,push-v3 --decoder mlp -H 5 --methods goskill,mtbc
"""

STAGES = "collect,extract,enhance,policy,baselines,evaluate"


@common.command("goskill", epilog=EPILOG)
@click.option("--preset", type=click.Choice(["quick", "cpu", "gpu"]), default="quick",
              help="quick: small, ~5 min on 2 cores; cpu: the benchmark size; gpu: the paper's sizes.")
@click.option("--stages", default=None, metavar="LIST",
              help=f"Comma list of {STAGES} (or all). Default: all for a new run; the remaining ones with --run-dir.")
@click.option("--methods", default=None, metavar="LIST",
              help="Methods to train/evaluate: goskill, goskill_noenh (no enhancement), mtbc, mtbc_rtg. "
                   "Default: goskill,mtbc,mtbc_rtg.")
@click.option("--tasks", default=None, metavar="mt10|mt50|LIST", help="MetaWorld -v3 tasks (default mt10).")
@click.option("--data", type=click.Path(exists=True, file_okay=False), default=None,
              help="A user dataset in the official <task>/<i>.npz layout instead of collecting.")
@click.option("--run-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Continue an existing run directory (its config.json and seed are used; size options given here override it).")
@click.option("--split", type=click.Choice(["near", "sub"]), default=None,
              help="near-optimal = all episodes, sub-optimal = first half (default near).")
@click.option("--episodes", type=click.IntRange(min=1), default=None, help="Episodes collected per task.")
@click.option("--max-steps", type=click.IntRange(min=1, max=999), default=None, help="Steps per episode.")
@click.option("-H", "--horizon", "H", type=click.IntRange(min=1, max=50), default=None,
              help="Skill horizon H (goal = s_{t+H} - s_t; paper 10).")
@click.option("--decoder", type=click.Choice(["transformer", "mlp"]), default=None,
              help="Skill decoder: causal transformer over the in-skill history (paper) or an MLP.")
@click.option("--conditioning", type=click.Choice(["prompt", "task"]), default=None,
              help="High level identifies the task by a trajectory prompt (paper) or a task-id embedding.")
@click.option("--extract-iters", type=click.IntRange(min=0), default=None)
@click.option("--enhance-iters", type=click.IntRange(min=0), default=None,
              help="Decoder-only enhancement steps (presets: = --policy-iters; the official loop takes one per high-level step).")
@click.option("--policy-iters", type=click.IntRange(min=0), default=None)
@click.option("--bc-iters", type=click.IntRange(min=0), default=None)
@click.option("--eval-episodes", type=click.IntRange(min=1), default=None, help="Evaluation episodes per task.")
@click.option("--envs-per-task", type=click.IntRange(min=1), default=None,
              help="Parallel environments per task in the vectorised evaluation.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Processes for data collection.")
@common.out_option()
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def cli(ctx, preset, stages, methods, tasks, data, run_dir, split, episodes, max_steps, H, decoder, conditioning,
        extract_iters, enhance_iters, policy_iters, bc_iters, eval_episodes, envs_per_task, workers, out,
        seed, device, threads, quiet, verbose):
    """GO-Skill (He et al., ICML 2025): goal-oriented skills (VQ over s_{t+H} - s_t), class-balanced skill
    enhancement and a return-conditioned high-level policy, against MT-BC and MT-BC-RTG, on MetaWorld.

    With no arguments: the quick preset on MT10, collected with MetaWorld's scripted experts behind a
    random-to-expert quality ramp, evaluated on vectorised envs. The run directory holds the data,
    checkpoints, config.json and result.json; `.result.methods[]` has method, success, return, per_task.
    """
    from icmltools.goskill.pipeline import start
    from icmltools.goskill.tasks import quiet as quiet_warnings

    overrides = dict(tasks=tasks, split=split, episodes=episodes, max_steps=max_steps, H=H, decoder=decoder,
                     conditioning=conditioning, extract_iters=extract_iters, enhance_iters=enhance_iters,
                     policy_iters=policy_iters, bc_iters=bc_iters, eval_episodes=eval_episodes,
                     envs_per_task=envs_per_task, workers=workers)
    packages = ("numpy", "torch", "gymnasium", "metaworld", "mujoco")
    with common.CommandRun(ctx, "goskill", seed=seed, device=device, threads=threads, packages=packages) as run:
        with quiet_warnings(), run.progress() as cb:
            res = start(preset=preset, out=out, run_dir=run_dir, data=data, stages=stages, methods=methods,
                        seed=seed, device=run.device, overrides=overrides, eval_episodes=None, progress=cb,
                        timer=run.timer)
        run.result = res
        run.artifacts["run_dir"] = res["run_dir"]
        for name in ("config.json", "result.json", "stages.json", "evaluation.json"):
            p = Path(res["run_dir"]) / name
            if p.exists():
                run.artifacts[name.split(".")[0]] = str(p)
