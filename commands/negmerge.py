"""`icml negmerge`: sign-consensual task-vector merging for machine unlearning (NegMerge, ICML 2025)."""
from __future__ import annotations

import click

from icmltools.negmerge import options

from . import common, merge_options

EPILOG = """Examples:

\b
  icml negmerge | jq -c '.result.methods[] | {method, forget_acc, retain_acc, avg_gap}'
  icml negmerge --n-seeds 3 --threads 2
  icml negmerge --export-demo demo_ckpts   # also writes the demo's checkpoints
  icml negmerge --pool '5,10,20;0,5e-4,5e-3;0'   # only the 9 candidates without label smoothing
  icml negmerge --base base.safetensors -c ft1.safetensors -c ft2.safetensors -c ft3.safetensors \\
      --lam 2.5 --out merged_run | jq .result.kept_fraction
  icml negmerge --base hf_model/ -c ft_a/ -c ft_b/ --lam-grid 0:1:0.05 \\
      --eval-cmd 'python eval.py --ckpt {checkpoint}' | jq .result.lambda_search.selected_lam
"""

# library parameter -> flag, where the names differ
PARAM_FLAGS = {"index": "--ta-index", "out_format": "--format", "fmt": "--format"}
MC = options.MergeConfig
DC = options.DemoConfig


@common.command("negmerge", epilog=EPILOG, param_flags=PARAM_FLAGS)
@merge_options.file_options(models="candidates", models_flags=("-c", "--candidate"),
                            models_help="A model fine-tuned on the forget set (repeat; >= 2 for merges).",
                            base_help="Original (pre-unlearning) checkpoint: .safetensors, .pt/.pth/.bin, or a Hugging "
                                      "Face folder. Without it the embedded demo runs.")
@click.option("--method", type=click.Choice(options.METHODS), default=MC.method,
              help="How the task vectors are merged (file mode).")
@click.option("--ta-index", type=click.IntRange(min=0), default=MC.index,
              help="task_arithmetic: which candidate (0-based).")
@click.option("--lam", type=float, default=None,
              help="Fixed scaling: theta = theta_pre - lam * tau (streamed straight to disk).")
@click.option("--lam-grid", default=None, metavar="START:STOP:STEP|A,B,..",
              help=f"Lambda grid to search (demo default {options.DEMO_LAM_GRID_SPEC}; the official CLIP grid is "
                   "0:1:0.05).")
@click.option("--eval-cmd", default=None, metavar="CMD",
              help="File mode with --lam-grid: a command run on each checkpoint ({checkpoint} is replaced by its "
                   "path, else appended) that prints JSON with forget_acc and retain_acc.")
@click.option("--eval-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds allowed per --eval-cmd run.")
@click.option("--retain-ratio", type=click.FloatRange(0, 1), default=options.RETAIN_RATIO,
              help="Lambda rule: lowest forget accuracy with retain >= ratio x the original's.")
@click.option("--patience", type=click.IntRange(min=0), default=None,
              help="Stop the lambda search after this many consecutive lambdas below the retain threshold "
                   f"(0 = whole grid, as the official code; default {options.FILE_PATIENCE} on files, "
                   f"{options.DEMO_PATIENCE} in the demo).")
@click.option("--ties-k", type=click.FloatRange(0, 1, min_open=True), default=MC.ties_k,
              help="TIES: fraction of each task vector kept (top-k by magnitude).")
@click.option("--dare", "dare_p", type=click.FloatRange(0, 1, max_open=True), default=MC.dare_p,
              help="DARE drop probability applied to each task vector before merging (0 = off).")
@click.option("--per-tensor", is_flag=True, help="Report the kept fraction of every tensor.")
@click.option("--allow-non-finite", is_flag=True,
              help="Merge checkpoints holding NaN/inf (refused by default, naming the file and tensor); each is "
                   "listed in the result, and a non-finite output is still refused.")
@click.option("--methods", "methods", type=common.CommaList(options.DEMO_METHODS),
              default=",".join(DC.methods), help="Demo: merges shown next to task arithmetic best/median.")
@click.option("--preset", type=click.Choice(options.PRESETS), default=options.DEFAULT_PRESET,
              help="Demo size: quick = the spec's task and 27 candidates (about a minute); tiny = a seconds-long smoke run.")
@click.option("--n-seeds", type=click.IntRange(min=1), default=options.DEMO_N_SEEDS,
              help="Demo: run seeds --seed .. --seed+N-1 and report the mean per method.")
@click.option("--pool", default=None, metavar="EPOCHS;WD;LS",
              help="Demo: the candidates' fine-tuning grid as three comma lists, epochs;weight decay;label smoothing "
                   f"(default the spec's '{options.pool_spec(DC())}' = {DC().n_candidates} candidates).")
@click.option("--export-demo", type=click.Path(file_okay=False), default=None,
              help="Demo: also write original, retrain and the candidates as .safetensors into this (new or empty) folder.")
