"""MT10 benchmark for `icml goskill`: GO-Skill vs MT-BC vs MT-BC-RTG over several seeds, one JSON on stdout.

Every seed collects its own ramp dataset once, trains and evaluates the three methods on it (same data,
same evaluation envs), then optional GO-Skill variants reuse that data (`mlp` = MLP skill decoder,
`h5` = skill horizon H = 5, `noenh` = without skill enhancement comes for free from the base run).

    python benchmarks/goskill_mt10.py --seeds 0,1,2 --jobs 2 > goskill_mt10.json
    python benchmarks/goskill_mt10.py --preset cpu --seeds 0,1,2            # the full CPU preset (slow)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

VARIANTS = {"mlp": {"decoder": "mlp"}, "h5": {"H": 5}, "task": {"conditioning": "task"}}


def _one_seed(job):
    seed, args, root = job
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from icmltools.goskill.pipeline import start
    from icmltools.goskill.tasks import quiet

    ov = json.loads(args.overrides)
    ov.setdefault("tasks", args.tasks)
    out = {"seed": seed}
    with quiet():
        t0 = time.perf_counter()
        base = start(preset=args.preset, out=str(Path(root) / f"s{seed}" / "base"), seed=seed, device="cpu",
                     methods="goskill,goskill_noenh,mtbc,mtbc_rtg", overrides=ov)
        out["base"] = base
        out["base_s"] = time.perf_counter() - t0
        data = str(Path(root) / f"s{seed}" / "base" / "data")
        for v in [v for v in args.variants.split(",") if v]:
            if args.variant_seeds and seed not in args.variant_seeds:
                continue
            vov = {**ov, **VARIANTS[v]}
            vov.pop("tasks", None)
            t0 = time.perf_counter()
            out[v] = start(preset=args.preset, out=str(Path(root) / f"s{seed}" / v), data=data, seed=seed,
                           device="cpu", methods="goskill", overrides=vov)
            out[v + "_s"] = time.perf_counter() - t0
    print(f"[goskill_mt10] seed {seed} done", file=sys.stderr, flush=True)
    return out


def _ms(x):
    x = np.asarray(x, float)
    return {"mean": float(x.mean()), "std": float(x.std(ddof=1)) if len(x) > 1 else 0.0, "per_seed": x.tolist()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="quick", choices=["quick", "cpu", "gpu"])
    ap.add_argument("--tasks", default="mt10")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes (one thread each)")
    ap.add_argument("--variants", default="mlp,h5", help="GO-Skill variants on the same data: mlp, h5, task")
    ap.add_argument("--variant-seeds", default="", help="seeds that run the variants (default: all)")
    ap.add_argument("--overrides", default="{}", help="JSON dict of config overrides, e.g. '{\"policy_iters\": 1000}'")
    ap.add_argument("--root", default=None, help="where run directories go (default: a temp folder)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    args.variant_seeds = [int(s) for s in args.variant_seeds.split(",")] if args.variant_seeds else []
    root = args.root or tempfile.mkdtemp(prefix="goskill_mt10_")
    t0 = time.perf_counter()
    jobs = [(s, args, root) for s in seeds]
    if args.jobs > 1:
        with mp.get_context("fork").Pool(args.jobs) as pool:
            runs = pool.map(_one_seed, jobs)
    else:
        runs = [_one_seed(j) for j in jobs]
    methods = {}
    for m in ("goskill", "goskill_noenh", "mtbc", "mtbc_rtg"):
        rs = [next(x for x in r["base"]["methods"] if x["method"] == m) for r in runs]
        methods[m] = {"success": _ms([x["success"] for x in rs]), "return": _ms([x["return"] for x in rs]),
                      "per_task_success": {t: float(np.mean([x["per_task"][t]["success"] for x in rs]))
                                           for t in rs[0]["per_task"]}}
    variants = {}
    for v in [v for v in args.variants.split(",") if v]:
        rs = [r[v]["methods"][0] for r in runs if v in r]
        if rs:
            variants["goskill_" + v] = {"config": VARIANTS[v], "seeds": [r["seed"] for r in runs if v in r],
                                        "success": _ms([x["success"] for x in rs]),
                                        "return": _ms([x["return"] for x in rs])}
    phases = {}
    for r in runs:
        for k, v in r["base"]["phase_s"].items():
            phases.setdefault(k, []).append(v)
    g, b, rtg = (methods[m]["success"]["mean"] for m in ("goskill", "mtbc", "mtbc_rtg"))
    cfg = json.loads((Path(runs[0]["base"]["run_dir"]) / "config.json").read_text())["config"]
    doc = {
        "benchmark": "goskill_mt10", "preset": args.preset, "overrides": json.loads(args.overrides),
        "tasks": runs[0]["base"]["tasks"], "seeds": seeds,
        "data": runs[0]["base"]["data"], "eval_episodes_per_task": cfg["eval_episodes"],
        "config": {k: cfg[k] for k in ("episodes", "max_steps", "H", "decoder", "dec_hidden", "dec_layers", "hl_hidden",
                                       "hl_layers", "context", "prompt_len", "extract_iters", "enhance_iters",
                                       "policy_iters", "bc_iters")},
        "methods": methods, "variants": variants,
        "ratios": {"goskill_over_mtbc": g / b if b else None, "goskill_over_mtbc_rtg": g / rtg if rtg else None},
        "phase_s_mean": {k: float(np.mean(v)) for k, v in phases.items()},
        "code_usage_per_seed": [r["base"]["code_usage"] for r in runs],
        "codes_used_per_seed": [r["base"]["codes_used"] for r in runs],
        "enhance_action_mse": [r["base"]["enhance"] for r in runs],
        "wall_s": time.perf_counter() - t0, "root": root,
    }
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
