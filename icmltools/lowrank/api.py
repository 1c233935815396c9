"""What `icml lowrank` calls: the approximation study, the tabular protocol, the compressor, the demo."""
from __future__ import annotations

from dataclasses import asdict

from . import approx as _approx
from . import compress as _compress
from . import demo as _demo
from . import uci as _uci
from .options import ApproxConfig, CompressConfig, DemoConfig, UciConfig


def approx(cfg: ApproxConfig, seed: int, device="cpu", progress=None, plot=None) -> dict:
    """Classical vs low-rank nets on Hölder targets; `plot` writes error vs MACs to a PNG."""
    res = _approx.run(cfg, seed, device, progress)
    if plot:
        _approx.plot(res, plot)
        res["plot"] = str(plot)
    return res


def uci(cfg: UciConfig, seed: int, csv=None, target=None, depth=None, width=None, device="cpu", progress=None) -> dict:
    return _uci.run(cfg, seed, csv, target, depth, width, device, progress)


def prepare_compress(path, cfg: CompressConfig, device="cpu"):
    """Open and plan (every input error is raised here, before the command creates its run folder)."""
    return _compress.prepare(path, cfg, device)


def compress(plan, out_dir, device="cpu", seed: int = 0, progress=None) -> dict:
    """Write the planned compression into `out_dir`."""
    return _compress.run_plan(plan, out_dir, device=device, seed=seed, progress=progress)


def validate_approx(cfg: ApproxConfig) -> None:
    _approx.validate(cfg)


def compress_demo(cfg: DemoConfig, seed: int, device="cpu", progress=None) -> dict:
    """The compression half of the demo only (a trained classical net, several ratios, fine-tuning)."""
    return _demo.compress_part(cfg, seed, device, progress)


def check(factored, map_path=None, model_ckpt=None, progress=None) -> dict:
    """Verify a factored checkpoint against its map (and the dense checkpoint): strict loads, per-layer shapes."""
    from . import check as _check

    return _check.check(factored, map_path, model_ckpt, progress)


def check_rows(res: dict) -> list[list]:
    return [[r["prefix"], "x".join(map(str, r["shape"])), r["rank"], r["format"], r["params_dense"], r["params_factored"]]
            for r in res["layers"]]


def validate_compress(cfg: CompressConfig) -> None:
    _compress.validate(cfg)


def demo(cfg: DemoConfig, seed: int, device="cpu", progress=None) -> dict:
    return _demo.run(cfg, seed, device, progress)


def config_dict(cfg) -> dict:
    return asdict(cfg)


def approx_rows(res: dict) -> list[list]:
    return [[r["beta"], r["width"], r["ratio"], r["params"], r["macs"], r["rel_rmse"], "*" if r.get("pareto") else ""]
            for r in res["summary"]]


def compress_rows(res: dict) -> list[list]:
    return [[r["key"], "x".join(map(str, r["shape"])), r["rank"], r["rel_fro_err"], r["macs_before"], r["macs_factored"]]
            for r in res["layers"]]


def demo_rows(res: dict) -> list[list]:
    return [[r["ratio"], r["macs"], r["rel_rmse_compressed"], r["rel_rmse_finetuned"]] for r in res["compress"]["ratios"]]
