"""`icml lowrank`: low-rank Swish networks (Li et al., ICML 2025): the approximation study and SVD compression."""
from __future__ import annotations

import click

from icmltools.commands import common
from icmltools.lowrank import options
from icmltools.lowrank.options import ApproxConfig, CompressConfig, DemoConfig, TrainConfig, UciConfig

PACKAGES = ("numpy", "torch")
GROUP_EPILOG = """Examples:

\b
  icml lowrank --threads 1 | jq -c '.result.compress.ratios[] | [.ratio, .macs, .rel_rmse_finetuned]'
  icml lowrank approx --widths 32,64,128 --ratios full,1/2,1/3,1/6 --beta 0.5,1.5 --seeds 3 --plot front.png
  icml lowrank uci --dataset diabetes | jq -c '[.result.classical.mean, .result.lowrank.mean, .result.t_test]'
  icml lowrank compress model.safetensors --rank-ratio 0.25 --out runs/lr1 | jq .result.totals
  icml lowrank check runs/lr1 --model-ckpt model.safetensors | jq .result.totals
"""


@common.group("lowrank", invoke_without_command=True, epilog=GROUP_EPILOG)
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def cli(ctx, seed, device, threads, quiet, verbose):
    """Low-rank Swish networks (Li et al., ICML 2025): a narrow bias-free linear layer (r <= W/3) between Swish
    layers keeps universal approximation of Hölder functions and saves >= 1/3 of the hidden-layer MACs.
    Subcommands: the approximation study, the paper's tabular protocol, SVD compression of checkpoints.
    Without a subcommand: a quick demo of both halves (a small sweep, then a trained net compressed at
    several ranks and fine-tuned), about a minute on one thread."""
    flags = ctx.ensure_object(dict)
    flags.update(quiet=bool(flags.get("quiet")) or quiet, verbose=(flags.get("verbose") or 0) + verbose)
    if ctx.invoked_subcommand is not None:
        return
    from icmltools.lowrank import api

    with common.CommandRun(ctx, "lowrank", seed=seed, device=device, threads=threads, packages=PACKAGES,
                           reference=options.REFERENCE) as run:
        with run.timer.phase("demo_s"), run.progress() as cb:
            run.result = api.demo(DemoConfig(), seed, run.device, cb)
        run.table("lowrank approx (beta 1.5)", ["beta", "W", "ratio", "params", "MACs", "rel_rmse", "Pareto"],
                  api.approx_rows(run.result["approx"]))
        run.table("lowrank compress + fine-tune", ["ratio", "MACs", "rel_rmse compressed", "fine-tuned"],
                  api.demo_rows(run.result))


@common.command("approx", epilog="""Examples:

\b
  icml lowrank approx | jq -c '.result.summary[] | [.width, .ratio, .macs, .rel_rmse, .pareto]'
  icml lowrank approx --ratios full,1/2,1/3,1/6 --beta 0.5,1.5,2.5 --seeds 3 --epochs 100 --plot front.png
""")
@click.option("--widths", type=common.CommaList(kind=float, positive=True), default=",".join(map(str, ApproxConfig.widths)),
              help="Swish widths W.")
@click.option("--ratios", type=common.CommaList(), default=",".join(ApproxConfig.ratios),
              help="full (classical) and/or r/W ratios like 1/3 (1/2 = the parameter-matched control).")
@click.option("--depth", type=click.IntRange(min=2), default=ApproxConfig.depth, help="Swish layers L.")
@click.option("--beta", "betas", type=common.CommaList(kind=float, positive=True),
              default=",".join(map(str, ApproxConfig.betas)), help="Hölder smoothness of the targets.")
@click.option("--dim", type=click.IntRange(min=1), default=ApproxConfig.dim, help="Input dimension d.")
@click.option("--seeds", type=click.IntRange(min=1), default=ApproxConfig.seeds,
              help="Repetitions (target, data, init); >= 2 gives the paired t-test.")
