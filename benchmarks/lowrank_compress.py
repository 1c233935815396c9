"""Scale benchmark of `icml lowrank compress`: a ~1 GB float32 (or `--dtype`) safetensors checkpoint of square
Linear weights.

Each mode runs in a fresh subprocess (benchmarks/_measure.py): imports and a tiny warm-up compression first, then
the peak resident set is reset (/proc/self/clear_refs) and the baseline RSS read, so `peak over baseline` is what
the work added (tracemalloc cannot see torch's or LAPACK's buffers; the kernel's VmHWM does):
  read       - every tensor read once through the same reader (icmltools.taskvec.open_checkpoint): the I/O floor,
  exact      - the streamed compression with the exact solver (rank ratio 1/3, factored safetensors output),
  randomized - the same with the randomized SVD (q = r + 10, 2 power iterations).
Reported: seconds (and CPU seconds), GB/s of input, GB/s relative to the plain read in the same run, peak RSS over
the baseline as a multiple of the largest tensor (target <= ~3), and exact vs randomized time and error (max and
mean over layers: randomized >= exact by Eckart-Young). `--breakdown` adds, on one tensor of the largest shape,
the peak of each stage alone (reading with and without a memory map, LAPACK's SVD, the Gram solver, torch's and
our randomized SVD, the singular values of the energy pass): where the memory goes. Everything written goes to
a temporary folder, removed at the end.

    python benchmarks/lowrank_compress.py                      # ~1 GB: 60 float32 2048 x 2048 weights
    python benchmarks/lowrank_compress.py --size-gb 0.1 --breakdown   # a quick run with the per-stage peaks
    python benchmarks/lowrank_compress.py --size-gb 0.05 --dtype bfloat16   # 16-bit weights (x their own bytes)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import _measure  # benchmarks/_measure.py: RSS from /proc, fresh-process runs


def generate(path: Path, size_gb: float, side: int, dtype: str = "float32") -> dict:
    """size_gb of side x side weights (decaying spectra: W = U diag(s) V' would be costly; a product of two
    random thin-ish factors plus noise is cheap and has a spread spectrum) and biases, stored as `dtype`."""
    import torch

    from icmltools.core.seed import derive
    from icmltools.taskvec import write_state_dict

    dt = getattr(torch, dtype)
    n = max(1, round(size_gb * 1e9 / (side * side * dt.itemsize)))
    sd = {}
    for i in range(n):
        g = derive(0, "bench", i).torch()
        a = torch.randn(side, side // 4, generator=g) / side ** 0.5
        b = torch.randn(side // 4, side, generator=g)
        sd[f"layers.{i}.weight"] = (a @ b + 0.1 * torch.randn(side, side, generator=g) / side ** 0.5).to(dt)
        sd[f"layers.{i}.bias"] = torch.zeros(side, dtype=dt)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_state_dict(sd, path)
    return {"tensors": n, "side": side, "dtype": dtype, "bytes": path.stat().st_size,
            "largest_tensor_bytes": side * side * dt.itemsize}


def _read_all(path: str) -> dict:
    """Positioned reads of every tensor into one reused buffer per shape (real I/O, no memory map)."""
    import torch

    from icmltools.taskvec import open_checkpoint

    with open_checkpoint(path) as rd:
        bufs = {}
        for k, spec in rd.specs.items():
            rd.get_into(k, bufs.setdefault((spec.shape, spec.dtype), torch.empty(spec.shape, dtype=spec.dtype)))
    return {}


def _compress(mode: str, path: str, out: str) -> dict:
    import icmltools.lowrank.compress as C
    from icmltools.lowrank.options import CompressConfig

    r = C.compress_checkpoint(path, out, CompressConfig(svd=mode))
    errs = [x["rel_fro_err"] for x in r["layers"]]
    return {"max_err": max(errs), "mean_err": sum(errs) / len(errs), "solvers": sorted({x["solver"] for x in r["layers"]}),
            "param_saving": r["totals"]["param_saving"], "bytes_out": r["totals"]["bytes_out"]}


def _stage(name: str, path: str) -> dict:
    """One stage alone on the first tensor of the file (rank 1/3)."""
    import torch

    from icmltools.core.seed import derive
    from icmltools.lowrank import svd
    from icmltools.lowrank.compress import read_checked, row_source
    from icmltools.taskvec import open_checkpoint

    with open_checkpoint(path) as rd:
        key = next(k for k, s in rd.specs.items() if len(s.shape) == 2)
        r = min(rd.specs[key].shape) // 3
        if name == "get_mmap":
            w = rd.get(key)
            return {"sum": float(w.sum())}
        w = read_checked(rd, key)
        stages = {
            "get_into": lambda: None,
            "lapack_svd_old_exact": lambda: torch.linalg.svd(w, full_matrices=False),
            "gram_exact": lambda: svd.exact(row_source(rd, key, "cpu"), r),
            "torch_svd_lowrank_old_randomized": lambda: torch.svd_lowrank(w, q=r + 10, niter=2),
            "randomized_halko": lambda: svd.randomized(w, r, 10, 2, derive(0, "bench")),
            "svdvals_energy_pass": lambda: torch.linalg.svdvals(w),
        }
        if name == "gram_exact":
            del w       # the compressor hands the solver a row-block reader, not a tensor
        stages[name]()
    return {}


STAGES = ("get_mmap", "get_into", "lapack_svd_old_exact", "gram_exact", "torch_svd_lowrank_old_randomized",
          "randomized_halko", "svdvals_energy_pass")


def child(mode: str, path: str, out: str, threads: int) -> dict:
    import torch

    import icmltools.lowrank.compress as C
    from icmltools.lowrank.options import CompressConfig

    torch.set_num_threads(threads)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)   # scipy's OpenBLAS (the Gram solver's eigh)
    except ImportError:
        pass
    warm = Path(out + "-warm")  # every code path once (LAPACK, safetensors, writer) before the baseline
    generate(warm / "w.safetensors", 64 * 64 * 4 * 2 / 1e9, 64)
    for svd_mode in ("exact", "randomized"):
        C.compress_checkpoint(warm / "w.safetensors", warm / f"o-{svd_mode}", CompressConfig(svd=svd_mode))
    _stage("lapack_svd_old_exact", str(warm / "w.safetensors"))
    _stage("torch_svd_lowrank_old_randomized", str(warm / "w.safetensors"))
    reset = _measure.reset_peak()
    base = _measure.vm("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "read":
        res = _read_all(path)
    elif mode in STAGES:
        res = _stage(mode, path)
    else:
        res = _compress(mode, path, out)
    return {"mode": mode, "seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "baseline_rss": base, "peak_rss": _measure.vm("VmHWM"), "peak_reset": reset, **res}


def run_child(mode, path, out, threads):
    return _measure.run_child(__file__, ["--child", mode, "--path", path, "--out", out, "--threads", threads],
                              threads=threads)


def summarise(info: dict, rows: dict) -> dict:
    """GB/s, ratio to the plain read and peak RSS over the baseline in units of the largest tensor."""
    gb, big = info["bytes"] / 1e9, info["largest_tensor_bytes"]
    read_s = rows["read"].get("seconds")
    for r in rows.values():
        if "error" in r:
            continue
        r["gb_per_s"] = gb / r["seconds"]
        r["vs_read"] = r["gb_per_s"] / (gb / read_s) if read_s else None
        r["peak_over_baseline_x_largest"] = round((r["peak_rss"] - r["baseline_rss"]) / big, 2)
    ex, rn = rows.get("exact", {}), rows.get("randomized", {})
    if "seconds" in ex and "seconds" in rn:
        return {"time": rn["seconds"] / ex["seconds"], "max_err_minus_exact": rn["max_err"] - ex["max_err"],
                "mean_err_minus_exact": rn["mean_err"] - ex["mean_err"]}
    return {}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--side", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", help="weights stored as float32, bfloat16 or float16")
    ap.add_argument("--modes", default="read,exact,randomized", help="which of read,exact,randomized to run")
    ap.add_argument("--breakdown", action="store_true", help="also each stage alone on one tensor")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.path, a.out, a.threads)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="lowrank-bench-"))
    t0 = time.perf_counter()
    try:
        info = generate(tmp / "model.safetensors", a.size_gb, a.side, a.dtype)
        rows = {m: run_child(m, tmp / "model.safetensors", tmp / f"out-{m}", a.threads)
                for m in ["read"] + [m for m in a.modes.split(",") if m != "read"]}
        stages = {s: run_child(s, tmp / "model.safetensors", tmp / f"out-{s}", a.threads)
                  for s in (STAGES if a.breakdown else ())}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    versus = summarise(info, rows)
    for r in stages.values():
        if "error" not in r:
            r["peak_over_baseline_x_largest"] = round((r["peak_rss"] - r["baseline_rss"]) / info["largest_tensor_bytes"], 2)
    doc = {"checkpoint": info, "threads": a.threads, "load_1min": os.getloadavg()[0], "wall_s": time.perf_counter() - t0,
           "modes": rows, "randomized_vs_exact": versus}
    if stages:
        doc["stages_one_tensor"] = {k: {x: v.get(x) for x in ("peak_over_baseline_x_largest", "seconds", "error")
                                        if x in v} for k, v in stages.items()}
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
