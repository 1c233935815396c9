"""`icml cabs-merge`: conflict-aware, balanced (n:m) sparsification of task vectors for merging (CABS, ICML 2025)."""
from __future__ import annotations

import click

from icmltools.cabs import options

from . import common, merge_options

EPILOG = """Examples:

\b
  icml cabs-merge | jq -c '.result.summary[] | [.name, .test_avg, .max_pairwise_overlap]'
  icml cabs-merge --n-seeds 3 --methods cabs,bs,ca_magnitude,task_arithmetic
  icml cabs-merge --base base.safetensors --models math.safetensors,code.safetensors \\
      --nm 8:32 --lam 0.6,0.4 --out merged_run | jq -c '.result.overlap.max_pairwise'
  icml cabs-merge --base llama/ --models ft_a/,ft_b/ --nm-for 1=4:32 --exclude 'lm_head.*' --out run2
  icml cabs-merge --config mergekit.yml --out run3   # a mergekit YAML (cabs, task_arithmetic, ties, ...)
  icml cabs-merge --base b.safetensors --models a.safetensors,c.safetensors --lam-grid 0.5:2:0.25 \\
      --eval-cmd 'python eval.py {checkpoint}' | jq .result.lambda_search.selected_scale
"""

# library parameter -> flag, where the names differ
PARAM_FLAGS = {"out_format": "--format", "out_dtype": "--dtype", "weights": "--lam", "model_options": "--nm",
               "densities": "--nm", "options": "--config"}
DC = options.DemoConfig


@common.command("cabs-merge", epilog=EPILOG, param_flags=PARAM_FLAGS)
@merge_options.file_options(models="model_list", models_flags=("-m", "--model"),
                            models_help="A fine-tuned checkpoint (repeat; the order given is the pruning order). "
                                        "Alternative to --models.",
                            base_help="Base checkpoint theta_0: .safetensors, a weights-only torch file, or a Hugging "
                                      "Face folder (sharded or not). Without it (and without --config) the embedded "
                                      "demo runs.", filters=True, chunk=True, out_dtype=True)
@click.option("--models", "models_csv", default=None, metavar="M1,M2,..",
              help="Fine-tuned checkpoints, comma-separated; their order is the pruning order.")
@click.option("--config", type=click.Path(exists=False, dir_okay=False), default=None,
              help="A mergekit YAML config (models, base_model, merge_method, parameters weight/density/n_m_ratio) "
                   "for the methods both tools have, instead of --base/--models.")
@click.option("--method", type=click.Choice(options.METHODS), default="cabs",
              help="File mode: CABS or a baseline at the same density n/m.")
@click.option("--nm", default=options.AUTO_NM, metavar="auto|N:M",
              help=f"n:m pattern for every model; auto = m {options.AUTO_M}, n = max(1, {options.AUTO_TOTAL} // K) (K models). "
                   "The other pruning methods use density n/m.")
@click.option("--nm-for", multiple=True, metavar="I=N:M",
              help="The n:m of model I (0-based, in the model order); repeat.")
@click.option("--lam", type=merge_options.per_model_floats(), default=options.DEFAULT_LAM, metavar="L|L1,L2,..",
              help="Lambda: one for all models, or one per model in the model order.")
@click.option("--lam-grid", default=None, metavar="START:STOP:STEP|A,B,..",
              help="Search a global scale s (theta_0 + s * sum_k lam_k * pruned_k) with --eval-cmd; the best is written.")
@click.option("--eval-cmd", default=None, metavar="CMD",
              help="With --lam-grid: run on each checkpoint ({checkpoint} is replaced by its path, else appended); "
                   "it prints JSON with a finite \"score\" (higher is better).")
@click.option("--eval-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds allowed per --eval-cmd run.")
@click.option("--tail", type=click.Choice(options.TAILS), default=options.DEFAULT_TAIL,
              help="Last partial block (numel % m): pad = keep its top min(n, r) (mergekit); drop = prune it (RoBERTa).")
@click.option("--allow-non-finite", is_flag=True,
              help="Merge checkpoints holding NaN/inf (refused by default, naming the file and tensor); each is listed "
                   "in the result, and a non-finite output is still refused.")
@click.option("--methods", type=common.CommaList(options.DEMO_METHODS, allow_all=True), default=",".join(DC.methods),
              help="Demo: the merges compared.")
@click.option("--n-seeds", type=click.IntRange(min=1), default=options.DEMO_N_SEEDS,
              help="Demo: seeds --seed .. --seed+N-1.")
