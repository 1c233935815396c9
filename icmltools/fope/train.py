"""Training and the side-by-side comparison for fope-train (evaluation: `evaluate`; checkpoints: `ckpt`).

Every position embedding is trained with the same seed, the same initial shared weights and the same
batches, then evaluated on the same windows / passkey samples at N, 2N, 4N, 8N (configurable). RoPE
models can be extended training-free with PI or YaRN at each evaluation length L (factor L/N), reported
as `rope+pi` / `rope+yarn`.

Random streams (`core.seed.derive`): `(seed, "init")` shared weights and `(seed, "init", "fope", layer)`
FoPE coefficients (model.py), `(seed, "batches", rank)` training batches, `(seed, "eval", length)`
passkey evaluation samples. None depends on which other position embeddings run, so one model trained
alone gives the numbers it gives inside a comparison.

Step time (`train.step_ms`, and `fope_vs_rope_step_time`): on CUDA the wall time of a step between two
`torch.cuda.synchronize()`; on CPU the CPU time of the training thread (`time.thread_time`, one torch
thread) or of the process (`time.process_time`, several torch threads), so other processes' load does
not enter it. `step_clock` says which; `step_time_ms` is always the wall time.

A loss or gradient norm that turns non-finite stops training before the optimizer step
(`TrainingDiverged`, naming the step): no weight is updated from it and no checkpoint is written after
it; `run_compare` then removes the checkpoint folders this call created.
"""
from __future__ import annotations

import logging
import math
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.core.seed import as_stream
from icmltools.nn import DecoderStack

from .ckpt import load_checkpoint, read_checkpoint_meta, resume_state, save_checkpoint
from .data import PasskeyTask, TextData, check_lengths, sample_windows
from .dist import Dist, join, leave
from .evaluate import SE_NOTE, eval_extended, eval_lengths, evaluate, summarize
from .model import build_model, parse_pes
from .options import RunConfig

__all__ = ["RunConfig", "Dist", "build_model", "lm_loss", "train_one", "evaluate", "run_compare", "run_eval",
           "load_checkpoint", "read_checkpoint_meta", "check_data", "TrainingDiverged", "step_clock"]

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]


class TrainingDiverged(RuntimeFailure):
    """The training loss or gradient norm became NaN or inf (exit 1)."""


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


# --------------------------------------------------------------------------------------------- training


def step_clock(device: str) -> str:
    """How training steps are timed on `device`: `cuda_wall`, `thread_cpu` (one torch thread) or
    `process_cpu` (several)."""
    if device.startswith("cuda"):
        return "cuda_wall"
    return "thread_cpu" if torch.get_num_threads() == 1 else "process_cpu"


