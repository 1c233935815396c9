"""Calibration statistics for GuidedQuant (one pass over the FP model), on any `adapters.Adapter`.

* `saliency_pass`: per calibration sequence n, l_n = its mean token cross-entropy; for every quantized Linear,
  s_{t,g} = mean over the output channels of group g of (1e3 * dl_n/dz_t)^2 (official `gradients.py`: it
  squares, the docstring says abs) and the Fisher diagonal F = sum_n (dl_n/dW)^2 with dl_n/dW = sum_t dz_t x_t^T.
  Sequences do not interact in the model, so a chunk's loss sum_n l_n gives each sequence's own gradients.
  G groups per projection: a Linear fusing `parts` projections (q, k, v) gets parts x G groups, as the
  official code, which quantizes each projection as its own Linear with G groups.
* `block_hessians`: each block's Linears fed their inputs from the FP model (official `activations.py`); for
  them H_g = sum_t s_{t,g} x_t x_t^T (a sum, not a mean) and the plain H = sum_t x_t x_t^T, one block at a
  time, so memory holds one block's Hessians.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from icmltools.core.errors import BadInputError

from .adapters import QLayer
from .quant import effective_groups


@dataclass
class LayerStats:
    name: str
    W: torch.Tensor          # (d_out, d_in) float32, FP weights
    F: torch.Tensor          # (d_out, d_in) Fisher diagonal
    H_plain: torch.Tensor    # (1, d_in, d_in) float64
    H_guided: torch.Tensor   # (G, d_in, d_in) float64
    groups: int              # G used for this layer (largest divisor of d_out <= the requested G)


def layer_groups(d_out: int, groups: int, parts: int = 1) -> int:
    """Saliency groups of a layer whose d_out rows fuse `parts` equal projections: G per projection (the
    largest divisor of d_out / parts not above `groups`), contiguous, so no group straddles two projections."""
    return parts * effective_groups(d_out // parts, groups)


def guided_hessian(X: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """H_g = sum_t S[t, g] x_t x_t^T for every g (X: tokens x d_in, S: tokens x G) -> (G, d_in, d_in)."""
    return torch.stack([(X * S[:, g:g + 1]).T @ X for g in range(S.shape[1])])


def seq_losses(adapter, windows: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of each window (windows: (N, T + 1) tokens; inputs then shifted targets)."""
    logits = adapter.logits(windows[:, :-1])
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1), reduction="none")
    return ce.view(windows.shape[0], -1).mean(1)


@torch.no_grad()
def eval_loss(adapter, windows: torch.Tensor, device: str, chunk: int = 16) -> float:
    """Mean over windows of the mean token cross-entropy (nats per token: per byte for a byte-level model)."""
    tot = 0.0
    for i in range(0, windows.shape[0], chunk):
        tot += float(seq_losses(adapter, windows[i:i + chunk].to(device)).sum())
    return tot / windows.shape[0]


class _Capture:
    """Forward hooks keeping each Linear's input and a tensor hook keeping the gradient of its output."""

    def __init__(self, layers: list[QLayer]):
        self.x: dict = {}
        self.dz: dict = {}
        self.handles = [q.module.register_forward_hook(self._hook(q.name)) for q in layers]

    def _hook(self, name):
        def fwd(mod, inp, out):
            self.x[name] = inp[0].detach()
            out.register_hook(lambda g: self.dz.__setitem__(name, g.detach()))
        return fwd

    def close(self):
        for h in self.handles:
            h.remove()


