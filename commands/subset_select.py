"""`icml subset-select`: RAM-APL (Wan et al., ICML 2025) and subset-selection baselines on feature matrices."""
from __future__ import annotations

import click
from click.core import ParameterSource

from icmltools.subset import options
from icmltools.subset.options import Config

from . import common

EPILOG = """Examples:

\b
  icml subset-select | jq -c '.result.evaluation[] | [.method, .rate, .test_acc]'
  icml subset-select --dataset synthetic --noise 0.2 -r 0.5 -r 0.7 -m ram-apl -m ram -m random
  icml subset-select -f clip.npy -f dinov2.npy --labels train.csv:label -r 0.1 -r 0.3 \\
      --indices-out subset.txt | jq '.result.selections[] | {rate, n_selected}'
  icml subset-select -f clip.npy -f dinov2.npy --labels y.npy -m ram-apl -m random --evaluate \\
      -r 0.05 --seeds 3 | jq '.result.evaluation'
"""

_CLICK_NAME = {"include_indices": "no_indices"}  # Config field -> click parameter where they differ


def _refuse_unused(ctx: click.Context, cfg) -> None:
    """An option given on the command line that this run would not use is a usage error (not ignored)."""
    flags = {p.name: max(p.opts, key=len) for p in ctx.command.params if isinstance(p, click.Option)}
    for name, why in options.unused_options(cfg).items():
        name = _CLICK_NAME.get(name, name)
        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            raise click.UsageError(f"{flags[name]}: {why}")


def _shown_params(params: dict, cfg, resolved: dict) -> dict:
    """The envelope's params: what ran (resolved methods, rates, mode), without the options that did not apply."""
    unused = {_CLICK_NAME.get(n, n) for n in options.unused_options(cfg)}
    return {k: v for k, v in {**params, **resolved}.items() if k not in unused}


_RATES_HELP = (f"Selection rate p in (0, 1], repeatable. Default: {', '.join(map(str, options.SELECT_RATES))} when "
               f"selecting; {' '.join(map(str, options.EVALUATE_RATES))} when evaluating.")


@common.command("subset-select", epilog=EPILOG, param_flags={"include_indices": "--no-indices"})
@click.option("-f", "--features", "features", multiple=True, metavar="FILE[:KEY]",
              help="Feature matrix (N, d) of one extractor: .npy (memory-mapped), .npz, .pt or .safetensors. "
                   "Repeat for several extractors (same row order). Without it, the embedded --dataset is used.")
@click.option("--labels", default=None, metavar="FILE[:COLUMN]",
              help="Labels (N,): .npy, or a CSV/TSV/text column by name or index (default: last column).")
@click.option("-m", "--method", "methods", multiple=True, type=click.Choice(options.METHODS),
              help=f"Selection method(s). Default: {', '.join(options.SELECT_METHODS)} when selecting, all of "
                   "them when evaluating.")
@click.option("-r", "--rate", "rates", multiple=True, type=float, help=_RATES_HELP)
@click.option("--view", type=click.IntRange(min=0), default=Config.view,
              help="Which extractor the single-view baselines (min, moderate, kcenter, herding, graphcut) use.")
@click.option("--dataset", type=click.Choice(options.DATASETS), default=Config.dataset,
              help="Embedded data when no --features: scikit-learn's digits with label-free views, or the "
                   "synthetic fine-grained generator.")
@click.option("--n-views", type=click.IntRange(1, options.MAX_VIEWS), default=Config.n_views,
              help="Extractor views of the embedded data.")
@click.option("--evaluate/--no-evaluate", "evaluate", default=None,
              help="Train a target classifier on every subset. Default: on for embedded data, off for --features.")
@click.option("--target", type=click.Choice(options.TARGETS), default=Config.target,
              help="Target classifier for --evaluate (cnn needs image inputs, e.g. digits raw images).")
@click.option("--eval-input", default=None, metavar="raw|view:K",
              help="Inputs of the target model: raw (embedded data; --raw for yours) or one feature view. "
                   "Default: raw for embedded data, view:0 for --features.")