class StepTimer:
    """Per-step wall time and the time of the clock `step_clock(device)` names."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.clock = step_clock(device)
        self._cpu = {"thread_cpu": time.thread_time, "process_cpu": time.process_time}.get(self.clock, time.process_time)
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
        self._t0, self._c0 = time.perf_counter(), self._cpu()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            if self.cuda:
                torch.cuda.synchronize()
            self.wall.append(time.perf_counter() - self._t0)
            self.cpu.append(self._cpu() - self._c0)
        return False

    def record(self) -> dict:
        skip = min(5, max(0, len(self.wall) - 1))           # warm-up steps
        med = (lambda v: float(np.median(v[skip:]) * 1e3) if v else None)
        wall, cpu = med(self.wall), med(self.cpu)
        return {"step_ms": wall if self.clock == "cuda_wall" else cpu, "step_clock": self.clock,
                "step_time_ms": wall, "step_cpu_ms": cpu,
                "train_wall_s": float(np.sum(self.wall)), "train_cpu_s": float(np.sum(self.cpu))}


def _wrap(model, cfg: RunConfig, dist: Dist, device: str):
    """The module the optimizer steps through: DDP across ranks, torch.compile if asked."""
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[dist.local_rank] if device.startswith("cuda") else None)
    return torch.compile(model) if cfg.compile else model


def _step(train_model, model, opt, seq, cfg: RunConfig, device: str, pe: str, step: int) -> float:
    """One AdamW step; a non-finite loss or gradient norm raises TrainingDiverged before the update (the
    gradient norm is all-reduced under DDP, so every rank stops at the same step)."""
    loss = lm_loss(train_model, seq, device)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or math.inf)
    value, gnorm = float(loss.detach()), float(norm)
    if not (math.isfinite(value) and math.isfinite(gnorm)):
        raise TrainingDiverged(f"{pe}: training diverged at step {step + 1} of {cfg.steps} (loss {value:.4g}, "
                               f"gradient norm {gnorm:.4g}); stopped before updating the weights",
                               hint="try a smaller lr")
    opt.step()
    return value


def _record(model, cfg: RunConfig, start: int, losses: list, timer: StepTimer) -> dict:
    return {"steps": cfg.steps, "resumed_from": start or None,
            "final_train_loss": float(np.mean(losses[-20:])) if losses else None, **timer.record(),
            "params": model.num_params(),
            "frozen_pe_numel": sum(b.numel() for n, b in model.named_buffers() if n.endswith("_coef"))}


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
    start = resume_state(ckpt_dir, model, opt, batches.gen, device) if resume and ckpt_dir is not None else 0
    if start:
        log.info("%s: resumed at step %d from %s", pe, start, ckpt_dir)
    saves = ckpt_dir is not None and dist.writes
    train_model = _wrap(model, cfg, dist, device)
    losses, timer = [], StepTimer(device)
    model.train()
    for step in range(start, cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        seq = batches.next()
        with timer:
            losses.append(_step(train_model, model, opt, seq, cfg, device, pe, step))
        progress(f"train {pe}", step + 1, cfg.steps)
        if saves and cfg.ckpt_every and (step + 1) % cfg.ckpt_every == 0 and step + 1 < cfg.steps:
            save_checkpoint(ckpt_dir, model, meta, opt, batches.gen.get_state(), step + 1)
    if saves:
        save_checkpoint(ckpt_dir, model, meta, opt, batches.gen.get_state(), cfg.steps)
    model.eval()
    return model, _record(model, cfg, start, losses, timer)


# --------------------------------------------------------------------------------------------- comparison


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


def _step_ratio(methods: list[dict]) -> dict:
    """FoPE's training step time over RoPE's, by the clock both were timed with."""
    t = {m["pe"]: m["train"] for m in methods if m["pe"] in ("rope", "fope")}
    if len(t) < 2 or not (t["rope"]["step_ms"] and t["fope"]["step_ms"]):
        return {}
    return {"fope_vs_rope_step_time": t["fope"]["step_ms"] / t["rope"]["step_ms"],
            "step_time_clock": t["fope"]["step_clock"]}


def _train_all(pes, cfg: RunConfig, data, device: str, seed, out_dir, extend: tuple, resume: bool,
               progress: Progress, stream, dist: Dist) -> list[dict]:
    methods = []
    for pe in pes:
        ckpt = out_dir / pe if out_dir is not None else None
        model, rec = train_one(pe, cfg, data, device, seed, progress, ckpt, resume, dist)
        if dist.main:
            rows = _compare_row(pe, model, rec, cfg, data, device, seed, ckpt, extend, progress)
            methods.extend(rows)
            if stream:
                stream({"pe": pe, "summary": rows[0]["summary"], "train": rec})
        del model
    return methods


def run_compare(pes, cfg: RunConfig, data, device: str, seed=0, out_dir: Path | None = None,
                extend: tuple = (), resume: bool = False, progress: Progress = _noop,
                stream: Callable[[dict], None] | None = None) -> dict:
    """Train every position embedding in `pes` with the same seed and batches, evaluate them on the
    same lengths and samples, and return the side-by-side table (only the main rank evaluates and
    reports; `cpu_seconds` is this process's CPU time for the whole comparison). If training diverges,
    the checkpoint folders this call created are removed before the error propagates."""
    c0 = time.process_time()
    cfg.validate()
    pes = parse_pes(pes)
    check_data(cfg, data)
    dist, device = join(device)
    new = [out_dir / pe for pe in pes if out_dir is not None and not (out_dir / pe).exists()]
    try:
        methods = _train_all(pes, cfg, data, device, seed, out_dir, tuple(extend), resume, progress, stream, dist)
    except TrainingDiverged:
        if dist.writes:
            for d in new:
                shutil.rmtree(d, ignore_errors=True)
        raise
    leave(dist)
    return {"task": cfg.task, "train_length": cfg.train_length, "eval_lengths": eval_lengths(cfg),
            "methods": methods, "config": cfg.to_dict(), "world_size": dist.world, **_step_ratio(methods),
            "standard_errors": SE_NOTE[cfg.task], "cpu_seconds": time.process_time() - c0}


def _eval_config(meta: dict, factors, eval_samples) -> RunConfig:
    cfg = RunConfig.from_dict(meta["run"])
    if eval_samples:
        cfg = replace(cfg, eval_samples=int(eval_samples))
    if factors:
        cfg = replace(cfg, eval_factors=tuple(factors))
    cfg.validate()
    return cfg


def run_eval(ckpt_dir, data, device: str, lengths: list[int] | None = None, factors: tuple | None = None,
             extend: tuple | str | None = (), extend_factor: float | None = None, eval_samples: int | None = None,
             seed=0, progress: Progress = _noop) -> dict:
    """Reload a checkpoint and evaluate it at new lengths (N always included); with `extend` (RoPE
    checkpoints only) one row per training-free extension (PI / YaRN at factor L/N, or a fixed
    `extend_factor`)."""
    c0 = time.process_time()
    extend = (extend,) if isinstance(extend, str) else tuple(extend or ())
    model, meta = load_checkpoint(ckpt_dir, device)
    cfg = _eval_config(meta, factors, eval_samples)
    lengths = eval_lengths(cfg, lengths)
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
    return {"task": cfg.task, "train_length": cfg.train_length, "eval_lengths": lengths, "checkpoint": str(ckpt_dir),
            "trained_steps": meta.get("step"), "methods": methods, "standard_errors": SE_NOTE[cfg.task],
            "cpu_seconds": time.process_time() - c0}
