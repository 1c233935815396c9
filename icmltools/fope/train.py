"""Training, evaluation, checkpoints and the side-by-side comparison for fope-train.

Every position embedding is trained with the same seed, the same initial shared weights and the same
batches (the data generator is seeded from the run seed only), then evaluated on the same windows /
passkey samples at N, 2N, 4N, 8N (configurable). RoPE models can be extended training-free with PI or
YaRN at each evaluation length L (factor L/N), reported as `rope+pi` / `rope+yarn`.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from icmltools.core.checkpoint import load_safetensors, safe_torch_load, save_safetensors, save_torch
from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.core.jsonio import atomic_write_json
from icmltools.nn import DecoderStack, TransformerConfig

from .data import PasskeyTask, TextData, check_lengths, eval_windows, sample_windows
from .model import build_model, parse_pes, set_rope_scaling

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]


def _noop(desc: str, done: int, total: int) -> None:
    return None


@dataclass
class RunConfig:
    """Everything that defines a run (a preset fills it; CLI options override fields)."""
    task: str = "text"                 # text | passkey
    train_length: int = 64
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mlp_hidden: Optional[int] = None   # default 4 * d_model
    steps: int = 300
    batch_size: int = 32
    lr: float = 1e-3
    warmup: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    sigma: float = 0.3
    theta: float = 10000.0
    pad: str = "official"
    eval_factors: tuple = (1, 2, 4, 8)
    eval_samples: int = 32            # text windows per length / passkey samples per length
    eval_batch: int = 16
    passkey_digits: int = 5
    ckpt_every: int = 0               # 0: only at the end
    compile: bool = False

    def model_config(self, vocab_size: int) -> TransformerConfig:
        return TransformerConfig(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                                 mlp_hidden=self.mlp_hidden, vocab_size=vocab_size)

    def eval_lengths(self) -> list[int]:
        return [int(round(f * self.train_length)) for f in self.eval_factors]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["eval_factors"] = list(self.eval_factors)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "eval_factors" in kw:
            kw["eval_factors"] = tuple(kw["eval_factors"])
        return cls(**kw)

    def validate(self) -> None:
        if self.task not in ("text", "passkey"):
            raise BadInputError(f"--task must be text or passkey, got {self.task!r}")
        for name in ("train_length", "d_model", "n_layers", "n_heads", "steps", "batch_size", "eval_samples",
                     "eval_batch"):
            if int(getattr(self, name)) < 1:
                raise BadInputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise BadInputError(f"--d-model {self.d_model} must split into --n-heads {self.n_heads} heads of even width")
        if not self.eval_factors or any(f <= 0 for f in self.eval_factors):
            raise BadInputError("--eval-factors must be positive numbers, e.g. 1,2,4,8")
        if self.lr <= 0:
            raise BadInputError("--lr must be > 0")
        if self.sigma < 0:
            raise BadInputError("--sigma must be >= 0")


# --------------------------------------------------------------------------------------------- device


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def dist_setup(device: str) -> tuple[Dist, str]:
    """Join a torchrun (DDP) job when WORLD_SIZE > 1: NCCL on CUDA (one GPU per local rank), gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(), device
    import torch.distributed as dist

    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        device = f"cuda:{local}"
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Dist(rank, world, local), device


def autocast(device: str):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    import contextlib

    return contextlib.nullcontext()


# --------------------------------------------------------------------------------------------- training


def lr_at(step: int, cfg: RunConfig) -> float:
    """Linear warm-up then cosine decay to min_lr_ratio * lr (OLMo's cosine_with_warmup)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


class Batches:
    """The training batch stream for one seed (identical for every position embedding)."""

    def __init__(self, cfg: RunConfig, data, seed: int, rank: int = 0):
        self.cfg, self.data = cfg, data
        self.gen = torch.Generator().manual_seed(10_000 + seed * 1009 + rank)

    def next(self) -> torch.Tensor:
        if isinstance(self.data, PasskeyTask):
            return self.data.batch(self.cfg.batch_size, self.cfg.train_length, self.gen)[0]
        return sample_windows(self.data.train, self.cfg.batch_size, self.cfg.train_length, self.gen)


def lm_loss(model, seq: torch.Tensor, device: str) -> torch.Tensor:
    x, y = seq[:, :-1].to(device), seq[:, 1:].to(device)
    with autocast(device):
        logits = model(x)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def save_checkpoint(ckpt_dir: Path, model: DecoderStack, meta: dict, opt=None, batches: Batches | None = None,
                    step: int = 0) -> None:
    """model.safetensors (weights + FoPE coefficients), config.json, and train_state.pt for resuming."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v for k, v in model.state_dict().items()}
    if model.head is not None and model.cfg.tie_weights:
        state.pop("head.weight", None)
    save_safetensors(state, ckpt_dir / "model.safetensors", metadata={"format": "icml-fope-train", "pe": meta["pe"]})
    if opt is not None:
        save_torch({"optimizer": opt.state_dict(), "step": step, "data_rng": batches.gen.get_state(),
                    "torch_rng": torch.get_rng_state()}, ckpt_dir / "train_state.pt")
    atomic_write_json(ckpt_dir / "config.json", {**meta, "step": step})


