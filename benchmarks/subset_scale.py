"""Scale benchmark for `icml subset-select`: N = 10^6 samples, d = 768, K = 3 synthetic extractors.

Writes K float32 feature matrices chunk by chunk as memory-mapped `.npy` files under a temporary folder
in /tmp (removed at the end), then runs each method through the real CLI in a fresh subprocess and
records wall time and the child's peak RSS (os.wait4). Baselines measured in the same run: one plain
chunked read of the K files (the I/O floor), MIN (one extractor) and random selection. k-center and
graph-cut cost O(p * sum_c n_c^2 * d) (greedy, one matvec per pick); at full N they run at
`--greedy-rate` (default 0.01); their cost at the headline rate is extrapolated from the measured
per-pick time and labelled as such. Prints one JSON document.

    python benchmarks/subset_scale.py                       # the full configuration (~10-20 min, 10 GB in /tmp)
    python benchmarks/subset_scale.py --n 20000 --d 64      # a quick smoke run
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

import numpy as np


def generate(folder: str, n: int, d: int, k: int, classes: int, seed: int, chunk: int = 50_000,
             small_n: int = 0) -> dict:
    """K views of a class-structured problem, float32, written chunk-wise (peak memory ~ one chunk)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n).astype(np.int64)
    np.save(os.path.join(folder, "labels.npy"), y)
    paths = []
    t0 = time.perf_counter()
    for v in range(k):
        centres = (rng.standard_normal((classes, d), dtype=np.float32) * (0.35 + 0.1 * v)).astype(np.float32)
        sigma = np.float32(1.0 + 0.25 * v)
        path = os.path.join(folder, f"view{v}.npy")
        mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            block = rng.standard_normal((e - s, d), dtype=np.float32)
            block *= sigma
            block += centres[y[s:e]]
            mm[s:e] = block
        mm.flush()
        del mm
        paths.append(path)
    out = {"paths": paths, "labels": os.path.join(folder, "labels.npy"), "gen_s": time.perf_counter() - t0}
    if small_n:  # the first small_n rows of view 0, for the greedy methods at the headline rate
        src = np.load(paths[0], mmap_mode="r")
        np.save(os.path.join(folder, "small_view0.npy"), np.asarray(src[:small_n]))
        np.save(os.path.join(folder, "small_labels.npy"), y[:small_n])
        del src
        out.update(small_path=os.path.join(folder, "small_view0.npy"),
                   small_labels=os.path.join(folder, "small_labels.npy"))
    return out


def run_child(argv: list[str], folder: str, name: str) -> dict:
    """Run argv in a fresh process; wall time and that child's peak RSS (KiB -> MiB)."""
    out_path = os.path.join(folder, f"{name}.json")
    err_path = os.path.join(folder, f"{name}.err")
    t0 = time.perf_counter()
    with open(out_path, "w") as fo, open(err_path, "w") as fe:
        p = subprocess.Popen(argv, stdout=fo, stderr=fe)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    rec = {"wall_s": round(wall, 2), "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
           "peak_rss_mib": round(ru.ru_maxrss / 1024, 1), "exit": p.returncode}
    if p.returncode != 0:
        rec["stderr_tail"] = open(err_path).read()[-600:]
        return rec
    try:
        doc = json.load(open(out_path))
        if not isinstance(doc, dict):
            return rec
        rec["inner_timing"] = doc.get("timing")
        rec["result"] = doc.get("result")
    except (OSError, ValueError):
        pass
    return rec


READ_PASS = """
import sys, numpy as np
tot = 0.0
for p in sys.argv[1:]:
    X = np.load(p, mmap_mode="r")
    for s in range(0, X.shape[0], 10922):
        tot += float(np.asarray(X[s:s+10922], dtype=np.float64).sum())
    del X
print(tot)
"""

GREEDY_STEP = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[4]))
from icmltools.subset.engine import Engine
e = Engine("cpu")
n, d, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
X = torch.randn(n, d)
out = {}
for m, f in (("kcenter", lambda: e.kcenter_order(X, steps, 0)), ("graphcut", lambda: e.graphcut_order(X, steps))):
    t = time.perf_counter(); f(); out[m] = (time.perf_counter() - t) / steps
