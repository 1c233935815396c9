"""Benchmark of `icml cabs-merge` on files: CABS, BS and CA-magnitude next to task arithmetic and a plain read.

    python benchmarks/cabs_merge.py                    # base + 4 models of ~1.19 GB each, bf16 (the spec's layout)
    python benchmarks/cabs_merge.py --gb 0.3 --methods cabs,task_arithmetic

The models are generated in a temporary folder (removed at the end): a Llama-like layout (embedding and head
32000 x 2048, blocks of 4 x 2048^2 + 3 x 2048 x 5632, the number of blocks chosen for --gb) in bfloat16, single
.safetensors files. Each measurement runs in a fresh process: a plain read of the same five files through the same
reader (the floor, one thread), then `icml cabs-merge --method M --nm 4:32 --threads T` (--threads, default every
core) for every method, writing the
merged checkpoint. Reported per method: seconds, GB/s of checkpoint read (base + models, once), peak RSS of the
child (ru_maxrss), and the ratios to the plain read and to task arithmetic measured in the same run. One JSON
document on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from merge_engine import layout  # benchmarks/merge_engine.py: the Llama layout, here without the norms (spec)

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("task_arithmetic", "cabs", "bs", "ca_magnitude")
RSS_TARGET_GB, SECONDS_TARGET = 2.5, 60.0

READ = """
import sys, time
from icmltools.taskvec import open_checkpoint
t0 = time.perf_counter(); n = 0
for p in sys.argv[1:]:
    r = open_checkpoint(p)
    for k in r.keys():
        n += r.get(k).numel()
print(time.perf_counter() - t0)
"""


def generate(folder: Path, gb: float, n: int) -> list[Path]:
    """base.safetensors and model_i.safetensors (base + small noise), one tensor in memory at a time per file."""
    import torch
    from safetensors.torch import save_file

    from icmltools.core.seed import derive

    shapes = layout(gb, norms=False)
    paths = [folder / "base.safetensors"] + [folder / f"model_{i}.safetensors" for i in range(n)]
    g = derive(0, "bench-cabs").torch()
    base = {k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes}
    save_file(base, str(paths[0]))
    for p in paths[1:]:
        save_file({k: (v.float() + 0.01 * torch.randn(v.shape, generator=g)).to(torch.bfloat16)
                   for k, v in base.items()}, str(p))
    return paths


def child(argv: list[str]) -> tuple[float, float, str]:
    """Run a child with one thread: (wall seconds, peak RSS GB of the children so far, stdout)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{argv[:4]}... failed: {out.stderr[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) * 1024 / 1e9, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.19)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--nm", default="4:32")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="--threads of each merge")
    ap.add_argument("--generate", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        generate(Path(args.generate), args.gb, args.n)
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench_cabs_"))
    try:
        # generated in a child: Linux keeps a process's peak RSS across fork + exec, so a parent that held the
        # models would show its own peak in every measuring child
        child([sys.executable, __file__, "--generate", str(tmp), "--gb", str(args.gb), "--n", str(args.n)])
        paths = [tmp / "base.safetensors"] + [tmp / f"model_{i}.safetensors" for i in range(args.n)]
        nbytes = sum(p.stat().st_size for p in paths)
        child([sys.executable, "-c", READ, *map(str, paths)])            # warm the page cache
        wall, _, out = child([sys.executable, "-c", READ, *map(str, paths)])
        read_s = float(out.strip().splitlines()[-1])
        rows = {"read": {"seconds": read_s, "gb_per_s": nbytes / 1e9 / read_s}}
        for m in args.methods.split(","):
            wall, rss, out = child([sys.executable, "-m", "icmltools", "cabs-merge", "-q", "--threads", str(args.threads),
                                    "--base", str(paths[0]), "--models", ",".join(map(str, paths[1:])),
                                    "--method", m, "--nm", args.nm, "--out", str(tmp / f"out_{m}")])
            res = json.loads(out)["result"]
            rows[m] = {"seconds": res["seconds"], "wall_s": wall, "gb_per_s": nbytes / 1e9 / res["seconds"],
                       "peak_rss_gb": res["peak_rss_gb"], "fraction_of_read": read_s / res["seconds"],
                       "max_pairwise_overlap": (res.get("overlap") or {}).get("max_pairwise"),
                       "kept_fraction": [x["kept_fraction"] for x in res["models"]]}
            shutil.rmtree(tmp / f"out_{m}", ignore_errors=True)
        ta = rows.get("task_arithmetic")
        for m, r in rows.items():
            if ta and m not in ("read", "task_arithmetic"):
                r["speed_vs_task_arithmetic"] = ta["seconds"] / r["seconds"]
            if m != "read":
                r["meets_rss_target"] = r["peak_rss_gb"] < RSS_TARGET_GB
                r["meets_seconds_target"] = r["seconds"] < SECONDS_TARGET
        print(json.dumps({"gb_per_model": args.gb, "n_models": args.n, "bytes_read": nbytes, "nm": args.nm,
                          "cpu_count": os.cpu_count(), "threads": args.threads, "load_avg": os.getloadavg(), "rows": rows,
                          "targets": {"peak_rss_gb": RSS_TARGET_GB, "seconds": SECONDS_TARGET}}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