def saliency_pass(adapter, windows: torch.Tensor, groups: int, device: str, chunk: int = 16,
                  grad_scale: float = 1e3, progress: Callable = lambda *a: None) -> tuple[dict, dict, float]:
    """Saliencies s (tokens x G per layer, Eq. 7 of the paper) and Fisher diagonals F, from the per-sequence
    losses of the FP model; also returns the mean calibration loss. NaN/inf gradients are refused."""
    model = adapter.model
    layers = adapter.layers()
    S = {q.name: [] for q in layers}
    Fd = {q.name: torch.zeros(q.W.shape, dtype=torch.float32, device=device) for q in layers}
    req = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    cap = _Capture(layers)
    total = 0.0
    try:
        for i in range(0, windows.shape[0], chunk):
            w = windows[i:i + chunk].to(device)
            emb = adapter.embed(w[:, :-1]).detach().requires_grad_(True)
            logits = adapter.logits(embeds=emb)
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="none")
            loss_n = ce.view(w.shape[0], -1).mean(1)
            total += float(loss_n.detach().sum())
            loss_n.sum().backward()
            for q in layers:
                _accumulate(q, cap.x[q.name], cap.dz[q.name], groups, grad_scale, S, Fd)
            progress("calibration: gradients", min(i + chunk, windows.shape[0]), windows.shape[0])
    finally:
        cap.close()
        for p, r in zip(model.parameters(), req):
            p.requires_grad_(r)
    return {n: torch.cat(v) for n, v in S.items()}, Fd, total / windows.shape[0]


def _accumulate(q: QLayer, x, dz, groups, grad_scale, S, Fd):
    if not bool(torch.isfinite(dz).all()):
        raise BadInputError(f"layer {q.name}: the calibration pass gave NaN or inf output gradients", param="calib")
    d_out = dz.shape[-1]
    dz, x = dz.reshape(-1, dz.shape[1], d_out), x.reshape(-1, x.shape[1], x.shape[-1])
    n, t = dz.shape[:2]
    G = layer_groups(d_out, groups, q.parts)
    sq = (dz.float() * grad_scale).pow(2).view(n * t, G, d_out // G).mean(-1)
    S[q.name].append(sq)
    gw = torch.einsum("nto,nti->noi", dz.float(), x.float())       # dl_n/dW per sequence, (d_out, d_in)
    Fd[q.name] += gw.pow(2).sum(0)


class _HessianHooks:
    """Forward hooks accumulating H = sum x x^T and H_g = sum s_g x x^T for one block's Linears."""

    def __init__(self, layers: list[QLayer], S: dict, T: int, device: str):
        self.S, self.T, self.device, self.start = S, T, device, 0
        d_in = {q.name: q.W.shape[1] for q in layers}
        self.Hp = {q.name: torch.zeros(d_in[q.name], d_in[q.name], dtype=torch.float64, device=device) for q in layers}
        self.Hg = {q.name: torch.zeros(S[q.name].shape[1], d_in[q.name], d_in[q.name], dtype=torch.float64,
                                       device=device) for q in layers}
        self.handles = [q.module.register_forward_hook(self._hook(q.name)) for q in layers]

    def _hook(self, name):
        def fwd(mod, inp, out):
            x = inp[0].reshape(-1, inp[0].shape[-1]).float()
            if self.start * self.T + x.shape[0] > self.S[name].shape[0]:
                raise RuntimeError(f"layer {name}: more inputs than calibration tokens (called twice per pass?)")
            s = self.S[name][self.start * self.T:self.start * self.T + x.shape[0]].to(self.device)
            self.Hp[name] += (x.T @ x).double()
            self.Hg[name] += guided_hessian(x, s).double()
        return fwd

    def close(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def block_hessians(adapter, windows: torch.Tensor, S: dict, Fd: dict, device: str, chunk: int = 16
                   ) -> Iterator[list[LayerStats]]:
    """Yield the `LayerStats` of each block's quantized Linears in turn (H_g built one block at a time from
    the FP model's inputs to that block)."""
    T = windows.shape[1] - 1
    for layers, run in adapter.block_passes(windows, chunk, device):
        hooks = _HessianHooks(layers, S, T, device)
        try:
            run(lambda i, h=hooks: setattr(h, "start", i))
        finally:
            hooks.close()
        yield [LayerStats(q.name, q.W.to(device), Fd[q.name], hooks.Hp[q.name][None], hooks.Hg[q.name],
                          hooks.Hg[q.name].shape[0]) for q in layers]