print(out)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0.1, help="rate of RAM-APL / MIN / random")
    ap.add_argument("--greedy-rate", type=float, default=0.01, help="rate of k-center / graph-cut at full N")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small-n", type=int, default=100_000,
                    help="also run k-center / graph-cut at --rate on the first SMALL_N rows (0: skip)")
    ap.add_argument("--skip", default="", help="comma-separated methods to skip")
    ap.add_argument("--generate-only", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate_only:
        print(json.dumps(generate(args.generate_only, args.n, args.d, args.k, args.classes, args.seed,
                                  small_n=args.small_n)))
        return
    skip = set(filter(None, args.skip.split(",")))
    folder = tempfile.mkdtemp(prefix="icml_subset_scale_", dir="/tmp")
    report: dict = {"config": {k: v for k, v in vars(args).items() if k != "generate_only"}, "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}}
    try:
        # generate in a child process: a forked child's ru_maxrss starts at the parent's RSS, so the parent
        # must never hold big pages itself
        gen = subprocess.run([sys.executable, __file__, "--generate-only", folder, "--n", str(args.n), "--d",
                              str(args.d), "--k", str(args.k), "--classes", str(args.classes), "--seed",
                              str(args.seed), "--small-n", str(args.small_n)], capture_output=True, text=True,
                             check=True)
        data = json.loads(gen.stdout)
        one = os.path.getsize(data["paths"][0]) / 2**20
        report["data"] = {"generate_s": round(data["gen_s"], 1), "one_matrix_mib": round(one, 1),
                          "all_matrices_mib": round(one * args.k, 1)}
        base = [sys.executable, "-m", "icmltools", "subset-select", "-q", "--labels", data["labels"],
                "--threads", str(args.threads), "--device", args.device, "--no-indices"]
        feats = sum((["-f", p] for p in data["paths"]), [])
        runs = {}
        runs["read_pass"] = run_child([sys.executable, "-c", READ_PASS] + data["paths"], folder, "read")
        plan = [("ram-apl", feats, args.rate), ("min", ["-f", data["paths"][0]], args.rate),
                ("random", ["-f", data["paths"][0]], args.rate),
                ("kcenter", ["-f", data["paths"][0]], args.greedy_rate),
                ("graphcut", ["-f", data["paths"][0]], args.greedy_rate)]
        for m, f, rate in plan:
            if m in skip:
                continue
            idx = os.path.join(folder, f"{m}.txt")
            rec = run_child(base + f + ["-m", m, "-r", str(rate), "--indices-out", idx], folder, m)
            rec["rate"] = rate
            if rec.get("result"):
                s = rec["result"]["selections"][0]
                rec["n_selected"] = s["n_selected"]
                rec.pop("result")
            runs[m] = rec
        if args.small_n:
            for m in ("kcenter", "graphcut"):
                if m in skip:
                    continue
                rec = run_child(base[:6] + [data["small_labels"]] + base[7:] + ["-f", data["small_path"], "-m", m,
                                "-r", str(args.rate)], folder, f"{m}_small")
                rec.update(rate=args.rate, n=args.small_n)
                if rec.get("result"):
                    rec["n_selected"] = rec.pop("result")["selections"][0]["n_selected"]
                runs[f"{m}_small_n"] = rec
        # per-pick cost of the greedy methods on one class-sized block, to extrapolate to the headline rate
        n_c = args.n // args.classes
        out = subprocess.run([sys.executable, "-c", GREEDY_STEP, str(n_c), str(args.d), "50", str(args.threads)],
                             capture_output=True, text=True)
        per_pick = eval(out.stdout.strip()) if out.returncode == 0 else {}
        picks = round(args.rate * n_c) * args.classes
        report["greedy_extrapolation"] = {
            "class_size": n_c, "per_pick_ms": {m: round(v * 1e3, 2) for m, v in per_pick.items()},
            f"estimated_s_at_rate_{args.rate}": {m: round(v * picks, 1) for m, v in per_pick.items()},
            "note": "extrapolated, not measured: picks x measured per-pick time on one class block"}
        report["runs"] = runs
        r = runs.get("ram-apl", {})
        ratios = {}
        if r.get("exit") == 0:
            ratios["ram_apl_peak_rss_over_one_matrix"] = round(r["peak_rss_mib"] / one, 2)
            if runs.get("read_pass", {}).get("exit") == 0:  # what RAM-APL holds beyond reading the files once
                ratios["ram_apl_rss_above_read_pass_over_one_matrix"] = round(
                    (r["peak_rss_mib"] - runs["read_pass"]["peak_rss_mib"]) / one, 2)
            for b in ("read_pass", "min", "random", "kcenter", "graphcut"):
                if runs.get(b, {}).get("exit") == 0:
                    ratios[f"ram_apl_wall_over_{b}"] = round(r["wall_s"] / runs[b]["wall_s"], 2)
        report["ratios"] = ratios
        report["machine"]["loadavg_end"] = os.getloadavg()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
