"""Scale benchmark of `icml lowrank compress`: a ~1 GB float32 safetensors checkpoint of square Linear weights.

Each mode runs in a fresh subprocess (peak RSS = the child's VmHWM; its own imports happen before the
baseline RSS is taken, so `peak_over_baseline` is what the work added):
  read       - every tensor read once through the same reader (icmltools.taskvec.open_checkpoint): the I/O floor,
  exact      - the streamed compression with exact SVD (rank ratio 1/3, factored safetensors output),
  randomized - the same with torch.svd_lowrank (q = r + 10, 2 power iterations).
Reported: seconds, GB/s of input, GB/s relative to the plain read in the same run, peak RSS over the
baseline as a multiple of the largest tensor (target <= ~3), and exact vs randomized error (max and mean
over layers: randomized >= exact by Eckart-Young). Everything written goes to a temporary folder, removed.

    python benchmarks/lowrank_compress.py                      # ~1 GB: 60 float32 2048 x 2048 weights
    python benchmarks/lowrank_compress.py --size-gb 0.1        # a quick smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _vm(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1


def generate(path: Path, size_gb: float, side: int) -> dict:
    """size_gb of float32 side x side weights (decaying spectra: W = U diag(s) V' would be costly; a
    product of two random thin-ish factors plus noise is cheap and has a spread spectrum) and biases."""
    import torch

    from icmltools.core.seed import derive
    from icmltools.taskvec import write_state_dict

    n = max(1, round(size_gb * 1e9 / (side * side * 4)))
    sd = {}
    for i in range(n):
        g = derive(0, "bench", i).torch()
        a = torch.randn(side, side // 4, generator=g) / side ** 0.5
        b = torch.randn(side // 4, side, generator=g)
        sd[f"layers.{i}.weight"] = a @ b + 0.1 * torch.randn(side, side, generator=g) / side ** 0.5
        sd[f"layers.{i}.bias"] = torch.zeros(side)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_state_dict(sd, path)
    return {"tensors": n, "side": side, "bytes": path.stat().st_size, "largest_tensor_bytes": side * side * 4}


def child(mode: str, path: str, out: str, threads: int) -> dict:
    import torch

    import icmltools.lowrank.compress as C
    from icmltools.lowrank.options import CompressConfig
    from icmltools.taskvec import open_checkpoint

    torch.set_num_threads(threads)
    warm = Path(out + "-warm")  # every code path once (LAPACK, safetensors, writer) before the baseline
    generate(warm / "w.safetensors", 64 * 64 * 4 * 2 / 1e9, 64)
    C.compress_checkpoint(warm / "w.safetensors", warm / "o", CompressConfig(svd=mode if mode != "read" else "exact"))
    base = _vm("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    res = {}
    if mode == "read":
        with open_checkpoint(path) as rd:  # positioned reads into one reused buffer per shape: real I/O
            bufs = {}
            for k, spec in rd.specs.items():
                buf = bufs.setdefault((spec.shape, spec.dtype), torch.empty(spec.shape, dtype=spec.dtype))
                rd.get_into(k, buf)
    else:
        r = C.compress_checkpoint(path, out, CompressConfig(svd=mode))
        res = {"max_err": r["totals"]["max_rel_fro_err"],
               "mean_err": sum(x["rel_fro_err"] for x in r["layers"]) / len(r["layers"]),
               "param_saving": r["totals"]["param_saving"], "bytes_out": r["totals"]["bytes_out"]}
    return {"mode": mode, "seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "baseline_rss": base, "peak_rss": _vm("VmHWM"), **res}


def run_child(mode, path, out, threads):
    p = subprocess.run([sys.executable, __file__, "--child", mode, "--path", str(path), "--out", str(out),
                        "--threads", str(threads)], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--side", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", default=None)
    ap.add_argument("--path", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.path, a.out, a.threads)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="lowrank-bench-"))
    try:
        info = generate(tmp / "model.safetensors", a.size_gb, a.side)
        rows = {m: run_child(m, tmp / "model.safetensors", tmp / f"out-{m}", a.threads)
                for m in ("read", "exact", "randomized")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gb = info["bytes"] / 1e9
    for r in rows.values():
        r["gb_per_s"] = gb / r["seconds"]
        r["vs_read"] = r["gb_per_s"] / (gb / rows["read"]["seconds"])
        r["peak_over_baseline_x_largest"] = (r["peak_rss"] - r["baseline_rss"]) / info["largest_tensor_bytes"]
    print(json.dumps({"checkpoint": info, "threads": a.threads, "load": os.getloadavg()[0], "modes": rows,
                      "randomized_vs_exact": {"time": rows["randomized"]["seconds"] / rows["exact"]["seconds"],
                                              "max_err": rows["randomized"]["max_err"] - rows["exact"]["max_err"]}},
                     indent=1))


if __name__ == "__main__":
    main()