@click.option("--test-features", multiple=True, metavar="FILE",
              help="Test-split features (one per --features, same order) for --evaluate on a feature view, with "
                   "--test-labels; without a test split a stratified --holdout of the given rows is the test set.")
@click.option("--test-labels", default=None, metavar="FILE[:COLUMN]", help="Test-split labels for --evaluate.")
@click.option("--raw", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Raw target-model inputs (.npy, same rows as the features) for --eval-input raw.")
@click.option("--raw-test", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Raw test inputs (same shape per row as --raw) for --eval-input raw, with --test-labels.")
@click.option("--holdout", type=click.FloatRange(0.05, 0.9), default=Config.holdout,
              help="Test fraction held out of your rows when --evaluate has no --test-features.")
@click.option("--noise", type=click.FloatRange(0.0, 1.0, max_open=True), default=Config.noise,
              help="Symmetric label noise injected into the training labels (fraction, below (K-1)/K for K "
                   "classes); the noisy fraction inside each subset is reported.")
@click.option("--seeds", type=click.IntRange(1, 100), default=Config.seeds,
              help="Evaluation repeats k = 0..N-1; repeat k draws its label noise, random/k-center choices and "
                   "training from derive(--seed, 'subset', 'repeat', k).")
@click.option("--indices-out", default=None, type=click.Path(dir_okay=False),
              help="Write the selected indices as a plain text file (one per line); with several "
                   "(method, rate) pairs, one file each: STEM.METHOD.pRATE.txt. The folder must exist; all output "
                   "files are written together at the end, or none.")
@click.option("--scores-out", default=None, type=click.Path(dir_okay=False),
              help="Write per-sample [RAM, APL] (N x 2 .npy); score = W1*RAM + W2*APL at any rate.")
@click.option("--no-indices", is_flag=True, help="Leave the index lists out of the JSON (use with --indices-out).")
@click.option("--chunk-rows", type=click.IntRange(min=0), default=Config.chunk_rows,
              help="Rows per chunk of the distance passes (0 = about 64 MB per chunk).")
@click.option("--jsonl", is_flag=True, help="Stream one JSON line per (repeat, method, rate) while evaluating.")
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def cli(ctx, features, labels, methods, rates, view, dataset, n_views, evaluate, target, eval_input, test_features,
        test_labels, raw, raw_test, holdout, noise, seeds, indices_out, scores_out, no_indices, chunk_rows, jsonl,
        seed, device, threads, quiet, verbose):
    """One-shot subset selection with several foundation-model feature extractors (RAM-APL, Wan et al.,
    ICML 2025) and the standard baselines, on feature files you extracted or on embedded data.

    RAM-APL ranks each class by the mean over extractors of the within-class distance rank to the class
    mean (RAM) plus the fraction of extractors whose nearest class mean disagrees with the label (APL),
    weighted by a sigmoid of the rate p (W1 = 0.6, W2 = 0.4 at p = 0.5), and keeps round(n_c * p) per class.
    """
    with common.CommandRun(ctx, "subset-select", seed=seed, device=device, threads=threads,
                           reference=options.REFERENCE) as run:
        from icmltools.subset import api

        cfg = api.resolve(Config(
            features=tuple(features), labels=labels, dataset=dataset, n_views=n_views, methods=methods or None,
            rates=rates or None, view=view, evaluate=evaluate, target=target, eval_input=eval_input,
            test_features=tuple(test_features), test_labels=test_labels, raw=raw, raw_test=raw_test,
            holdout=holdout, noise=noise, seeds=seeds, seed=seed, indices_out=indices_out, scores_out=scores_out,
            include_indices=not no_indices, chunk_rows=chunk_rows, device=run.device))
        _refuse_unused(ctx, cfg)
        run.params = _shown_params(run.params, cfg, api.shown_params(cfg))
        with run.progress() as cb, run.timer.phase("evaluate" if cfg.evaluate else "select"):
            run.result, art = api.run(cfg, progress=cb, stream=run.stream if jsonl else None)
        run.artifacts.update(art)
