"""Models and data for guidedquant: an `icml fope-train` checkpoint (loaded only through icmltools.fope's
public loader), a Hugging Face causal-LM folder (`hf`, optional transformers) or the embedded demo LM trained
in-process; calibration/evaluation windows of tokens (bytes for the byte-level models).

Random streams: `(seed, "demo", "init")` demo weights, `(seed, "demo", "batches")` its training batches,
`(seed, "calib")` calibration window starts. Evaluation windows are evenly spaced (no randomness).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive
from icmltools.nn import DecoderStack, RotaryEmbedding, TransformerConfig

from .adapters import DecoderAdapter
from .options import CalibConfig, DemoConfig


def _folder_kind(path: Path) -> str:
    """'fope' for an icml fope-train checkpoint folder, 'hf' for a Hugging Face model folder."""
    cfg = path / "config.json"
    if not path.is_dir() or not cfg.is_file():
        raise BadInputError(f"{path}: not a model folder (expected a fope-train checkpoint folder or a Hugging Face "
                            "model folder, with config.json)", param="model")
    try:
        doc = json.loads(cfg.read_text())
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise BadInputError(f"{cfg}: unreadable config ({type(e).__name__})", param="model") from None
    if isinstance(doc, dict) and ("model_type" in doc or "architectures" in doc):
        return "hf"
    return "fope"


def load_model(path, device: str):
    """(adapter, description) of a fope-train checkpoint folder or a Hugging Face causal-LM folder (`hf.load`);
    other architectures are refused."""
    p = Path(path)
    if not p.exists():
        raise BadInputError(f"{p}: no such folder", param="model")
    if _folder_kind(p) == "hf":
        from . import hf

        return hf.load(p, device)
    from icmltools.fope.ckpt import load_checkpoint

    model, meta = load_checkpoint(p, device=device, param="model")
    if meta.get("run", {}).get("task", "text") != "text" or model.embed is None or model.head is None:
        raise BadInputError(f"{p}: unsupported architecture (a {meta.get('run', {}).get('task')} checkpoint; "
                            "only byte-level text LMs are supported)", param="model")
    model.float().eval()
    return DecoderAdapter(model), {"source": str(p), "pe": meta.get("pe"), "format": "icml-fope-train",
                                   "params": model.num_params(), "trained_on": (meta.get("data") or {}).get("sha256")}


def load_calib(calib) -> "object":
    """Byte-level text: the user's UTF-8 file (first 90 % calibrates, last 10 % evaluates) or the stdlib corpus."""
    from icmltools.fope.data import default_corpus, load_text

    if calib is None:
        return default_corpus()
    try:
        return load_text(calib)
    except BadInputError as e:
        raise BadInputError(e.message, param="calib") from None


def windows(data, ccfg: CalibConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(calibration windows at random train offsets, evaluation windows evenly spaced over validation),
    each (n, seq_len + 1) int64. A split shorter than one window is refused."""
    L = ccfg.seq_len
    name = str(data.info.get("source")) if data.info.get("source") not in (None, "python-stdlib") else "default corpus"
    unit = data.info.get("unit", "bytes")
    for split, what in ((data.train, "calibration"), (data.val, "evaluation")):
        if split.size < L + 1:
            raise BadInputError(f"{name}: the {what} part ({split.size} {unit}) is shorter than one window of "
                                f"{L + 1} {unit}", param="calib", hint="use a shorter --seq-len or a longer text")
    starts = derive(seed, "calib").numpy().integers(0, data.train.size - L, size=ccfg.calib_seqs)
    ev = np.linspace(0, data.val.size - L - 1, num=ccfg.eval_seqs).astype(np.int64)
    idx = np.arange(L + 1)[None]
    return (torch.from_numpy(data.train[starts[:, None] + idx].astype(np.int64)),
            torch.from_numpy(data.val[ev[:, None] + idx].astype(np.int64)))


def train_demo(data, dcfg: DemoConfig, seed: int, device: str, progress=lambda *a: None) -> DecoderStack:
    """The spec's demo LM (d 128, 2 blocks, 4 heads, SwiGLU 512, RoPE, bytes): AdamW, OneCycle with 10 %
    warm-up, `steps` batches of random training windows."""
    cfg = TransformerConfig(d_model=dcfg.d_model, n_layers=dcfg.n_layers, n_heads=dcfg.n_heads,
                            mlp_hidden=dcfg.mlp_hidden, vocab_size=256)
    with derive(seed, "demo", "init").torch_init():
        model = DecoderStack(cfg, lambda i: RotaryEmbedding(cfg.head_dim)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=dcfg.lr, weight_decay=dcfg.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=dcfg.lr, total_steps=dcfg.steps,
                                                pct_start=dcfg.warmup_frac)
    gen = derive(seed, "demo", "batches").torch()
    L = dcfg.seq_len
    for step in range(dcfg.steps):
        starts = torch.randint(0, data.train.size - L, (dcfg.batch_size,), generator=gen).numpy()
        w = torch.from_numpy(data.train[starts[:, None] + np.arange(L + 1)[None]].astype(np.int64)).to(device)
        logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 256), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        progress("demo: training", step + 1, dcfg.steps)
    return model.eval()
