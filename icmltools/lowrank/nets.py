"""The paper's Swish networks, their cost, training, and the module swap for factored checkpoints.

`build_net` is the official `utils.Net` (DannisLi/LowRankUAT): Linear(d_in, W) -> SiLU, then (L-1) times
[Linear(W, r, bias=False) -> Linear(r, W) -> SiLU] (low-rank) or [Linear(W, W) -> SiLU] (classical), then
Linear(W, d_out). The factored pair is a `LowRank` module with children `down` and `up`, so a compressed
checkpoint's keys read `<p>.down.weight`, `<p>.up.weight`, `<p>.up.bias`.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from fractions import Fraction

import torch
from torch import nn

from icmltools.core.errors import BadInputError

from .options import FULL


class LowRank(nn.Sequential):
    """Linear(in, r, bias=False) then Linear(r, out): the paper's narrow bias-free linear layer and its expansion."""

    def __init__(self, d_in: int, d_out: int, rank: int, bias: bool = True):
        super().__init__(OrderedDict(down=nn.Linear(d_in, rank, bias=False), up=nn.Linear(rank, d_out, bias=bias)))


def parse_ratio(text) -> Fraction | None:
    """'full' -> None (classical); '1/3', '0.5' -> a fraction in (0, 1]."""
    if isinstance(text, str) and text.strip().lower() == FULL:
        return None
    try:
        r = Fraction(str(text).strip()).limit_denominator(10_000)
    except (ValueError, ZeroDivisionError):
        raise BadInputError(f"{text!r} is not a ratio (use full, a fraction like 1/3, or a number)", param="ratios") from None
    if not 0 < r <= 1:
        raise BadInputError(f"ratio {text} is outside (0, 1]", param="ratios")
    return r


def rank_for(width: int, ratio: Fraction | None) -> int | None:
    """r = max(1, floor(ratio * W)) (the official int(W/3) at ratio 1/3); None for the classical net."""
    return None if ratio is None else max(1, math.floor(ratio * width))


def build_net(d_in: int, d_out: int, depth: int, width: int, rank: int | None = None) -> nn.Sequential:
    """The official `Net` (depth = number of Swish layers); rank None = classical."""
    layers: list[nn.Module] = [nn.Linear(d_in, width), nn.SiLU()]
    for _ in range(depth - 1):
        layers.append(nn.Linear(width, width) if rank is None else LowRank(width, width, rank))
        layers.append(nn.SiLU())
    layers.append(nn.Linear(width, d_out))
    return nn.Sequential(*layers)


def cost(model: nn.Module) -> dict:
    """Parameters and MACs per sample (sum of in*out over Linear layers)."""
    macs = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    return {"params": sum(p.numel() for p in model.parameters()), "macs": macs}


def net_macs(d_in: int, d_out: int, depth: int, width: int, rank: int | None) -> int:
    """Closed form: d_in W + (L-1)(W^2 or 2 W r) + W d_out."""
    hidden = width * width if rank is None else 2 * width * rank
    return d_in * width + (depth - 1) * hidden + width * d_out


def warmup_cosine(t: float, warm: float, total: float) -> float:
    """Linear warm-up to 1 over `warm` units, then cosine to 0 at `total` (t counts from 1)."""
    if t <= warm:
        return t / max(warm, 1e-12)
    return 0.5 * (1 + math.cos(math.pi * (t - warm) / max(total - warm, 1e-12)))


def train(model, x, y, *, loss: str, epochs: int, lr: float, batch: int, gen, schedule, weight_decay: float = 0.01,
          check=None):
    """AdamW minibatch training; `schedule(epoch, step, steps_per_epoch)` gives the lr factor of each step."""
    crit = nn.MSELoss() if loss == "mse" else nn.CrossEntropyLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    n = x.shape[0]
    per = max(1, math.ceil(n / batch))
    model.train()
    for ep in range(epochs):
        perm = torch.randperm(n, generator=gen, device=gen.device).to(x.device)
        for i in range(per):
            for g in opt.param_groups:
                g["lr"] = lr * schedule(ep, i, per)
            idx = perm[i * batch:(i + 1) * batch]
            opt.zero_grad(set_to_none=True)
            out = crit(model(x[idx]), y[idx])
            out.backward()
            opt.step()
        if check is not None:
            check(ep, float(out.detach()))
    model.eval()
    return model


def step_schedule(epochs: int, warmup: float):
    """Per-step warm-up over the first `warmup` fraction of all steps, then cosine (the approximation study)."""
    def f(ep, i, per):
        total = epochs * per
        return warmup_cosine(ep * per + i + 1, warmup * total, total)
    return f


def epoch_schedule(epochs: int, warmup_epochs: int):
    """The official per-epoch LambdaLR (cv_*.py): epoch e trains at lr * lambda(e), lambda(e) = (e+1)/warm during
    warm-up, then 0.5(1 + cos(pi (e+1-warm)/(total-warm))) (torch's LambdaLR starts at lambda(0), skorch steps
    it at each epoch's end)."""
    def f(ep, i, per):
        if ep + 1 <= warmup_epochs:
            return (ep + 1) / warmup_epochs
        return 0.5 * (1 + math.cos(math.pi * (ep + 1 - warmup_epochs) / max(epochs - warmup_epochs, 1)))
    return f


# --------------------------------------------------------------------------------------------- factored layout


def swap_to_lowrank(model: nn.Module, lowrank_map: dict) -> nn.Module:
    """Replace each nn.Linear named in `lowrank_map` ({prefix: {"rank", ...}}) by LowRank(in, out, rank), in place.
    The map is the one `compress` writes; the model's state can then take the factored file with strict=True."""
    for prefix, entry in lowrank_map.items():
        parent, _, name = prefix.rpartition(".")
        try:
            owner = model.get_submodule(parent) if parent else model
            lin = getattr(owner, name)
        except AttributeError:
            raise BadInputError(f"the model has no module {prefix!r} named in the low-rank map", param="lowrank_map") from None
        if not isinstance(lin, nn.Linear):
            raise BadInputError(f"module {prefix!r} is a {type(lin).__name__}, not nn.Linear", param="lowrank_map")
        setattr(owner, name, LowRank(lin.in_features, lin.out_features, int(entry["rank"]), bias=lin.bias is not None))
    return model


def load_factored(model: nn.Module, state: dict, lowrank_map: dict | None = None, source: str = "checkpoint") -> nn.Module:
    """Swap the mapped Linear layers, then load `state` strictly; a missing/extra key or a shape that differs
    from the model's raises BadInputError naming the tensor (before anything is copied)."""
    if lowrank_map:
        swap_to_lowrank(model, lowrank_map)
    want = model.state_dict()
    missing = [k for k in want if k not in state]
    extra = [k for k in state if k not in want]
    if missing or extra:
        k = (missing or extra)[0]
        raise BadInputError(f"{source}: tensor {k!r} is {'missing' if missing else 'not in the model'}"
                            f" ({len(missing)} missing, {len(extra)} extra)")
    for k, v in want.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise BadInputError(f"{source}: tensor {k!r} has shape {list(state[k].shape)}, the model expects "
                                f"{list(v.shape)}")
    model.load_state_dict(state, strict=True)
    return model