@common.out_option()
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def cli(ctx, base, model_list, include, exclude, out_format, out_dtype, chunk_elems, models_csv, config, method, nm,
        nm_for, lam, lam_grid, eval_cmd, eval_timeout, tail, allow_non_finite, methods, n_seeds, seed, device, threads,
        quiet, verbose, out):
    """Merge fine-tuned models with CABS (Yang et al., ICML 2025) or a baseline, on the shared merge engine.

    Each task vector tau_k = theta_k - theta_0 keeps the n largest magnitudes of every block of m
    (balanced n:m sparsity), only on the positions no earlier model kept (conflict-aware, in the model
    order), never rescaled; theta = theta_0 + sum_k lambda_k * pruned_k, streamed tensor by tensor.

    Without --base, runs the embedded demo (four generated tasks on a shared trunk, fine-tuned per task,
    the trunks merged) and reports per-task accuracy of CABS and its baselines at the same density.
    """
    models = _check_usage(ctx, base, models_csv, model_list, config)
    with common.CommandRun(ctx, "cabs-merge", seed=seed, device=device, threads=threads,
                           reference=options.REFERENCE, param_flags=PARAM_FLAGS) as run:
        if base is None and config is None:
            _demo(run, methods, nm, tail, n_seeds, out)
        else:
            _files(run, base, models, config, dict(method=method, nm=nm, nm_for=nm_for, lam=lam, tail=tail,
                                                   out_format=out_format, out_dtype=out_dtype,
                                                   chunk_elems=chunk_elems, include=include,
                                                   exclude=exclude, seed=seed, lam_grid=lam_grid, eval_cmd=eval_cmd,
                                                   eval_timeout=eval_timeout), out, allow_non_finite)


FILE_ONLY = ("models_csv", "model_list", "method", "nm_for", "lam", "include", "exclude", "out_format", "out_dtype",
             "chunk_elems", "allow_non_finite", "lam_grid", "eval_cmd", "eval_timeout")
DEMO_ONLY = ("methods", "n_seeds")
NOT_WITH_CONFIG = ("base", "models_csv", "model_list", "method", "nm", "nm_for", "lam", "out_dtype")


def _given(ctx) -> list:
    return [p for p in ctx.command.params if ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]


def _check_usage(ctx, base, models_csv, model_list, config) -> list:
    """Options that conflict or that the chosen mode would ignore, as usage errors (exit 2); the model list."""
    given = _given(ctx)
    if config is not None:
        for p in given:
            if p.name in NOT_WITH_CONFIG + DEMO_ONLY:
                raise click.UsageError(f"{p.opts[-1]} does not go with --config (the config file says it)")
        return []
    if base is None:
        for p in given:
            if p.name in FILE_ONLY:
                raise click.UsageError(f"{p.opts[-1]} applies to merges of your checkpoints only (with --base)")
        return []
    for p in given:
        if p.name in DEMO_ONLY:
            raise click.UsageError(f"{p.opts[-1]} applies to the embedded demo only (not with --base)")
    if models_csv and model_list:
        raise click.UsageError("give the models with --models or with -m/--model, not both")
    models = [m.strip() for m in models_csv.split(",") if m.strip()] if models_csv else list(model_list)
    if not models:
        raise click.UsageError("give the fine-tuned checkpoints with --models M1,M2 (or -m M1 -m M2)")
    return models


def _demo(run, methods, nm, tail, n_seeds: int, out) -> None:
    from dataclasses import asdict

    from icmltools.cabs import api

    cfg = api.demo_config(methods=methods, nm=nm, tail=tail)
    if out:
        run.make_dir(out, config=asdict(cfg))
    with run.progress() as cb, run.timer.phase("demo"):
        run.result = api.run_demo(cfg, seeds=range(run.seed, run.seed + n_seeds), tail=tail, progress=cb)
    cols, rows = api.demo_table(run.result)
    run.table(f"CABS demo: mean test accuracy over {n_seeds} seed(s), n:m {cfg.nm}", cols, rows)


def _files(run, base, models, config, opts: dict, out, allow_non_finite: bool) -> None:
    from icmltools.cabs import api

    with run.timer.phase("open"):
        if config is not None:
            job = api.prepare_config(config, **{k: opts[k] for k in ("out_format", "chunk_elems", "seed", "tail",
                                                                     "lam_grid", "eval_cmd", "eval_timeout",
                                                                     "include", "exclude")})
        else:
            job = api.prepare_files(base, models, **opts)
    for w in job.warnings:
        run.log(f"warning: {w}")
    d = run.make_dir(out, config=job.config())
    with run.progress() as cb, run.timer.phase("merge"):
        run.result = api.merge_files(job, d, device=run.device, progress=cb, allow_non_finite=allow_non_finite)
    run.artifacts["merged"] = run.result["output"]
