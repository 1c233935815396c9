"""`icml guidedquant`: end-loss-guided weight quantization (GuidedQuant, Kim et al., ICML 2025) with LNQ,
against RTN, GPTQ and the SqueezeLLM k-means, on the same calibration statistics."""
from __future__ import annotations

import click

from icmltools.commands import common
from icmltools.guidedquant import options
from icmltools.guidedquant.options import CalibConfig, DemoConfig, QuantConfig

PACKAGES = ("numpy", "torch", "safetensors")
EPILOG = """Examples:

\b
  icml guidedquant --threads 1 | jq -c '.result.runs[] | [.method, .bits, .delta_loss]'
  icml guidedquant --model runs/fope-train/X/rope --calib corpus.txt --bits 2,3 --out runs/gq1
  icml guidedquant --model ckpt/rope --methods lnq_guided --bits 3 --dequant-out ckpt/rope-w3
"""


@common.command("guidedquant", param_flags={"model": "--model"}, epilog=EPILOG)
@click.option("--model", "model_dir", type=click.Path(), default=None,
              help="An icml fope-train checkpoint folder, or a Hugging Face causal-LM folder (llama, mistral, qwen2, "
                   "gpt2; needs the hf extra; local files only) [default: train the demo LM in-process].")
@click.option("--calib", type=click.Path(), default=None,
              help="UTF-8 text for calibration (first 90 %) and evaluation (last 10 %); default: the stdlib corpus.")
@click.option("--methods", type=common.CommaList(options.METHODS, allow_all=True), default=",".join(options.METHODS),
              help="Methods, the paper's first.")
@click.option("--bits", type=common.CommaList(kind=float, positive=True), default=None,
              help=f"Bit widths {options.BITS_RANGE[0]}..{options.BITS_RANGE[1]} [default: "
                   f"{','.join(map(str, DemoConfig.bits))} for the demo, {','.join(map(str, options.DEFAULT_BITS))} "
                   "for --model]")
@click.option("--groups", type=click.IntRange(min=1), default=QuantConfig.groups,
              help="G: saliency groups of output channels, one Hessian each (largest divisor of d_out <= G).")
@click.option("--iters", type=click.IntRange(min=1), default=QuantConfig.iters, help="T: LNQ iterations.")
@click.option("--cd-cycles", type=click.IntRange(min=1), default=QuantConfig.cd_cycles,
              help="Coordinate-descent sweeps per LNQ P-step.")
@click.option("--calib-seqs", type=click.IntRange(min=1), default=CalibConfig.calib_seqs, help="Calibration windows.")
@click.option("--eval-seqs", type=click.IntRange(min=1), default=CalibConfig.eval_seqs, help="Evaluation windows.")
@click.option("--seq-len", type=click.IntRange(min=1), default=CalibConfig.seq_len, help="Window length (bytes).")
@click.option("--steps", type=click.IntRange(min=1), default=DemoConfig.steps, help="Demo training steps (no --model).")
@click.option("--dequant-out", type=click.Path(), default=None,
              help="Write the dequantized model (one method, one bit width) to this new folder.")
@common.out_option("Folder for quantized_<method>_<bits>bit.safetensors (nothing is written without it).")
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def cli(ctx, model_dir, calib, methods, bits, groups, iters, cd_cycles, calib_seqs, eval_seqs, seq_len, steps,
        dequant_out, out, seed, device, threads, quiet, verbose):
    """GuidedQuant + LNQ vs RTN, GPTQ and SqueezeLLM k-means: quantize the decoder Linears of a model to 2-4 bits
    on the same calibration statistics and compare end losses. Without --model: the demo (a small byte-level
    LM trained in-process, every method at 2 bits, about a minute on one thread)."""
    from icmltools.guidedquant import api

    if model_dir is not None and ctx.get_parameter_source("steps").name != "DEFAULT":
        raise click.UsageError("--steps trains the demo model; it cannot be used with --model")
    if dequant_out is not None and (len(methods) != 1 or (bits is not None and len(bits) != 1)):
        raise click.UsageError("--dequant-out writes one model: give one method (--methods) and one bit width (--bits)")
    qcfg = QuantConfig(methods=methods, bits=bits, groups=groups, iters=iters, cd_cycles=cd_cycles)
    ccfg = CalibConfig(calib_seqs=calib_seqs, eval_seqs=eval_seqs, seq_len=seq_len)
    with common.CommandRun(ctx, "guidedquant", seed=seed, device=device, threads=threads, packages=PACKAGES,
                           reference=options.REFERENCE) as run:
        qcfg = api.resolve(qcfg, model_dir)
        if out:
            out = run.make_dir(out, config=api.config_dict(qcfg, ccfg))
        with run.timer.phase("compute_s"), run.progress() as cb:
            run.result, written = api.run(model_dir, calib, qcfg, ccfg, DemoConfig(steps=steps), run.device, seed,
                                          out, dequant_out, cb)
        run.artifacts.update(written)
        run.table(f"guidedquant (FP loss {run.result['fp_loss']:.4f} nats/byte)",
                  ["method", "bits", "delta loss", "bits/weight", "seconds"], api.summary_rows(run.result))
