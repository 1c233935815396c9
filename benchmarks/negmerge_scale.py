"""Scale benchmark of `icml negmerge`: a ~1 GB safetensors base and N=10 candidates on disk.

Measures, each in a fresh subprocess (peak RSS = the child's own VmHWM from /proc/self/status; wall time
and the process's CPU time, which other jobs on a shared machine disturb less):
  read    - reading every tensor of the 11 files once through the same lazy reader (the I/O floor),
  stream  - the streamed NegMerge (icmltools.negmerge.merge.merge_to_checkpoint, lambda = 1), which checks
            every tensor read and written for NaN/inf (one reduction each),
  stream_unchecked - the same merge with the engine's separate torch finiteness check replaced by a no-op (with
            numba the compiled loops count non-finite values inside their own pass, so this no longer isolates
            the checks' cost; it did on the torch path),
  naive   - a plain torch merge that loads all 11 state_dicts (safetensors.torch.load_file), merges with
            torch.stack per tensor and saves with save_file.
Then checks that the two merged files are identical, deletes everything it wrote, and prints one JSON
document. Files live in a temporary folder under /tmp (warm page cache: they were just written).

    python benchmarks/negmerge_scale.py                 # ~1 GB x 11 files, ~12 GB of /tmp while running
    python benchmarks/negmerge_scale.py --size-gb 0.1   # a quick smoke run
    python benchmarks/negmerge_scale.py --size-gb 0.5 --skip-naive --ab-repeats 4   # the checks' cost, A/B

`--ab-repeats K` adds K rounds of stream and stream_unchecked in alternating order and reports the medians
(`finite_check_ab`): on a shared machine one pair of runs can differ by 2x with the other jobs' load.
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

SIDE = 4096


def _layout(size_gb: float):
    """~size_gb of float32: square weight matrices plus small biases and one integer buffer."""
    n_big = max(1, round(size_gb * 1e9 / (SIDE * SIDE * 4)))
    side = SIDE if size_gb >= 0.5 else max(256, int((size_gb * 1e9 / 4 / n_big) ** 0.5))
    specs = []
    for i in range(n_big):
        specs.append((f"layers.{i}.weight", (side, side)))
        specs.append((f"layers.{i}.bias", (side,)))
    return specs


def generate(folder: Path, size_gb: float, n: int) -> dict:
    """Base and n candidates; candidate i = base + 0.01 * (shifted shared noise) + a small bias of its own,
    written tensor by tensor so generation never holds a whole model."""
    import torch

    from icmltools.taskvec import CheckpointReader, CheckpointWriter, TensorSpec

    specs = _layout(size_gb)

    class Gen(CheckpointReader):
        format = "safetensors"

        def __init__(self, which: int):
            super().__init__(Path(f"<gen {which}>"))
            self.which = which
            self.specs = {k: TensorSpec(k, torch.float32, s) for k, s in specs}
            self.specs["step"] = TensorSpec("step", torch.int64, ())
            self.shards = [(None, list(self.specs))]

        def get(self, name):
            if name == "step":
                return torch.tensor(1000 + max(self.which, 0))
            seed = sum(map(ord, name))
            g = torch.Generator().manual_seed(seed)
            base = torch.randn(self.specs[name].shape, generator=g)
            if self.which < 0:
                return base
            noise = torch.randn(self.specs[name].shape, generator=g).reshape(-1)
            return base + 0.01 * (noise.roll(7919 * self.which).reshape(base.shape) + 0.3 + 0.05 * self.which)

    paths = {"base": folder / "base.safetensors", "candidates": []}
    t0 = time.perf_counter()
    for which in [-1] + list(range(n)):
        p = paths["base"] if which < 0 else folder / f"cand_{which:02d}.safetensors"
        g = Gen(which)
        with CheckpointWriter(g, p) as w:
            for name in w.order:
                w.write(name, g.get(name))
        if which >= 0:
            paths["candidates"].append(p)
    return {"seconds": time.perf_counter() - t0, "file_bytes": os.path.getsize(paths["base"]),
            "paths": paths}


# --------------------------------------------------------------------------------------------- children


def _paths(folder: Path, n: int):
    return folder / "base.safetensors", [folder / f"cand_{i:02d}.safetensors" for i in range(n)]


def _child_read(folder: Path, n: int) -> int:
    """Every tensor of the n + 1 files once, through the same positioned reads into a reused buffer as the merge."""
    import torch

    from icmltools.taskvec import open_checkpoint

    base, cands = _paths(folder, n)
    total = 0
    readers = [open_checkpoint(p) for p in [base] + cands]
    buf = None
    for name in readers[0].keys():
        spec = readers[0].specs[name]
        if buf is None or buf.numel() < spec.numel or buf.dtype != spec.dtype:
            buf = torch.empty(max(spec.numel, 1), dtype=spec.dtype)
        for r in readers:
            r.get_into(name, buf[: spec.numel].view(spec.shape))
            total += spec.nbytes
    return total


def _child_stream(folder: Path, n: int) -> int:
    from icmltools.negmerge import merge as M
    from icmltools.taskvec import open_checkpoint

    base, cands = _paths(folder, n)
    stats = M.merge_to_checkpoint(open_checkpoint(base), [open_checkpoint(p) for p in cands], M.MergeConfig(),
                                  1.0, folder / "out_stream.safetensors")
    return stats.bytes_read


def _child_stream_unchecked(folder: Path, n: int) -> int:
    """The streamed merge with the per-tensor finiteness checks replaced by a no-op (what they cost)."""
    import icmltools.merge.engine as E

    E.all_finite = lambda t: True
    return _child_stream(folder, n)


def _child_naive(folder: Path, n: int) -> int:
    """Load all n + 1 state_dicts, merge with torch.stack per tensor, save."""
    import torch
    from safetensors.torch import load_file, save_file

    base, cands = _paths(folder, n)
    b = load_file(str(base))
    cs = [load_file(str(p)) for p in cands]
    out = {}
    for k, v in b.items():
        if not v.is_floating_point():
            out[k] = v
            continue
        st = torch.stack([c[k] for c in cs]) - v
        mask = torch.sign(st).sum(0).abs() == len(cs)
        tau = torch.where(mask, st.sum(0) / len(cs), torch.zeros(()))
        out[k] = v - 1.0 * tau
        del st, mask, tau
    save_file(out, str(folder / "out_naive.safetensors"))
    return sum(os.path.getsize(p) for p in [base] + cands)


def _compare(folder: Path) -> dict:
    import torch

    from icmltools.taskvec import open_checkpoint

    a, b2 = open_checkpoint(folder / "out_stream.safetensors"), open_checkpoint(folder / "out_naive.safetensors")
    worst = 0.0
    equal = set(a.keys()) == set(b2.keys())
    for k in a.keys():
        x, y = a.get(k), b2.get(k)
        if x.is_floating_point():
            worst = max(worst, float((x - y).abs().max()))
        else:
            equal &= bool(torch.equal(x, y))
    return {"same_keys_and_buffers": equal, "max_abs_diff": worst}


CHILDREN = {"read": _child_read, "stream": _child_stream, "stream_unchecked": _child_stream_unchecked,
            "naive": _child_naive}


def child(mode: str, folder: Path, n: int) -> dict:
    """One measurement in this (fresh) process: seconds, bytes, GB/s and peak RSS."""
    import torch

    torch.set_num_threads(1)
    if mode == "compare":
        return _compare(folder)
    if mode not in CHILDREN:
        raise SystemExit(f"unknown mode {mode}")
    # every mode's imports happen before the RSS baseline and the clock
    import safetensors.torch  # noqa: F401

    import icmltools.negmerge.merge  # noqa: F401
    import icmltools.taskvec  # noqa: F401

    rss_after_imports = _measure.vm("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    nbytes = CHILDREN[mode](folder, n)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": round(dt, 3), "cpu_seconds": round(cpu, 3), "bytes": nbytes,
            "gb_per_s": round(nbytes / 1e9 / dt, 3), "gb_per_cpu_s": round(nbytes / 1e9 / cpu, 3),
            "peak_rss_gb": round(_measure.vm("VmHWM") / 1e9, 3), "rss_after_imports_gb": round(rss_after_imports / 1e9, 3)}


def run_child(mode: str, folder: Path, n: int, timeout: float) -> dict:
    return _measure.run_child(__file__, ["--child", mode, "--dir", folder, "--n", n], timeout)


def _ab(folder: Path, n: int, rounds: int) -> dict:
    """`rounds` rounds of (stream, stream_unchecked), the order alternating; medians of wall and CPU throughput."""
    import statistics

    runs: dict = {"stream": [], "stream_unchecked": []}
    for r in range(rounds):
        for mode in ("stream", "stream_unchecked") if r % 2 == 0 else ("stream_unchecked", "stream"):
            runs[mode].append(run_child(mode, folder, n, 1800))
    out: dict = {"rounds": rounds}
    for mode, rows in runs.items():
        for key in ("gb_per_s", "gb_per_cpu_s"):
            vals = [x[key] for x in rows if key in x]
            out[f"{mode}_{key}"] = vals
            out[f"{mode}_{key}_median"] = statistics.median(vals) if vals else None
    a, b = out["stream_gb_per_cpu_s_median"], out["stream_unchecked_gb_per_cpu_s_median"]
    out["checked_over_unchecked_cpu_throughput"] = round(a / b, 3) if a and b else None
    a, b = out["stream_gb_per_s_median"], out["stream_unchecked_gb_per_s_median"]
    out["checked_over_unchecked_wall_throughput"] = round(a / b, 3) if a and b else None
    return out


def _ratios(doc: dict, model_bytes: int) -> None:
    """Throughput and memory ratios between the measured modes (those that ran) into doc["ratios"]."""
    s, r, nv, su = doc["stream"], doc["read"], doc.get("naive", {}), doc["stream_unchecked"]
    ratios = {}
    if "gb_per_s" in s and "gb_per_s" in r:
        ratios["stream_over_read_throughput"] = round(s["gb_per_s"] / r["gb_per_s"], 3)
    if "gb_per_s" in s and "gb_per_s" in su:
        ratios["stream_over_unchecked_throughput"] = round(s["gb_per_s"] / su["gb_per_s"], 3)
    if "gb_per_s" in s and "gb_per_s" in nv:
        ratios["stream_over_naive_throughput"] = round(s["gb_per_s"] / nv["gb_per_s"], 3)
        ratios["naive_over_stream_peak_rss"] = round(nv["peak_rss_gb"] / s["peak_rss_gb"], 3)
    if "peak_rss_gb" in s:
        ratios["stream_peak_rss_over_model_size"] = round(s["peak_rss_gb"] * 1e9 / model_bytes, 3)
        doc["target_peak_rss_below_2_5_gb"] = s["peak_rss_gb"] < 2.5
    doc["ratios"] = ratios


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=1.0, help="size of each model (float32)")
    ap.add_argument("--n", type=int, default=10, help="number of candidates")
    ap.add_argument("--tmp", default="/tmp", help="parent folder of the temporary files")
    ap.add_argument("--skip-naive", action="store_true", help="do not run the load-everything baseline")
    ap.add_argument("--ab-repeats", type=int, default=0,
                    help="extra alternating rounds of stream / stream_unchecked (the finiteness checks' cost)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, Path(a.dir), a.n)))
        return
    import torch

    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="negmerge_scale_", dir=a.tmp))
    doc: dict = {"benchmark": "negmerge_scale", "config": {"size_gb": a.size_gb, "n_candidates": a.n,
                 "threads": 1, "dtype": "float32", "page_cache": "warm (files just written)"}}
    try:
        gen = generate(folder, a.size_gb, a.n)
        model_bytes = gen["file_bytes"]
        doc["generate"] = {"seconds": round(gen["seconds"], 2), "model_gb": round(model_bytes / 1e9, 3),
                           "total_gb_on_disk": round(model_bytes * (a.n + 1) / 1e9, 3)}
        doc["read"] = run_child("read", folder, a.n, 1800)
        doc["stream"] = run_child("stream", folder, a.n, 1800)
        doc["stream_unchecked"] = run_child("stream_unchecked", folder, a.n, 1800)
        if a.ab_repeats > 0:
            doc["finite_check_ab"] = _ab(folder, a.n, a.ab_repeats)
        need = model_bytes * (a.n + 3)
        if a.skip_naive:
            doc["naive"] = {"skipped": "--skip-naive"}
        elif _measure.mem_available() < need + 3e9:
            doc["naive"] = {"skipped": f"needs ~{need / 1e9:.1f} GB, only {_measure.mem_available() / 1e9:.1f} GB available"}
        else:
            doc["naive"] = run_child("naive", folder, a.n, 1800)
            if "error" not in doc["naive"]:
                doc["outputs"] = run_child("compare", folder, a.n, 1800)
        _ratios(doc, model_bytes)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        doc["cleaned_up"] = not folder.exists()
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
