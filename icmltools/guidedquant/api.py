"""What `icml guidedquant` calls: quantize a model with every method on the same calibration statistics,
evaluate the end loss of each, and write the quantized / dequantized checkpoints all or none.

Pipeline: model (fope-train checkpoint, Hugging Face causal LM, or the demo trained in-process; seen through
an `adapters.Adapter`) -> windows -> FP loss -> one saliency/Fisher pass -> per block: H_g, then every
method x bit width on its Linears -> end losses.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from icmltools.core.errors import BadInputError, RuntimeFailure

from . import methods as M
from . import models, stats
from .adapters import DecoderAdapter
from .options import BITS_RANGE, DEFAULT_BITS, METHODS, NON_UNIFORM, CalibConfig, DemoConfig, QuantConfig
from .quant import bits_per_weight, pstep_kernel


def resolve(qcfg: QuantConfig, model_dir=None) -> QuantConfig:
    """Bit widths: integers in BITS_RANGE (whole floats accepted); None -> 2 for the demo, 3 for a model."""
    bits = qcfg.bits
    if bits is None:  # the demo runs at 2 bits, a user's model at the spec's default 3
        bits = DemoConfig.bits if model_dir is None else DEFAULT_BITS
    lo, hi = BITS_RANGE
    bad = [b for b in bits if not (float(b).is_integer() and lo <= b <= hi)]
    if bad or not bits:
        raise BadInputError(f"bit widths must be integers in {lo}..{hi}, got {', '.join(map(str, bad)) or 'none'}",
                            param="bits")
    return replace(qcfg, bits=tuple(dict.fromkeys(int(b) for b in bits)))


def validate(qcfg: QuantConfig, ccfg: CalibConfig) -> None:
    """Refuse unusable settings, naming the library parameter (bit widths: `resolve`)."""
    resolve(qcfg)
    unknown = [m for m in qcfg.methods if m not in METHODS]
    if unknown or not qcfg.methods:
        raise BadInputError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}", param="methods")
    for name in ("groups", "iters", "cd_cycles", "kmeans_iters", "block"):
        if getattr(qcfg, name) < 1:
            raise BadInputError(f"must be at least 1, got {getattr(qcfg, name)}", param=name)
    for name in ("calib_seqs", "seq_len", "eval_seqs", "chunk"):
        if getattr(ccfg, name) < 1:
            raise BadInputError(f"must be at least 1, got {getattr(ccfg, name)}", param=name)


def _quantize_all(adapter, calib_w, qcfg: QuantConfig, ccfg: CalibConfig, device: str, progress
                  ) -> tuple[dict, float]:
    """Every (method, bits) on every quantized Linear: {(method, bits): {layer: output}}, calibration loss."""
    S, Fd, calib_loss = stats.saliency_pass(adapter, calib_w, qcfg.groups, device, ccfg.chunk, qcfg.grad_scale,
                                            progress)
    runs = {(m, b): {} for m in qcfg.methods for b in qcfg.bits}
    n_layers = len(adapter.layers())
    done = 0
    for block in stats.block_hessians(adapter, calib_w, S, Fd, device, ccfg.chunk):
        for ls in block:
            cache: dict = {}
            for (m, b), layers in runs.items():
                t0 = time.perf_counter()
                out = M.REGISTRY[m](ls, b, qcfg, cache)
                out["record"].update(name=ls.name, shape=list(ls.W.shape), groups=ls.groups if m.endswith("_guided")
                                     else 1, seconds=round(time.perf_counter() - t0, 4))
                layers[ls.name] = out
            done += 1
            progress("quantizing layers", done, n_layers)
    return runs, calib_loss


def _run_row(method: str, bits: int, layers: dict, end_loss: float, fp_loss: float) -> dict:
    uniform = method not in NON_UNIFORM
    numel = sum(o["W_hat"].numel() for o in layers.values())
    bpw = sum(bits_per_weight(bits, o["W_hat"].shape[1], uniform) * o["W_hat"].numel() for o in layers.values()) / numel
    recs = [o["record"] for o in layers.values()]
    return {"method": method, "bits": bits, "end_loss": end_loss, "delta_loss": end_loss - fp_loss,
            "bits_per_weight": round(bpw, 4), "seconds": round(sum(r["seconds"] for r in recs), 3),
            "monotone": all(r.get("monotone", True) for r in recs), "layers": recs}


def _check_finite(x: float, what: str) -> float:
    if not torch.isfinite(torch.tensor(x)):
        raise RuntimeFailure(f"{what} is not finite")
    return x


def quantize(adapter, data, qcfg: QuantConfig, ccfg: CalibConfig, device: str, seed: int = 0,
             progress=lambda *a: None) -> tuple[dict, dict]:
    """Run every method and bit width; returns (result dict, {(method, bits): layer outputs})."""
    validate(qcfg, ccfg)
    max_len = getattr(adapter, "max_len", None)
    if max_len and ccfg.seq_len > max_len:
        raise BadInputError(f"must be at most the model's {max_len} positions, got {ccfg.seq_len}", param="seq_len")
    calib_w, eval_w = models.windows(data, ccfg, seed)
    runs, calib_loss = _quantize_all(adapter, calib_w, qcfg, ccfg, device, progress)  # refuses NaN gradients first
    fp_loss = stats.eval_loss(adapter, eval_w, device, ccfg.chunk)
    if not torch.isfinite(torch.tensor(fp_loss)):
        raise BadInputError("the model's validation loss is not finite", param="model")
    rows = []
    for (m, b), layers in runs.items():
        end = _check_finite(stats.eval_loss(adapter.with_weights(layers), eval_w, device, ccfg.chunk),
                            f"the {m} {b}-bit loss")
        rows.append(_run_row(m, b, layers, end, fp_loss))
    calib = {"source": data.info.get("source"), "sha256": data.info.get("sha256"), "calib_seqs": ccfg.calib_seqs,
             "eval_seqs": ccfg.eval_seqs, "seq_len": ccfg.seq_len, "calib_loss": calib_loss,
             "tokens": int(calib_w.shape[0] * (calib_w.shape[1] - 1))}
    lnq = any(m.startswith("lnq") for m in qcfg.methods)
    return {"fp_loss": fp_loss, "calib": calib, "config": asdict(qcfg),
            "pstep_kernel": pstep_kernel(device) if lnq else None, "runs": rows}, runs


# --------------------------------------------------------------------------------------------- outputs


def output_name(method: str, bits: int) -> str:
    return f"quantized_{method}_{bits}bit.safetensors"


def _quantized_tensors(adapter, layers: dict) -> dict:
    """The checkpoint's tensors with each quantized weight replaced by its stored tensors (always for W as
    (d_out, d_in), also where the module keeps the transpose); every tensor its own copy."""
    out = {}
    for name, t in adapter.state_dict().items():
        base = name[:-len(".weight")] if name.endswith(".weight") else None
        if base in layers:
            for suffix, v in layers[base]["tensors"].items():
                out[f"{base}.{suffix}"] = v.detach().cpu().contiguous()
        else:
            out[name] = t.clone()
    return out


def write_outputs(adapter, runs: dict, result: dict, out_dir=None, dequant_out=None, source_dir=None) -> dict:
    """`quantized_<method>_<b>bit.safetensors` per run under `out_dir`, and `dequant_out` (a new folder in the
    input's format: see the adapter's `write_dequantized`) for the one run. All or none: the quantized files
    are renamed after the rest is written."""
    from icmltools.core.jsonio import atomic_path

    written: dict = {}
    meta = {"format": "icml-guidedquant", "calib_sha256": str(result["calib"]["sha256"]),
            "model_format": adapter.kind,
            **{k: str(v) for k, v in result["config"].items() if k in ("groups", "iters", "cd_cycles")}}
    transposed = [q.name for q in adapter.layers() if q.transposed]
    if transposed:
        meta["transposed_in_model"] = ",".join(transposed)
    with contextlib.ExitStack() as stack:
        for (m, b), layers in (runs.items() if out_dir is not None else ()):
            from safetensors.torch import save_file

            path = Path(out_dir) / output_name(m, b)
            tmp = stack.enter_context(atomic_path(path, suffix=".tmp.safetensors"))
            save_file(_quantized_tensors(adapter, layers), str(tmp), metadata={**meta, "method": m, "bits": str(b)})
            written[f"{m}_{b}bit"] = str(path)
        if dequant_out is not None:
            (m, b), layers = next(iter(runs.items()))
            d = Path(dequant_out)
            if d.exists() and (not d.is_dir() or any(d.iterdir())):
                raise BadInputError(f"{d}: exists and is not an empty folder", param="dequant_out")
            adapter.with_weights(layers).write_dequantized(d, {"method": m, "bits": b, **meta}, source_dir)
            written["dequantized"] = str(d)
    return written


def run(model_dir=None, calib=None, qcfg: QuantConfig | None = None, ccfg: CalibConfig | None = None,
        dcfg: DemoConfig | None = None, device: str = "cpu", seed: int = 0, out_dir=None, dequant_out=None,
        progress=lambda *a: None) -> tuple[dict, dict]:
    """The command: load (or train the demo), quantize, evaluate, write. Returns (result, written paths)."""
    qcfg, ccfg, dcfg = qcfg or QuantConfig(), ccfg or CalibConfig(), dcfg or DemoConfig()
    qcfg = resolve(qcfg, model_dir)
    validate(qcfg, ccfg)
    data = models.load_calib(calib)
    if model_dir is None:
        t0 = time.perf_counter()
        adapter = DecoderAdapter(models.train_demo(data, dcfg, seed, device, progress))
        src = {"source": "demo", "train_s": round(time.perf_counter() - t0, 2), "config": asdict(dcfg)}
    else:
        adapter, src = models.load_model(model_dir, device)
        data = adapter.prepare_data(data)
    result, runs = quantize(adapter, data, qcfg, ccfg, device, seed, progress)
    result = {"model": src, **result}
    written = write_outputs(adapter, runs, result, out_dir, dequant_out, model_dir)
    return result, written


def config_dict(qcfg: QuantConfig, ccfg: CalibConfig) -> dict:
    """The resolved settings (the run folder's config.json)."""
    return {"quant": asdict(qcfg), "calib": asdict(ccfg)}


def summary_rows(result: dict) -> list[list]:
    """method, bits, delta loss, bits/weight, seconds: the short table on stderr."""
    return [[r["method"], r["bits"], r["delta_loss"], r["bits_per_weight"], r["seconds"]] for r in result["runs"]]
