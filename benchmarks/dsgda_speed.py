"""Speed of `icml dsgda run`'s deterministic table: the exact round map (mat-vecs, matrix powers) against
direct simulation of the same runs, both vectorised over the step-size grid, and against direct simulation
one step size at a time (the unvectorised prototype). Prints one JSON document.

    python benchmarks/dsgda_speed.py [--couplings 0.1,1] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import time


def _table(game_fn, searcher, lrs, couplings, runs):
    t = time.perf_counter()
    rounds = []
    for c in couplings:
        g = game_fn(c)
        rounds += [searcher(g, name, K, lrs, 1e-6, 20000)["rounds_to_eps"] for name, K in runs]
    return time.perf_counter() - t, rounds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--couplings", default="0.1,1")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import numpy as np

    from icmltools.core.device import set_threads
    from icmltools.dsgda import games, search
    from icmltools.dsgda.options import LR_GRID, RunConfig

    set_threads(args.threads)
    couplings = [float(c) for c in args.couplings.split(",")]
    cfg = RunConfig()
    runs = [(m, K) for m in ("decoupled", "gda", "altgda", "eg", "localsgda") for K in ((10, 100) if m in
                                                                                       ("decoupled", "localsgda") else (1,))]
    lrs = np.asarray(LR_GRID)

    def game_fn(c):
        return games.quadratic(cfg.dim, 100.0, cfg.mu, c, seed=0)

    exact_s, exact = _table(game_fn, search.affine_search, lrs, couplings, runs)
    direct_s, direct = _table(game_fn, search.direct_search, lrs, couplings, runs)
    print(json.dumps({"couplings": couplings, "runs": [f"{m}:K{K}" for m, K in runs], "threads": args.threads,
                      "exact_map_s": round(exact_s, 3), "direct_vectorised_s": round(direct_s, 3),
                      "speedup_exact_vs_direct": round(direct_s / exact_s, 2),
                      "same_rounds": exact == direct, "rounds": exact}))


if __name__ == "__main__":
    main()
