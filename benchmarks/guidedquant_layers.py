"""Seconds per layer vs size for LNQ, the k-means init and GPTQ (guided, G = 4), and the blocked/vectorised
P-step against the straightforward per-column numpy sweep of the same P-step, in the same run.

    python benchmarks/guidedquant_layers.py [--sizes 256,512,1024,2048] [--bits 3] [--threads 1]

Prints one JSON document. Times are CPU seconds of this process (`time.process_time`, one thread: robust to
other jobs on a shared machine) and wall seconds. The P-step comparisons (`speedup` = plain / blocked, the
issue's target is >= 10; H's normalised matrix `p_step_matrix` is inside the blocked time):
`pstep_in_lnq` the P-step as LNQ runs it (cd = 4 cycles, from the k-means labels with the codebook of
iteration 1's C-step), `pstep_from_kmeans` cd = 4 cycles from the k-means init (labels and codebook: many
more labels move), `pstep_one_cycle_from_kmeans` one cycle. `changed`: the fraction of labels that moved;
`us_per_column_cycle`: CPU microseconds per column and cycle. Layers are square (d x d) with correlated inputs
(tokens = 2 d).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from icmltools.core.device import set_threads
from icmltools.core.seed import derive
from icmltools.guidedquant import quant as q
from icmltools.guidedquant.options import QuantConfig


def timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def layer(d: int, G: int, seed: int = 0):
    g = derive(seed, "bench", d).torch()
    W = torch.randn(d, d, generator=g) * 0.02
    X = torch.randn(2 * d, d // 8, generator=g) @ torch.randn(d // 8, d, generator=g) + 0.1 * torch.randn(2 * d, d, generator=g)
    S = torch.rand(2 * d, G, generator=g)
    H = torch.stack([(X * S[:, k:k + 1]).T @ X for k in range(G)])
    F = torch.rand(d, d, generator=g)
    return W, H, F


def pstep_pair(W, Hd, labels, C, cycles: int, block: int) -> dict:
    """The blocked P-step (p_step_matrix included) and the plain per-column sweep from the same start."""
    fast, fast_c, _ = timed(lambda: q.p_step(W, Hd, labels, C, cycles, block))
    plain, plain_c, _ = timed(lambda: q.p_step_plain(W.numpy(), Hd.numpy(), labels.numpy(), C.numpy(), cycles))
    d = W.shape[1]
    return {"blocked_s": round(fast_c, 4), "plain_s": round(plain_c, 4), "speedup": round(plain_c / max(fast_c, 1e-9), 2),
            "same_labels": float((fast.numpy() == plain).mean()),
            "changed": round(float((plain != labels.numpy()).mean()), 4),
            "us_per_column_cycle": {"blocked": round(fast_c / cycles / d * 1e6, 1),
                                    "plain": round(plain_c / cycles / d * 1e6, 1)}}


def bench(d: int, bits: int, cfg: QuantConfig) -> dict:
    W, H, F = layer(d, cfg.groups)
    Hd, _ = q.damp_hessians(H, f"bench{d}", cfg.lnq_damp0)
    (labels, C), km_c, km_w = timed(lambda: q.kmeans_init(W, F, 2 ** bits, cfg.kmeans_iters))
    res, lnq_c, lnq_w = timed(lambda: q.lnq(W, Hd, labels, C, cfg))
    _, gp_c, gp_w = timed(lambda: q.gptq(W, H, bits, cfg, f"bench{d}"))
    C1 = q.c_step(W, Hd, labels, 2 ** bits, cfg.c_reg)       # LNQ's iteration 1: its P-steps start after a C-step
    return {"d": d, "lnq_s": round(lnq_c, 3), "kmeans_s": round(km_c, 3), "gptq_guided_s": round(gp_c, 3),
            "lnq_wall_s": round(lnq_w, 3), "kmeans_wall_s": round(km_w, 3), "gptq_guided_wall_s": round(gp_w, 3),
            "pstep_in_lnq": pstep_pair(W, Hd, labels, C1, cfg.cd_cycles, cfg.block),
            "pstep_from_kmeans": pstep_pair(W, Hd, labels, C, cfg.cd_cycles, cfg.block),
            "pstep_one_cycle_from_kmeans": pstep_pair(W, Hd, labels, C, 1, cfg.block),
            "lnq_objective_ratio": round(res["objective_trace"][-1] / res["objective_trace"][0], 4)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="256,512,1024,2048")
    ap.add_argument("--bits", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    set_threads(a.threads)
    cfg = QuantConfig()
    rows = [bench(int(d), a.bits, cfg) for d in a.sizes.split(",")]
    print(json.dumps({"benchmark": "guidedquant_layers", "bits": a.bits, "groups": cfg.groups, "iters": cfg.iters,
                      "cd_cycles": cfg.cd_cycles, "threads": a.threads, "torch": torch.__version__,
                      "clock": "process_time (CPU s)", "rows": rows,
                      "min_pstep_speedup": {k: min(r[k]["speedup"] for r in rows) for k in
                                            ("pstep_in_lnq", "pstep_from_kmeans", "pstep_one_cycle_from_kmeans")}},
                     indent=1))


if __name__ == "__main__":
    main()
