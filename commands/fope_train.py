"""`icml fope-train`: train small decoder-only LMs with FoPE and the baselines, compare length extrapolation."""
from __future__ import annotations

import click

from icmltools.fope import options

from . import common

EPILOG = """Examples:

\b
  icml fope-train --pe rope,fope | jq '.result.methods[] | {pe, growth: .summary.loss_growth_4x}'
  icml fope-train --preset passkey --pe rope,fope,fope-cf | jq '.result.methods[] | [.pe, .summary]'
  icml fope-train --pe all --extend pi,yarn --out runs/cmp
  icml fope-train --eval runs/cmp/rope --eval-factors 1,2,4,8,16 --extend yarn
  icml fope-train --text my.txt --train-length 128 --steps 2000 --pe rope,fope
  torchrun --nproc_per_node 4 -m icmltools fope-train --preset 60m --pe fope --device cuda
"""


def _check_modes(ckpt_dir, resume, no_save, out, extend_factor) -> None:
    """Options that contradict each other (usage errors, exit 2)."""
    if ckpt_dir and resume:
        raise click.UsageError("--resume continues a training run; it does not apply to --eval")
    if resume and no_save:
        raise click.UsageError("--resume and --no-save contradict each other")
    if resume and not out:
        raise click.UsageError("--resume needs --out DIR (the run folder to resume)")
    if extend_factor and not ckpt_dir:
        raise click.UsageError("--extend-factor applies to --eval (training runs use L/N per length)")


@common.command("fope-train", epilog=EPILOG)
@click.option("--pe", "pes", type=common.CommaList(options.PES, allow_all=True), default=",".join(options.DEFAULT_PES),
              help="Position embeddings to train side by side: rope, fope, fope-cf (clip-floor only), "
                   "fope-fs (Fourier series only), nope, alibi, or all.")
@click.option("--preset", type=click.Choice(tuple(options.PRESETS)), default=options.DEFAULT_PRESET,
              help="quick: stdlib bytes, N 64, CPU minutes; passkey: passkey task, N 128; cpu: the spec's CPU "
                   "prototype scale; 60m: the paper's 60M shape (GPU).")
@click.option("--task", type=click.Choice(options.TASKS), default=None, help="Override the preset's task.")
@click.option("--text", "text_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Train on this UTF-8 text file at byte level (default: the Python stdlib's .py sources). "
                   "With --eval: evaluate on it instead of the data recorded in the checkpoint.")
@click.option("--train-length", type=click.IntRange(min=1), default=None, help="Training context N (preset).")
@click.option("--d-model", type=click.IntRange(min=2), default=None, help="Model width (preset).")
@click.option("--n-layers", type=click.IntRange(min=1), default=None, help="Layers (preset).")
@click.option("--n-heads", type=click.IntRange(min=1), default=None, help="Attention heads (preset).")
@click.option("--mlp-hidden", type=click.IntRange(min=1), default=None, help="SwiGLU hidden width (4 * d-model).")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Training steps (preset).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Sequences per step (preset).")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None, help="Peak AdamW learning rate.")
@click.option("--warmup", type=click.IntRange(min=0), default=None, help="Linear warm-up steps.")
@click.option("--sigma", type=click.FloatRange(min=0), default=None,
              help="FoPE coefficient init gain (paper: 0.3 / 0.4 / 0.6 for 60M / 180M / 1.2B).")
@click.option("--theta", type=click.FloatRange(min=1, min_open=True), default=None,
              help=f"RoPE base ({options.RunConfig.theta:g}).")
@click.option("--pad", type=click.Choice(tuple(options.PADS)), default=None,
              help="FoPE padding of the unused dims: official pads sin and cos with 1.0, vllm pads sin with 0.0.")
@click.option("--eval-factors", type=common.CommaList(kind=float, positive=True), default=None,
              help="Evaluation lengths as multiples of N (preset; e.g. 1,2,4,8).")
@click.option("--eval-samples", type=click.IntRange(min=1), default=None,
              help="Validation windows (text: the same windows at every length) or passkey samples per length.")
