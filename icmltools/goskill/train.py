"""Training loops: skill extraction (phase 1), relabelling, class-balanced enhancement, high level, baselines.

Optimiser everywhere: AdamW (lr 3e-4, weight decay 1e-4), linear warm-up, gradient clipping at 1.0.
"""
from __future__ import annotations

import contextlib
import logging
import math

import numpy as np
import torch
import torch.nn.functional as F

from icmltools.core.errors import RuntimeFailure
from icmltools.core.seed import Stream, as_stream, derive

from . import data as D
from .models import BCPolicy, HighLevelPolicy, SkillModel

log = logging.getLogger(__name__)


def _opt(params, cfg, iters):
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    warm = max(1, min(cfg.warmup, iters // 5 if iters else 1))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warm))
    return opt, sched


def _fit(params, cfg, iters: int, batch_loss, name: str, progress=None, every: int = 50,
         stage: str | None = None) -> list[float]:
    """`iters` optimiser steps on `batch_loss(it)`: AdamW, linear warm-up, gradient clipping. Returns the losses.
    A loss that is not finite stops training with a `RuntimeFailure` naming `stage` (default `name`) and the
    step, before that step updates the weights."""
    opt, sched = _opt(params, cfg, iters)
    losses = []
    for it in range(iters):
        loss = batch_loss(it)
        value = loss.item()
        if not math.isfinite(value):
            raise RuntimeFailure(f"{stage or name}: the training loss became {value} at step {it + 1} of {iters}; "
                                 "nothing of this stage was saved",
                                 hint="check the data for extreme values, or try another seed or smaller sizes")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        sched.step()
        losses.append(value)
        if progress and (it % every == 0 or it == iters - 1):
            progress(name, it + 1, iters)
    return losses


def _summary(iters: int, losses: list[float]) -> dict:
    return {"iters": iters, "loss_first": _mean(losses[:50]), "loss_last": _mean(losses[-50:])}


@contextlib.contextmanager
def _dropout_stream(stream: Stream, device):
    """Dropout draws from torch's global generator (it takes no generator argument): seed it from the stage's
    stream for the loop and restore the caller's state afterwards."""
    dev = torch.device(device)
    with stream.child("dropout").torch_init([dev] if dev.type == "cuda" else []):
        yield


def _t(x, device, dtype=None):
    t = torch.from_numpy(np.ascontiguousarray(x)).to(device)
    return t.to(dtype) if dtype is not None else t


def _masked_mse(pred, target, mask):
    se = ((pred - target) ** 2).mean(-1)
    return (se * mask).sum() / mask.sum().clamp(min=1.0)


def extract_skills(model: SkillModel, fd: D.FlatData, cfg, seed, device, progress=None) -> dict:
    """Phase 1 (Sec. 4.1, Algorithm 1): L = ||pi_L(a | z_q, s) - a||^2 over the in-skill window + beta ||z - sg(e)||^2
    with z = f(g_t), g_t = s_{t+H} - s_t; EMA codebook, k-means init. Streams: derive(seed, "extract", ...)."""
    s = as_stream(seed, "extract")
    rng = s.child("batches").numpy()
    model.to(device).train()
    model.vq.generator = s.child("kmeans").torch()

    def batch_loss(it):
        idx = rng.integers(0, fd.n, size=cfg.extract_batch)
        st, a, m = (_t(x, device) for x in D.windows(fd, idx, cfg.H))
        pred, _, vq_loss = model(st, _t(D.goals(fd, idx, cfg.H), device), a)
        return _masked_mse(pred, a, m) + vq_loss

    params = [p for p in model.parameters() if p.requires_grad]
    with _dropout_stream(s, device):
        losses = _fit(params, cfg, cfg.extract_iters, batch_loss, "extract", progress)
    return _summary(cfg.extract_iters, losses)


@torch.no_grad()
def relabel(model: SkillModel, fd: D.FlatData, H: int, device, batch: int = 8192) -> np.ndarray:
    """Nearest code of g_t for every timestep t (the skill label of the window starting at t; Sec. 4.2)."""
    model.to(device).eval()
    out = np.empty(fd.n, dtype=np.int64)
    for b in range(0, fd.n, batch):
        idx = np.arange(b, min(b + batch, fd.n))
        out[idx] = model.codes_of(_t(D.goals(fd, idx, H), device)).cpu().numpy()
    return out


def action_mse(model: SkillModel, fd: D.FlatData, codes: np.ndarray, H: int, device, n: int = 2048,
               seed: int = 0) -> dict:
    """Held-out style diagnostic: action MSE of the decoder on random windows (the same windows for a given
    seed: derive(seed, "action_mse")), overall and per code."""
    model.to(device).eval()
    rng = derive(seed, "action_mse").numpy()
    idx = rng.integers(0, fd.n, size=min(n, fd.n))
    s, a, m = D.windows(fd, idx, H)
    with torch.no_grad():
        pred, _, _ = model(_t(s, device), _t(D.goals(fd, idx, H), device), _t(a, device), freeze=True)
        se = (((pred.cpu().numpy() - a) ** 2).mean(-1) * m).sum(1) / np.maximum(m.sum(1), 1)
    per = {int(c): float(se[codes[idx] == c].mean()) for c in np.unique(codes[idx])}
    return {"mse": float(se.mean()), "per_code": per}


def enhance(model: SkillModel, fd: D.FlatData, codes: np.ndarray, cfg, seed, device, progress=None) -> dict:
    """Skill enhancement (Sec. 4.2, Algorithm 1): fine-tune the decoder only, encoder and codebook frozen, on
    class-balanced batches (the same number of windows for every used code). The official loop takes one such
    step per high-level step (so `enhance_iters` = `policy_iters` in the presets) with a balanced batch as large
    as a phase-1 batch (`batch_size * n_tasks // valid_codes` windows per code): `enhance_per_code` = 0 does
    that. Streams: derive(seed, "enhance", ...)."""
    s = as_stream(seed, "enhance")
    rng = s.child("batches").numpy()
    model.to(device).train()
    per_code = enhance_per_code(cfg, codes)

    def batch_loss(it):
        idx = D.balanced_indices(codes, per_code, rng)
        st, a, m = (_t(x, device) for x in D.windows(fd, idx, cfg.H))
        enc = model.state_changes(st).detach()
        pred = model.decoder(model.vq.lookup(_t(codes[idx], device)), enc, st, a)
        return _masked_mse(pred, a, m)

    for p in model.encoder.parameters():
        p.requires_grad_(False)
    try:
        with _dropout_stream(s, device):
            losses = _fit(list(model.decoder.parameters()), cfg, cfg.enhance_iters, batch_loss, "enhance", progress)
    finally:
        for p in model.encoder.parameters():
            p.requires_grad_(True)
    return {**_summary(cfg.enhance_iters, losses), "per_code": per_code}


def enhance_per_code(cfg, codes: np.ndarray) -> int:
    """Windows per used code in a balanced batch: `cfg.enhance_per_code`, or (0) a phase-1-sized batch split
    evenly over the used codes (official `get_batch_for_skill`)."""
    if cfg.enhance_per_code > 0:
        return int(cfg.enhance_per_code)
    return max(1, cfg.extract_batch // max(1, len(np.unique(codes))))


class PromptPool:
    """Trajectory prompts: the `prompt_pool` highest-return episodes of each task; a prompt is the last
    `prompt_len` skill steps of one of them, drawn at random (official `stochastic_prompt`)."""

    def __init__(self, fd: D.FlatData, k: int):
        self.by_task = {}
        for tid in range(len(fd.tasks)):
            eps = [(R, e) for e, R in zip(fd.episodes, fd.ep_return) if e[0] == tid]
            eps.sort(key=lambda x: -x[0])
            self.by_task[tid] = [e for _, e in eps[:max(1, k)]]

    def sample(self, fd, codes, task_ids, cfg, rng):
        out = []
        for tid in task_ids:
            pool = self.by_task[int(tid)]
            ep = pool[int(rng.integers(len(pool)))]
            out.append(D.prompt_sequence(fd, codes, ep, cfg.prompt_len, cfg.H, cfg.scale))
        return [np.stack(x) for x in zip(*out)]


def train_high_level(hl: HighLevelPolicy, model: SkillModel, fd: D.FlatData, codes: np.ndarray, cfg, seed, device,
                     progress=None) -> dict:
    """Return-conditioned high-level policy (Sec. 4.3, Algorithm 2): cross-entropy -log pi_H(z_i | prompt,
    R_<=i, s_<=i, z_<i) over the codes at every skill step; skill steps are H apart starting anywhere (the
    official `augment` sampling), context `cfg.context`. Streams: derive(seed, "policy", ...)."""
    s = as_stream(seed, "policy")
    rng = s.child("batches").numpy()
    hl.to(device).train()
    model.to(device).eval()
    pool = PromptPool(fd, cfg.prompt_pool)
    accs = []

    def batch_loss(it):
        ends = rng.integers(0, fd.n, size=cfg.policy_batch)
        st, c, r, ts, m = D.skill_sequences(fd, codes, ends, cfg.context, cfg.H, cfg.scale)
        tid = fd.task_id[ends]
        ct, mt = _t(c, device), _t(m, device)
        zv = model.vq.lookup(ct).detach() * mt[..., None]
        prompt = None
        if cfg.conditioning == "prompt":
            ps, pc, pr, pts, pm = pool.sample(fd, codes, tid, cfg, rng)
            pz = model.vq.lookup(_t(pc, device)).detach() * _t(pm, device)[..., None]
            prompt = (_t(ps, device), pz, _t(pr, device), _t(pts, device), _t(pm, device))
        logits = hl(_t(st, device), zv, _t(r, device), _t(ts, device), mt, prompt=prompt, task=_t(tid, device))
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ct.reshape(-1), reduction="none")
        with torch.no_grad():
            accs.append(float(((logits.argmax(-1) == ct).float() * mt).sum() / mt.sum()))
        return (ce * mt.reshape(-1)).sum() / mt.sum()

    with _dropout_stream(s, device):
        losses = _fit(list(hl.parameters()), cfg, cfg.policy_iters, batch_loss, "policy", progress)
    return {**_summary(cfg.policy_iters, losses), "code_accuracy_last": _mean(accs[-50:])}


def train_bc(policy: BCPolicy, fd: D.FlatData, cfg, seed, device, progress=None, name: str = "mtbc") -> dict:
    """MT-BC (state + task id) or MT-BC-RTG (also the scaled return-to-go): action MSE. Streams:
    derive(seed, "baselines", name, ...)."""
    s = as_stream(seed, "baselines", name)
    rng = s.child("batches").numpy()
    policy.to(device).train()

    def batch_loss(it):
        idx = rng.integers(0, fd.n, size=cfg.bc_batch)
        st, a = _t(fd.obs[idx], device), _t(fd.actions[idx], device)
        rtg = _t(fd.rtg[idx] / cfg.scale, device)
        return F.mse_loss(policy(st, _t(fd.task_id[idx], device), rtg), a)

    with _dropout_stream(s, device):
        losses = _fit(list(policy.parameters()), cfg, cfg.bc_iters, batch_loss, name, progress, every=100,
                      stage=f"baselines ({name})")
    return _summary(cfg.bc_iters, losses)


def _mean(x):
    return float(np.mean(x)) if len(x) else float("nan")