@click.option("--epochs", type=click.IntRange(min=1), default=TrainConfig.epochs, help="Training epochs per net.")
@click.option("--n-train", type=click.IntRange(min=2), default=ApproxConfig.n_train, help="Training points.")
@click.option("--n-test", type=click.IntRange(min=2), default=ApproxConfig.n_test, help="Test points.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write rel_rmse vs MACs to this PNG.")
@common.out_option()
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def approx(ctx, widths, ratios, depth, betas, dim, seeds, epochs, n_train, n_test, plot, out, seed, device, threads,
           quiet, verbose):
    """Classical vs low-rank Swish nets at equal depth on Hölder targets: params, MACs, time, rel_rmse, Pareto front."""
    from icmltools.lowrank import api

    cfg = ApproxConfig(widths=widths, ratios=ratios, depth=depth, betas=betas, dim=dim, seeds=seeds, n_train=n_train,
                       n_test=n_test, train=TrainConfig(epochs=epochs))
    with common.CommandRun(ctx, "lowrank", seed=seed, device=device, threads=threads, packages=PACKAGES,
                           reference=options.REFERENCE) as run:
        api.validate_approx(cfg)
        if out:
            run.make_dir(out, config=api.config_dict(cfg))
        with run.timer.phase("approx_s"), run.progress() as cb:
            run.result = api.approx(cfg, seed, run.device, cb, plot=plot)
        if plot:
            run.artifacts["plot"] = str(plot)
        run.table("lowrank approx", ["beta", "W", "ratio", "params", "MACs", "rel_rmse", "Pareto"], api.approx_rows(run.result))


@common.command("uci", epilog="""Examples:

\b
  icml lowrank uci --dataset wine | jq -c '[.result.depth, .result.width, .result.classical.mean, .result.lowrank.mean]'
  icml lowrank uci --csv bike.csv --target cnt --task regression --folds 10
  icml lowrank uci --dataset iris --depth 2 --width 16 --folds 5 --epochs 20
""")
@click.option("--dataset", type=click.Choice(options.DATASETS), default=UciConfig.dataset, help="sklearn's bundled table.")
@click.option("--csv", type=click.Path(dir_okay=False), default=None,
              help="A CSV with a header instead (categorical columns become dummies).")
@click.option("--target", default=None, help="The CSV's target column [default: the last].")
@click.option("--task", type=click.Choice(options.TASKS), default=UciConfig.task,
              help="auto: classes for text or <= 10 distinct integer labels, else regression.")
@click.option("--depth", type=click.IntRange(min=2), default=None, help="Skip the grid search: this depth (with --width).")
@click.option("--width", type=click.IntRange(min=1), default=None, help="Skip the grid search: this width (with --depth).")
@click.option("--folds", type=click.IntRange(min=2), default=UciConfig.folds, help="k of the k-fold CV.")
@click.option("--epochs", type=click.IntRange(min=1), default=UciConfig.epochs, help="Epochs per fit (10 warm-up).")
@common.out_option()
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def uci(ctx, dataset, csv, target, task, depth, width, folds, epochs, out, seed, device, threads, quiet, verbose):
    """The paper's protocol: grid search of the classical net by k-fold CV, then classical vs low-rank (r = W/3) on
    the same folds with paired one-sided t-tests."""
    from icmltools.lowrank import api

    if target and not csv:
        raise click.UsageError("--target goes with --csv")
    cfg = UciConfig(dataset=dataset, task=task, folds=folds, epochs=epochs)
    with common.CommandRun(ctx, "lowrank", seed=seed, device=device, threads=threads, packages=PACKAGES,
                           reference=options.REFERENCE) as run:
        if out:
            run.make_dir(out, config=api.config_dict(cfg))
        with run.timer.phase("uci_s"), run.progress() as cb:
            run.result = api.uci(cfg, seed, csv, target, depth, width, run.device, cb)
        r = run.result
        run.table(f"lowrank uci ({r['source']})", ["net", r["metric"], "sd", "params", "MACs"],
                  [[k, r[k]["mean"], r[k]["sd"], r[k]["params"], r[k]["macs"]] for k in ("classical", "lowrank")])


@common.command("compress", param_flags={"fmt": "--format", "out_format": "--output-format"},
                epilog="""Examples:

\b
  icml lowrank compress model.safetensors --out runs/lr1 | jq .result.totals
  icml lowrank compress hf_folder/ --energy 0.9 --svd randomized --device auto --out runs/lr2
  icml lowrank compress model.pt --rank-ratio 0.25 --format dense --out runs/lr3
  icml lowrank compress --demo | jq -c '.result.ratios[] | [.ratio, .rel_rmse_compressed, .rel_rmse_finetuned]'
""")
@click.argument("checkpoint", required=False, type=click.Path())
@click.option("--rank-ratio", type=float, default=None, help="r = max(1, floor(ratio * min(out, in))) [default: 1/3].")
@click.option("--energy", type=float, default=None, help="Smallest r keeping this fraction of sum sigma^2 (instead of a ratio).")
@click.option("--svd", type=click.Choice(options.SVD_METHODS), default=CompressConfig.svd,
              help="exact: truncated SVD (float64 Gram eigendecomposition for 32/16-bit weights on a CPU, else "
                   "torch.linalg.svd); randomized: Halko et al.'s subspace iteration (q = r + 10, 2 power iterations).")