def load_checkpoint(ckpt_dir: str | os.PathLike, device: str = "cpu") -> tuple[DecoderStack, dict]:
    """Rebuild a model from `config.json` + `model.safetensors`; corrupt files raise BadInputError."""
    d = Path(ckpt_dir)
    if d.is_file():
        d = d.parent
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise BadInputError(f"{d}: not a fope-train checkpoint (no config.json)")
    try:
        meta = json.loads(cfg_path.read_text())
        run = RunConfig.from_dict(meta["run"])
        mcfg = TransformerConfig(**meta["model"])
        pe = meta["pe"]
    except (ValueError, KeyError, TypeError) as e:
        raise BadInputError(f"{cfg_path}: corrupt checkpoint config ({type(e).__name__}: {e})") from None
    state = load_safetensors(d / "model.safetensors")
    model = build_model(pe, mcfg, run.train_length, run.theta, run.sigma, run.pad, int(meta.get("seed", 0)))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise BadInputError(f"{d / 'model.safetensors'}: weights do not match config.json "
                            f"({str(e).splitlines()[0][:200]})") from None
    return model.to(device), meta


def train_one(pe: str, cfg: RunConfig, data, device: str, seed: int = 0, progress: Progress = _noop,
              ckpt_dir: Path | None = None, resume: bool = False, dist: Dist | None = None) -> tuple[DecoderStack, dict]:
    """Train one model; returns (model, training record with losses and step times)."""
    dist = dist or Dist()
    vocab = data.vocab_size
    model = build_model(pe, cfg.model_config(vocab), cfg.train_length, cfg.theta, cfg.sigma, cfg.pad, seed).to(device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=cfg.weight_decay)
    batches = Batches(cfg, data, seed, dist.rank)
    meta = {"pe": pe, "seed": seed, "run": cfg.to_dict(), "model": cfg.model_config(vocab).to_dict(),
            "data": getattr(data, "info", None) if isinstance(data, TextData) else data.info()}
    start = 0
    if resume and ckpt_dir is not None and (ckpt_dir / "train_state.pt").is_file():
        st = safe_torch_load(ckpt_dir / "train_state.pt")
        model.load_state_dict(load_safetensors(ckpt_dir / "model.safetensors", device=device))
        opt.load_state_dict(st["optimizer"])
        batches.gen.set_state(st["data_rng"])
        torch.set_rng_state(st["torch_rng"])
        start = int(st["step"])
        log.info("%s: resumed at step %d from %s", pe, start, ckpt_dir)
    train_model = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        train_model = DDP(model, device_ids=[dist.local_rank] if device.startswith("cuda") else None)
    if cfg.compile:
        train_model = torch.compile(train_model)
    losses, wall, cpu = [], [], []
    model.train()
    for step in range(start, cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        seq = batches.next()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = lm_loss(train_model, seq, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        lv = float(loss.detach())
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if not math.isfinite(lv):
            raise RuntimeFailure(f"{pe}: training loss became {lv} at step {step}; try a smaller --lr")
        losses.append(lv)
        progress(f"train {pe}", step + 1, cfg.steps)
        if ckpt_dir is not None and dist.main and cfg.ckpt_every and (step + 1) % cfg.ckpt_every == 0 \
                and step + 1 < cfg.steps:
            save_checkpoint(ckpt_dir, model, meta, opt, batches, step + 1)
    if ckpt_dir is not None and dist.main:
        save_checkpoint(ckpt_dir, model, meta, opt, batches, cfg.steps)
    model.eval()
    skip = min(5, max(0, len(wall) - 1))
    rec = {
        "steps": cfg.steps, "resumed_from": start or None,
        "final_train_loss": float(np.mean(losses[-20:])) if losses else None,
        "step_time_ms": float(np.median(wall[skip:]) * 1e3) if wall else None,
        "step_cpu_ms": float(np.median(cpu[skip:]) * 1e3) if cpu else None,
        "train_wall_s": float(np.sum(wall)), "train_cpu_s": float(np.sum(cpu)),
        "params": model.num_params(), "frozen_pe_numel": sum(b.numel() for n, b in model.named_buffers()
                                                            if n.endswith("_coef")),
    }
    return model, rec


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
def eval_passkey(model, task: PasskeyTask, length: int, cfg: RunConfig, device: str, seed: int) -> dict:
    """Exact-match passkey accuracy (greedy digits == key) over `eval_samples` sequences, LM loss over all
    tokens and loss on the answer digits, and accuracy per depth bucket (quarters of the sequence)."""
    gen = torch.Generator().manual_seed(777_000 + seed * 31 + length)
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


def run_compare(pes, cfg: RunConfig, data, device: str, seed: int = 0, out_dir: Path | None = None,
                extend: tuple = (), resume: bool = False, progress: Progress = _noop,
                stream: Callable[[dict], None] | None = None) -> dict:
    """Train every position embedding in `pes` with the same seed and batches, evaluate them on the
    same lengths and samples, and return the side-by-side table."""
    cfg.validate()
    pes = parse_pes(pes)
    if isinstance(data, TextData):
        check_lengths(data, cfg.train_length, max(cfg.eval_lengths()))
    elif cfg.train_length + 1 < data.min_length:
        raise BadInputError(f"--train-length {cfg.train_length} is too short for the passkey task "
                            f"(needs >= {data.min_length - 1})")
    dist, device = dist_setup(device)
    methods = []
    for pe in pes:
        ckpt = out_dir / pe if out_dir is not None else None
        model, rec = train_one(pe, cfg, data, device, seed, progress, ckpt, resume, dist)
        if not dist.main:
            continue
        evals = evaluate(model, cfg, data, device, seed, progress=progress, label=f"eval {pe}")
        row = {"pe": pe, "eval": evals, "summary": summarize(evals, cfg), "train": rec,
               "checkpoint": str(ckpt) if ckpt is not None else None}
        methods.append(row)
        if stream:
            stream({"pe": pe, "summary": row["summary"], "train": rec})
        if pe == "rope":
            for kind in extend:
                ev = eval_extended(model, cfg, data, device, seed, kind)
                methods.append({"pe": f"rope+{kind}", "eval": ev, "summary": summarize(ev, cfg),
                                "extension": {"type": kind, "factor": "max(1, L/N) per evaluation length",
                                              "training_free": True, "base": "rope"}})
        del model
    if dist.world > 1:
        import torch.distributed as tdist

        tdist.barrier()
        tdist.destroy_process_group()
    result = {"task": cfg.task, "train_length": cfg.train_length, "eval_lengths": cfg.eval_lengths(),
              "methods": methods, "config": cfg.to_dict(), "world_size": dist.world}
    rope = next((m for m in methods if m["pe"] == "rope"), None)
    fope = next((m for m in methods if m["pe"] == "fope"), None)
    if rope and fope and rope["train"]["step_time_ms"] and fope["train"]["step_time_ms"]:
        result["fope_vs_rope_step_time"] = fope["train"]["step_time_ms"] / rope["train"]["step_time_ms"]
    return result


def run_eval(ckpt_dir, data, device: str, lengths: list[int] | None = None, factors: tuple | None = None,
             extend: str | None = None, extend_factor: float | None = None, eval_samples: int | None = None,
             seed: int = 0, progress: Progress = _noop) -> dict:
    """Reload a checkpoint and evaluate it at new lengths (optionally RoPE + PI/YaRN)."""
    model, meta = load_checkpoint(ckpt_dir, device)
    cfg = RunConfig.from_dict(meta["run"])
    if eval_samples:
        cfg = replace(cfg, eval_samples=int(eval_samples))
    if factors:
        cfg = replace(cfg, eval_factors=tuple(factors))
    lengths = lengths or cfg.eval_lengths()
    if isinstance(data, TextData):
        check_lengths(data, cfg.train_length, max(lengths), name="evaluation data")
        if data.vocab_size != meta["model"]["vocab_size"]:
            raise BadInputError(f"{ckpt_dir}: model vocabulary {meta['model']['vocab_size']} does not match the "
                                f"data's ({data.vocab_size}); was it trained on --task passkey?")
    pe = meta["pe"]
    if extend:
        if pe != "rope":
            raise BadInputError(f"--extend {extend} applies to RoPE checkpoints; this one uses {pe}")
        evals = eval_extended(model, cfg, data, device, seed, extend, lengths, extend_factor)
        label = f"rope+{extend}"
    else:
        evals = evaluate(model, cfg, data, device, seed, lengths, progress)
        label = pe
    return {"task": cfg.task, "train_length": cfg.train_length, "checkpoint": str(ckpt_dir),
            "trained_steps": meta.get("step"),
            "methods": [{"pe": label, "eval": evals, "summary": summarize(evals, cfg)}]}
