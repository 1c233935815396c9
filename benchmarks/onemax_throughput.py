"""Throughput of `icml onemax-sim` empirical mode: windows x steps x algorithms per second.

Target (issue 2): 10^6 windows x 200 steps x 6 algorithms in under a minute on 2 cores. The baseline, measured
in the same run, is a straightforward per-window loop (numpy per window, first index >= threshold), timed
on a subsample and reported as a rate. Prints one JSON document with wall and process CPU seconds (on a
shared machine the wall time mostly measures the other jobs; the CPU time is this process's own work).

    python benchmarks/onemax_throughput.py [--windows 1000000] [--steps 200] [--baseline-windows 3000]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from icmltools.onemax import api, data, rules, worstcase
from icmltools.onemax.rules import RuleParams


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--baseline-windows", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    n, T = a.windows, a.steps
    series = data.synthetic_market(n + T - 1, seed=a.seed)
    algs = rules.ALGORITHMS
    params = RuleParams(lam=0.5)
    cfg = api.OneMaxConfig(m=data.MARKET_BOUNDS[0], M=data.MARKET_BOUNDS[1], window=T, stride=1,
                           noise=("exact",), algorithms=algs, chunk=20000)
    t0, c0 = time.perf_counter(), time.process_time()
    res = api.run_empirical(cfg, series, a.seed, "synthetic")
    vec_s, vec_cpu = time.perf_counter() - t0, time.process_time() - c0
    assert res["n_windows"] == n

    # baseline: one window at a time
    sw = np.lib.stride_tricks.sliding_window_view(series, T)
    m, M = data.MARKET_BOUNDS
    nb = min(a.baseline_windows, n)
    t0, c0 = time.perf_counter(), time.process_time()
    base_ratios = {name: [] for name in algs}
    for i in range(nb):
        w = sw[i] / m
        p = w.max()
        for name in algs:
            phi = float(rules.threshold(name, p, M / m, params))
            base_ratios[name].append(worstcase.sequence_ratio(w, phi))
    base_s, base_cpu = time.perf_counter() - t0, time.process_time() - c0
    # the two implementations agree on the subsample
    chk = api.run_empirical(api.OneMaxConfig(**{**cfg.__dict__}), series[: nb + T - 1], 0, "s")
    agree = all(abs(next(r["mean_ratio"] for r in alg["empirical"]) - float(np.mean(base_ratios[alg["name"]]))) < 1e-6
                for alg in chk["algorithms"])

    cells = n * T * len(algs)
    out = {
        "benchmark": "onemax_throughput",
        "windows": n, "steps": T, "algorithms": list(algs),
        "vectorised_s": round(vec_s, 3), "vectorised_cpu_s": round(vec_cpu, 3),
        "vectorised_cells_per_s": cells / vec_s,
        "baseline_loop_windows": nb, "baseline_loop_s": round(base_s, 3), "baseline_loop_cpu_s": round(base_cpu, 3),
        "baseline_loop_cells_per_s": nb * T * len(algs) / base_s,
        "speedup_vs_loop": (cells / vec_s) / (nb * T * len(algs) / base_s),
        "speedup_vs_loop_cpu": (cells / vec_cpu) / (nb * T * len(algs) / base_cpu),
        "target_s": 60.0, "target_met": vec_s < 60.0,
        "agree_with_loop": agree,
        "load_average": os.getloadavg()[0], "cpu_count": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