@click.option("--format", "fmt", type=click.Choice(options.FORMATS), default=CompressConfig.fmt,
              help="factored: <p>.down/.up (the paper's layout) + lowrank_map.json; dense: U_r S_r V_r' in place.")
@click.option("--output-format", "out_format", type=click.Choice(options.OUTPUT_FORMATS), default=CompressConfig.out_format,
              help="File format of the output (same = the input's).")
@click.option("--include", default=CompressConfig.include, help="Regex of the keys to factor.")
@click.option("--exclude", default=CompressConfig.exclude, help="Regex of keys never factored.")
@click.option("--min-dim", type=click.IntRange(min=1), default=CompressConfig.min_dim, help="Skip matrices smaller on a side.")
@click.option("--force", is_flag=True, help="Factor even where r (out + in) >= out * in (no saving).")
@click.option("--demo", is_flag=True, help="No checkpoint: train a net, compress it at several ratios, fine-tune.")
@common.out_option()
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def compress(ctx, checkpoint, rank_ratio, energy, svd, fmt, out_format, include, exclude, min_dim, force, demo, out, seed,
             device, threads, quiet, verbose):
    """Truncated SVD of a checkpoint's Linear weights (safetensors, HF folder, weights-only torch), streamed
    tensor by tensor: per-layer error, parameter and MAC savings; the output goes into the run folder."""
    from icmltools.lowrank import api

    if demo == bool(checkpoint):
        raise click.UsageError("give a CHECKPOINT, or --demo (not both)")
    cfg = CompressConfig(rank_ratio=rank_ratio, energy=energy, svd=svd, fmt=fmt, out_format=out_format, include=include,
                         exclude=exclude, min_dim=min_dim, force=force)
    with common.CommandRun(ctx, "lowrank", seed=seed, device=device, threads=threads, packages=PACKAGES,
                           reference=options.REFERENCE) as run:
        if demo:
            with run.timer.phase("demo_s"), run.progress() as cb:
                run.result = api.compress_demo(DemoConfig(), seed, run.device, cb)
            return
        api.validate_compress(cfg)
        with run.timer.phase("plan_s"):
            plan = api.prepare_compress(checkpoint, cfg, run.device)
        d = run.make_dir(out, config=api.config_dict(cfg))
        with run.timer.phase("compress_s"), run.progress() as cb:
            run.result = api.compress(plan, d, run.device, seed, cb)
        run.artifacts.update(checkpoint=run.result["output"], map=run.result["map"])
        run.table("lowrank compress", ["key", "shape", "rank", "rel_fro_err", "MACs", "factored"], api.compress_rows(run.result))


@common.command("check", param_flags={"map_path": "--map", "model_ckpt": "--model-ckpt"}, epilog="""Examples:

\b
  icml lowrank check runs/lr1 | jq -c '.result.layers[] | [.prefix, .shape, .rank]'
  icml lowrank check runs/lr1/compressed.safetensors --model-ckpt model.safetensors | jq .result.totals
  icml lowrank check factored.safetensors --map lowrank_map.json
""")
@click.argument("factored", type=click.Path())
@click.option("--map", "map_path", type=click.Path(dir_okay=False), default=None,
              help=f"The low-rank map [default: the run folder's {options.MAP_NAME}, else the checkpoint's record].")
@click.option("--model-ckpt", type=click.Path(), default=None,
              help="The dense checkpoint it came from: every other tensor must match it too (no extra, none missing).")
@common.standard_options(seed=False, threads=True)
@click.pass_context
def check(ctx, factored, map_path, model_ckpt, threads, quiet, verbose):
    """Load a factored checkpoint (a compress run folder, or the file with --map) strictly into the swapped
    low-rank structure, one layer at a time: per-layer shapes, ranks and parameters; a missing, extra or
    differently shaped tensor is an error naming it and both shapes (exit 2). Writes nothing."""
    from icmltools.lowrank import api

    with common.CommandRun(ctx, "lowrank", threads=threads, packages=PACKAGES, reference=options.REFERENCE) as run:
        with run.timer.phase("check_s"), run.progress() as cb:
            run.result = api.check(factored, map_path, model_ckpt, cb)
        run.table("lowrank check", ["prefix", "shape", "rank", "format", "params", "factored"], api.check_rows(run.result))


for _cmd in (approx, uci, compress, check):
    cli.add_command(_cmd)