@common.out_option()
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def cli(ctx, base, candidates, method, ta_index, lam, lam_grid, eval_cmd, eval_timeout, retain_ratio, patience,
        ties_k, dare_p, out_format, per_tensor, allow_non_finite, methods, preset, n_seeds, pool, export_demo, seed,
        device, threads, quiet, verbose, out):
    """Unlearn by negating a merged task vector: NegMerge (Kim et al., ICML 2025) and baselines.

    Task vectors tau_i = theta_i - theta_pre of N models fine-tuned on the forget set are merged
    keeping only elements whose sign all N share (mean of those, zero elsewhere); the unlearned
    model is theta_pre - lambda * tau, with lambda the lowest-forget-accuracy point whose retain
    accuracy stays >= 0.95 x the original's. Merges stream tensor by tensor on the shared merge
    engine, so memory stays near a few copies of the largest tensor whatever the number of candidates.

    Without --base, runs the embedded demo (generated task, memorising MLP, retrain gold standard,
    27 candidates) and reports forget/retain/test accuracy, MIA-efficacy and Avg.Gap to retrain for
    original, retrain, task arithmetic (best and median candidate), NegMerge, uniform, TIES and MagMax.
    """
    _check_usage(ctx, base, candidates, lam, lam_grid, eval_cmd)
    with common.CommandRun(ctx, "negmerge", seed=seed, device=device, threads=threads,
                           reference=options.REFERENCE) as run:
        if base is None:
            _demo(run, dict(preset=preset, methods=methods, lam=lam, lam_grid=lam_grid, ties_k=ties_k, dare_p=dare_p,
                            retain_ratio=retain_ratio, patience=patience, pool=pool), n_seeds, export_demo, out)
        else:
            _files(run, base, candidates, dict(method=method, index=ta_index, ties_k=ties_k, dare_p=dare_p, seed=seed,
                                               out_format=out_format, lam=lam, lam_grid=lam_grid, eval_cmd=eval_cmd,
                                               eval_timeout=eval_timeout, retain_ratio=retain_ratio,
                                               patience=patience, allow_non_finite=allow_non_finite),
                   per_tensor, out)


# options of one mode only: given in the other, they would be silently ignored
FILE_ONLY = ("method", "ta_index", "eval_cmd", "eval_timeout", "out_format", "per_tensor", "allow_non_finite")
DEMO_ONLY = ("methods", "preset", "n_seeds", "pool", "export_demo")


def _check_usage(ctx, base, candidates, lam, lam_grid, eval_cmd) -> None:
    """Options that conflict, that the chosen mode needs, or that it would ignore, as usage errors (exit 2)."""
    given = [p for p in ctx.command.params
             if ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
    if lam is not None and lam_grid is not None:
        raise click.UsageError("give either --lam or --lam-grid, not both")
    if base is None:
        if candidates:
            raise click.UsageError("--candidate needs --base (without --base the embedded demo runs)")
        for p in given:
            if p.name in FILE_ONLY:
                raise click.UsageError(f"{p.opts[-1]} applies to merges of your checkpoints only (with --base)")
        return
    for p in given:
        if p.name in DEMO_ONLY:
            raise click.UsageError(f"{p.opts[-1]} applies to the embedded demo only (not with --base)")
    if not candidates:
        raise click.UsageError("give the fine-tuned checkpoints with -c/--candidate (repeat it)")
    if lam is None and lam_grid is None:
        raise click.UsageError("give --lam, or --lam-grid with --eval-cmd (e.g. --lam 1.0)")
    if lam_grid is not None and eval_cmd is None:
        raise click.UsageError("--lam-grid on your checkpoints needs --eval-cmd (the built-in evaluator is the demo's)")
    if lam is not None and eval_cmd is not None:
        raise click.UsageError("--eval-cmd evaluates the checkpoints of a --lam-grid search; with a fixed --lam "
                               "nothing is evaluated (run your evaluation on the output)")


def _demo(run, opts: dict, n_seeds: int, export_demo, out) -> None:
    from dataclasses import asdict

    from icmltools.negmerge import api

    cfg = api.demo_config(**opts)
    if out:
        run.make_dir(out, config=asdict(cfg))
    with run.progress() as cb, run.timer.phase("demo"):
        run.result = api.run_demo(cfg, seed=run.seed, n_seeds=n_seeds, device=run.device, progress=cb,
                                  export_dir=export_demo)
    if export_demo:
        run.artifacts["demo_checkpoints"] = export_demo


def _files(run, base, candidates, opts: dict, per_tensor: bool, out) -> None:
    from icmltools.negmerge import api

    with run.timer.phase("open"):
        job = api.prepare_files(base, candidates, **opts)
    d = run.make_dir(out, config=job.config())
    with run.progress() as cb, run.timer.phase("merge"):
        run.result = api.merge_files(job, d, device=run.device, per_tensor=per_tensor, progress=cb)
    run.artifacts["merged"] = run.result["output"]
