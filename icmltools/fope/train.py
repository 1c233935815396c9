"""Training, evaluation, checkpoints and the side-by-side comparison for fope-train.

Every position embedding is trained with the same seed, the same initial shared weights and the same
batches, then evaluated on the same windows / passkey samples at N, 2N, 4N, 8N (configurable). RoPE
models can be extended training-free with PI or YaRN at each evaluation length L (factor L/N), reported
as `rope+pi` / `rope+yarn`.

Random streams (`core.seed.derive`): `(seed, "init")` shared weights and `(seed, "init", "fope", layer)`
FoPE coefficients (model.py), `(seed, "batches", rank)` training batches, `(seed, "eval", length)`
passkey evaluation samples. None depends on which other position embeddings run, so one model trained
alone gives the numbers it gives inside a comparison.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from icmltools.core.checkpoint import load_safetensors, safe_torch_load, save_safetensors, save_torch
from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.core.jsonio import atomic_write_json
from icmltools.core.seed import as_stream
from icmltools.nn import DecoderStack, TransformerConfig

from .data import PasskeyTask, TextData, check_lengths, eval_windows, sample_windows
from .dist import Dist, join, leave
from .model import build_model, parse_pes, set_rope_scaling
from .options import RunConfig

__all__ = ["RunConfig", "Dist", "build_model", "lm_loss", "train_one", "evaluate", "run_compare", "run_eval",
           "load_checkpoint", "read_checkpoint_meta", "check_data"]

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]


def _noop(desc: str, done: int, total: int) -> None:
    return None


def autocast(device: str):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    import contextlib

    return contextlib.nullcontext()


def check_data(cfg: RunConfig, data, max_length: int | None = None, name: str | None = None) -> None:
    """The training length and the longest evaluation length fit the data (text splits / passkey layout)."""
    if isinstance(data, PasskeyTask):
        if cfg.train_length + 1 < data.min_length:
            raise BadInputError(f"{cfg.train_length} is too short for the passkey task "
                                f"(needs >= {data.min_length - 1})", param="train_length")
        return
    check_lengths(data, cfg.train_length, max_length or max(cfg.eval_lengths()), name=name)


# --------------------------------------------------------------------------------------------- training


def lr_at(step: int, cfg: RunConfig) -> float:
    """Linear warm-up then cosine decay to min_lr_ratio * lr (OLMo's cosine_with_warmup)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


class Batches:
    """The training batch stream of one seed and rank, `derive(seed, "batches", rank)` (identical for every
    position embedding)."""

    def __init__(self, cfg: RunConfig, data, seed=0, rank: int = 0):
        self.cfg, self.data = cfg, data
        self.gen = as_stream(seed, "batches", rank).torch()

    def next(self) -> torch.Tensor:
        if isinstance(self.data, PasskeyTask):
            return self.data.batch(self.cfg.batch_size, self.cfg.train_length, self.gen)[0]
        return sample_windows(self.data.train, self.cfg.batch_size, self.cfg.train_length, self.gen)


def lm_loss(model, seq: torch.Tensor, device: str) -> torch.Tensor:
    x, y = seq[:, :-1].to(device), seq[:, 1:].to(device)
    with autocast(device):
        logits = model(x)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


# --------------------------------------------------------------------------------------------- checkpoints


def save_checkpoint(ckpt_dir: Path, model: DecoderStack, meta: dict, opt=None, batches: Batches | None = None,
                    step: int = 0) -> None:
    """model.safetensors (weights + FoPE coefficients), config.json (the checkpoint's own: PE, run and model
    config), and train_state.pt (optimizer, step, batch-stream state) for resuming."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    state = dict(model.state_dict())
    if model.head is not None and model.cfg.tie_weights:
        state.pop("head.weight", None)
    save_safetensors(state, ckpt_dir / "model.safetensors", metadata={"format": "icml-fope-train", "pe": meta["pe"]})
    if opt is not None:
        save_torch({"optimizer": opt.state_dict(), "step": step, "data_rng": batches.gen.get_state()},
                   ckpt_dir / "train_state.pt")
    atomic_write_json(ckpt_dir / "config.json", {**meta, "step": step})


def read_checkpoint_meta(ckpt_dir: str | os.PathLike, param: str = "ckpt_dir") -> tuple[Path, dict]:
    """(folder, parsed config.json) of a checkpoint folder (or of the folder of a file in it); a missing,
    corrupt or foreign config raises BadInputError naming `param`."""
    d = Path(ckpt_dir)
    if d.is_file():
        d = d.parent
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise BadInputError(f"{d}: not a fope-train checkpoint folder (no config.json)", param=param)
    try:
        meta = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise BadInputError(f"{cfg_path}: corrupt checkpoint config ({type(e).__name__})", param=param) from None
    if isinstance(meta, dict) and "command" in meta and "pe" not in meta:
        subs = sorted(c.parent.name for c in d.glob("*/model.safetensors"))
        raise BadInputError(f"{d} is a run folder; pass one of its checkpoints: {', '.join(subs) or 'none'}",
                            param=param)
    if not isinstance(meta, dict) or not {"pe", "run", "model"} <= set(meta):
        raise BadInputError(f"{cfg_path}: corrupt checkpoint config (missing pe/run/model)", param=param)
    return d, meta


def load_checkpoint(ckpt_dir: str | os.PathLike, device: str = "cpu") -> tuple[DecoderStack, dict]:
    """Rebuild a model from `config.json` + `model.safetensors`; corrupt files raise BadInputError."""
    d, meta = read_checkpoint_meta(ckpt_dir)
    try:
        run = RunConfig.from_dict(meta["run"])
        mcfg = TransformerConfig(**meta["model"])
    except (ValueError, KeyError, TypeError) as e:
        raise BadInputError(f"{d / 'config.json'}: corrupt checkpoint config ({type(e).__name__}: {e})",
                            param="ckpt_dir") from None
    state = load_safetensors(d / "model.safetensors")
    model = build_model(meta["pe"], mcfg, run.train_length, run.theta, run.sigma, run.pad, int(meta.get("seed", 0)))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise BadInputError(f"{d / 'model.safetensors'}: weights do not match config.json "
                            f"({str(e).splitlines()[0][:200]})", param="ckpt_dir") from None
    return model.to(device), meta


# --------------------------------------------------------------------------------------------- training


def _resume(ckpt_dir: Path | None, model, opt, batches: Batches, device: str, pe: str) -> int:
    """Load weights, optimizer and batch-stream state from `ckpt_dir/train_state.pt`; returns the step."""
    if ckpt_dir is None or not (ckpt_dir / "train_state.pt").is_file():
        return 0
    st = safe_torch_load(ckpt_dir / "train_state.pt")
    model.load_state_dict(load_safetensors(ckpt_dir / "model.safetensors", device=device))
    opt.load_state_dict(st["optimizer"])
    batches.gen.set_state(st["data_rng"])
    log.info("%s: resumed at step %d from %s", pe, int(st["step"]), ckpt_dir)
    return int(st["step"])


def _wrap(model, cfg: RunConfig, dist: Dist, device: str):
    """The module the optimizer steps through: DDP across ranks, torch.compile if asked."""
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[dist.local_rank] if device.startswith("cuda") else None)
    return torch.compile(model) if cfg.compile else model


def _step(train_model, model, opt, seq, cfg: RunConfig, device: str) -> float:
    loss = lm_loss(train_model, seq, device)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    value = float(loss.detach())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return value


def _record(model, cfg: RunConfig, start: int, losses: list, wall: list, cpu: list) -> dict:
    skip = min(5, max(0, len(wall) - 1))
    return {
        "steps": cfg.steps, "resumed_from": start or None,
        "final_train_loss": float(np.mean(losses[-20:])) if losses else None,
        "step_time_ms": float(np.median(wall[skip:]) * 1e3) if wall else None,
        "step_cpu_ms": float(np.median(cpu[skip:]) * 1e3) if cpu else None,
        "train_wall_s": float(np.sum(wall)), "train_cpu_s": float(np.sum(cpu)),
        "params": model.num_params(),
        "frozen_pe_numel": sum(b.numel() for n, b in model.named_buffers() if n.endswith("_coef")),
    }


def train_one(pe: str, cfg: RunConfig, data, device: str, seed=0, progress: Progress = _noop,
              ckpt_dir: Path | None = None, resume: bool = False, dist: Dist | None = None) -> tuple[DecoderStack, dict]:
    """Train one model (AdamW, warm-up + cosine, clipped gradients); returns (model, training record).
    Only the main rank writes checkpoints."""
    dist = dist or Dist()
    vocab = data.vocab_size
    model = build_model(pe, cfg.model_config(vocab), cfg.train_length, cfg.theta, cfg.sigma, cfg.pad, seed).to(device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=cfg.weight_decay)
    batches = Batches(cfg, data, seed, dist.rank)
    meta = {"pe": pe, "seed": seed, "run": cfg.to_dict(), "model": cfg.model_config(vocab).to_dict(),
            "data": data.info if isinstance(data, TextData) else data.info()}
    start = _resume(ckpt_dir, model, opt, batches, device, pe) if resume else 0
    saves = ckpt_dir is not None and dist.writes
    train_model = _wrap(model, cfg, dist, device)
    losses, wall, cpu = [], [], []
    model.train()
    for step in range(start, cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        seq = batches.next()
        t0, c0 = time.perf_counter(), time.process_time()
        lv = _step(train_model, model, opt, seq, cfg, device)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if not math.isfinite(lv):
            raise RuntimeFailure(f"{pe}: training loss became {lv} at step {step}; try a smaller learning rate")
        losses.append(lv)
        progress(f"train {pe}", step + 1, cfg.steps)
        if saves and cfg.ckpt_every and (step + 1) % cfg.ckpt_every == 0 and step + 1 < cfg.steps:
            save_checkpoint(ckpt_dir, model, meta, opt, batches, step + 1)
    if saves:
        save_checkpoint(ckpt_dir, model, meta, opt, batches, cfg.steps)
    model.eval()
    return model, _record(model, cfg, start, losses, wall, cpu)


# --------------------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def eval_text(model, data: TextData, length: int, cfg: RunConfig, device: str) -> dict:
    """Loss/perplexity on fixed validation windows of `length` bytes, plus loss per position bucket of
    width N (the training length)."""
    seqs = eval_windows(data.val, cfg.eval_samples, length)
    nll = []
    for i in range(0, len(seqs), cfg.eval_batch):
        s = seqs[i:i + cfg.eval_batch]
        x, y = s[:, :-1].to(device), s[:, 1:].to(device)
        with autocast(device):
            logits = model(x)
        nll.append(F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").cpu())
    nll = torch.cat(nll)                      # (n, length)
    loss = float(nll.mean())
    N = cfg.train_length
    buckets = [{"start": a, "end": min(a + N, length), "loss": float(nll[:, a:a + N].mean())}
               for a in range(0, length, N)]
    return {"length": length, "factor": length / N, "loss": loss, "ppl": math.exp(min(loss, 50.0)),
            "bits_per_byte": loss / math.log(2), "buckets": buckets}


@torch.no_grad()
def eval_passkey(model, task: PasskeyTask, length: int, cfg: RunConfig, device: str, seed=0) -> dict:
    """Exact-match passkey accuracy (greedy digits == key) over `eval_samples` sequences drawn from
    `derive(seed, "eval", length)` (the same for every model), LM loss over all tokens and loss on the
    answer digits, and accuracy per depth bucket (quarters of the sequence)."""
    gen = as_stream(seed, "eval", length).torch()
    seqs, ans = task.batch(cfg.eval_samples, length, gen)
    correct, tok_loss, ans_loss, depths = [], [], [], []
    key_first = task.vocab.index("pass")  # the key line starts "The pass key is"
    for i in range(0, len(seqs), cfg.eval_batch):
        s, a = seqs[i:i + cfg.eval_batch], ans[i:i + cfg.eval_batch]
        x, y = s[:, :-1].to(device), s[:, 1:].to(device)
        with autocast(device):
            logits = model(x).float()
        nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none").cpu()
        pred = logits.argmax(-1).cpu()
        idx = a
        ok = (pred.gather(1, idx) == s[:, 1:].gather(1, idx)).all(1)
        correct.append(ok)
        tok_loss.append(nll.mean(1))
        ans_loss.append(nll.gather(1, idx).mean(1))
        # depth of the key line: first "pass" token (relative position in the sequence)
        first = (s[:, :-1] == key_first).float().argmax(1)
        depths.append(first.float() / length)
    ok = torch.cat(correct).float()
    depth = torch.cat(depths)
    quart = [{"depth": f"{q / 4:.2f}-{(q + 1) / 4:.2f}",
              "acc": float(ok[(depth >= q / 4) & (depth < (q + 1) / 4)].mean())
              if ((depth >= q / 4) & (depth < (q + 1) / 4)).any() else None} for q in range(4)]
    loss = float(torch.cat(tok_loss).mean())
    return {"length": length, "factor": length / cfg.train_length, "loss": loss, "ppl": math.exp(min(loss, 50.0)),
            "answer_loss": float(torch.cat(ans_loss).mean()), "passkey_acc": float(ok.mean()),
            "n": int(ok.numel()), "by_depth": quart}


def evaluate(model, cfg: RunConfig, data, device: str, seed: int, lengths: list[int] | None = None,
             progress: Progress = _noop, label: str = "eval") -> list[dict]:
    model.eval()
    lengths = lengths or cfg.eval_lengths()
    out = []
    for j, L in enumerate(lengths):
        if isinstance(data, PasskeyTask):
            out.append(eval_passkey(model, data, L, cfg, device, seed))
        else:
            out.append(eval_text(model, data, L, cfg, device))
        progress(label, j + 1, len(lengths))
    return out


def eval_extended(model, cfg: RunConfig, data, device: str, seed: int, kind: str,
                  lengths: list[int] | None = None, factor: float | None = None) -> list[dict]:
    """RoPE extended training-free with PI or YaRN: at each length L the factor is max(1, L/N)
    (or a fixed `factor`). Restores plain RoPE afterwards."""
    lengths = lengths or cfg.eval_lengths()
    out = []
    try:
        for L in lengths:
            s = float(factor) if factor else max(1.0, L / cfg.train_length)
            set_rope_scaling(model, {"type": kind, "factor": s, "original_length": cfg.train_length})
            row = evaluate(model, cfg, data, device, seed, [L])[0]
            row["scale_factor"] = s
            out.append(row)
    finally:
        set_rope_scaling(model, None)
    return out


# --------------------------------------------------------------------------------------------- summaries


def summarize(evals: list[dict], cfg: RunConfig) -> dict:
    """Loss growth from N to each longer length, and passkey accuracy per factor."""
    base = next((e for e in evals if e["length"] == cfg.train_length), evals[0])
    s = {"loss_at_N": base["loss"]}
    for e in evals:
        if e["length"] != base["length"]:
            s[f"loss_growth_{e['factor']:g}x"] = e["loss"] - base["loss"]
        if "passkey_acc" in e:
            s[f"passkey_acc_{e['factor']:g}x"] = e["passkey_acc"]
    return s


def _compare_row(pe: str, model, rec: dict, cfg: RunConfig, data, device: str, seed, ckpt, extend: tuple,
                 progress: Progress) -> list[dict]:
    """The table rows of one trained model: its own, then RoPE + each training-free extension."""
    evals = evaluate(model, cfg, data, device, seed, progress=progress, label=f"eval {pe}")
    rows = [{"pe": pe, "eval": evals, "summary": summarize(evals, cfg), "train": rec,
             "checkpoint": str(ckpt) if ckpt is not None else None}]
    for kind in extend if pe == "rope" else ():
        ev = eval_extended(model, cfg, data, device, seed, kind)
        rows.append({"pe": f"rope+{kind}", "eval": ev, "summary": summarize(ev, cfg),
                     "extension": {"type": kind, "factor": "max(1, L/N) per evaluation length",
                                   "training_free": True, "base": "rope"}})
    return rows


def run_compare(pes, cfg: RunConfig, data, device: str, seed=0, out_dir: Path | None = None,
                extend: tuple = (), resume: bool = False, progress: Progress = _noop,
                stream: Callable[[dict], None] | None = None) -> dict:
    """Train every position embedding in `pes` with the same seed and batches, evaluate them on the
    same lengths and samples, and return the side-by-side table (only the main rank evaluates and
    reports; `cpu_seconds` is this process's CPU time for the whole comparison)."""
    c0 = time.process_time()
    cfg.validate()
    pes = parse_pes(pes)
    check_data(cfg, data)
    dist, device = join(device)
    methods = []
    for pe in pes:
        ckpt = out_dir / pe if out_dir is not None else None
        model, rec = train_one(pe, cfg, data, device, seed, progress, ckpt, resume, dist)
        if dist.main:
            rows = _compare_row(pe, model, rec, cfg, data, device, seed, ckpt, tuple(extend), progress)
            methods.extend(rows)
            if stream:
                stream({"pe": pe, "summary": rows[0]["summary"], "train": rec})
        del model
    leave(dist)
    result = {"task": cfg.task, "train_length": cfg.train_length, "eval_lengths": cfg.eval_lengths(),
              "methods": methods, "config": cfg.to_dict(), "world_size": dist.world}
    rope = next((m for m in methods if m["pe"] == "rope"), None)
    fope = next((m for m in methods if m["pe"] == "fope"), None)
    if rope and fope and rope["train"]["step_time_ms"] and fope["train"]["step_time_ms"]:
        result["fope_vs_rope_step_time"] = fope["train"]["step_time_ms"] / rope["train"]["step_time_ms"]
    result["cpu_seconds"] = time.process_time() - c0
    return result


def run_eval(ckpt_dir, data, device: str, lengths: list[int] | None = None, factors: tuple | None = None,
             extend: tuple | str | None = (), extend_factor: float | None = None, eval_samples: int | None = None,
             seed=0, progress: Progress = _noop) -> dict:
    """Reload a checkpoint and evaluate it at new lengths; with `extend` (RoPE checkpoints only) one row
    per training-free extension (PI / YaRN at factor L/N, or at a fixed `extend_factor`)."""
    c0 = time.process_time()
    extend = (extend,) if isinstance(extend, str) else tuple(extend or ())
    model, meta = load_checkpoint(ckpt_dir, device)
    cfg = RunConfig.from_dict(meta["run"])
    if eval_samples:
        cfg = replace(cfg, eval_samples=int(eval_samples))
    if factors:
        cfg = replace(cfg, eval_factors=tuple(factors))
    cfg.validate()
    lengths = lengths or cfg.eval_lengths()
    check_data(cfg, data, max(lengths), name="evaluation data")
    if isinstance(data, TextData) and data.vocab_size != meta["model"]["vocab_size"]:
        raise BadInputError(f"{ckpt_dir}: model vocabulary {meta['model']['vocab_size']} does not match the "
                            f"data's ({data.vocab_size}); was it trained on the passkey task?", param="ckpt_dir")
    pe = meta["pe"]
    if extend and pe != "rope":
        raise BadInputError(f"{', '.join(extend)} applies to RoPE checkpoints; this one uses {pe}", param="extend")
    if extend_factor and not extend:
        raise BadInputError("a fixed extension factor needs an extension (pi or yarn)", param="extend_factor")
    methods = []
    for kind in extend:
        evals = eval_extended(model, cfg, data, device, seed, kind, lengths, extend_factor)
        methods.append({"pe": f"rope+{kind}", "eval": evals, "summary": summarize(evals, cfg)})
    if not extend:
        evals = evaluate(model, cfg, data, device, seed, lengths, progress)
        methods.append({"pe": pe, "eval": evals, "summary": summarize(evals, cfg)})
    return {"task": cfg.task, "train_length": cfg.train_length, "checkpoint": str(ckpt_dir),
            "trained_steps": meta.get("step"), "methods": methods, "cpu_seconds": time.process_time() - c0}
