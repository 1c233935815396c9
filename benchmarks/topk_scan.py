"""The top-k scan's threshold selection (kernels.radix_select_tau) on bf16 task vectors, against its floor.

Times, on the same tensors in one process: the selection as the engine runs it (a sample names the buckets, the
high pass counts their low histograms: one pass over tau), the same selection with the windows switched off (the
high pass, then a low pass over tau for the bucket of the k-th), and the plain high histogram pass alone (the
floor of any selection by histograms). Prints one JSON document: seconds (best of --repeat), ns per element and
the ratios to the floor. Tensors: generated (a base ~ N(0, 0.02) in bf16 and a fine-tuned copy, tau ~ N(0,
0.002) rounded to bf16), or the largest tensors of --base/--model safetensors files.

    python benchmarks/topk_scan.py                     # generated, 2^24 elements, densities 0.1 0.3 0.5
    python benchmarks/topk_scan.py --base B --model M  # the checkpoints' 4 largest tensors
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial

from _measure import best_of  # benchmarks/_measure.py


def _tensors(args):
    import torch

    if args.base is None:
        g = torch.Generator().manual_seed(args.seed)
        base = (torch.randn(args.numel, generator=g) * 0.02).to(torch.bfloat16)
        raw = (base.float() + torch.randn(args.numel, generator=g) * 0.002).to(torch.bfloat16)
        return [("generated", raw, base)]
    from safetensors import safe_open

    with safe_open(args.base, "pt") as b, safe_open(args.model, "pt") as m:
        sizes = {k: int(torch.Size(b.get_slice(k).get_shape()).numel()) for k in b.keys()}
        names = sorted(sizes, key=lambda k: -sizes[k])[: args.tensors]
        return [(k, m.get_tensor(k).reshape(-1), b.get_tensor(k).reshape(-1)) for k in names]


def _select(K, raw, base, ks, window_min):
    """K.radix_select_tau with K.WINDOW_MIN set for the call (the tensors below it skip the sample)."""
    old, K.WINDOW_MIN = K.WINDOW_MIN, window_min
    try:
        return K.radix_select_tau(raw, base, ks)
    finally:
        K.WINDOW_MIN = old


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="base safetensors file (default: generated tensors)")
    ap.add_argument("--model", help="fine-tuned safetensors file (with --base)")
    ap.add_argument("--tensors", type=int, default=4, help="largest tensors taken from the files")
    ap.add_argument("--numel", type=int, default=1 << 24, help="generated tensor's elements")
    ap.add_argument("--densities", default="0.1,0.3,0.5")
    ap.add_argument("--threads", type=int, default=None, help="numba threads (default: every core)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if (args.base is None) != (args.model is None):
        ap.error("--base and --model go together")

    import numpy as np

    from icmltools.core.device import set_threads
    from icmltools.merge import kernels as K

    if not K.available():
        print(json.dumps({"error": "numba is not available"}))
        return 1
    if args.threads:
        set_threads(args.threads)
    km = K._mod()
    tensors = _tensors(args)
    dens = [float(d) for d in args.densities.split(",")]
    window_min = K.WINDOW_MIN

    best = partial(best_of, repeat=args.repeat)

    rows = []
    for name, raw, base in tensors:
        n = raw.numel()
        for d in dens:
            ks = [int(d * n)]

            windows = partial(_select, K, raw, base, ks, window_min)
            two_passes = partial(_select, K, raw, base, ks, 1 << 62)  # no sample: the low pass runs
            floor = partial(km.hist_hi_tau, K._np(raw).reshape(-1), K._np(base).reshape(-1),
                            np.zeros(1 << 15, np.int64), None)
            if windows() != two_passes():
                raise SystemExit(f"{name}: the windowed selection differs from two passes")
            before = dict(K.WINDOWS)
            t = {"windows": best(windows), "two_passes": best(two_passes), "high_pass_alone": best(floor)}
            hit = K.WINDOWS["hit"] > before["hit"]
            rows.append({"tensor": name, "numel": n, "density": d, "windows_hit": hit,
                         "seconds": {k: round(v, 5) for k, v in t.items()},
                         "ns_per_element": {k: round(v / n * 1e9, 3) for k, v in t.items()},
                         "windows_x_high_pass": round(t["windows"] / t["high_pass_alone"], 3),
                         "windows_x_two_passes": round(t["windows"] / t["two_passes"], 3)})
    print(json.dumps({"threads": km.numba.get_num_threads(), "repeat": args.repeat, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
