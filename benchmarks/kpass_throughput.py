"""icml kpass throughput: groups/s end to end (JSONL bytes in, JSONL bytes out) through the stream transform,
for pass@k (k = 8, loo) and maj@k (k = 8, loo), against a plain per-group Python loop (json.loads, numpy per
group, json.dumps) measured in the same run. Also the CLI as a subprocess (`icml kpass transform`, with start-up).
Target: >= 20k groups/s on one core. Prints one JSON document.

    python benchmarks/kpass_throughput.py [--groups 50000]
"""
import argparse
import io
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from icmltools.core.seed import derive  # noqa: E402
from icmltools.kpass.options import TransformConfig  # noqa: E402
from icmltools.kpass.stream import Sink, transform  # noqa: E402


def make_input(groups, k, seed=0):
    rng = derive(seed, "kpass-bench").numpy()
    ans = rng.integers(0, 4, (groups, k))
    lines = []
    for g in range(groups):
        samples = [{"reward": int(a == 0), "answer": str(a)} for a in ans[g]]
        lines.append(json.dumps({"id": g, "samples": samples}))
    return ("\n".join(lines) + "\n").encode()


def loop_pass(data):
    out = io.BytesIO()
    for line in data.splitlines():
        obj = json.loads(line)
        r = np.array([s["reward"] for s in obj["samples"]], dtype=float)
        a = np.zeros_like(r)
        top = np.argsort(r)
        a[top[-1]] = r[top[-1]] - r[top[-2]]
        obj["advantages"] = a.tolist()
        out.write(json.dumps(obj).encode() + b"\n")
    return out.getvalue()


def _vote(counts, rew):
    if not counts:
        return 0.0
    mx = max(counts.values())
    tied = [a for a, c in counts.items() if c == mx]
    return sum(rew[a] for a in tied) / len(tied)


def loop_maj(data):
    out = io.BytesIO()
    for line in data.splitlines():
        obj = json.loads(line)
        ans = [s["answer"] for s in obj["samples"]]
        rew = {s["answer"]: s["reward"] for s in obj["samples"]}
        counts = {}
        for a in ans:
            counts[a] = counts.get(a, 0) + 1
        f = _vote(counts, rew)
        adv = []
        for a in ans:
            counts[a] -= 1
            adv.append(f - _vote({b: c for b, c in counts.items() if c}, rew))
            counts[a] += 1
        obj["advantages"] = adv
        out.write(json.dumps(obj).encode() + b"\n")
    return out.getvalue()


def ours(data, objective):
    sink = Sink(io.BytesIO(), owned=False)
    transform(TransformConfig(objective=objective), io.BufferedReader(io.BytesIO(data)), "bench", sink)
    return sink.fh.getvalue()


def timed(fn, *a):
    t = time.perf_counter()
    c = time.process_time()
    out = fn(*a)
    return out, time.perf_counter() - t, time.process_time() - c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=50_000)
    ap.add_argument("--k", type=int, default=8)
    args = ap.parse_args()
    data = make_input(args.groups, args.k)
    rows = {}
    for name, base, obj in (("pass@k", loop_pass, "pass"), ("maj@k", loop_maj, "maj")):
        b_out, b_wall, b_cpu = timed(base, data)
        o_out, o_wall, o_cpu = timed(ours, data, obj)
        same = np.allclose([json.loads(x)["advantages"] for x in b_out.splitlines()[:2000]],
                           [json.loads(x)["advantages"] for x in o_out.splitlines()[:2000]])
        rows[name] = {"groups_per_s": args.groups / o_wall, "groups_per_cpu_s": args.groups / o_cpu,
                      "loop_groups_per_s": args.groups / b_wall, "loop_groups_per_cpu_s": args.groups / b_cpu,
                      "ratio_vs_loop": b_wall / o_wall, "same_advantages_as_loop": bool(same),
                      "meets_20k_target": args.groups / o_cpu >= 20_000}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "icmltools", "kpass", "transform", "-q", "--threads", "1"],
                       input=data, capture_output=True, check=True)
    cli_wall = time.perf_counter() - t
    rows["cli pass@k (subprocess, incl. start-up)"] = {"groups_per_s": args.groups / cli_wall,
                                                      "lines_out": p.stdout.count(b"\n")}
    print(json.dumps({"groups": args.groups, "k": args.k, "load_avg_1m": os.getloadavg()[0], "results": rows},
                     indent=2))


if __name__ == "__main__":
    main()
