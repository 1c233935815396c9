"""Evaluation for fope-train: loss per length with standard errors, passkey accuracy, summaries.

Text: every length is scored on the same `eval_samples` windows of the validation split, placed at the
same start offsets (evenly spaced so that the longest window fits): the window of length L starts where
the N window starts and holds it as its prefix. The model is causal, so one forward pass over the longest
window gives the loss of every shorter window as the mean over its prefix (the N loss is the mean of the
first N token losses of the same forward pass; bitwise what a forward pass over the N window alone
gives). The growth from N to L is then a paired difference over windows, and its standard error is the
standard deviation of the per-window differences over sqrt(windows). RoPE + PI / YaRN rows change the
rotary scaling per length, so they run one forward pass per length, on the same windows.

Passkey: the samples of length L come from `derive(seed, "eval", L)` (a different sequence per length),
so the growth's standard error is that of a difference of independent means; accuracy's is binomial.
Standard errors treat windows (samples) as independent draws.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from icmltools.core.seed import as_stream

from .data import PasskeyTask, TextData, eval_starts, windows_at
from .model import set_rope_scaling
from .options import RunConfig

__all__ = ["eval_lengths", "window_nll", "text_rows", "eval_text", "eval_passkey", "evaluate", "eval_extended",
           "summarize", "SE_NOTE"]

Progress = Callable[[str, int, int], None]

SE_NOTE = {"text": "standard errors over evaluation windows (independent draws); growth: paired over the same "
                   "windows (the L window starts where the N window starts)",
           "passkey": "standard errors over samples (independent draws; binomial for accuracy); growth: "
                      "independent samples per length"}


def _noop(desc: str, done: int, total: int) -> None:
    return None


def _autocast(device: str):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    import contextlib

    return contextlib.nullcontext()


def _se(x: torch.Tensor) -> float | None:
    """Standard error of the mean of `x` (None for a single value)."""
    n = x.numel()
    return float(x.double().std(unbiased=True) / math.sqrt(n)) if n > 1 else None


def eval_lengths(cfg: RunConfig, lengths: list[int] | None = None) -> list[int]:
    """The lengths to evaluate, ascending and unique; N (the training length) is always one of them, since
    every growth is measured from it."""
    return sorted(set(lengths or cfg.eval_lengths()) | {cfg.train_length})


# --------------------------------------------------------------------------------------------- text


@torch.no_grad()
def window_nll(model, stream, starts, length: int, cfg: RunConfig, device: str, progress: Progress = _noop,
               label: str = "eval") -> torch.Tensor:
    """Token losses (windows, length) of `model` on the windows of `length` bytes at `starts`."""
    out = []
    for i in range(0, len(starts), cfg.eval_batch):
        s = windows_at(stream, starts[i:i + cfg.eval_batch], length)
        x, y = s[:, :-1].to(device), s[:, 1:].to(device)
        with _autocast(device):
            logits = model(x)
        out.append(F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").cpu())
        progress(label, min(i + cfg.eval_batch, len(starts)), len(starts))
    return torch.cat(out)


def text_rows(nll: dict[int, torch.Tensor], train_length: int) -> list[dict]:
    """One row per length from the token losses `{L: (windows, L)}` on shared windows: loss, its standard
    error, perplexity, bits per byte, loss per position bucket of width N, and the growth from N (paired
    over windows) with its standard error."""
    N = train_length
    base = nll[N].mean(1)
    rows = []
    for L in sorted(nll):
        per_window = nll[L].mean(1)                     # (windows,)
        loss = float(per_window.mean())
        row = {"length": L, "factor": L / N, "loss": loss, "loss_se": _se(per_window), "windows": len(per_window),
               "ppl": math.exp(min(loss, 50.0)), "bits_per_byte": loss / math.log(2),
               "buckets": [{"start": a, "end": min(a + N, L), "loss": float(nll[L][:, a:a + N].mean())}
                           for a in range(0, L, N)]}
        if L != N:
            diff = per_window - base
            row["loss_growth"] = float(diff.mean())
            row["loss_growth_se"] = _se(diff)
        rows.append(row)
    return rows


def eval_text(model, data: TextData, lengths: list[int], cfg: RunConfig, device: str, progress: Progress = _noop,
              label: str = "eval") -> list[dict]:
    """Every length on the same windows, from one forward pass over the longest (see the module doc)."""
    L_max = max(lengths)
    starts = eval_starts(data.val.size, cfg.eval_samples, L_max)
    nll = window_nll(model, data.val, starts, L_max, cfg, device, progress, label)
    return text_rows({L: nll[:, :L] for L in lengths}, cfg.train_length)


# --------------------------------------------------------------------------------------------- passkey


def _depth_accuracy(ok: torch.Tensor, depth: torch.Tensor) -> list[dict]:
    out = []
    for q in range(4):
        sel = (depth >= q / 4) & (depth < (q + 1) / 4)
        out.append({"depth": f"{q / 4:.2f}-{(q + 1) / 4:.2f}", "acc": float(ok[sel].mean()) if sel.any() else None,
                    "n": int(sel.sum())})
    return out


@torch.no_grad()
def eval_passkey(model, task: PasskeyTask, length: int, cfg: RunConfig, device: str, seed=0) -> dict:
    """Exact-match passkey accuracy (greedy digits == key) over `eval_samples` sequences drawn from
    `derive(seed, "eval", length)` (the same for every model), LM loss over all tokens and loss on the
    answer digits, accuracy per depth bucket (quarters of the sequence), and standard errors."""
    gen = as_stream(seed, "eval", length).torch()
    seqs, ans = task.batch(cfg.eval_samples, length, gen)
    correct, tok_loss, ans_loss, depths = [], [], [], []
    key_first = task.vocab.index("pass")  # the key line starts "The pass key is"
    for i in range(0, len(seqs), cfg.eval_batch):
        s, a = seqs[i:i + cfg.eval_batch], ans[i:i + cfg.eval_batch]
        x, y = s[:, :-1].to(device), s[:, 1:].to(device)
        with _autocast(device):
            logits = model(x).float()
        nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none").cpu()
        pred = logits.argmax(-1).cpu()
        correct.append((pred.gather(1, a) == s[:, 1:].gather(1, a)).all(1))
        tok_loss.append(nll.mean(1))
        ans_loss.append(nll.gather(1, a).mean(1))
        depths.append((s[:, :-1] == key_first).float().argmax(1).float() / length)  # depth of the key line
    ok, per_sample = torch.cat(correct).float(), torch.cat(tok_loss)
    loss, acc, n = float(per_sample.mean()), float(ok.mean()), int(ok.numel())
    return {"length": length, "factor": length / cfg.train_length, "loss": loss, "loss_se": _se(per_sample),
            "ppl": math.exp(min(loss, 50.0)), "answer_loss": float(torch.cat(ans_loss).mean()),
            "passkey_acc": acc, "passkey_acc_se": math.sqrt(acc * (1 - acc) / n), "n": n,
            "by_depth": _depth_accuracy(ok, torch.cat(depths))}


# --------------------------------------------------------------------------------------------- both


def evaluate(model, cfg: RunConfig, data, device: str, seed: int, lengths: list[int] | None = None,
             progress: Progress = _noop, label: str = "eval") -> list[dict]:
    """One row per length (`eval_lengths`: ascending, N included)."""
    model.eval()
    lengths = eval_lengths(cfg, lengths)
    if not isinstance(data, PasskeyTask):
        return eval_text(model, data, lengths, cfg, device, progress, label)
    out = []
    for j, L in enumerate(lengths):
        out.append(eval_passkey(model, data, L, cfg, device, seed))
        progress(label, j + 1, len(lengths))
    return out


def _scale(L: int, cfg: RunConfig, factor: float | None) -> float:
    return float(factor) if factor else max(1.0, L / cfg.train_length)


def eval_extended(model, cfg: RunConfig, data, device: str, seed: int, kind: str,
                  lengths: list[int] | None = None, factor: float | None = None) -> list[dict]:
    """RoPE extended training-free with PI or YaRN: at each length L the factor is max(1, L/N) (or a fixed
    `factor`), on the windows plain evaluation uses. Restores plain RoPE afterwards."""
    model.eval()
    lengths = eval_lengths(cfg, lengths)
    scaling = {"type": kind, "original_length": cfg.train_length}
    try:
        if isinstance(data, PasskeyTask):
            rows = []
            for L in lengths:
                set_rope_scaling(model, {**scaling, "factor": _scale(L, cfg, factor)})
                rows.append(eval_passkey(model, data, L, cfg, device, seed))
        else:
            starts = eval_starts(data.val.size, cfg.eval_samples, max(lengths))
            nll = {}
            for L in lengths:
                set_rope_scaling(model, {**scaling, "factor": _scale(L, cfg, factor)})
                nll[L] = window_nll(model, data.val, starts, L, cfg, device)
            rows = text_rows(nll, cfg.train_length)
    finally:
        set_rope_scaling(model, None)
    for row in rows:
        row["scale_factor"] = _scale(row["length"], cfg, factor)
    return rows


def _hypot(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else math.hypot(a, b)


def summarize(evals: list[dict], cfg: RunConfig) -> dict:
    """Loss at N and its growth to each other length, and passkey accuracy per factor, each with its
    standard error (`<key>_se`)."""
    base = next(e for e in evals if e["length"] == cfg.train_length)
    s = {"loss_at_N": base["loss"], "loss_at_N_se": base["loss_se"]}
    for e in evals:
        f = f"{e['factor']:g}x"
        if e["length"] != base["length"]:
            if "loss_growth" in e:   # text: paired over windows
                s[f"loss_growth_{f}"], s[f"loss_growth_{f}_se"] = e["loss_growth"], e["loss_growth_se"]
            else:                    # passkey: independent samples per length
                s[f"loss_growth_{f}"] = e["loss"] - base["loss"]
                s[f"loss_growth_{f}_se"] = _hypot(e["loss_se"], base["loss_se"])
        if "passkey_acc" in e:
            s[f"passkey_acc_{f}"], s[f"passkey_acc_{f}_se"] = e["passkey_acc"], e["passkey_acc_se"]
    return s
