"""Where DARE's merge time goes: its two compiled loops against task arithmetic's, on the same chunk.

Times, in one process, on one chunk of every model (bf16, the engine's chunk of 2^21 elements by default), each
writing the bf16 output as a merge does: task arithmetic's one-pass loop (kernels.sum_raw: the floor of a loop
over every model's chunk), DARE's and DARE-TIES' combining loop on given keep masks (the fused loop alone), the
keep masks alone (one MT19937 stream per model, the models' streams in parallel) and the whole of
kernels.dare_merge_raw (masks, then the loop: what the engine runs). Prints one JSON document: seconds (best of
--repeat), ns per model and element, and each row's ratio to task arithmetic's loop. Tensors: generated (a base
~ N(0, 0.02) and fine-tuned copies, tau ~ N(0, 0.001), in bf16), or the first chunk of the largest tensor of
--base / --models safetensors files.

    python benchmarks/dare_loops.py                        # generated, 4 models, density 0.2, one thread
    python benchmarks/dare_loops.py --base B --models M1 M2 M3 M4 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys

from _measure import best_of  # benchmarks/_measure.py


def _chunk(args):
    """(base, [raws]) bf16 chunks of args.numel elements."""
    import torch

    if args.base is None:
        g = torch.Generator().manual_seed(args.seed)
        base = (torch.randn(args.numel, generator=g) * 0.02).to(torch.bfloat16)
        return base, [(base.float() + torch.randn(args.numel, generator=g) * 0.001).to(torch.bfloat16)
                      for _ in range(args.n)]
    from safetensors import safe_open

    with safe_open(args.base, "pt") as b:
        name = max(b.keys(), key=lambda k: torch.Size(b.get_slice(k).get_shape()).numel())
        base = b.get_tensor(name).reshape(-1)[: args.numel].clone()
    raws = []
    for p in args.models:
        with safe_open(p, "pt") as m:
            raws.append(m.get_tensor(name).reshape(-1)[: args.numel].clone())
    return base, raws


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="base safetensors file (default: generated tensors)")
    ap.add_argument("--models", nargs="+", help="fine-tuned safetensors files (with --base)")
    ap.add_argument("--n", type=int, default=4, help="generated models")
    ap.add_argument("--numel", type=int, default=1 << 21, help="elements of the chunk")
    ap.add_argument("--density", type=float, default=0.2, help="DARE's density (p = 1 - density)")
    ap.add_argument("--threads", type=int, default=1, help="numba threads")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if (args.base is None) != (args.models is None):
        ap.error("--base and --models go together")
    if not 0.0 < args.density <= 1.0:
        ap.error("--density must be in (0, 1]")

    import numpy as np
    import torch

    from icmltools.core.device import numba_wide_vectors, set_threads
    from icmltools.merge import kernels as K

    if not K.available():
        print(json.dumps({"error": "numba is not available"}))
        return 1
    set_threads(args.threads)
    km = K._mod()
    base, raws = _chunk(args)
    k, n = len(raws), base.numel()
    if not 1 <= k <= K.MAX_ONE_PASS:
        ap.error(f"1 to {K.MAX_ONE_PASS} models")
    b, rs = K._one_pass(base, raws)
    p = 1.0 - args.density
    out, oe = torch.empty(n), torch.empty(n, dtype=torch.bfloat16)
    ea = K._emit_args(base, (oe, 1.0, 1))  # the output written, as a merge does
    emit = K._emit_flagged(b, ea)
    ws = np.ones(k)
    ds = np.full(k, np.float32(1.0 - p), np.float64)  # the divisor as kernels.dare_merge_raw makes it
    thrs = np.full(k, K._dare_thr(p), np.int64)
    streams = [K.mt_stream(args.seed + i) for i in range(k)]
    mts = np.stack([s.mt for s in streams])
    state = K.line_aligned_zeros(mts.shape, np.uint32)  # as kernels.dare_merge_raw hands them to dare_masks
    masks = np.empty((k, n), np.uint8)
    buf = torch.empty(K.MAX_ONE_PASS * n, dtype=torch.uint8)

    def draw():
        state[:] = mts
        km.dare_masks(state, np.full(k, 624, np.int64), thrs, masks)

    draw()

    def combine(consensus):
        return lambda: km.dare_merge_raw(b, rs, masks, ds, ws, consensus, True, out.numpy(), *emit)

    rows = {
        "task_arithmetic_loop": lambda: km.sum_raw(b, rs, ws, out.numpy(), 0, *ea),
        "dare_loop": combine(False),
        "dare_ties_loop": combine(True),
        "dare_masks": draw,
        "dare_whole": lambda: K.dare_merge_raw(base, raws, streams, [p] * k, [1.0] * k, False, True, True, out, buf,
                                               emit=(oe, 1.0, 1)),
    }
    res = {}
    for name, fn in rows.items():
        s = best_of(fn, args.repeat)
        res[name] = {"seconds": round(s, 6), "ns_per_model_element": round(s / (k * n) * 1e9, 4)}
    floor = res["task_arithmetic_loop"]["seconds"]
    for r in res.values():
        r["ratio_to_task_arithmetic_loop"] = round(r["seconds"] / floor, 3)
    import numba

    print(json.dumps({"models": k, "numel": n, "density": args.density, "threads": args.threads,
                      "numba_cpu_features_set": numba.config.CPU_FEATURES is not None and not numba_wide_vectors(),
                      "numba_512_bit": numba_wide_vectors(),  # set by core.device._wide_vectors, not the user
                      "generated": args.base is None, "results": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
