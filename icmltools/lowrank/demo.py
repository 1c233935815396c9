"""Bare `icml lowrank`: a small approximation sweep, then a trained classical net compressed through the real
checkpoint path (safetensors file -> `compress_checkpoint` -> strict load into the low-rank layout), evaluated
before and after a short fine-tuning (spec's demo: AdamW lr 3e-3, 5 epochs)."""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from icmltools.core.seed import derive
from icmltools.taskvec import open_checkpoint, write_state_dict

from . import approx
from .compress import compress_checkpoint
from .nets import build_net, cost, load_factored, step_schedule, train
from .options import ApproxConfig, CompressConfig, DemoConfig, TrainConfig


def rel_rmse(net, x, y) -> float:
    with torch.no_grad():
        return float(((net(x)[:, 0] - y) ** 2).mean().sqrt() / y.std())


def compress_one(net, cfg: ApproxConfig, ratio: float, folder: Path, seed: int, device) -> tuple:
    """Write `net`, compress the file at `ratio` (forced: ratios >= 1/2 save nothing, shown as controls), load the
    factored file strictly into a fresh copy."""
    src = folder / "classical.safetensors"
    if not src.exists():
        write_state_dict({k: v.detach().cpu() for k, v in net.state_dict().items()}, src)
    out = folder / f"r{ratio:.4f}"
    res = compress_checkpoint(src, out, CompressConfig(rank_ratio=ratio, force=True), device=device, seed=seed)
    with open_checkpoint(res["output"]) as rd:
        state = {k: rd.get(k) for k in rd.keys()}
    small = build_net(cfg.dim, 1, cfg.depth, net[0].out_features)
    load_factored(small, state, _map(res), source=res["output"])
    return small.to(device), res


def _map(res: dict) -> dict:
    import json

    return json.loads(Path(res["map"]).read_text())


def demo_config(dc: DemoConfig) -> ApproxConfig:
    return ApproxConfig(widths=dc.widths, ratios=dc.ratios, train=TrainConfig(epochs=dc.epochs))


def compress_part(dc: DemoConfig, seed: int, device="cpu", progress=None) -> dict:
    """Train the classical W = demo_width net on the rep-0 beta-1.5 data, compress it at each ratio through a
    file, evaluate, fine-tune (AdamW, lr finetune_lr, finetune_epochs), evaluate again."""
    acfg = demo_config(dc)
    data = approx.make_data(acfg, seed, 0, acfg.betas[0])
    xtr, ytr, xte, yte = (torch.as_tensor(a, dtype=torch.float32, device=device) for a in data)
    cfg = replace(acfg, widths=(dc.demo_width,))
    with derive(seed, "approx", "init", 0, dc.demo_width, "full").torch_init():
        net = build_net(cfg.dim, 1, cfg.depth, dc.demo_width).to(device)
    train(net, xtr, ytr[:, None], loss="mse", epochs=dc.epochs, lr=cfg.train.lr, batch=cfg.train.batch,
          gen=derive(seed, "demo", "batches").torch(str(device)), schedule=step_schedule(dc.epochs, cfg.train.warmup))
    rows = []
    probe = torch.rand(256, cfg.dim, generator=derive(seed, "demo", "probe").torch()).to(device)
    with tempfile.TemporaryDirectory(prefix="icml-lowrank-") as tmp:
        for ratio in dc.compress_ratios:
            small, res = compress_one(net, cfg, ratio, Path(tmp), seed, device)
            with torch.no_grad():
                max_diff = float((small(probe) - net(probe)).abs().max())
            before = rel_rmse(small, xte, yte)
            train(small, xtr, ytr[:, None], loss="mse", epochs=dc.finetune_epochs, lr=dc.finetune_lr,
                  batch=cfg.train.batch, gen=derive(seed, "demo", "finetune", f"{ratio:.4f}").torch(str(device)),
                  schedule=step_schedule(dc.finetune_epochs, 0.0))
            rows.append({"ratio": ratio, "ranks": [r["rank"] for r in res["layers"]],
                         "layer_rel_fro_err": [r["rel_fro_err"] for r in res["layers"]],
                         "macs": cost(small)["macs"], "params": cost(small)["params"], "max_output_diff": max_diff,
                         "rel_rmse_compressed": before, "rel_rmse_finetuned": rel_rmse(small, xte, yte)})
            if progress:
                progress("compress demo", len(rows), len(dc.compress_ratios))
    return {"width": dc.demo_width, "depth": cfg.depth, "macs": cost(net)["macs"], "rel_rmse": rel_rmse(net, xte, yte),
            "ratios": rows}


def run(dc: DemoConfig, seed: int, device="cpu", progress=None) -> dict:
    """Both halves: the sweep (beta 1.5) and compression + fine-tuning of the classical W = demo_width net."""
    return {"approx": approx.run(demo_config(dc), seed, device, progress),
            "compress": compress_part(dc, seed, device, progress)}
