"""`icml fope-train`: train small decoder-only LMs with FoPE and the baselines, compare length extrapolation."""
from __future__ import annotations

import click

from . import common

PE_NAMES = ("rope", "fope", "fope-cf", "fope-fs", "nope", "alibi")
PRESET_NAMES = ("quick", "passkey", "cpu", "60m")

EPILOG = """Examples:

\b
  icml fope-train --pe rope,fope | jq '.result.methods[] | {pe, growth: .summary.loss_growth_4x}'
  icml fope-train --preset passkey --pe rope,fope,fope-cf | jq '.result.methods[] | [.pe, .summary]'
  icml fope-train --pe all --extend pi,yarn --out runs/cmp
  icml fope-train --eval runs/cmp/rope --eval-factors 1,2,4,8,16 --extend yarn
  icml fope-train --text my.txt --train-length 128 --steps 2000 --pe rope,fope
  torchrun --nproc_per_node 4 -m icmltools fope-train --preset 60m --pe fope --device cuda
"""


def _pe_list(ctx, param, value):
    if value is None:
        return None
    out = []
    for raw in value.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name == "all":
            out.extend(p for p in PE_NAMES if p not in out)
        elif name not in PE_NAMES:
            raise click.BadParameter(f"unknown position embedding {name!r}; choose from {', '.join(PE_NAMES)} or all")
        elif name not in out:
            out.append(name)
    if not out:
        raise click.BadParameter("give at least one position embedding")
    return out


