"""Speed of `icml shap-pay`: the exact n = 15 equilibrium, the Monte Carlo n = 30 equilibrium (400 permutations),
and our Shapley estimators against a plain permutation loop (one value call per coalition) measured in the same
run. Prints one JSON document.

    python benchmarks/shap_pay_bench.py [--threads 1] [--seed 0]
"""
from __future__ import annotations

import argparse
import itertools
import json
import time

import numpy as np

from icmltools.core.device import set_threads
from icmltools.core.seed import derive
from icmltools.shappay import api, options
from icmltools.shappay import game as gm
from icmltools.shappay import shapley as sh


def loop_shapley(game, s, orders) -> np.ndarray:
    """The plain baseline: walk each permutation, one value call per coalition."""
    n = game.n
    phi = np.zeros(n)
    for order in orders:
        mask = np.zeros((1, n))
        prev = 0.0
        for i in order:
            mask[0, i] = 1.0
            cur = game.value(mask, s)[0]
            phi[i] += cur - prev
            prev = cur
    return phi / len(orders)


def timed(fn):
    """(result, wall seconds); the CPU seconds of the last call are kept in CPU[0] (shared boxes: wall > CPU)."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    CPU[0] = time.process_time() - c
    return out, time.perf_counter() - t


CPU = [0.0]


def shapley_vs_loop(n: int, perms: int | None, seed: int) -> dict:
    game = gm.default_game(options.GameConfig(n=n, groups=2 if n <= 15 else 3), seed)
    s = np.linspace(1.0, 100.0, n)
    if perms is None:
        coal, orders = sh.exact_coalitions(n), list(itertools.permutations(range(n)))
    else:
        coal = sh.mc_coalitions(n, perms, derive(seed, "bench", "perms").numpy())
        order_mat = derive(seed, "bench", "perms").numpy().permuted(np.tile(np.arange(n), (perms, 1)), axis=1)
        orders = [list(r) for r in order_mat]
    (phi, _), t_ours = timed(lambda: sh.shapley(lambda M: game.value(M, s), coal))
    phi_loop, t_loop = timed(lambda: loop_shapley(game, s, orders))
    return {"n": n, "mode": coal.mode, "perms": perms, "ours_s": t_ours, "loop_s": t_loop,
            "speedup": t_loop / t_ours, "max_abs_diff": float(np.max(np.abs(phi - phi_loop)))}


def equilibrium(n: int, mode: str, perms: int | None, seed: int) -> dict:
    game = gm.default_game(options.GameConfig(n=n, groups=2 if n <= 15 else 3), seed)
    eq = options.EquilibriumConfig(mechanisms=("shap", "none"), deviation_grid=0)
    r, t = timed(lambda: api.equilibrium(game, options.ShapleyConfig(shapley=mode, perms=perms), eq, seed))
    m = r["mechanisms"]
    return {"n": n, "mode": mode, "perms": perms, "seconds": t, "cpu_s": CPU[0], "data_gain": r["data_gain"],
            **{f"{k}_{f}": m[k][f] for k in m for f in ("total_data", "free_riders", "rounds", "gap")}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    set_threads(a.threads)
    report = {"threads": a.threads,
              "shapley_exact_n8": shapley_vs_loop(8, None, a.seed),
              "shapley_mc_n30_400": shapley_vs_loop(30, 400, a.seed),
              "equilibrium_exact_n15": equilibrium(15, "exact", None, a.seed),
              "equilibrium_mc_n30_400": equilibrium(30, "mc", 400, a.seed)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
