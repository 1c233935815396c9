"""Seconds per layer vs size for LNQ, the k-means init and GPTQ (guided, G = 4), and the P-step kernels (the
numpy blocked/vectorised sweep and the compiled numba sweep) against the straightforward per-column numpy sweep
of the same P-step, in the same run.

    python benchmarks/guidedquant_layers.py [--sizes 256,512,1024,2048] [--bits 3] [--threads 1]

Prints one JSON document. Times are CPU seconds of this process (`time.process_time`, one thread: robust to
other jobs on a shared machine) and wall seconds. The P-step comparisons (`speedup` = plain / numpy blocked,
`speedup_numba` = plain / numba; the issue's target is >= 10; each kernel's set-up, e.g. H's normalised matrix
`p_step_matrix` or the numba sweep's first matmul, is inside its time; numba's compile time is not: the kernel
is called once on a tiny problem before any timing, and `numba` reports the import of numba and the kernel
module (`import_s`), that first call in this process (`first_call_s`: a compile, or a load from numba's
cache) and a compile from an empty cache in a child process (`cold_compile_s`, CPU and wall, the import
excluded)):
`pstep_in_lnq` the P-step as LNQ runs it (cd = 4 cycles, from the k-means labels with the codebook of
iteration 1's C-step), `pstep_from_kmeans` cd = 4 cycles from the k-means init (labels and codebook: many
more labels move), `pstep_one_cycle_from_kmeans` one cycle. `changed`: the fraction of labels that moved;
`us_per_column_cycle`: CPU microseconds per column and cycle. `lnq_s` runs LNQ with the default CPU P-step
(numba where installed), `lnq_numpy_s` with the numpy one. Layers are square (d x d) with correlated inputs
(tokens = 2 d). `load_average`: the machine's 1/5/15-minute load averages at the start and the end (this
process included), to quote with the figures on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
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
    """The numpy blocked P-step (p_step_matrix included), the numba one (if installed) and the plain per-column
    sweep from the same start."""
    fast, fast_c, _ = timed(lambda: q.p_step(W, Hd, labels, C, cycles, block, kernel="numpy"))
    plain, plain_c, _ = timed(lambda: q.p_step_plain(W.numpy(), Hd.numpy(), labels.numpy(), C.numpy(), cycles))
    d = W.shape[1]
    row = {"blocked_s": round(fast_c, 4), "plain_s": round(plain_c, 4), "speedup": round(plain_c / max(fast_c, 1e-9), 2),
           "same_labels": float((fast.numpy() == plain).mean()),
           "changed": round(float((plain != labels.numpy()).mean()), 4),
           "us_per_column_cycle": {"blocked": round(fast_c / cycles / d * 1e6, 1),
                                   "plain": round(plain_c / cycles / d * 1e6, 1)}}
    if q.numba_available():
        nb, nb_c, _ = timed(lambda: q.p_step(W, Hd, labels, C, cycles, block, kernel="numba"))
        row.update(numba_s=round(nb_c, 4), speedup_numba=round(plain_c / max(nb_c, 1e-9), 2),
                   same_labels_numba=float((nb.numpy() == plain).mean()))
        row["us_per_column_cycle"]["numba"] = round(nb_c / cycles / d * 1e6, 1)
    return row


COMPILE = """import time, torch
from icmltools.guidedquant import _pstep_numba, quant as q
args = (torch.randn(4, 6), torch.eye(6).expand(2, 6, 6).contiguous(), torch.zeros(4, 6, dtype=torch.long),
        torch.randn(4, 4), 2)
c0, w0 = time.process_time(), time.perf_counter()
q.p_step(*args, kernel="numba")
c1, w1 = time.process_time(), time.perf_counter()
q.p_step(*args, kernel="numba")
c2, w2 = time.process_time(), time.perf_counter()
print((c1 - c0) - (c2 - c1), (w1 - w0) - (w2 - w1))
"""


def numba_compile() -> dict | None:
    """The numba kernel's first call here (compile or cache load; float32, the benchmark's dtype), and a compile
    from an empty cache folder in a child process."""
    avail, import_c, import_w = timed(q.numba_available)          # imports numba and the kernel module
    if not avail:
        return None
    W, H, F = layer(16, 2)
    labels, C = q.kmeans_init(W, F, 8, 5)
    _, first_c, first_w = timed(lambda: q.p_step(W, H, labels, C, 1, kernel="numba"))
    from icmltools.guidedquant import _pstep_numba

    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, check=True)
    cold_c, cold_w = map(float, out.stdout.split())
    return {"numba": __import__("numba").__version__, "cached": _pstep_numba.CACHED,
            "import_s": {"cpu": round(import_c, 3), "wall": round(import_w, 3)},
            "first_call_s": {"cpu": round(first_c, 3), "wall": round(first_w, 3)},
            "cold_compile_s": {"cpu": round(cold_c, 3), "wall": round(cold_w, 3)}}


def bench(d: int, bits: int, cfg: QuantConfig) -> dict:
    W, H, F = layer(d, cfg.groups)
    Hd, _ = q.damp_hessians(H, f"bench{d}", cfg.lnq_damp0)
    (labels, C), km_c, km_w = timed(lambda: q.kmeans_init(W, F, 2 ** bits, cfg.kmeans_iters))
    res, lnq_c, lnq_w = timed(lambda: q.lnq(W, Hd, labels, C, cfg))
    res_np, lnq_np_c, _ = timed(lambda: q.lnq(W, Hd, labels, C, cfg, kernel="numpy"))
    _, gp_c, gp_w = timed(lambda: q.gptq(W, H, bits, cfg, f"bench{d}"))
    C1 = q.c_step(W, Hd, labels, 2 ** bits, cfg.c_reg)       # LNQ's iteration 1: its P-steps start after a C-step
    return {"d": d, "lnq_s": round(lnq_c, 3), "lnq_numpy_s": round(lnq_np_c, 3),
            "lnq_same_labels": bool(torch.equal(res["labels"], res_np["labels"])), "kmeans_s": round(km_c, 3), "gptq_guided_s": round(gp_c, 3),
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
    load0 = os.getloadavg()
    cfg = QuantConfig()
    compile_rec = numba_compile()                     # before any timing: compile time stays out of the ratios
    rows = [bench(int(d), a.bits, cfg) for d in a.sizes.split(",")]
    keys = ("pstep_in_lnq", "pstep_from_kmeans", "pstep_one_cycle_from_kmeans")
    out = {"benchmark": "guidedquant_layers", "bits": a.bits, "groups": cfg.groups, "iters": cfg.iters,
           "cd_cycles": cfg.cd_cycles, "threads": a.threads, "torch": torch.__version__,
           "lnq_pstep_kernel": q.pstep_kernel("cpu"), "numba": compile_rec, "clock": "process_time (CPU s)",
           "load_average": {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]},
           "rows": rows, "min_pstep_speedup": {k: min(r[k]["speedup"] for r in rows) for k in keys}}
    if compile_rec:
        out["min_pstep_speedup_numba"] = {k: min(r[k]["speedup_numba"] for r in rows) for k in keys}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