def _floats(ctx, param, value):
    if value is None:
        return None
    try:
        vals = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {value!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise click.BadParameter("expected positive numbers, e.g. 1,2,4,8")
    return vals


def _extend(ctx, param, value):
    if not value:
        return ()
    out = []
    for raw in value.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name not in ("pi", "yarn"):
            raise click.BadParameter(f"unknown extension {name!r}; use pi and/or yarn")
        out.append(name)
    return tuple(out)


@common.command("fope-train", epilog=EPILOG)
@click.option("--pe", "pes", default="rope,fope", callback=_pe_list,
              help="Position embeddings to train side by side (comma list): rope, fope, fope-cf (clip-floor only), "
                   "fope-fs (Fourier series only), nope, alibi, or all.")
@click.option("--preset", type=click.Choice(PRESET_NAMES), default="quick",
              help="quick: stdlib bytes, N 64, CPU minutes; passkey: passkey task, N 128; cpu: the spec's CPU "
                   "prototype scale; 60m: the paper's 60M shape (GPU).")
@click.option("--task", type=click.Choice(["text", "passkey"]), default=None, help="Override the preset's task.")
@click.option("--text", "text_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Train on this UTF-8 text file at byte level (default: the Python stdlib's .py sources).")
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
@click.option("--theta", type=click.FloatRange(min=1, min_open=True), default=None, help="RoPE base (10000).")
@click.option("--pad", type=click.Choice(["official", "vllm"]), default=None,
              help="FoPE padding of the unused dims: official pads sin and cos with 1.0, vllm pads sin with 0.0.")
@click.option("--eval-factors", callback=_floats, default=None, help="Evaluation lengths as multiples of N (1,2,4,8).")
@click.option("--eval-samples", type=click.IntRange(min=1), default=None,
              help="Validation windows (text) or passkey samples per length.")
@click.option("--passkey-digits", type=click.IntRange(min=1, max=20), default=5, help="Digits of the pass key.")
@click.option("--extend", callback=_extend, default="",
              help="Also evaluate RoPE extended training-free with pi and/or yarn (factor L/N per length).")
@click.option("--extend-factor", type=click.FloatRange(min=1), default=None,
              help="Eval mode: a fixed PI/YaRN factor instead of L/N per length.")
@click.option("--eval", "eval_ckpt", type=click.Path(exists=True), default=None,
              help="Eval mode: reload this checkpoint folder (one PE's folder of a run) and evaluate it.")
@click.option("--ckpt-every", type=click.IntRange(min=0), default=None, help="Checkpoint every K steps (0: at the end).")
@click.option("--resume", is_flag=True, help="Resume the run in --out from its checkpoints.")
@click.option("--no-save", is_flag=True, help="Write no checkpoints or run folder.")
@click.option("--compile", "compile_", is_flag=True, help="torch.compile the model (GPU).")
@click.option("--jsonl", is_flag=True, help="Stream one JSON line per trained model before the summary.")
@common.out_option()
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def cli(ctx, pes, preset, task, text_file, train_length, d_model, n_layers, n_heads, mlp_hidden, steps, batch_size,
        lr, warmup, sigma, theta, pad, eval_factors, eval_samples, passkey_digits, extend, extend_factor, eval_ckpt,
        ckpt_every, resume, no_save, compile_, jsonl, out, seed, device, threads, quiet, verbose):
    """Fourier Position Embedding (Hua et al., ICML 2025) vs RoPE, NoPE and ALiBi on small decoder-only LMs.

    Trains each --pe on the same data, seed and batches at length N, then reports loss, perplexity
    and (for --task passkey) passkey-retrieval accuracy at N, 2N, 4N, 8N. --eval reloads a checkpoint
    and evaluates it at new lengths. Runs under torchrun (DDP) unchanged.
    """
    import contextlib
    import os
    import time

    rank = int(os.environ.get("RANK", "0"))
    quiet_stdout = open(os.devnull, "w") if rank != 0 else None
    guard = contextlib.redirect_stdout(quiet_stdout) if quiet_stdout else contextlib.nullcontext()
    with guard, common.CommandRun(ctx, "fope-train", seed=seed, device=device, threads=threads) as run:
        from icmltools.core.errors import BadInputError
        from icmltools.core.runs import make_run_dir
        from icmltools.fope import api

        c0 = time.process_time()
        if eval_ckpt:
            with run.timer.phase("eval"), run.progress() as cb:
                run.result = api.eval_checkpoint(eval_ckpt, run.device, text_file=text_file, factors=eval_factors,
                                                 extend=(extend[0] if extend else None), extend_factor=extend_factor,
                                                 eval_samples=eval_samples, seed=seed, progress=cb)
        else:
            if resume and not out:
                raise BadInputError("--resume needs --out DIR (the run folder to resume)")
            overrides = dict(task=task, train_length=train_length, d_model=d_model, n_layers=n_layers,
                             n_heads=n_heads, mlp_hidden=mlp_hidden, steps=steps, batch_size=batch_size, lr=lr,
                             warmup=warmup, sigma=sigma, theta=theta, pad=pad, eval_factors=eval_factors,
                             eval_samples=eval_samples, ckpt_every=ckpt_every,
                             compile=True if compile_ else None, passkey_digits=passkey_digits)
            if text_file and task is None:
                overrides["task"] = "text"
            cfg = api.make_config(preset, **overrides)
            data = api.load_data(cfg, text_file)
            api.preflight(cfg, data, run.device)
            run_dir = None
            if not no_save and rank == 0:
                run_dir = make_run_dir("fope-train", out, allow_existing=resume)
            elif not no_save and out:
                from pathlib import Path

                run_dir = Path(out)
            with run.timer.phase("train+eval"), run.progress() as cb:
                res = api.compare(pes, cfg, data, run.device, seed=seed, out_dir=run_dir, extend=extend,
                                  resume=resume, progress=cb, stream=run.stream if jsonl else None)
            res["preset"] = preset
            run.result = res
            if run_dir is not None and rank == 0:
                api.write_run_files(run_dir, run.params, res)
                run.artifacts["run_dir"] = str(run_dir)
                run.artifacts["checkpoints"] = {m["pe"]: m["checkpoint"] for m in res["methods"] if m.get("checkpoint")}
        run.result["cpu_seconds"] = time.process_time() - c0
    if quiet_stdout:
        quiet_stdout.close()