@click.option("--passkey-digits", type=click.IntRange(min=1, max=20), default=options.RunConfig.passkey_digits,
              help="Digits of the pass key.")
@click.option("--extend", type=common.CommaList(options.EXTENSIONS), default=None,
              help="Also evaluate RoPE extended training-free with pi and/or yarn (factor L/N per length).")
@click.option("--extend-factor", type=click.FloatRange(min=1), default=None,
              help="Eval mode: a fixed PI/YaRN factor instead of L/N per length.")
@click.option("--eval", "ckpt_dir", type=click.Path(exists=True), default=None,
              help="Eval mode: reload this checkpoint folder (one PE's folder of a run) and evaluate it.")
@click.option("--ckpt-every", type=click.IntRange(min=0), default=None, help="Checkpoint every K steps (0: at the end).")
@click.option("--resume", is_flag=True,
              help="Resume the run in --out from its checkpoints (same settings; Ctrl-C keeps them).")
@click.option("--no-save", is_flag=True, help="Write no checkpoints or run folder.")
@click.option("--compile", "compile_", is_flag=True, help="torch.compile the model (GPU).")
@click.option("--jsonl", is_flag=True, help="Stream one JSON line per trained model before the summary.")
@common.out_option()
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def cli(ctx, pes, preset, task, text_file, train_length, d_model, n_layers, n_heads, mlp_hidden, steps, batch_size,
        lr, warmup, sigma, theta, pad, eval_factors, eval_samples, passkey_digits, extend, extend_factor, ckpt_dir,
        ckpt_every, resume, no_save, compile_, jsonl, out, seed, device, threads, quiet, verbose):
    """Fourier Position Embedding (Hua et al., ICML 2025) vs RoPE, NoPE and ALiBi on small decoder-only LMs.

    Trains each --pe on the same data, seed and batches at length N, then reports loss, perplexity
    and (for --task passkey) passkey-retrieval accuracy at N, 2N, 4N, 8N. --eval reloads a checkpoint
    and evaluates it at new lengths. Runs under torchrun (DDP) unchanged.
    """
    from icmltools.fope.dist import process_info

    _check_modes(ckpt_dir, resume, no_save, out, extend_factor)
    proc = process_info()  # torchrun ranks > 0 print nothing and write nothing
    with common.CommandRun(ctx, "fope-train", seed=seed, device=device, threads=threads, packages=("numpy", "torch"),
                           reference=options.REFERENCE, writes=proc.writes) as run:
        from icmltools.fope import api

        if ckpt_dir:
            with run.timer.phase("eval"), run.progress() as cb:
                run.result = api.eval_checkpoint(ckpt_dir, run.device, text_file=text_file, factors=eval_factors,
                                                 extend=extend, extend_factor=extend_factor,
                                                 eval_samples=eval_samples, seed=seed, progress=cb)
            return
        cfg, data = api.prepare(preset, text_file, run.device, task=task, train_length=train_length,
                                d_model=d_model, n_layers=n_layers, n_heads=n_heads, mlp_hidden=mlp_hidden,
                                steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, sigma=sigma, theta=theta,
                                pad=pad, eval_factors=eval_factors, eval_samples=eval_samples, ckpt_every=ckpt_every,
                                compile=compile_ or None, passkey_digits=passkey_digits)
        if resume:
            api.check_resume(out, cfg, data, pes)
        # rank 0 makes the run folder; on the other ranks make_dir only returns --out (to resume from).
        # Ctrl-C keeps a folder that holds checkpoints (resumable); one with none is removed.
        save_to = None if no_save else run.make_dir(out, allow_existing=resume, config=cfg.to_dict(), resumable=True)
        with run.timer.phase("train+eval"), run.progress() as cb:
            run.result = api.compare(pes, cfg, data, run.device, seed=seed, out_dir=save_to, extend=extend,
                                     resume=resume, progress=cb, stream=run.stream if jsonl else None, preset=preset)
        if save_to is not None:
            run.artifacts["checkpoints"] = {m["pe"]: m["checkpoint"] for m in run.result["methods"]
                                            if m.get("checkpoint")}
